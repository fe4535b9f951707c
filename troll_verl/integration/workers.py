# Copyright 2026 The troll-verl authors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""TROLL's verl worker classes: verl's own workers plus the flags of TROLL's two passes.

Where verl has the policy-loss logits seam (:func:`troll_verl.integration.seam.seam_available`), verl's own worker
sets the
seam's flags for loss ``troll`` and these classes add only the CPU platform's process group. On verl 0.9 as
released, :class:`TrollActorWorkerMixin` adds three things to verl's actor workers (``ActorRolloutRefWorker``:
:class:`TrollActorRolloutRefWorker`; ``separate_async``'s ``DetachActorWorker``: :class:`TrollDetachActorWorker`),
all inert unless the trainer asks for them:

- ``init_model`` installs :class:`~troll_verl.integration.loss_fn.TrollLossFn` on the actor when ``loss_mode=troll``;
- ``compute_log_prob`` with ``troll_store_old_topk`` (set by TROLL's trainer on the old-log-prob pass only) turns
  on verl's logits hook so the old policy's top-K is stored with ``old_log_probs``; a reference pass
  (``no_lora_adapter``) asking for it is refused, so it can never overwrite the old policy's data;
- ``update_actor`` with ``troll_update`` turns on the logits hook (``distillation_use_topk``) and skips verl's own
  log-prob on those logits (``distillation_only``: nothing else reads or overwrites the saved logits); with
  ``troll_old_from_rollout`` (bypass mode) the step's first micro-batch also reports ``troll/mismatch_kl``.

Every worker class here first runs TROLL's start-up checks in its own process (the plugin is active on this node,
the model's attention can load here: :func:`troll_verl.integration.startup.check_worker_start`) and initialises a
``gloo`` process group on the CPU platform (see :func:`troll_verl.platform.cpu.init_cpu_process_group`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch.distributed.tensor import DTensor
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from troll_verl.platform.cpu import detach_cpu_copy, init_cpu_process_group

from .checks import uses_troll
from .loss_fn import TROLL_MODE_KEY, TrollLossFn
from .seam import seam_available
from .startup import check_training_worker_start, check_worker_start

# the roles of verl's actor worker that train (verl's ActorRolloutRefWorker tests the same list)
_ACTOR_ROLES = ("actor", "actor_rollout", "actor_rollout_ref")

__all__ = [
    "TrollActorWorkerMixin",
    "TrollActorRolloutRefWorker",
    "TrollDetachActorWorker",
    "TrollTrainingWorker",
    "TROLL_OLD_PASS_KEY",
    "TROLL_UPDATE_KEY",
    "TROLL_OLD_SOURCE_KEY",
    "swap_worker_classes",
]

# Non-tensor flags set by TROLL's trainer on the KVBatchMeta of the old-log-prob and update passes.
TROLL_OLD_PASS_KEY = "troll_store_old_topk"
TROLL_UPDATE_KEY = "troll_update"
# Set with TROLL_UPDATE_KEY in bypass mode: the old distribution is the rollout's (troll/mismatch_kl is reported).
TROLL_OLD_SOURCE_KEY = "troll_old_from_rollout"


class TrollTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` (critic, standalone actor); on the CPU platform it creates a gloo group first."""

    def __init__(self, config):
        check_training_worker_start(config)
        init_cpu_process_group()
        super().__init__(config)


class TrollActorWorkerMixin:
    """TROLL's pass flags on a verl actor worker (see the module docstring); put it first in the bases."""

    def __init__(self, config, role: str, distillation_config=None, **kwargs):
        check_worker_start(config, role)
        init_cpu_process_group()
        super().__init__(config, role, distillation_config=distillation_config, **kwargs)
        self.troll_loss_fn: TrollLossFn | None = None
        # where verl has the policy-loss logits seam, verl's own worker sets the passes' flags: TROLL's step aside
        self.stock_route = not seam_available()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """verl's ``init_model``; with ``loss_mode=troll`` on the stock route, TROLL's loss function installed on the
        actor."""
        super().init_model()
        if self.role in _ACTOR_ROLES and uses_troll(self.config.actor.policy_loss) and self.stock_route:
            self.troll_loss_fn = TrollLossFn(omega_conf_to_dataclass(self.config.actor))
            self.loss_fn = self.troll_loss_fn
            self.actor.set_loss_fn(self.troll_loss_fn)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        """verl's pass; with ``troll_store_old_topk`` it also stores the old policy's top-K (refused on a reference
        pass)."""
        if self.stock_route and tu.get_non_tensor_data(data=data, key=TROLL_OLD_PASS_KEY, default=False):
            if tu.get_non_tensor_data(data=data, key="no_lora_adapter", default=False):
                raise RuntimeError(
                    "A reference pass (no_lora_adapter=True) asked to store TROLL's old top-K; it would overwrite "
                    "the old policy's distribution. The trainer must clear troll_store_old_topk before the "
                    "reference pass."
                )
            if self.troll_loss_fn is None:
                raise RuntimeError("TROLL's old-top-K pass needs loss_mode=troll on the actor (init_model).")
            tu.assign_non_tensor(data, compute_loss=True, distillation_use_topk=True, **{TROLL_MODE_KEY: "old"})
        return super().compute_log_prob(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        """verl's update; with ``troll_update`` the logits hook computes TROLL's terms (verl's own log-prob skipped)."""
        if self.stock_route and tu.get_non_tensor_data(data=data, key=TROLL_UPDATE_KEY, default=False):
            if self.troll_loss_fn is None:
                raise RuntimeError("TROLL's update pass needs loss_mode=troll on the actor (init_model).")
            tu.assign_non_tensor(data, distillation_use_topk=True, distillation_only=True, **{TROLL_MODE_KEY: "update"})
            if tu.get_non_tensor_data(data=data, key=TROLL_OLD_SOURCE_KEY, default=False):
                self.troll_loss_fn.measure_mismatch()  # bypass mode: the old distribution is the rollout's
        return super().update_actor(data)


class TrollActorRolloutRefWorker(TrollActorWorkerMixin, ActorRolloutRefWorker):
    """verl's ``ActorRolloutRefWorker`` plus TROLL's pass flags (``sync``, ``colocate_async``)."""


class TrollDetachActorWorker(TrollActorWorkerMixin, DetachActorWorker):
    """verl's ``DetachActorWorker`` (``separate_async``: π_old saved to and restored from CPU) plus TROLL's flags."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_model_to_cpu(self, n):
        """verl's save of π_old, copied where the saved state would alias the live parameters."""
        super().save_model_to_cpu(n)
        # NOTE: verl's save moves the parameters' shards with .cpu(), which returns the live storage itself where
        # the parameters already are on the CPU (the CPU platform; parameter offload between calls): π_old would
        # follow every update. Copy the saved state wherever it aliases a parameter (see detach_cpu_copy).
        if _aliases_parameters(self.cpu_saved_models[n], self.actor.engine.module):
            self.cpu_saved_models[n] = detach_cpu_copy(self.cpu_saved_models[n])


# verl's worker classes -> TROLL's (identical unless TROLL's flags are set)
_WORKER_SWAP = {
    ActorRolloutRefWorker: TrollActorRolloutRefWorker,
    DetachActorWorker: TrollDetachActorWorker,
    TrainingWorker: TrollTrainingWorker,
}


def swap_worker_classes(role_worker_mapping: dict) -> None:
    """Replace verl's worker classes in a trainer's ``role_worker_mapping`` (role -> Ray actor class) by TROLL's, in
    place (the v1 trainers and the legacy task runner alike); other classes stay."""
    import ray

    for role, remote_cls in list(role_worker_mapping.items()):
        original = getattr(remote_cls, "__ray_actor_class__", remote_cls)
        if original in _WORKER_SWAP:
            role_worker_mapping[role] = ray.remote(_WORKER_SWAP[original])


def _aliases_parameters(state, module) -> bool:
    """Whether any tensor in ``state`` (tuples, lists, dicts walked) shares storage with a parameter of ``module``."""
    live = set()
    for param in module.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param  # a DTensor's shard on this rank
        live.add(local.untyped_storage().data_ptr())
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.untyped_storage().data_ptr() in live:
                return True
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False

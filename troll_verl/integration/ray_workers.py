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
"""The worker classes TROLL's trainers hand to Ray in place of verl's: the critic's training worker (the CPU
platform's process group) and ``separate_async``'s ``DetachActorWorker`` (π_old copied where it would alias the live
parameters). The actor's training worker, where TROLL lives, is not among them: verl's actor worker builds it
(:mod:`troll_verl.integration.workers`).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import TrainingWorker

from troll_verl.platform.cpu import detach_cpu_copy

from .workers import TrollTrainingWorker

__all__ = ["TrollDetachActorWorker", "swap_worker_classes"]


class TrollDetachActorWorker(DetachActorWorker):
    """verl's ``DetachActorWorker`` (``separate_async``: π_old saved to and restored from CPU), its π_old copied
    where it would alias the live parameters. Its actor training worker is TROLL's, as for every actor worker."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_model_to_cpu(self, n):
        """verl's save of π_old, copied where the saved state would alias the live parameters."""
        super().save_model_to_cpu(n)
        # NOTE: verl's save moves the parameters' shards with .cpu(), which returns the live storage itself where
        # the parameters already are on the CPU (the CPU platform; parameter offload between calls): π_old would
        # follow every update. Copy the saved state wherever it aliases a parameter (see detach_cpu_copy).
        if _aliases_parameters(self.cpu_saved_models[n], self.actor.engine.module):
            self.cpu_saved_models[n] = detach_cpu_copy(self.cpu_saved_models[n])


# verl's worker classes -> TROLL's, where a trainer builds them as Ray actors itself (the actor's training worker and
# the reference's are chosen by verl's ActorRolloutRefWorker: the plugin sets those)
_WORKER_SWAP = {
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

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
"""TROLL's training workers: the actor's, where TROLL lives, and the CPU platform's (critic, reference).

:class:`TrollActorTrainingWorker` is verl's ``TrainingWorker`` for the actor. The plugin installs it as
``ActorRolloutRefWorker.actor_worker_cls`` (:mod:`troll_verl.integration.plugin`), so every verl trainer that builds
verl's actor worker (v1 ``sync``, ``colocate_async``, ``separate_async``'s ``DetachActorWorker``, the legacy
``RayPPOTrainer``) runs TROLL through it with the one override ``policy_loss.loss_mode=troll``. For any other loss
it is verl's ``TrainingWorker`` (plus the CPU platform's process group). With TROLL, on a verl without the
policy-loss logits seam:

- ``set_loss_fn`` installs :class:`~troll_verl.integration.loss_fn.TrollLossFn` in place of verl's ``ppo_loss``
  closure (whose actor config it reads, :func:`troll_verl.compat.actor_loss_closure`), after TROLL's actor-level
  rules (:func:`troll_verl.integration.checks.check_actor`): verl's own ``main_ppo`` refuses what
  ``troll_verl.main`` refuses, before any pass, naming the setting;
- ``infer_batch`` (verl's old-log-prob pass, ``compute_log_prob``) turns on the logits hook, and the old policy's
  top-K is kept on this worker (:class:`~troll_verl.integration.old_cache.OldTopKCache`): nothing of it enters the
  pass's output, so verl's data plane never carries it. A reference pass through the actor (LoRA,
  ``no_lora_adapter``) stays verl's own;
- ``train_mini_batch`` (the update) puts the old top-K on its batch before verl splits it into mini-batches: made
  from the rollout's top-K where the batch carries it (bypass mode: each sample's ``extra_fields`` on the v1
  trainers, a column each on the legacy one; :func:`troll_verl.bypass.mode.old_fields_from_batch`; on a verl with
  the seam too, whose hook then reads it), else the kept one where every sequence's kept
  log-probs equal the ``old_log_probs`` it received, else one no-grad pass over the shard from the weights before
  the first optimizer step, whose sampled-token log-probs then replace ``old_log_probs``, so the ratio and the
  projection never use two different old policies. Metrics: ``troll/old_pass_reused_frac`` (sequences served from
  the old pass), ``troll/old_pass_recompute_s`` (the extra pass's time, 0 when none ran) and
  ``troll/old_from_rollout`` (1 where the old top-K is the rollout's).

Where verl has the seam (:func:`troll_verl.integration.seam.route`), verl's own worker runs TROLL and this
class adds only the CPU platform's process group. This module imports only ``verl.workers.engine_workers`` of verl's
workers (the module whose loading installs these classes). Every worker class here first runs TROLL's start-up
checks in its own process (:func:`troll_verl.integration.startup.check_training_worker_start`) and initialises a
``gloo`` process group on the CPU platform (:func:`troll_verl.platform.cpu.init_cpu_process_group`).
"""

from __future__ import annotations

import logging
import os
import sys
import time

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import TrainingWorker

from troll_verl import kernels
from troll_verl.bypass.mode import old_fields_from_batch
from troll_verl.compat import (
    ENGINE_BATCH_ADAPTER_METHODS,
    VerlVersionError,
    actor_loss_closure,
    engine_pass_defaults,
)
from troll_verl.core.layout import OLD_FIELDS
from troll_verl.platform.cpu import init_cpu_process_group

from . import seam
from .checks import check_actor, check_loss_closure, uses_troll
from .config import troll_settings
from .diagnostics import GradientParts, all_advantages_zero
from .loss_fn import TROLL_MODE_KEY, TrollLossFn
from .old_cache import OldTopKCache
from .startup import check_training_worker_start, route_troll_logs

__all__ = [
    "TrollActorTrainingWorker",
    "TrollTrainingWorker",
    "OLD_PASS_METRICS",
    "install_worker_classes",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# verl's neo shape: TrainingWorker's entry points adapt their batch and hand the engine's TensorDict to private methods
ENGINE_BATCH_ADAPTER = all(hasattr(TrainingWorker, name) for name in ENGINE_BATCH_ADAPTER_METHODS)

# the worker's metrics of where the update's old top-K came from (logged under actor/ by verl's trainers)
OLD_PASS_METRICS = ("troll/old_pass_reused_frac", "troll/old_pass_recompute_s", "troll/old_from_rollout")
# their values where the old top-K is the rollout's (bypass mode): no old pass reused, none run
_FROM_ROLLOUT = dict(zip(OLD_PASS_METRICS, (0.0, 0.0, 1.0), strict=True))


class TrollTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` (critic, reference); on the CPU platform it creates a gloo group first. TROLL's
    warnings in its process reach stderr whatever the root logger's level (:func:`~.startup.route_troll_logs`)."""

    def __init__(self, config):
        route_troll_logs()
        check_training_worker_start(config)
        init_cpu_process_group()
        super().__init__(config)


class TrollActorTrainingWorker(TrollTrainingWorker):
    """verl's actor ``TrainingWorker`` with TROLL's two passes (see the module docstring); inert for other losses.

    Args:
        config: verl's ``TrainingWorkerConfig`` for the actor.
    """

    def __init__(self, config):
        super().__init__(config)
        self.troll_loss_fn: TrollLossFn | None = None
        self.troll_settings = None  # TROLL's settings where the loss is troll (both routes)
        self.old_topk_cache = OldTopKCache()
        self._miss_reported = False  # the first miss is a warning, later ones info

    def set_loss_fn(self, loss_fn):
        """verl's closure; ``TrollLossFn`` instead where verl's ``ppo_loss`` closure names ``loss_mode=troll``, after
        TROLL's actor-level rules (on every rank, before any pass: each refusal names the setting to change)."""
        closure, actor_config = actor_loss_closure(loss_fn)
        if actor_config is None or not uses_troll(actor_config.policy_loss):
            return super().set_loss_fn(loss_fn)
        check_loss_closure(closure)
        check_actor(actor_config, self.model_config)
        self.troll_settings = troll_settings(actor_config)
        kernels.configure(self.troll_settings.kernels)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 0:
            # NOTE: print, as verl's workers do: Ray's worker log shows no INFO records
            print(kernels.describe_choice(), flush=True)
        if seam.route() == seam.STOCK:
            self.troll_loss_fn = TrollLossFn(actor_config, old_sink=self.old_topk_cache.put)
            loss_fn = self.troll_loss_fn
        super().set_loss_fn(loss_fn)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_batch(self, data: TensorDict) -> TensorDict:
        """verl's optimizer step on one mini-batch; with ``policy_loss.diagnostics`` also what it was made of
        (:mod:`troll_verl.integration.diagnostics`)."""
        if self.troll_loss_fn is None or not self.troll_settings.diagnostics:
            return super().train_batch(data)
        zero = all_advantages_zero(data, self.engine.get_data_parallel_group())
        for key, value in engine_pass_defaults(self).items():
            if key not in data.keys():
                tu.assign_non_tensor(data, **{key: value})
        disable_auto_offload = tu.get(data, key="disable_auto_offload", default=False)
        with self.engine.train_mode(disable_auto_offload=disable_auto_offload):
            output = GradientParts(self.engine, self.loss_fn).measure(data, super().train_batch)
        if output is not None:
            metrics = tu.get(output, "metrics")
            metrics["troll/zero_adv_frac"] = float(zero)
            if zero:
                metrics["troll/zero_adv_grad_norm"] = metrics["grad_norm"]
        return output

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def infer_batch(self, data: TensorDict) -> TensorDict:
        """verl's forward-only pass; with TROLL (not a reference pass) it also keeps the old policy's top-K."""
        if not ENGINE_BATCH_ADAPTER:
            self._mark_old_pass(data)
        return super().infer_batch(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data: TensorDict) -> TensorDict:
        """verl's update; with TROLL the old top-K goes on ``data`` first and the logits hook computes TROLL's terms
        (verl's own log-prob on those logits skipped)."""
        if ENGINE_BATCH_ADAPTER:
            return super().train_mini_batch(data)
        if self.troll_loss_fn is None:
            return self._seam_update(data, super().train_mini_batch)
        return self._troll_update(data, super().train_mini_batch)

    # verl's neo shape (ENGINE_BATCH_ADAPTER): the entry points above adapt the batch (a NeoProto view) to the engine's
    # TensorDict and hand it to these two, where TROLL's passes then work (compat.ENGINE_BATCH_ADAPTER_METHODS)
    def _infer_batch_impl(self, data: TensorDict) -> TensorDict:
        self._mark_old_pass(data)
        return super()._infer_batch_impl(data)

    def _train_mini_batch_impl(self, data: TensorDict) -> TensorDict:
        if self.troll_loss_fn is None:
            return self._seam_update(data, super()._train_mini_batch_impl)
        return self._troll_update(data, super()._train_mini_batch_impl)

    def _mark_old_pass(self, data: TensorDict) -> None:
        """Turn on the logits hook for TROLL's old pass (not for a reference pass through the actor)."""
        if self.troll_loss_fn is not None and not tu.get_non_tensor_data(data, "no_lora_adapter", default=False):
            tu.assign_non_tensor(data, compute_loss=True, distillation_use_topk=True, **{TROLL_MODE_KEY: "old"})

    def _seam_update(self, data: TensorDict, update) -> TensorDict:
        """verl's own update (other losses; TROLL on a verl with the seam, whose hook reads OLD_FIELDS where the batch
        carries them: the rollout's top-K, put here in bypass mode)."""
        metrics = self._put_rollout_topk(data) if self.troll_settings is not None else None
        output = update(data)
        if output is not None and metrics is not None:
            tu.get(output, "metrics").update({key: [value] for key, value in metrics.items()})
        return output

    def _troll_update(self, data: TensorDict, update) -> TensorDict:
        """verl's ``update`` on ``data`` with the old top-K put on it and the logits hook on; the source metrics."""
        metrics = self._put_old_topk(data)
        tu.assign_non_tensor(data, distillation_use_topk=True, distillation_only=True, **{TROLL_MODE_KEY: "update"})
        try:
            output = update(data)
        finally:
            self.old_topk_cache.end_update(data)
        if output is not None:
            tu.get(output, "metrics").update({key: [value] for key, value in metrics.items()})
        return output

    def _put_old_topk(self, data: TensorDict) -> dict[str, float]:
        """Put the old top-K on the update's shard ``data`` (see the module docstring); its metrics."""
        if all(key in data.keys() for key in OLD_FIELDS):
            # the caller made the old top-K itself (as the seam's core.losses.troll_old_fields takes it: as it is)
            self.troll_loss_fn.measure_mismatch()
            return dict(_FROM_ROLLOUT)
        from_rollout = self._put_rollout_topk(data)
        if from_rollout is not None:
            # bypass mode: the first micro-batch measures the rollout's mismatch against the actor
            self.troll_loss_fn.measure_mismatch()
            return from_rollout
        fields, hits = self.old_topk_cache.take(data)
        n = len(data["input_ids"].offsets()) - 1
        recompute_s = 0.0
        # every rank of the worker group joins the extra pass (its collectives), where any rank missed a sequence
        missed = torch.tensor([float(fields is None)])
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(missed, op=torch.distributed.ReduceOp.MAX)
        if missed.item() > 0:
            if fields is None:
                log = logger.info if self._miss_reported else logger.warning
                self._miss_reported = True
                log(
                    "TROLL: %d of %d sequences of this update were not served by the kept old top-K (%s); one no-grad "
                    "pass over the shard recomputes it from the weights before the first optimizer step "
                    "(troll/old_pass_recompute_s).",
                    n - hits, n, self.old_topk_cache.last_misses,
                )  # fmt: skip
            start = time.perf_counter()
            self._old_pass(data)
            fields, _ = self.old_topk_cache.take(data, check_log_probs=False)
            _replace_old_log_probs(data, self.old_topk_cache.log_probs(data))
            recompute_s = time.perf_counter() - start
            hits = 0
        for key, value in fields.items():
            data[key] = value
        return dict(zip(OLD_PASS_METRICS, (hits / max(n, 1), recompute_s, 0.0), strict=True))

    def _put_rollout_topk(self, data: TensorDict) -> dict[str, float] | None:
        """OLD_FIELDS on ``data`` from the rollout's top-K where the batch carries it (bypass mode where the rollout
        was asked for it: :func:`troll_verl.bypass.mode.prepare_bypass`), by
        :func:`~troll_verl.bypass.mode.old_fields_from_batch`; the source metrics and ``troll/rollout_tail_mass``, or
        None where it carries none. ``old_log_probs`` is already the rollout's (verl's bypass mode)."""
        made = old_fields_from_batch(data, self.troll_settings)
        if made is None:
            return None
        fields, tail = made
        device = data["input_ids"].device
        for key, value in fields.items():
            data[key] = value.to(device)
        return {**_FROM_ROLLOUT, **tail}

    def _old_pass(self, data: TensorDict) -> None:
        """One no-grad pass over ``data`` from the current weights, keeping its old top-K (verl's infer_batch)."""
        probe = data.copy()
        tu.assign_non_tensor(probe, calculate_entropy=False, calculate_sum_pi_squared=False)
        self.infer_batch(probe)


def _replace_old_log_probs(data: TensorDict, log_probs: list[torch.Tensor]) -> None:
    """``data["old_log_probs"]`` replaced by ``log_probs`` (one ``(j,)`` per sequence), in its layout and dtype."""
    old = data["old_log_probs"]
    if old.is_nested:
        values = torch.cat(log_probs).to(device=old.device, dtype=old.dtype)
        data["old_log_probs"] = torch.nested.nested_tensor_from_jagged(values, old.offsets())
        return
    new = torch.zeros_like(old)
    for i, row in enumerate(log_probs):
        new[i, : row.shape[0]] = row.to(device=old.device, dtype=old.dtype)
    data["old_log_probs"] = new


def install_worker_classes(engine_workers) -> None:
    """Set verl's actor worker to build TROLL's training worker for the actor (and, on the CPU platform, the
    reference: its gloo group), refusing where another plugin set one already
    (:data:`troll_verl.compat.WORKER_CLASS_HOOKS`). Called by the plugin when ``verl.workers.engine_workers`` loads.

    Args:
        engine_workers: the module ``verl.workers.engine_workers``.
    """
    from troll_verl.platform.cpu import cpu_platform_requested

    worker = engine_workers.ActorRolloutRefWorker
    wanted = {"actor_worker_cls": TrollActorTrainingWorker}
    if cpu_platform_requested():
        wanted["ref_worker_cls"] = TrollTrainingWorker
    for attribute, cls in wanted.items():
        current = getattr(worker, attribute, None)
        if current is None:
            raise VerlVersionError(
                f"This verl's ActorRolloutRefWorker has no {attribute}, the hook through which troll-verl installs "
                "TROLL's actor training worker (verl 0.9.1 and main have it); install verl==0.9.1."
            )
        if current is not cls and current is not engine_workers.TrainingWorker:
            raise RuntimeError(
                f"verl's ActorRolloutRefWorker.{attribute} is already {current.__module__}.{current.__qualname__}, "
                "set by another plugin; troll-verl cannot install TROLL's worker there. Uninstall the other plugin."
            )
        setattr(worker, attribute, cls)


# This module imported verl's actor worker module itself (a Ray worker unpickling one of these classes before anything
# else imported verl's): the plugin's hook stepped aside then (see plugin._install_worker_classes), so install here.
if getattr(sys.modules.get("troll_verl.integration.plugin"), "_REGISTERED", False):
    install_worker_classes(sys.modules["verl.workers.engine_workers"])

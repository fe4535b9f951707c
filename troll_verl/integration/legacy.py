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
"""TROLL on verl's legacy trainer (``trainer.use_v1=false``): ``RayPPOTrainer`` plus TROLL's pass flags.

verl 0.9.1 runs the legacy trainer from ``verl.trainer.main_ppo_v0.TaskRunner``, which builds verl's
``RayPPOTrainer`` and verl's worker classes itself (no registry, no ``_target_``); verl's ``neo`` branch makes it the
only trainer. :class:`TrollTaskRunner` is that task runner with TROLL's trainer (:class:`TrollRayPPOTrainer`) and
TROLL's workers (:mod:`troll_verl.integration.workers`, the same as on the v1 route); ``python -m troll_verl.main
trainer.use_v1=false`` selects it.

The trainer adds to verl's what the v1 route's mixin adds (:mod:`troll_verl.integration.trainer`), through the same
flags on the same workers:

- the old-log-prob pass sets ``troll_store_old_topk``, and keeps the old policy's top-K the worker returns
  (:data:`~troll_verl.core.layout.OLD_FIELDS`) next to ``old_log_probs``, padded like them ``(bsz, T, K)``. verl's
  own ``_compute_old_log_prob`` keeps only its fixed outputs, so this pass is verl's, re-stated with TROLL's fields
  (its verl statements are checked in :data:`troll_verl.compat.MIRRORED_STATEMENTS`);
- the update pass sets ``troll_update`` (through ``meta_info``, which verl hands to the worker as non-tensor data);
- the reference pass never stores the old top-K;
- with the seeded agent loop (:mod:`troll_verl.rollout.agent_loop`), the rollout requests carry the step and each
  answer's number, which verl's v1 agent loop passes and the legacy one does not.

Not on this trainer yet, each refused by :func:`troll_verl.integration.checks.validate_troll_config` with the fix:
bypass mode (the rollout's top-K reaches the legacy trainer through no field), verl with the policy-loss seam
(``upstream/``), and verl's ``neo`` data plane (its ``EngineBatchSpec`` materialises only whitelisted keys).
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from troll_verl.core.layout import OLD_FIELDS
from troll_verl.rollout import SEEDED_AGENT_LOOP

from .checks import uses_troll, validate_troll_config
from .config import use_troll_policy_loss_config
from .workers import TROLL_OLD_PASS_KEY, TROLL_UPDATE_KEY, swap_worker_classes

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

__all__ = ["TrollRayPPOTrainer", "TrollTaskRunner", "SeededRequests"]

# the padding value of each old field past a response's end (never read: the loss takes each response's rows only)
_OLD_FIELD_PAD = {"troll_old_ids": -1, "troll_old_logprobs": 0.0, "troll_old_tail": 0.0}


def pad_response_aligned(nested: torch.Tensor, width: int, pad) -> torch.Tensor:
    """A nested ``(bsz, j_i, ...)`` response-aligned tensor as a padded ``(bsz, width, ...)`` one, like verl's
    ``no_padding_2_padding`` pads ``old_log_probs`` (response token ``j`` at column ``j``)."""
    size = (nested.size(0), width, *nested.values().shape[1:])
    return torch.nested.to_padded_tensor(nested, pad, output_size=size)


class SeededRequests:
    """verl's agent-loop manager with what the seeded agent loop reads from every request.

    verl's v1 agent loop passes each request the step (``global_steps``) and its answer's number within the prompt's
    group (``session_id``); the legacy trainer's passes neither. This wrapper adds both as per-sample columns of the
    generation batch (from ``meta_info["global_steps"]`` and the order of equal ``uid``), calls verl's manager, and
    removes them from the batch and the output again. Every other attribute is verl's manager's.
    """

    _COLUMNS = ("global_steps", "session_id")

    def __init__(self, manager):
        self._manager = manager

    def __getattr__(self, name):
        return getattr(self._manager, name)

    def generate_sequences(self, batch: DataProto) -> DataProto:
        """verl's ``generate_sequences`` on ``batch`` with the two columns added for the call."""
        n = len(batch)
        keys = batch.non_tensor_batch.get("uid", np.arange(n))
        seen: Counter = Counter()
        sessions = []
        for key in keys:
            sessions.append(seen[key])
            seen[key] += 1
        step = int(batch.meta_info.get("global_steps", 0))
        batch.non_tensor_batch["session_id"] = np.array(sessions, dtype=object)
        batch.non_tensor_batch["global_steps"] = np.full(n, step, dtype=object)
        try:
            output = self._manager.generate_sequences(batch)
        finally:
            for column in self._COLUMNS:
                batch.non_tensor_batch.pop(column, None)
        for column in self._COLUMNS:
            output.non_tensor_batch.pop(column, None)
        return output


class TrollRayPPOTrainer(RayPPOTrainer):
    """verl's legacy ``RayPPOTrainer`` with TROLL's pass flags (see the module docstring).

    With ``loss_mode`` other than ``troll`` it behaves exactly like verl's (the clip baselines), apart from the seeded
    requests where that agent loop is selected.
    """

    def __init__(self, config: DictConfig, *args, **kwargs):
        self.uses_troll = uses_troll(config.actor_rollout_ref.actor.policy_loss)
        self.troll_settings = validate_troll_config(config) if self.uses_troll else None
        if self.uses_troll:
            use_troll_policy_loss_config(config)
        super().__init__(config, *args, **kwargs)

    def init_workers(self):
        """verl's workers (TROLL's classes, chosen by :class:`TrollTaskRunner`) and, with the seeded agent loop, the
        requests' step and answer numbers."""
        super().init_workers()
        agent_loop = OmegaConf.select(self.config, "actor_rollout_ref.rollout.agent.default_agent_loop")
        if agent_loop == SEEDED_AGENT_LOOP:
            self.async_rollout_manager = SeededRequests(self.async_rollout_manager)

    def _compute_old_log_prob(self, batch: DataProto):
        if not self.uses_troll:
            return super()._compute_old_log_prob(batch)
        # verl's pass (RayPPOTrainer._compute_old_log_prob), with TROLL's flag and its fields kept
        batch_td = left_right_2_no_padding(batch.to_tensordict())
        calculate_sum_pi_squared = self.config.actor_rollout_ref.actor.get("calculate_sum_pi_squared", False)
        tu.assign_non_tensor(
            batch_td, calculate_entropy=True, calculate_sum_pi_squared=calculate_sum_pi_squared, compute_loss=False,
            **{TROLL_OLD_PASS_KEY: True},
        )  # fmt: skip
        output = self.actor_rollout_wg.compute_log_prob(batch_td)
        result = {
            "old_log_probs": no_padding_2_padding(tu.get(output, "log_probs"), batch_td).float(),
            "entropys": no_padding_2_padding(tu.get(output, "entropy"), batch_td).float(),
        }
        routed_experts = tu.get(output, "routed_experts")
        if routed_experts is not None:
            result["routed_experts"] = routed_experts
        if calculate_sum_pi_squared:
            result["sum_pi_squared"] = no_padding_2_padding(tu.get(output, "sum_pi_squared"), batch_td).float()
        width = result["old_log_probs"].shape[1]
        for key in OLD_FIELDS:
            value = tu.get(output, key)
            if value is None:
                raise RuntimeError(
                    f"TROLL's old-log-prob pass returned no {key}: the actor worker is not TROLL's (it is chosen by "
                    "troll_verl.integration.legacy.TrollTaskRunner, i.e. python -m troll_verl.main with "
                    "trainer.use_v1=false)."
                )
            result[key] = pad_response_aligned(value, width, _OLD_FIELD_PAD[key])
        return DataProto.from_tensordict(tu.get_tensordict(result)), tu.get(output, "metrics")["mfu"]

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        # the reference pass (also LoRA's reference-through-actor pass) must never store TROLL's old top-K
        batch.meta_info.pop(TROLL_OLD_PASS_KEY, None)
        return super()._compute_ref_log_prob(batch)

    def _update_actor(self, batch: DataProto) -> DataProto:
        if not self.uses_troll:
            return super()._update_actor(batch)
        batch.meta_info[TROLL_UPDATE_KEY] = True  # to the worker as non-tensor data (DataProto.to_tensordict)
        try:
            return super()._update_actor(batch)
        finally:
            batch.meta_info.pop(TROLL_UPDATE_KEY, None)


@ray.remote
class TrollTaskRunner(BaseTaskRunner):
    """verl's legacy ``TaskRunner`` (``verl.trainer.main_ppo_v0``) with TROLL's trainer and workers.

    NOTE: verl's ``TaskRunner.run`` constructs ``RayPPOTrainer`` itself; :meth:`run` is its body with
    :class:`TrollRayPPOTrainer` (the statements it restates are checked in ``compat.MIRRORED_STATEMENTS``).
    """

    def add_actor_rollout_worker(self, config):
        """verl's actor worker, as TROLL's class."""
        out = super().add_actor_rollout_worker(config)
        swap_worker_classes(self.role_worker_mapping)
        return out

    def add_critic_worker(self, config):
        """verl's critic worker, as TROLL's class."""
        super().add_critic_worker(config)
        swap_worker_classes(self.role_worker_mapping)

    def run(self, config):
        """Build the workers, datasets and :class:`TrollRayPPOTrainer`, and train (verl's ``TaskRunner.run``)."""
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        logger.info("TROLL TaskRunner (legacy trainer) on %s, PID %d", socket.gethostname(), os.getpid())
        OmegaConf.resolve(config)
        actor_rollout_cls, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        resource_pool_manager = self.init_resource_pool_mgr(config)
        datasets = {
            split: create_rl_dataset(files, config.data, tokenizer, processor, is_train=split == "train",
                                     max_samples=config.data.get(f"{split}_max_samples", -1))
            for split, files in (("train", config.data.train_files), ("val", config.data.val_files))
        }  # fmt: skip
        trainer = TrollRayPPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=ray_worker_group_cls,
            train_dataset=datasets["train"],
            val_dataset=datasets["val"],
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, datasets["train"]),
        )
        trainer.init_workers()
        trainer.fit()

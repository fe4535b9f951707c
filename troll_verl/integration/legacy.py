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
"""TROLL's task runner for verl's legacy trainer (``trainer.use_v1=false``): ``RayPPOTrainer`` with seeded requests.

TROLL itself needs nothing of the legacy trainer: with ``policy_loss.loss_mode=troll``, verl's own ``main_ppo
trainer.use_v1=false`` builds verl's actor worker, whose training worker is TROLL's
(:mod:`troll_verl.integration.workers`), and the old top-K stays on that worker. ``python -m troll_verl.main
trainer.use_v1=false`` runs :class:`TrollTaskRunner` instead, which adds:

- TROLL's validation before the workers start (the refusals name the setting to change);
- in bypass mode, the rollout set up to return its top-K (:func:`troll_verl.bypass.mode.prepare_bypass`), which
  reaches TROLL's training worker as the agent loop's per-sample columns; with verl's own ``main_ppo`` the rollout
  returns none, and the worker recomputes the old top-K in one no-grad pass (``troll/old_pass_recompute_s``);
- TROLL's critic worker class (the CPU platform's process group);
- with the seeded agent loop (:mod:`troll_verl.rollout.agent_loop`), the rollout requests' step and each answer's
  number, which verl's v1 agent loop passes and the legacy one does not (:class:`SeededRequests`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from troll_verl.rollout import SEEDED_AGENT_LOOP

from .checks import prepare_troll_run
from .ray_workers import swap_worker_classes

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

__all__ = ["TrollRayPPOTrainer", "TrollTaskRunner", "SeededRequests"]


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
    """verl's legacy ``RayPPOTrainer`` with TROLL's validation and the seeded requests (see the module docstring).

    With ``loss_mode`` other than ``troll`` it behaves exactly like verl's (the clip baselines), apart from the seeded
    requests where that agent loop is selected.
    """

    def __init__(self, config: DictConfig, *args, **kwargs):
        # before the workers and replicas are built; in bypass mode the rollout's top-K reaches TROLL's training
        # worker as a column per sample
        self.troll_settings = prepare_troll_run(config)  # None for other losses
        super().__init__(config, *args, **kwargs)

    def init_workers(self):
        """verl's workers (TROLL's classes, chosen by :class:`TrollTaskRunner`) and, with the seeded agent loop, the
        requests' step and answer numbers."""
        super().init_workers()
        agent_loop = OmegaConf.select(self.config, "actor_rollout_ref.rollout.agent.default_agent_loop")
        if agent_loop == SEEDED_AGENT_LOOP:
            self.async_rollout_manager = SeededRequests(self.async_rollout_manager)


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

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
"""TROLL's v1 trainer: verl's synchronous PPO trainer plus TROLL's pass flags.

Selected with ``trainer.v1.trainer_mode=troll`` (``python -m troll_verl.main`` presets it). It *is* verl's
``sync`` trainer (colocated rollout, synchronous updates) and runs with ``trainer_mode`` reset to ``sync``, so
every sync code path of verl behaves as usual. On top it

- validates the TROLL settings and refuses configurations TROLL cannot run, naming the setting to change, and
  selects TROLL's settings class where verl's stock policy-loss config is named;
- uses :class:`~troll_verl.workers.TrollActorRolloutRefWorker` (and :class:`~troll_verl.workers.
  TrollTrainingWorker` for the critic), which are verl's workers plus inert-by-default TROLL flags;
- on verl 0.9 as released, tags the old-log-prob pass (store the old top-K), keeps the flag off on the reference
  pass, and tags the update pass. Where verl has the policy-loss logits seam, verl's own trainer tags the passes
  (:func:`troll_verl.seam.seam_available`) and these overrides step aside.

With ``loss_mode`` other than ``troll`` it behaves exactly like verl's sync trainer (used for the clip baselines).
"""

from __future__ import annotations

import logging
import os

import ray
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from .config import troll_loss_enabled, use_troll_policy_loss_config, validate_troll_config
from .platform.cpu import cpu_platform_requested
from .seam import seam_available
from .workers import TROLL_OLD_PASS_KEY, TROLL_UPDATE_KEY, TrollActorRolloutRefWorker, TrollTrainingWorker

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

__all__ = ["TrollTrainer", "register_trainer", "TRAINER_NAME"]

# trainer.v1.trainer_mode that selects this trainer
TRAINER_NAME = "troll"

# Replay-buffer poll interval on the CPU platform (verl's default is 2 s).
CPU_REPLAY_POLL_S = 0.05


class TrollTrainer(PPOTrainerSync):
    """verl's sync PPO trainer with TROLL's pass flags (see the module docstring).

    Args:
        config: the full verl config (``ppo_trainer`` plus overrides).
    """

    def __init__(self, config: DictConfig):
        # NOTE: verl keys sync-vs-async behaviour off trainer.v1.trainer_mode; this trainer is the sync one.
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        self.troll_enabled = troll_loss_enabled(config)
        self.troll_settings = validate_troll_config(config) if self.troll_enabled else None
        if self.troll_enabled:
            use_troll_policy_loss_config(config)
        # TROLL's own pass flags, only where verl lacks the policy-loss logits seam
        self.troll_flags = self.troll_enabled and not seam_available()
        super().__init__(config)
        if cpu_platform_requested():
            # NOTE: verl's replay buffer polls the TransferQueue every 2 s, which dominates a CPU step (~0.7 s).
            self.replay_buffer.poll_interval = CPU_REPLAY_POLL_S

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        # verl's worker classes → TROLL's subclasses (identical unless TROLL's flags are set).
        swap = {ActorRolloutRefWorker: TrollActorRolloutRefWorker, TrainingWorker: TrollTrainingWorker}
        for role, remote_cls in list(self.role_worker_mapping.items()):
            original = getattr(remote_cls, "__ray_actor_class__", remote_cls)
            if original in swap:
                self.role_worker_mapping[role] = ray.remote(swap[original])

    def _compute_old_log_prob(self, batch, metrics: dict):
        if not self.troll_flags:
            return super()._compute_old_log_prob(batch, metrics)
        batch.extra_info[TROLL_OLD_PASS_KEY] = True
        try:
            out = super()._compute_old_log_prob(batch, metrics)
        finally:
            batch.extra_info[TROLL_OLD_PASS_KEY] = False
        if out is not None and out is not batch:
            out.extra_info[TROLL_OLD_PASS_KEY] = False
        return out

    def _compute_ref_log_prob(self, batch, metrics: dict):
        # The reference pass (also LoRA's reference-through-actor pass) must never store TROLL's old top-K.
        if self.troll_flags:
            batch.extra_info[TROLL_OLD_PASS_KEY] = False
        return super()._compute_ref_log_prob(batch, metrics)

    def _update_actor(self, batch, metrics: dict):
        if not self.troll_flags:
            return super()._update_actor(batch, metrics)
        batch.extra_info[TROLL_UPDATE_KEY] = True
        try:
            return super()._update_actor(batch, metrics)
        finally:
            batch.extra_info[TROLL_UPDATE_KEY] = False


def register_trainer() -> None:
    """Register :class:`TrollTrainer` as verl's v1 trainer ``troll`` (refusing a name taken by another class)."""
    from verl.trainer.ppo.v1.trainer_base import register_trainer as _register

    existing = TRAINER_REGISTRY.get(TRAINER_NAME)
    if existing is not None and existing is not TrollTrainer:
        raise RuntimeError(
            f"verl's trainer registry already has {TRAINER_NAME!r} ({existing.__module__}.{existing.__qualname__}); "
            "uninstall the other plugin."
        )
    _register(TRAINER_NAME)(TrollTrainer)


register_trainer()

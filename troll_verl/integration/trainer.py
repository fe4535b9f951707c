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
"""TROLL's v1 trainers: verl's ``sync``, ``colocate_async`` and ``separate_async`` trainers plus bypass mode.

TROLL itself needs no trainer: ``actor_rollout_ref.actor.policy_loss.loss_mode=troll`` alone runs it on every verl
trainer, through TROLL's actor training worker (:mod:`troll_verl.integration.workers`). These trainers add what
the worker cannot do by itself; each is :class:`TrollTrainerMixin` on one of verl's trainers, selected with
``trainer.v1.trainer_mode``:

===========================  ================================  ==============================================
``trainer_mode``             verl's trainer                    notes
===========================  ================================  ==============================================
``troll`` (``troll_sync``)   ``PPOTrainerSync``                colocated rollout, synchronous updates
``troll_colocate_async``     ``PPOTrainerColocateAsync``       colocated rollout, partial rollouts, warm-up
                                                               batches (``trainer.v1.colocate_async.*``)
``troll_separate_async``     ``PPOTrainerSeparateAsync``       standalone rollout pool; not yet run end to end
===========================  ================================  ==============================================

``python -m troll_verl.main`` presets ``troll``. Each runs with ``trainer_mode`` reset to verl's own mode name, so
every code path of that verl trainer (and its ``trainer.v1.<mode>.*`` settings) behaves as usual. On top, the mixin

- validates the TROLL settings before the workers start and refuses configurations TROLL cannot run, naming the
  setting to change, and selects TROLL's settings class where verl's stock policy-loss config is named;
- swaps verl's critic and ``separate_async`` worker classes for TROLL's (the CPU platform's process group, π_old's
  copy: :mod:`troll_verl.integration.ray_workers`);
- in bypass mode, sets the vLLM rollout up to return its top-K (which TROLL's actor training worker turns into the
  old fields) and keeps it across the asynchronous trainers' resumed requests (:mod:`troll_verl.bypass`).

With ``loss_mode`` other than ``troll`` each behaves exactly like the verl trainer it extends (the clip baselines).
"""

from __future__ import annotations

import logging
import os
from typing import ClassVar

from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

from troll_verl.bypass.mode import bypass_requested
from troll_verl.bypass.vllm_topk import TopKFullyAsyncLLMServerClient
from troll_verl.compat import rebuild_llm_client
from troll_verl.platform.cpu import cpu_platform_requested

from . import seam
from .checks import prepare_troll_run, troll_trainer_mode
from .ray_workers import swap_worker_classes

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

__all__ = [
    "TrollTrainerMixin",
    "TrollTrainer",
    "TrollTrainerColocateAsync",
    "TrollTrainerSeparateAsync",
    "TROLL_TRAINERS",
]

# Replay-buffer poll interval on the CPU platform (verl's default is 2 s).
CPU_REPLAY_POLL_S = 0.05


class TrollTrainerMixin:
    """TROLL's additions to a verl v1 trainer (see the module docstring); put it first in the bases.

    Args:
        config: the full verl config (``ppo_trainer`` plus overrides).
    """

    # verl's trainer_mode this trainer runs as (its code paths and trainer.v1.<mode> settings)
    troll_base_mode: ClassVar[str]

    def __init__(self, config: DictConfig):
        self.troll_settings = prepare_troll_run(config)  # None for other losses
        # bypass mode: the old distribution is the vLLM rollout's top-K and no old-log-prob pass runs (bypass/mode.py)
        self.troll_bypass = self.troll_settings is not None and bypass_requested(config)
        # NOTE: verl keys its sync-vs-async behaviour off trainer.v1.trainer_mode; run as verl's own mode.
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.troll_base_mode
        if self.troll_bypass and seam.route() == seam.SEAM:
            # NOTE: the mismatch metric lives in TROLL's loss function, which verl's own ppo_loss replaces on the seam
            logger.warning(
                "TROLL bypass mode on a verl with the policy-loss logits seam: troll/mismatch_kl and "
                "troll/mismatch_projected_frac are not reported on this route (TROLL's loss function reports them on "
                "stock verl), and this combination has not run end to end; check troll/projected_frac on the first "
                "steps."
            )
        super().__init__(config)
        if cpu_platform_requested():
            # NOTE: verl's replay buffer polls the TransferQueue every 2 s, which dominates a CPU step (~0.7 s).
            self.replay_buffer.poll_interval = CPU_REPLAY_POLL_S

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        swap_worker_classes(self.role_worker_mapping)

    def get_llm_client(self):
        """verl's client; in bypass mode on the asynchronous trainers, rebuilt as the client that keeps the top-K."""
        client = super().get_llm_client()
        if self.troll_bypass and type(client) is FullyAsyncLLMServerClient:
            # NOTE: verl's abort-and-resume client (asynchronous trainers) drops the server's extra fields; the same
            # client (config and load balancer) as TROLL's subclass keeps the top-K.
            client = rebuild_llm_client(client, TopKFullyAsyncLLMServerClient)
        return client


class TrollTrainer(TrollTrainerMixin, PPOTrainerSync):
    """verl's sync PPO trainer with TROLL (``trainer.v1.trainer_mode=troll`` or ``troll_sync``)."""

    troll_base_mode = "sync"


class TrollTrainerColocateAsync(TrollTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated asynchronous PPO trainer with TROLL (``trainer.v1.trainer_mode=troll_colocate_async``)."""

    troll_base_mode = "colocate_async"


class TrollTrainerSeparateAsync(TrollTrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate-rollout asynchronous PPO trainer with TROLL (``trainer.v1.trainer_mode=troll_separate_async``).

    NOTE: verl's checkpoint engines for a standalone rollout pool need NCCL-class backends, so this mode has not run
    end to end here (CPU only); the dry run validates its config.
    """

    troll_base_mode = "separate_async"

    def __init__(self, config: DictConfig):
        super().__init__(config)  # validates first
        if self.troll_settings is not None:
            logger.warning(
                "TROLL with trainer.v1.trainer_mode=troll_separate_async: verl's separate-rollout trainer has not run "
                "end to end with TROLL yet (its checkpoint engines need NCCL-class backends, which CPU testing "
                "lacks); TROLL's old top-K comes from verl's old-log-prob pass on the restored pi_old weights. Check "
                "troll/old_pass_reused_frac (1.0: no extra pass) and troll/* metrics on your first steps."
            )


# trainer.v1.trainer_mode -> TROLL trainer ("troll" and its alias "troll_sync": verl's sync trainer)
TROLL_TRAINERS = {
    troll_trainer_mode(cls.troll_base_mode): cls
    for cls in (TrollTrainer, TrollTrainerColocateAsync, TrollTrainerSeparateAsync)
}
TROLL_TRAINERS["troll_sync"] = TrollTrainer

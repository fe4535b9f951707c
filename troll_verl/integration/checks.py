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
"""Whether a verl config can run TROLL: the one predicate for "this run uses TROLL" (:func:`uses_troll`), TROLL's
trainer modes, and :func:`validate_troll_config`, which refuses, naming the setting to change, every configuration
TROLL cannot run. Importing this module imports no verl (the plugin reads :data:`POLICY_LOSS_NAME` from it at every
``import verl``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import TrollPolicyLossConfig

__all__ = [
    "POLICY_LOSS_NAME",
    "uses_troll",
    "troll_requested",
    "validate_troll_config",
    "prepare_troll_run",
    "VERL_TRAINER_MODES",
    "TROLL_TRAINER_MODES",
    "troll_trainer_mode",
]

logger = logging.getLogger(__name__)

# the policy loss TROLL registers with verl (actor_rollout_ref.actor.policy_loss.loss_mode)
POLICY_LOSS_NAME = "troll"


def uses_troll(policy_loss: Any) -> bool:
    """Whether a policy-loss config (``actor_rollout_ref.actor.policy_loss``, as a DictConfig or verl's dataclass)
    selects TROLL's loss. The one test of "this run uses TROLL"; TROLL's trainers, workers and checks all ask it."""
    return policy_loss is not None and getattr(policy_loss, "loss_mode", None) == POLICY_LOSS_NAME


def _policy_loss(config) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss")


# verl's v1 trainer modes (trainer.v1.trainer_mode) that TROLL extends
VERL_TRAINER_MODES = ("sync", "colocate_async", "separate_async")


def troll_trainer_mode(base_mode: str) -> str:
    """The ``trainer.v1.trainer_mode`` that runs TROLL on verl's ``base_mode`` trainer (``sync`` -> ``troll``)."""
    return "troll" if base_mode == "sync" else f"troll_{base_mode}"


# every trainer.v1.trainer_mode that selects a TROLL trainer
TROLL_TRAINER_MODES = (*(troll_trainer_mode(mode) for mode in VERL_TRAINER_MODES), "troll_sync")


def troll_requested(config) -> bool:
    """True when a full verl config asks for TROLL: its loss (:func:`uses_troll`) or one of TROLL's trainers."""
    from omegaconf import OmegaConf

    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    return uses_troll(_policy_loss(config)) or mode in TROLL_TRAINER_MODES


def validate_troll_config(config) -> TrollPolicyLossConfig:
    """Check that a full verl config can run TROLL; return the validated TROLL settings.

    Raises:
        ValueError: naming the setting to change, for every configuration TROLL cannot run.
    """
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from .config import troll_settings

    actor = config.actor_rollout_ref.actor
    from troll_verl.bypass.mode import bypass_requested, check_bypass_config
    from troll_verl.compat import has_v1_task_runner

    from . import seam

    if not OmegaConf.select(config, "trainer.use_v1", default=True):
        # verl's legacy trainer: verl's actor worker runs TROLL's training worker, as on the v1 trainers
        if seam.route() == seam.SEAM:
            raise ValueError(
                "TROLL on the legacy trainer (trainer.use_v1=false) has not run on a verl with the policy-loss logits "
                "seam (upstream/): there verl's own RayPPOTrainer tags the passes. Set trainer.use_v1=true."
            )
    else:
        if not has_v1_task_runner():
            raise ValueError(
                "This verl runs only its legacy trainer (verl.trainer.main_ppo has no v1 task runner), and "
                "trainer.use_v1=true asks for the v1 one. Set trainer.use_v1=false."
            )
        mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync")
        if str(mode).startswith("troll") and mode not in TROLL_TRAINER_MODES:
            raise ValueError(
                f"trainer.v1.trainer_mode={mode} is not one of TROLL's trainers; use one of "
                f"{list(TROLL_TRAINER_MODES)}."
            )
    if OmegaConf.select(config, "actor_rollout_ref.model.use_fused_kernels", default=False):
        raise ValueError(
            "actor_rollout_ref.model.use_fused_kernels=true never materialises the logits TROLL needs for its "
            "top-K supports. Set actor_rollout_ref.model.use_fused_kernels=false."
        )
    from troll_verl.core.losses import BACKENDS  # the one table of strategies TROLL has a backend for

    if actor.strategy not in BACKENDS:
        raise ValueError(
            f"TROLL's engine path supports actor_rollout_ref.actor.strategy in {list(BACKENDS)}, got "
            f"{actor.strategy!r}. Set actor_rollout_ref.actor.strategy=fsdp2 (or megatron)."
        )
    if actor.strategy == "megatron":
        logger.warning(
            "TROLL on the Megatron engine: the vocab-parallel and context-parallel code is tested against the "
            "single-rank result (megatron-core parallel state, gloo, CPU), but this release has not yet been run on "
            "verl's full Megatron engine; check troll/* metrics on your first steps."
        )
    for engine_key in ("fsdp_config", "megatron"):  # the engine config each strategy reads
        if OmegaConf.select(config, f"actor_rollout_ref.actor.{engine_key}.pad_to_length", default=False):
            raise ValueError(
                f"actor_rollout_ref.actor.{engine_key}.pad_to_length=true pads packed sequences to a static length "
                "that TROLL's response-row mapping does not know about. Set actor_rollout_ref.actor.pad_to_length="
                "false (and actor_rollout_ref.actor.megatron.pad_to_length=false on Megatron)."
            )
    if OmegaConf.select(config, "distillation.enabled", default=False):
        raise ValueError(
            "TROLL uses verl's top-K logits hook, which distillation also uses. Set distillation.enabled=false."
        )
    settings = troll_settings(SimpleNamespace(policy_loss=omega_conf_to_dataclass(actor.policy_loss)))
    # 0 (unset): TROLL's trainers set it to topk (prepare_troll_run)
    old_topk = OmegaConf.select(config, "actor_rollout_ref.actor.calculate_old_topk", default=0) or 0
    if seam.route() == seam.SEAM and 0 < old_topk < settings.topk:
        raise ValueError(
            f"On a verl with the policy-loss logits seam TROLL reads the old policy's top-K that verl's old-log-prob "
            f"pass stores, and actor_rollout_ref.actor.calculate_old_topk={old_topk} stores fewer than "
            f"policy_loss.troll.topk={settings.topk}. Set actor_rollout_ref.actor.calculate_old_topk={settings.topk} "
            "(or leave it 0: TROLL's trainer then sets it to topk)."
        )
    if settings.ratio_level == "sequence" and actor.loss_agg_mode != "seq-mean-token-mean":
        logger.warning(
            "TROLL with ratio_level=sequence (GSPO) is usually run with actor_rollout_ref.actor.loss_agg_mode="
            "seq-mean-token-mean; got %s.",
            actor.loss_agg_mode,
        )
    if bypass_requested(config):
        check_bypass_config(config, settings)
    return settings


def prepare_troll_run(config) -> TrollPolicyLossConfig | None:
    """What TROLL's trainers (v1 and legacy) do to a full verl config before the workers start, in place.

    None where the run does not use TROLL. Else: validate (:func:`validate_troll_config`, refusals naming the fix),
    select TROLL's settings class where verl's stock one is named, on a verl with the policy-loss logits seam have
    verl's old-log-prob pass store the old top-K (``actor.calculate_old_topk``, where unset), and in bypass mode set
    the rollout up to return its top-K (:func:`troll_verl.bypass.mode.prepare_bypass`).

    Returns:
        the validated TROLL settings, or None.
    """
    if not uses_troll(config.actor_rollout_ref.actor.policy_loss):
        return None
    from omegaconf import open_dict

    from troll_verl.bypass.mode import bypass_requested, prepare_bypass

    from . import seam
    from .config import use_troll_policy_loss_config

    settings = validate_troll_config(config)
    use_troll_policy_loss_config(config)
    if seam.route() == seam.SEAM and not config.actor_rollout_ref.actor.get("calculate_old_topk", 0):
        # verl's old-log-prob pass stores the old top-K that TROLL's update hook reads (upstream C)
        with open_dict(config):
            config.actor_rollout_ref.actor.calculate_old_topk = settings.topk
    if bypass_requested(config):
        # the rollout returns its top-K, which TROLL's actor training worker turns into the old distribution
        prepare_bypass(config, settings)
    return settings

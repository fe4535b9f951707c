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
"""TROLL's policy-loss configuration for verl 0.9: a drop-in :class:`verl.workers.config.PolicyLossConfig` subclass.

Select it from the command line with ``actor_rollout_ref.actor.policy_loss._target_=troll_verl.integration.config.
TrollPolicyLossConfig`` to set any of its keys; with only ``loss_mode=troll`` the paper's defaults are used
(see :func:`troll_settings`). The TROLL keys and their checks are :class:`troll_verl.core.config.TrollConfig`'s; here
they sit flat in ``policy_loss`` (``policy_loss.kl_bound``), and ``policy_loss.troll`` is the config itself, the
place TROLL's code reads them from (in verl with TROLL built in they are the nested ``policy_loss.troll``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, ClassVar

from verl.workers.config import PolicyLossConfig

from troll_verl.core.config import VALUE_DTYPES, TrollConfig

__all__ = [
    "TrollPolicyLossConfig",
    "troll_settings",
    "troll_loss_enabled",
    "validate_troll_config",
    "use_troll_policy_loss_config",
    "VALUE_DTYPES",
    "POLICY_LOSS_CONFIG_TARGET",
    "VERL_TRAINER_MODES",
    "TROLL_TRAINER_MODES",
    "troll_trainer_mode",
]

logger = logging.getLogger(__name__)
# Actor strategies TROLL's engine path supports.
_SUPPORTED_STRATEGIES = ("fsdp", "fsdp2", "megatron")

# verl's v1 trainer modes (trainer.v1.trainer_mode) that TROLL extends
VERL_TRAINER_MODES = ("sync", "colocate_async", "separate_async")


def troll_trainer_mode(base_mode: str) -> str:
    """The ``trainer.v1.trainer_mode`` that runs TROLL on verl's ``base_mode`` trainer (``sync`` -> ``troll``)."""
    return "troll" if base_mode == "sync" else f"troll_{base_mode}"


# every trainer.v1.trainer_mode that selects a TROLL trainer
TROLL_TRAINER_MODES = (*(troll_trainer_mode(mode) for mode in VERL_TRAINER_MODES), "troll_sync")

# ``_target_`` of this module's settings class, and of verl's stock policy-loss config
POLICY_LOSS_CONFIG_TARGET = "troll_verl.config.TrollPolicyLossConfig"
_VERL_POLICY_LOSS_TARGET = "verl.workers.config.PolicyLossConfig"


@dataclass
class TrollPolicyLossConfig(PolicyLossConfig, TrollConfig):
    """verl's policy-loss settings plus TROLL's (:class:`~troll_verl.core.config.TrollConfig`), all flat under
    ``actor.policy_loss``; every TROLL value is validated on construction, errors name the key and the fix.

    Args:
        loss_mode (str): registered policy-loss name; ``"troll"``.
        (the TROLL keys: see :class:`~troll_verl.core.config.TrollConfig`)
    """

    key_prefix: ClassVar[str] = "actor_rollout_ref.actor.policy_loss"

    loss_mode: str = "troll"

    @property
    def troll(self) -> TrollConfig:
        """TROLL's settings: this config itself (verl with TROLL built in nests them as ``policy_loss.troll``)."""
        return self


def troll_settings(actor_config: Any) -> TrollPolicyLossConfig:
    """The TROLL settings of an actor config.

    Args:
        actor_config: a verl ``ActorConfig`` (or anything with a ``policy_loss`` attribute).

    Returns:
        ``actor_config.policy_loss`` if it already is a :class:`TrollPolicyLossConfig`; for a plain
        ``PolicyLossConfig`` (only ``loss_mode=troll`` was set) a :class:`TrollPolicyLossConfig` with the
        paper's defaults, carrying over the shared fields.
    """
    policy_loss = getattr(actor_config, "policy_loss", None)
    if isinstance(policy_loss, TrollPolicyLossConfig):
        return policy_loss
    if policy_loss is None:
        raise ValueError("The actor config has no policy_loss section; TROLL reads its settings from it.")
    shared = {f.name for f in fields(PolicyLossConfig)} - {"_target_"}
    return TrollPolicyLossConfig(**{name: policy_loss[name] for name in shared if name in policy_loss})


def use_troll_policy_loss_config(config) -> bool:
    """Select :class:`TrollPolicyLossConfig` where a full verl config still names verl's stock policy-loss config.

    verl's workers then build the actor config with TROLL's settings (the paper's defaults for keys not set), which
    is where TROLL's code reads them (``policy_loss.troll``). Returns True if ``_target_`` was changed.
    """
    from omegaconf import OmegaConf, open_dict

    node = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss")
    if node is None or node.get("_target_", _VERL_POLICY_LOSS_TARGET) != _VERL_POLICY_LOSS_TARGET:
        return False
    with open_dict(node):
        node._target_ = POLICY_LOSS_CONFIG_TARGET
    return True


def troll_loss_enabled(config) -> bool:
    """True when ``actor_rollout_ref.actor.policy_loss.loss_mode`` is ``troll`` (``config``: a full verl config)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode") == "troll"


def validate_troll_config(config) -> TrollPolicyLossConfig:
    """Check that a full verl config can run TROLL; return the validated TROLL settings.

    Raises:
        ValueError: naming the setting to change, for every configuration TROLL cannot run.
    """
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    actor = config.actor_rollout_ref.actor
    if not OmegaConf.select(config, "trainer.use_v1", default=True):
        raise ValueError(
            "TROLL runs on verl's v1 trainer only; set trainer.use_v1=true. verl's legacy trainer "
            "(trainer.use_v1=false) cannot carry TROLL without patching verl or a second entry point: "
            "main_ppo_v0.TaskRunner hard-codes ActorRolloutRefWorker and RayPPOTrainer (no registry, no _target_), "
            "and RayPPOTrainer._compute_old_log_prob keeps only fixed outputs of the old-log-prob pass "
            "(old_log_probs, entropys, routed_experts, sum_pi_squared), so the old top-K TROLL stores there would "
            "be dropped. Not implemented: TROLL's own TaskRunner and a RayPPOTrainer subclass re-implementing "
            "_compute_old_log_prob; verl with upstream PR C (upstream/README.md) carries the old top-K itself."
        )
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync")
    if str(mode).startswith("troll") and mode not in TROLL_TRAINER_MODES:
        raise ValueError(
            f"trainer.v1.trainer_mode={mode} is not one of TROLL's trainers; use one of {list(TROLL_TRAINER_MODES)}."
        )
    if mode in VERL_TRAINER_MODES:
        from .seam import seam_available

        if not seam_available():
            raise ValueError(
                f"trainer.v1.trainer_mode={mode} is verl's own trainer, which on this verl does not tag the passes "
                f"TROLL extends (old-log-prob and update). Set trainer.v1.trainer_mode={troll_trainer_mode(mode)}: "
                f"verl's {mode} trainer with TROLL."
            )
    if OmegaConf.select(config, "actor_rollout_ref.model.use_fused_kernels", default=False):
        raise ValueError(
            "actor_rollout_ref.model.use_fused_kernels=true never materialises the logits TROLL needs for its "
            "top-K supports. Set actor_rollout_ref.model.use_fused_kernels=false."
        )
    if actor.strategy not in _SUPPORTED_STRATEGIES:
        raise ValueError(
            f"TROLL's engine path supports actor_rollout_ref.actor.strategy in {list(_SUPPORTED_STRATEGIES)}, got "
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
    if settings.ratio_level == "sequence" and actor.loss_agg_mode != "seq-mean-token-mean":
        logger.warning(
            "TROLL with ratio_level=sequence (GSPO) is usually run with actor_rollout_ref.actor.loss_agg_mode="
            "seq-mean-token-mean; got %s.",
            actor.loss_agg_mode,
        )
    from troll_verl.bypass.mode import bypass_requested, check_bypass_config

    if bypass_requested(config):
        check_bypass_config(config, settings)
    return settings

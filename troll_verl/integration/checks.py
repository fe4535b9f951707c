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
trainer modes, and the refusals, each a small rule that raises ``ValueError`` naming the setting to change:

- actor-level rules (:data:`ACTOR_RULES`, :func:`check_actor`): what the actor's own config decides (fused kernels,
  strategy, static padding, TROLL's values, diagnostics). ``python -m troll_verl.main`` runs them before Ray, and
  TROLL's actor training worker runs them again before any pass, so verl's own ``main_ppo`` with the one override
  refuses the same settings; :func:`check_loss_closure` refuses, by name, a loss closure of verl's other than
  ``ppo_loss`` (distillation's);
- run-level rules (:data:`RUN_RULES`): what needs the whole config (the trainer, distillation), and bypass mode's
  rollout (:func:`troll_verl.bypass.mode.check_bypass_config`); ``troll_verl.main`` runs them before Ray.

:func:`validate_troll_config` runs them all. Importing this module imports no verl (the plugin reads
:data:`POLICY_LOSS_NAME` from it at every ``import verl``).
"""

from __future__ import annotations

import logging
from dataclasses import is_dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import TrollPolicyLossConfig

__all__ = [
    "POLICY_LOSS_NAME",
    "uses_troll",
    "troll_requested",
    "validate_troll_config",
    "check_actor",
    "check_loss_closure",
    "ACTOR_RULES",
    "RUN_RULES",
    "prepare_troll_run",
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


def troll_requested(config) -> bool:
    """True when a full verl config asks for TROLL's loss (:func:`uses_troll`)."""
    return uses_troll(_policy_loss(config))


def _value(node: Any, dotted: str, default: Any = None) -> Any:
    """``node.<dotted>`` on a Hydra node or on verl's config dataclasses alike; ``default`` where any part is unset."""
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


# ---------------------------------------------------------------------------------------------------------------------
# actor-level rules: what TROLL's actor training worker can see itself (verl's ActorConfig and the model's config).
# troll_verl.main runs them before Ray; the worker runs them again before any pass, so verl's own main_ppo refuses the
# same settings (integration/workers.py). Each gets (actor, model, settings) and raises ValueError naming the fix.
# ---------------------------------------------------------------------------------------------------------------------
def _rule_fused_kernels(actor, model, settings) -> None:
    if _value(model, "use_fused_kernels", False):
        raise ValueError(
            "actor_rollout_ref.model.use_fused_kernels=true never materialises the logits TROLL needs for its "
            "top-K supports. Set actor_rollout_ref.model.use_fused_kernels=false."
        )


def _rule_strategy(actor, model, settings) -> None:
    from troll_verl.core.losses import BACKENDS  # the one table of strategies TROLL has a backend for

    strategy = _value(actor, "strategy")
    if strategy not in BACKENDS:
        raise ValueError(
            f"TROLL's engine path supports actor_rollout_ref.actor.strategy in {list(BACKENDS)}, got {strategy!r}. "
            "Set actor_rollout_ref.actor.strategy=fsdp2 (or megatron)."
        )
    if strategy == "megatron":
        logger.warning(
            "TROLL on the Megatron engine: the vocab-parallel and context-parallel code is tested against the "
            "single-rank result (megatron-core parallel state, gloo, CPU), but this release has not yet been run on "
            "verl's full Megatron engine; check troll/* metrics on your first steps."
        )


def _rule_pad_to_length(actor, model, settings) -> None:
    # the actor's key, and the engine configs each strategy reads it from
    for key in ("pad_to_length", "fsdp_config.pad_to_length", "megatron.pad_to_length"):
        if _value(actor, key, False):
            raise ValueError(
                f"actor_rollout_ref.actor.{key}=true pads packed sequences to a static length that TROLL's "
                "response-row mapping does not know about. Set actor_rollout_ref.actor.pad_to_length=false (and "
                "actor_rollout_ref.actor.megatron.pad_to_length=false on Megatron)."
            )


def _rule_seam_old_topk(actor, model, settings) -> None:
    from . import seam

    # 0 (unset): troll_verl.main sets it to topk (prepare_troll_run)
    old_topk = _value(actor, "calculate_old_topk", 0) or 0
    if seam.route() == seam.SEAM and 0 < old_topk < settings.topk:
        raise ValueError(
            f"On a verl with the policy-loss logits seam TROLL reads the old policy's top-K that verl's old-log-prob "
            f"pass stores, and actor_rollout_ref.actor.calculate_old_topk={old_topk} stores fewer than "
            f"policy_loss.troll.topk={settings.topk}. Set actor_rollout_ref.actor.calculate_old_topk={settings.topk} "
            "(or leave it 0: troll_verl.main then sets it to topk)."
        )


def _rule_sequence_ratio(actor, model, settings) -> None:
    agg = _value(actor, "loss_agg_mode")
    if settings.ratio_level == "sequence" and agg != "seq-mean-token-mean":
        logger.warning(
            "TROLL with ratio_level=sequence (GSPO) is usually run with actor_rollout_ref.actor.loss_agg_mode="
            "seq-mean-token-mean; got %s.",
            agg,
        )


def _rule_diagnostics(actor, model, settings) -> None:
    from . import seam

    if not getattr(settings, "diagnostics", False):
        return
    strategy = _value(actor, "strategy")
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(
            "actor_rollout_ref.actor.policy_loss.diagnostics=true measures the gradient on verl's FSDP engine; "
            f"actor_rollout_ref.actor.strategy is {strategy!r}. Set policy_loss.diagnostics=false (or strategy=fsdp2)."
        )
    if seam.route() == seam.SEAM:
        raise ValueError(
            "actor_rollout_ref.actor.policy_loss.diagnostics=true runs through troll-verl's loss function, which a "
            "verl with the policy-loss logits seam does not call. Set policy_loss.diagnostics=false."
        )


ACTOR_RULES = (
    _rule_fused_kernels,
    _rule_strategy,
    _rule_pad_to_length,
    _rule_seam_old_topk,
    _rule_sequence_ratio,
    _rule_diagnostics,
)


def check_actor(actor: Any, model: Any) -> TrollPolicyLossConfig:
    """Run every actor-level rule (:data:`ACTOR_RULES`) on an actor's config; return its validated TROLL settings.

    Args:
        actor: ``actor_rollout_ref.actor``, as a Hydra node (before Ray) or verl's ``ActorConfig`` (in the worker).
        model: ``actor_rollout_ref.model``, likewise (verl's ``HFModelConfig`` in the worker).

    Raises:
        ValueError: naming the setting to change (an invalid TROLL value names its key).
    """
    from types import SimpleNamespace

    from verl.utils.config import omega_conf_to_dataclass

    from .config import troll_settings

    policy_loss = actor.policy_loss
    if not is_dataclass(policy_loss):
        policy_loss = omega_conf_to_dataclass(policy_loss)
    settings = troll_settings(SimpleNamespace(policy_loss=policy_loss))
    for rule in ACTOR_RULES:
        rule(actor, model, settings)
    return settings


def check_loss_closure(closure_name: str | None) -> None:
    """Refuse a loss closure other than verl's ``ppo_loss`` under ``loss_mode=troll`` (TROLL's worker asks, knowing the
    run uses TROLL): verl swaps in another where a feature replaces the policy loss, naming it."""
    if closure_name == "distillation_ppo_loss":
        raise ValueError(
            "verl hands the actor its distillation loss (distillation.enabled=true), and TROLL uses the same top-K "
            "logits hook as distillation. Set distillation.enabled=false."
        )
    if closure_name != "ppo_loss":
        raise ValueError(
            f"loss_mode=troll runs inside verl's ppo_loss, but verl handed the actor another loss ({closure_name}). "
            "Use verl's actor loss (no feature that replaces it) with TROLL."
        )


# ---------------------------------------------------------------------------------------------------------------------
# run-level rules: they need the whole config, so troll_verl.main runs them before Ray (only there)
# ---------------------------------------------------------------------------------------------------------------------
def _rule_trainer(config) -> None:
    from omegaconf import OmegaConf

    from troll_verl.compat import has_v1_task_runner

    from . import seam

    if not OmegaConf.select(config, "trainer.use_v1", default=True):
        # verl's legacy trainer: verl's actor worker runs TROLL's training worker, as on the v1 trainers
        if seam.route() == seam.SEAM:
            raise ValueError(
                "TROLL on the legacy trainer (trainer.use_v1=false) has not run on a verl with the policy-loss logits "
                "seam (upstream/): there verl's own RayPPOTrainer tags the passes. Set trainer.use_v1=true."
            )
        return
    if not has_v1_task_runner():
        raise ValueError(
            "This verl runs only its legacy trainer (verl.trainer.main_ppo has no v1 task runner), and "
            "trainer.use_v1=true asks for the v1 one. Set trainer.use_v1=false."
        )
    mode = str(OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync"))
    if mode.startswith("troll"):
        # troll-verl's trainer subclasses are gone: verl's own trainers run TROLL through its actor worker
        base = mode.removeprefix("troll").removeprefix("_") or "sync"
        raise ValueError(
            f"trainer.v1.trainer_mode={mode} was troll-verl's trainer, which is gone: verl's own trainers run TROLL "
            f"through its actor worker (loss_mode=troll). Set trainer.v1.trainer_mode={base}."
        )


def _rule_separate_async(config) -> None:
    from omegaconf import OmegaConf

    from troll_verl.platform.cpu import cpu_platform_requested

    if OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync") != "separate_async":
        return
    if cpu_platform_requested():
        # NOTE: verl's separate_async saves pi_old with fsdp2_sharded_save_to_cpu (verl/utils/fsdp_utils.py), whose
        # .cpu() returns the live storage of parameters already on the CPU: pi_old would follow every update
        raise ValueError(
            "trainer.v1.trainer_mode=separate_async on the CPU platform: verl saves pi_old with .cpu(), which aliases "
            "parameters that already live on the CPU (verl/utils/fsdp_utils.py, fsdp2_sharded_save_to_cpu), and its "
            "checkpoint engines need NCCL-class backends. Use trainer.v1.trainer_mode=colocate_async on the CPU."
        )
    offload = OmegaConf.select(config, "actor_rollout_ref.actor.fsdp_config.param_offload", default=False)
    sync_step = OmegaConf.select(config, "trainer.v1.separate_async.parameter_sync_step", default=1) or 1
    strategy = OmegaConf.select(config, "actor_rollout_ref.actor.strategy", default="fsdp")
    if offload and int(sync_step) > 1 and strategy != "fsdp":
        # NOTE: the same aliasing on a GPU: offloaded parameters live on the CPU between calls, so the saved pi_old of
        # each local step aliases them and restoring pi_old overwrites the step's update, for clip as for TROLL
        raise ValueError(
            "trainer.v1.trainer_mode=separate_async with actor_rollout_ref.actor.fsdp_config.param_offload=true and "
            f"trainer.v1.separate_async.parameter_sync_step={sync_step} on {strategy}: verl's "
            "fsdp2_sharded_save_to_cpu (verl/utils/fsdp_utils.py) keeps .cpu() of parameters that offload already put "
            "on the CPU, so restoring pi_old overwrites every local step's update. Set "
            "actor_rollout_ref.actor.fsdp_config.param_offload=false (on a dedicated trainer pool it only costs time) "
            "or trainer.v1.separate_async.parameter_sync_step=1."
        )


def _rule_distillation(config) -> None:
    from omegaconf import OmegaConf

    if OmegaConf.select(config, "distillation.enabled", default=False):
        check_loss_closure("distillation_ppo_loss")


RUN_RULES = (_rule_trainer, _rule_separate_async, _rule_distillation)


def validate_troll_config(config) -> TrollPolicyLossConfig:
    """Check that a full verl config can run TROLL: every run-level rule (:data:`RUN_RULES`), every actor-level one
    (:func:`check_actor`) and, in bypass mode, the rollout's (:func:`troll_verl.bypass.mode.check_bypass_config`).

    Returns:
        The validated TROLL settings.

    Raises:
        ValueError: naming the setting to change, for every configuration TROLL cannot run.
    """
    from troll_verl.bypass.mode import bypass_requested, check_bypass_config

    for rule in RUN_RULES:
        rule(config)
    settings = check_actor(config.actor_rollout_ref.actor, config.actor_rollout_ref.model)
    if bypass_requested(config):
        check_bypass_config(config, settings)
    return settings


def prepare_troll_run(config) -> TrollPolicyLossConfig | None:
    """What ``python -m troll_verl.main`` does to a full verl config before Ray starts, in place.

    None where the run does not use TROLL. Else: validate (:func:`validate_troll_config`, refusals naming the fix),
    select TROLL's settings class where verl's stock one is named, on a verl with the policy-loss logits seam have
    verl's old-log-prob pass store the old top-K (``actor.calculate_old_topk``, where unset), and in bypass mode set
    the rollout up to return its top-K (:func:`troll_verl.bypass.mode.prepare_bypass`). Every change goes through
    verl's own config keys, so the run is verl's ``main_ppo`` on that config.

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
        if seam.route() == seam.SEAM:
            # NOTE: the mismatch metric lives in TROLL's loss function, which verl's own ppo_loss replaces on the seam
            logger.warning(
                "TROLL bypass mode on a verl with the policy-loss logits seam: troll/mismatch_kl and "
                "troll/mismatch_projected_frac are not reported on this route (TROLL's loss function reports them on "
                "stock verl), and this combination has not run end to end; check troll/projected_frac on the first "
                "steps."
            )
    return settings

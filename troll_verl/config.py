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
"""TROLL's policy-loss configuration, a drop-in :class:`verl.workers.config.PolicyLossConfig` subclass.

Select it from the command line with ``actor_rollout_ref.actor.policy_loss._target_=troll_verl.config.
TrollPolicyLossConfig`` to set any of its keys; with only ``loss_mode=troll`` the paper's defaults are used
(see :func:`troll_settings`). Defaults follow TROLL (arXiv:2510.03817) §6.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

import torch
from verl.workers.config import PolicyLossConfig

from .sparse import OLD_ESTIMATES

__all__ = ["TrollPolicyLossConfig", "troll_settings", "troll_loss_enabled", "validate_troll_config", "VALUE_DTYPES"]

logger = logging.getLogger(__name__)
# Actor strategies TROLL's engine path supports.
_SUPPORTED_STRATEGIES = ("fsdp", "fsdp2", "megatron")

_PREFIX = "actor_rollout_ref.actor.policy_loss"
VALUE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrollPolicyLossConfig(PolicyLossConfig):
    """TROLL settings (TROLL §6 defaults). Every field is a YAML/CLI key under ``actor.policy_loss``.

    Args:
        loss_mode (str): registered policy-loss name; ``"troll"``.
        kl_bound (float): ε, the per-token trust-region radius KL(π ‖ π_old) ≤ ε. Paper: 0.05.
        alpha (float): α, weight of the regression term KL(π̃ ‖ sg π). Paper: 1.0.
        topk (int): K, the largest number of tokens kept per policy and position. Paper: 64.
        mass_delta (float): δ, tokens are kept until their mass reaches 1 − δ. Paper: 1e-5.
        floor (float): probability given to a token the old policy did not store. Paper: 1e-12.
        old_estimate (str): old-side value of a union token the old pass did not store: ``"floor"`` (the paper's
            ``floor``), ``"upper"`` (the smallest stored old probability, the largest the token can have) or
            ``"proportional"`` (the old tail mass shared out like the current policy's, capped likewise); see
            :func:`troll_verl.sparse.old_side_estimate` and ``docs/benchmarks.md`` for the measurement.
        tail (str): ``"bucket"`` (default) keeps the mass outside the support as one differentiable category;
            ``"renormalize"`` drops it and renormalises on the support (the paper's treatment; ablation only).
        ratio_level (str): ``"token"`` (GRPO, Dr.GRPO, PPO) or ``"sequence"`` (GSPO: the ratio is built from the
            projected log-probs at sequence level, TROLL §7).
        seq_log_ratio_cap (float): upper clamp of the sequence-level log-ratio (reference: 10).
        solver (str): ``"newton"`` (safeguarded Newton, default) or ``"bisection"``.
        solver_max_iter (int): iteration cap of the solver.
        solver_tol (float | None): Newton step tolerance in log w; None picks a dtype default.
        eta_max (float): largest η the solver may use; residual violations are reported as metrics.
        chunk_size (int | None): tokens per chunk in the lean logits path; None picks ~128 MiB chunks.
        old_value_dtype (str): dtype used to store the old top-K log-probs: float32, bfloat16 or float16.
    """

    loss_mode: str = "troll"
    kl_bound: float = 0.05
    alpha: float = 1.0
    topk: int = 64
    mass_delta: float = 1e-5
    floor: float = 1e-12
    old_estimate: str = "floor"
    tail: str = "bucket"
    ratio_level: str = "token"
    seq_log_ratio_cap: float = 10.0
    solver: str = "newton"
    solver_max_iter: int = 30
    solver_tol: float | None = None
    eta_max: float = 1e6
    chunk_size: int | None = None
    old_value_dtype: str = "float32"

    def __post_init__(self):
        """Validate every TROLL field; errors name the key and the fix."""
        _positive_float(self, "kl_bound", "the paper uses 0.05")
        if not _is_number(self.alpha) or self.alpha < 0 or not math.isfinite(self.alpha):
            raise ValueError(f"{_PREFIX}.alpha must be a finite float >= 0 (the paper uses 1.0), got {self.alpha!r}.")
        if not isinstance(self.topk, int) or isinstance(self.topk, bool) or self.topk < 1:
            raise ValueError(f"{_PREFIX}.topk must be an int >= 1 (the paper uses 64), got {self.topk!r}.")
        for name, paper in (("mass_delta", "1e-5"), ("floor", "1e-12")):
            value = getattr(self, name)
            if not _is_number(value) or not (0.0 < value < 1.0):
                raise ValueError(f"{_PREFIX}.{name} must lie in (0, 1) (the paper uses {paper}), got {value!r}.")
        _choice(self, "old_estimate", OLD_ESTIMATES)
        _choice(self, "tail", ("bucket", "renormalize"))
        _choice(self, "ratio_level", ("token", "sequence"))
        _choice(self, "solver", ("newton", "bisection"))
        _choice(self, "old_value_dtype", tuple(VALUE_DTYPES))
        _positive_float(self, "seq_log_ratio_cap", "the reference uses 10")
        _positive_float(self, "eta_max", "default 1e6")
        if not isinstance(self.solver_max_iter, int) or self.solver_max_iter < 1:
            raise ValueError(f"{_PREFIX}.solver_max_iter must be an int >= 1, got {self.solver_max_iter!r}.")
        if self.solver_tol is not None:
            _positive_float(self, "solver_tol", "or null for the dtype default")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size < 1):
            raise ValueError(
                f"{_PREFIX}.chunk_size must be a positive int (tokens per chunk) or null, got {self.chunk_size!r}."
            )

    @property
    def value_dtype(self) -> torch.dtype:
        """The torch dtype named by ``old_value_dtype``."""
        return VALUE_DTYPES[self.old_value_dtype]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_float(cfg: TrollPolicyLossConfig, name: str, hint: str) -> None:
    value = getattr(cfg, name)
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{_PREFIX}.{name} must be a finite float > 0 ({hint}), got {value!r}.")


def _choice(cfg: TrollPolicyLossConfig, name: str, options: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in options:
        raise ValueError(f"{_PREFIX}.{name} must be one of {list(options)}, got {value!r}.")


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
        raise ValueError("TROLL runs on verl's v1 trainer only; set trainer.use_v1=true.")
    if OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=true never recomputes old log-probs with the actor, so TROLL "
            "gets no old token distribution to project onto. Set algorithm.rollout_correction.bypass_mode=false."
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
    return settings

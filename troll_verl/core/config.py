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
"""TROLL's settings (arXiv:2510.03817 §6 defaults), validated on construction.

The policy-loss config of an actor carries them as ``policy_loss.troll``: TROLL's code reads
``config.policy_loss.troll`` wherever it gets verl's actor config.
"""

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from verl.base_config import BaseConfig

__all__ = ["TrollConfig", "VALUE_DTYPES", "RATIO_LEVELS"]

# ratio_level: the importance ratio per token (GRPO, Dr.GRPO, PPO) or GSPO's per sequence (TROLL §7)
RATIO_LEVELS = ("token", "sequence")
# Storage dtypes of the old top-K log-probs.
VALUE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrollConfig(BaseConfig):
    """TROLL settings (TROLL §6 defaults); every value is checked on construction.

    Args:
        kl_bound (float): ε, the per-token trust-region radius KL(π ‖ π_old) ≤ ε. Paper: 0.05.
        alpha (float): α, weight of the regression term KL(π̃ ‖ sg π). Paper: 1.0.
        topk (int): K, the largest number of tokens kept per policy and position. Paper: 64.
        mass_delta (float): δ, tokens are kept until their mass reaches 1 − δ. Paper: 1e-5.
        floor (float): probability given to a token the old policy did not store. Paper: 1e-12.
        old_estimate (str): old-side value of a union token the old pass did not store: ``"floor"`` (the paper's
            ``floor``) or the name of another estimate registered in ``variants``.
        tail (str): ``"bucket"`` (default) keeps the mass outside the support as one differentiable category, or the
            name of another tail registered in ``variants``.
        regression (str): which tokens' regression term KL(π̃ ‖ sg π) enters the loss: ``"projected"`` (the paper's:
            every token, zero where it was not projected) or the name of another rule registered in ``variants``.
        ratio_level (str): ``"token"`` (GRPO, Dr.GRPO, PPO) or ``"sequence"`` (GSPO: the ratio is built from the
            projected log-probs at sequence level, TROLL §7).
        seq_log_ratio_cap (float): upper clamp of the sequence-level log-ratio (reference: 10).
        solver (str): ``"newton"`` (safeguarded Newton, default) or the name of another solver registered in
            ``variants``.
        solver_max_iter (int): iteration cap of the solver.
        solver_tol (float | None): Newton step tolerance in log w; None picks a dtype default.
        eta_max (float): largest η the solver may use; residual violations are reported as metrics.
        chunk_size (int | None): tokens per chunk in the lean logits path; None picks an eighth of the tokens (at
            most 1 GiB of fp32).
        old_value_dtype (str): dtype used to store the old top-K log-probs: float32, bfloat16 or float16.
    """

    # where these keys live in verl's config; error messages name the key with it
    key_prefix: ClassVar[str] = "actor_rollout_ref.actor.policy_loss.troll"

    kl_bound: float = 0.05
    alpha: float = 1.0
    topk: int = 64
    mass_delta: float = 1e-5
    floor: float = 1e-12
    old_estimate: str = "floor"
    tail: str = "bucket"
    regression: str = "projected"
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
        prefix = self.key_prefix
        self._positive_float("kl_bound", "the paper uses 0.05")
        if not _is_number(self.alpha) or self.alpha < 0 or not math.isfinite(self.alpha):
            raise ValueError(f"{prefix}.alpha must be a finite float >= 0 (the paper uses 1.0), got {self.alpha!r}.")
        if not isinstance(self.topk, int) or isinstance(self.topk, bool) or self.topk < 1:
            raise ValueError(f"{prefix}.topk must be an int >= 1 (the paper uses 64), got {self.topk!r}.")
        for name, paper in (("mass_delta", "1e-5"), ("floor", "1e-12")):
            value = getattr(self, name)
            if not _is_number(value) or not (0.0 < value < 1.0):
                raise ValueError(f"{prefix}.{name} must lie in (0, 1) (the paper uses {paper}), got {value!r}.")
        from .variants import REGISTER_HINT, variant_names  # here: importing the settings imports no core module

        self._choice("old_estimate", variant_names("old_estimate"), REGISTER_HINT)
        self._choice("tail", variant_names("tail"), REGISTER_HINT)
        self._choice("regression", variant_names("regression"), REGISTER_HINT)
        self._choice("solver", variant_names("solver"), REGISTER_HINT)
        self._choice("ratio_level", RATIO_LEVELS)
        self._choice("old_value_dtype", tuple(VALUE_DTYPES))
        self._positive_float("seq_log_ratio_cap", "the reference uses 10")
        self._positive_float("eta_max", "default 1e6")
        if not isinstance(self.solver_max_iter, int) or self.solver_max_iter < 1:
            raise ValueError(f"{prefix}.solver_max_iter must be an int >= 1, got {self.solver_max_iter!r}.")
        if self.solver_tol is not None:
            self._positive_float("solver_tol", "or null for the dtype default")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size < 1):
            raise ValueError(
                f"{prefix}.chunk_size must be a positive int (tokens per chunk) or null, got {self.chunk_size!r}."
            )

    @property
    def value_dtype(self) -> torch.dtype:
        """The torch dtype named by ``old_value_dtype``."""
        return VALUE_DTYPES[self.old_value_dtype]

    def _positive_float(self, name: str, hint: str) -> None:
        value = getattr(self, name)
        if not _is_number(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{self.key_prefix}.{name} must be a finite float > 0 ({hint}), got {value!r}.")

    def _choice(self, name: str, options: tuple[str, ...], hint: str = "") -> None:
        value = getattr(self, name)
        if value not in options:
            hint = f"; {hint}" if hint else ""
            raise ValueError(f"{self.key_prefix}.{name} must be one of {list(options)}, got {value!r}{hint}.")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

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
"""The data TROLL's loss passes between its steps (arXiv:2510.03817 §5), and the pieces every path shares.

- :class:`OldTopK`: the old policy's stored sparse distribution; :class:`SparseSupport`: both policies on the union
  support plus the tail bucket; :class:`TrollTokenTerms`: the per-token terms of the loss.
- The argument checks of the support, :func:`assemble_support` (the tail column, the old side, the sampled token)
  and :func:`projected_support` (what the projection acts on).

:mod:`.sparse` and :mod:`.terms` compute these in torch; a fast path registered with :mod:`.fast_paths` builds the same
values from this module, never from those two, so the dispatch runs one way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from .host import host_reads
from .old_side import old_side_estimate
from .variants import variant

if TYPE_CHECKING:  # the settings class is verl's BaseConfig; projected_support needs only its values
    from .config import TrollConfig

__all__ = [
    "OldTopK",
    "SparseSupport",
    "TrollTokenTerms",
    "check_logits",
    "check_rows",
    "check_support_args",
    "check_sparse_inputs",
    "assemble_support",
    "projected_support",
    "support_diagnostics",
]


class OldTopK(NamedTuple):
    """The old policy's sparse distribution, as stored by the old-log-prob pass.

    Attributes:
        ids: ``(N, K)`` int32 vocabulary ids, sorted by probability, ``-1`` past the mass rule.
        logprobs: ``(N, K)`` log-probs at ``ids`` (fp32, bf16 or fp16; values past the mass rule are ignored).
        tail_logprob: ``(N,)`` fp32 log of the mass outside the stored ids (clamped to the floor).
    """

    ids: torch.Tensor
    logprobs: torch.Tensor
    tail_logprob: torch.Tensor


class SparseSupport(NamedTuple):
    """Both policies on the union support plus the tail bucket (last column), ready for :func:`project`.

    Attributes:
        new_logprobs: ``(..., S + 1)`` fp32 log-probs of the current policy; differentiable w.r.t. the logits.
        old_logprobs: ``(..., S + 1)`` fp32 log-probs of the old policy (floor where unknown).
        mask: ``(..., S + 1)`` bool, False at padding slots of rows whose union is smaller than S.
        ids: ``(..., S)`` int64 vocabulary ids of the union (sorted; ``-1`` at padding slots).
        sampled_index: ``(...)`` int64 position of the sampled token within the support.
    """

    new_logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    mask: torch.Tensor
    ids: torch.Tensor
    sampled_index: torch.Tensor

    def reshape(self, *batch: int) -> SparseSupport:
        """View every field with leading dims ``batch`` instead of ``(N,)``."""
        width, n_ids = self.new_logprobs.shape[-1], self.ids.shape[-1]
        return SparseSupport(
            self.new_logprobs.reshape(*batch, width),
            self.old_logprobs.reshape(*batch, width),
            self.mask.reshape(*batch, width),
            self.ids.reshape(*batch, n_ids),
            self.sampled_index.reshape(*batch),
        )


def check_logits(logits: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``logits`` is a floating ``(N, V)`` tensor."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(
            f"logits must be a floating (N, V) tensor, got {getattr(logits, 'shape', type(logits))}; "
            "flatten batch and sequence dims first."
        )


def check_rows(rows: torch.Tensor, n_logits: int) -> int:
    """Check that ``rows`` is a 1-D int64 index into the ``n_logits`` rows of the logits; return its length."""
    if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.dtype != torch.long:
        raise ValueError(f"rows must be a 1-D int64 tensor of row indices, got {getattr(rows, 'dtype', type(rows))}.")
    # the range check reads the rows back to the host: on the CPU only (an accelerator's indexing asserts itself)
    if rows.numel() and host_reads(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n_logits):
        raise ValueError(f"rows must index the {n_logits} rows of logits, got values outside [0, {n_logits}).")
    return rows.shape[0]


def check_support_args(topk: int, mass_delta: float, floor: float | None = None) -> None:
    """Raise ``ValueError`` naming the argument when ``topk``, ``mass_delta`` or ``floor`` is out of range."""
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"topk must be an int >= 1 (the paper uses 64), got {topk!r}.")
    if not isinstance(mass_delta, int | float) or not (0.0 < mass_delta < 1.0):
        raise ValueError(f"mass_delta must lie in (0, 1) (the paper uses 1e-5), got {mass_delta!r}.")
    if floor is not None and (not isinstance(floor, int | float) or not (0.0 < floor < 1.0)):
        raise ValueError(f"floor must lie in (0, 1) (the paper uses 1e-12), got {floor!r}.")


def check_sparse_inputs(n_rows: int, sampled: torch.Tensor, old: OldTopK, sampled_old_lp: torch.Tensor) -> None:
    """Raise ``ValueError`` unless the sampled tokens and the old top-K have one entry per row."""
    if sampled.shape != (n_rows,) or sampled_old_lp.shape != (n_rows,):
        raise ValueError(
            f"sampled_ids and old_sampled_logprob must have shape ({n_rows},) (one per token), got "
            f"{tuple(sampled.shape)} and {tuple(sampled_old_lp.shape)}."
        )
    if old.ids.shape[0] != n_rows or old.logprobs.shape != old.ids.shape or old.tail_logprob.shape != (n_rows,):
        raise ValueError(
            f"old top-K tensors must be ids/logprobs ({n_rows}, K) and tail_logprob ({n_rows},), got "
            f"{tuple(old.ids.shape)}, {tuple(old.logprobs.shape)}, {tuple(old.tail_logprob.shape)}."
        )


def assemble_support(
    new, tail, ids, old_u, valid, old: OldTopK, sampled, sampled_old_lp, floor, old_estimate: str = "floor"
) -> SparseSupport:
    """Append the tail bucket as the last column, fill in the old side
    (:func:`~troll_verl.core.old_side.old_side_estimate`) and locate the sampled token.

    Args:
        new: ``(N, S)`` current log-probs on the union.
        tail: ``(N,)`` the union's tail log-mass (clamped to the floor).
        ids: ``(N, S)`` the union ids.
        old_u: ``(N, S)`` the old log-probs known so far.
        valid: ``(N, S)`` the valid slots.
        old: the stored :class:`OldTopK`.
        sampled: ``(N,)`` the sampled ids.
        sampled_old_lp: ``(N,)`` their exact old log-probs.
        floor: the floor probability.
        old_estimate: ``"floor"`` or a registered estimate's name (:mod:`.variants`).

    Returns:
        :class:`SparseSupport` with ``(N, S + 1)`` fields.
    """
    old_u, old_tail = old_side_estimate(new, ids, old_u, valid, old, sampled, sampled_old_lp, floor, old_estimate)
    ones = torch.ones((new.shape[0], 1), dtype=torch.bool, device=new.device)
    return SparseSupport(
        new_logprobs=torch.cat([new, tail[:, None]], dim=1),
        old_logprobs=torch.cat([old_u, old_tail[:, None]], dim=1),
        mask=torch.cat([valid, ones], dim=1),
        ids=torch.where(valid, ids, -1),
        sampled_index=(ids == sampled[:, None]).long().argmax(-1),
    )


class TrollTokenTerms(NamedTuple):
    """Per-token TROLL quantities, all of the same shape (e.g. ``(N,)`` or ``(bsz, T)``).

    ``proj_log_prob``, ``log_prob`` and ``regression`` carry gradients; the rest are detached diagnostics.

    Attributes:
        proj_log_prob: log π(o_t), the projected log-prob of the sampled token.
        log_prob: log π̃(o_t), the current (unprojected) log-prob of the sampled token.
        regression: KL(π̃ ‖ sg π) on the support plus tail (TROLL §4).
        kl_before: KL(π̃ ‖ π_old).   kl_after: KL(π ‖ π_old).   eta: η*.
        projected: 1.0 where the token was projected.   support_size: union size without the tail.
        covered_mass: mass of π̃ on the union.
    """

    proj_log_prob: torch.Tensor
    log_prob: torch.Tensor
    regression: torch.Tensor
    kl_before: torch.Tensor
    kl_after: torch.Tensor
    eta: torch.Tensor
    projected: torch.Tensor
    support_size: torch.Tensor
    covered_mass: torch.Tensor

    def map(self, fn) -> TrollTokenTerms:
        """Apply ``fn`` to every field (e.g. reshape, pad)."""
        return TrollTokenTerms(*(fn(t) for t in self))


def projected_support(
    support: SparseSupport, cfg: TrollConfig, row_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the projection acts on: ``(log-probs (..., S + 1), mask (..., S + 1))`` of the current policy on the
    support, the tokens outside ``row_mask`` masked out entirely (identity, zero terms). The tail bucket is a
    category of its own (``cfg.tail="bucket"``, the core's); another tail registered under ``cfg.tail``
    (:mod:`.variants`) returns both from these."""
    new_lp = support.new_logprobs
    sup_mask = support.mask if row_mask is None else support.mask & row_mask[..., None]
    tail = variant("tail", cfg.tail)  # None: the bucket, the core's
    return (new_lp, sup_mask) if tail is None else tail(new_lp, sup_mask)


def support_diagnostics(support: SparseSupport, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The support's no-grad diagnostics per token: its size without the tail column (``(...)`` in ``dtype``) and the
    probability mass it covers, ``1 − exp(tail)`` (``(...)``)."""
    with torch.no_grad():
        return support.mask[..., :-1].sum(-1).to(dtype), 1.0 - torch.exp(support.new_logprobs[..., -1])

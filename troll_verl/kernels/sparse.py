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
"""The sparse supports of TROLL §5 from logits on the kernels: drop-in entry points for those of
:mod:`troll_verl.core.sparse`, same arguments, same outputs (up to the union's fixed width, below).

Per call: the old pass is two launches (:mod:`.stats`, :mod:`.topk`); the update pass's forward two and its backward
one (:mod:`.grad`), plus the small ``(N, C)`` tensor ops of :func:`troll_verl.core.support.assemble_support`. Only the
caller's logits and ``O(N·C)`` tensors are saved for backward; no ``(rows, V)`` buffer is allocated but the gradient.

NOTE: the union support has the fixed width ``C = K_old + K + 1`` (padding masked), where the torch path trims it to
the batch's largest union (a device sync). The values on the valid entries are the torch path's; the padding is
masked everywhere downstream (:func:`troll_verl.core.projection.project` takes the mask).
NOTE: ``rows`` is checked for shape and dtype only; its values must index distinct rows of the logits (a value check
would be a device sync).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from troll_verl.core.projection import full_precision
from troll_verl.core.support import (
    OldTopK,
    SparseSupport,
    assemble_support,
    check_logits,
    check_rows,
    check_sparse_inputs,
    check_support_args,
)

from .grad import logits_grad
from .topk import old_topk, support_forward

__all__ = ["SparseFromLogits", "triton_sparse_from_logits", "triton_old_topk_from_logits"]


def _check_kernel_inputs(logits: torch.Tensor, rows: torch.Tensor | None) -> int:
    """The core's checks of ``logits`` and ``rows`` plus the kernels' layout; returns the number of rows."""
    check_logits(logits)
    if logits.stride(-1) != 1:
        raise ValueError("the kernels read logits with a contiguous last dim; pass logits.contiguous().")
    return logits.shape[0] if rows is None else check_rows(rows, logits.shape[0])


class SparseFromLogits(torch.autograd.Function):
    """The kernels' ``_SparseFromLogits`` (:mod:`troll_verl.core.sparse`): the union support's current log-probs and
    tail from the logits, differentiable w.r.t. the logits.

    Forward: ``(logits (N_all, V), rows (N,) or None, old_ids (N, K_old), old_lp (N, K_old), sampled (N,),
    sampled_old_lp (N,), k, mass_delta, log_floor)`` → ``new (N, C)`` fp32 (0 at padding), ``tail (N,)`` fp32
    clamped to ``log_floor``, ``ids (N, C)`` int64 (sorted, −1 padding), ``old (N, C)`` fp32, ``valid (N, C)`` bool,
    ``C = K_old + k + 1``. Saves the logits (no copy), the log-sum-exp and ``O(N·C)`` tensors.
    """

    @staticmethod
    @full_precision
    def forward(ctx, logits, rows, old_ids, old_lp, sampled, sampled_old_lp, k, mass_delta, log_floor):
        """Two launches: the statistics pass and the support kernel."""
        ids, old, valid, new, tail_raw, lse = support_forward(
            logits, rows, old_ids, old_lp, sampled, sampled_old_lp, k, mass_delta, log_floor
        )
        ctx.save_for_backward(logits, rows, ids, valid, new, tail_raw, lse)
        ctx.log_floor = log_floor
        ctx.mark_non_differentiable(ids, old, valid)
        return new, tail_raw.clamp_min(log_floor), ids, old, valid

    @staticmethod
    @once_differentiable
    @full_precision
    def backward(ctx, g_new, g_tail, *_):
        """One launch: :func:`.grad.logits_grad`."""
        logits, rows, ids, valid, new, tail_raw, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 9
        g_new = torch.zeros_like(new) if g_new is None else g_new.float()
        g_tail = torch.zeros_like(tail_raw) if g_tail is None else g_tail.float()
        grad = logits_grad(logits, rows, lse, ids, valid, g_new, new, g_tail, tail_raw, ctx.log_floor)
        return grad, None, None, None, None, None, None, None, None


def triton_sparse_from_logits(
    logits: torch.Tensor,
    sampled_ids: torch.Tensor,
    old: OldTopK,
    old_sampled_logprob: torch.Tensor,
    *,
    topk: int = 64,
    mass_delta: float = 1e-5,
    floor: float = 1e-12,
    chunk_size: int | None = None,
    rows: torch.Tensor | None = None,
    old_estimate: str = "floor",
) -> SparseSupport:
    """:func:`troll_verl.core.sparse.troll_sparse_from_logits` on the kernels (same arguments; ``chunk_size`` is
    accepted and ignored: the kernels hold no ``(rows, V)`` buffer).

    Returns:
        :class:`~troll_verl.core.support.SparseSupport` with ``(N, C + 1)`` fields, ``C = K_old + min(topk, V) + 1``.
    """
    n = _check_kernel_inputs(logits, rows)
    check_support_args(topk, mass_delta, floor)
    sampled = sampled_ids.long()
    check_sparse_inputs(n, sampled, old, old_sampled_logprob)
    log_floor = math.log(floor)
    new, tail, ids, old_u, valid = SparseFromLogits.apply(
        logits, rows, old.ids, old.logprobs, sampled, old_sampled_logprob.detach(), min(topk, logits.shape[1]),
        mass_delta, log_floor,
    )  # fmt: skip
    return assemble_support(
        new, tail, ids, old_u, valid, old, sampled, old_sampled_logprob.detach(), floor, old_estimate
    )


@torch.no_grad()
@full_precision
def triton_old_topk_from_logits(
    logits: torch.Tensor,
    topk: int = 64,
    mass_delta: float = 1e-5,
    floor: float = 1e-12,
    value_dtype: torch.dtype = torch.float32,
    chunk_size: int | None = None,
    rows: torch.Tensor | None = None,
) -> OldTopK:
    """:func:`troll_verl.core.sparse.old_topk_from_logits` on the kernels (same arguments and outputs;
    ``chunk_size`` is ignored). Two launches."""
    _check_kernel_inputs(logits, rows)
    check_support_args(topk, mass_delta, floor)
    ids, lps, tail = old_topk(logits, rows, min(topk, logits.shape[1]), mass_delta, math.log(floor), value_dtype)
    return OldTopK(ids, lps, tail)

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
"""The backward pass of the sparse log-probs: ``∂L/∂z`` in one streaming read and write per row.

For the support log-probs ``new_a = z_a − LSE(z)`` (``a ∈ S``) and the tail ``log Σ_{b∉S} π_b`` with upstream
gradients ``g`` and ``g_t`` (derived in :mod:`troll_verl.core.sparse`), ``π = softmax(z)``, ``π_t``
the tail mass, ``g_t`` zero where the tail was clamped to the floor:

    ∂L/∂z_b = π_b · coef  +  1[b ∈ S] · (g_b − π_b · g_t / π_t),      coef = g_t / π_t − Σ_S g − g_t.

Every column gets ``exp(z_b − LSE) · coef`` computed in fp32 from the saved log-sum-exp and rounded once to the
logits' dtype; then the support entries are overwritten with their exact value ``g_a − π_a · (Σ_S g + g_t)``
(computed in fp32, rounded once): the ``g_t / π_t`` terms, large when the tail is small, cancel there exactly instead
of in floating point, and the terms that cancel at a token of probability near 1 keep their precision. Rows of the
logits that were not selected get zeros, written without reading the logits. Without a tail (``S = {o_t}``,
``g_t = 0``) this is the clip objective's cross-entropy backward, ``g · (1[b = o_t] − π_b)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import Launch, unused

__all__ = ["logits_grad", "grad_launch"]

_BLOCK_V = 2048
# 8 elements of a 2048-wide block per thread: 32 registers, no stack in any dtype (at 4 warps fp16 put 8 bytes there)
_WARPS = 8
_TINY = float(torch.finfo(torch.float32).tiny)


@triton.jit
def _grad_kernel(
    z_ptr,
    stride_z,
    g_ptr,
    stride_g,
    sel_ptr,
    lse_ptr,
    ids_ptr,
    valid_ptr,
    gnew_ptr,
    newlp_ptr,
    gtail_ptr,
    tail_ptr,
    V,
    C,
    log_floor,
    tiny,
    HAS_ROWS: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    C_P2: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per row of the gradient (= row of the logits); ``sel[row]`` is its selected index or −1.

    Parameters:
        z_ptr: ``(N_all, V)`` logits, last dim contiguous.
        stride_z: the logits' row stride.
        g_ptr: out ``(N_all, V)`` gradient in the logits' dtype.
        stride_g: the gradient's row stride.
        sel_ptr: ``(N_all,)`` int32 selected index of each logits row, −1 where unselected (read with ``HAS_ROWS``).
        lse_ptr: ``(N,)`` fp32 log-sum-exp of the selected rows.
        ids_ptr: ``(N, C)`` support ids.
        valid_ptr: ``(N, C)`` uint8 valid slots.
        gnew_ptr: ``(N, C)`` upstream gradient of the support log-probs.
        newlp_ptr: ``(N, C)`` fp32 support log-probs.
        gtail_ptr: ``(N,)`` upstream gradient of the tail (read with ``HAS_TAIL``).
        tail_ptr: ``(N,)`` fp32 unclamped tail (read with ``HAS_TAIL``).
        V: vocabulary size.
        C: the support's width.
        log_floor: the tail's clamp (no gradient at or below it).
        tiny: fp32's smallest normal.
        HAS_ROWS: rows are selected through ``sel_ptr`` (else every row, index = row).
        HAS_TAIL: the loss has a tail term.
        C_P2: ``C`` padded to a power of 2.
        BLOCK_V: columns per loop step.
    """
    pid = tl.program_id(0)
    pid64 = pid.to(tl.int64)
    if HAS_ROWS:
        i = tl.load(sel_ptr + pid)
    else:
        i = pid
    selected = i >= 0
    i64 = tl.maximum(i, 0).to(tl.int64)
    # an unselected row reads nothing (its widths are 0), so its coefficient is 0 and it gets zeros
    # NOTE: widths, not ``selected & mask``: Triton's interpreter turns a scalar bool & a vector bool into int32
    c_sel = tl.where(selected, C, 0)
    v_sel = tl.where(selected, V, 0)
    lse = tl.load(lse_ptr + i64, mask=selected, other=0.0)
    c = tl.arange(0, C_P2)
    valid = tl.load(valid_ptr + i64 * C + c, mask=c < c_sel, other=0) != 0
    g = tl.load(gnew_ptr + i64 * C + c, mask=valid, other=0.0).to(tl.float32)
    lp = tl.load(newlp_ptr + i64 * C + c, mask=valid, other=0.0)
    if HAS_TAIL:
        g_tail = tl.load(gtail_ptr + i64, mask=selected, other=0.0).to(tl.float32)
        tail = tl.load(tail_ptr + i64, mask=selected, other=0.0)
        g_tail = tl.where(tail > log_floor, g_tail, 0.0)  # the floor clamp has no gradient
        g_over_tail = tl.where(g_tail != 0, g_tail / tl.maximum(tl.exp(tail), tiny), 0.0)
    else:
        g_tail = 0.0
        g_over_tail = 0.0
    g_sum = tl.sum(g, axis=0) + g_tail
    coef = g_over_tail - g_sum
    z_row = z_ptr + pid64 * stride_z
    g_row = g_ptr + pid64 * stride_g
    for v0 in range(0, V, BLOCK_V):
        col = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(z_row + col, mask=col < v_sel, other=0.0).to(tl.float32)
        tl.store(g_row + col, tl.exp(x - lse) * coef, mask=col < V)
    tl.debug_barrier()  # the support entries below overwrite this program's dense values
    # π_a·coef + g_a − π_a·g_t/π_t with the g_t/π_t terms cancelled exactly (they are large when the tail is small)
    exact = g - tl.exp(lp) * g_sum
    ids = tl.load(ids_ptr + i64 * C + c, mask=valid, other=0)
    tl.store(g_row + ids, exact, mask=valid)


def selected_index(rows: torch.Tensor | None, n_all: int) -> torch.Tensor | None:
    """``(N_all,)`` int32: the position of each logits row in ``rows``, −1 where it is not selected (None: all)."""
    if rows is None:
        return None
    sel = torch.full((n_all,), -1, dtype=torch.int32, device=rows.device)
    return sel.index_copy_(0, rows, torch.arange(rows.shape[0], dtype=torch.int32, device=rows.device))


def grad_launch(logits, rows, lse, ids, valid, g_new, new_lp, g_tail=None, tail_raw=None, log_floor=0.0):
    """The backward kernel's launch and the gradient buffer it writes (arguments as :func:`logits_grad`). Nothing
    runs: on ``meta`` tensors it gives the launch's signature."""
    n_all, vocab = logits.shape
    grad = torch.empty((n_all, vocab), dtype=logits.dtype, device=logits.device)
    C = ids.shape[1]
    sel = selected_index(rows, n_all)  # contiguous, as every tensor handed to the kernel
    has_tail = g_tail is not None
    f32 = unused(torch.float32, logits.device)
    launch = Launch(
        _grad_kernel,
        (n_all,),
        dict(
            z_ptr=logits,
            stride_z=logits.stride(0),
            g_ptr=grad,
            stride_g=grad.stride(0),
            sel_ptr=unused(torch.int32, logits.device) if sel is None else sel,
            lse_ptr=lse.contiguous(),
            ids_ptr=ids.contiguous(),
            valid_ptr=valid.contiguous().view(torch.uint8),
            gnew_ptr=g_new.contiguous(),
            newlp_ptr=new_lp.contiguous(),
            gtail_ptr=g_tail.contiguous() if has_tail else f32,
            tail_ptr=tail_raw.contiguous() if has_tail else f32,
            V=vocab,
            C=C,
            log_floor=log_floor,
            tiny=_TINY,
        ),
        dict(HAS_ROWS=sel is not None, HAS_TAIL=has_tail, C_P2=triton.next_power_of_2(max(C, 1)), BLOCK_V=_BLOCK_V),
        _WARPS,
    )
    return launch, grad


def logits_grad(
    logits: torch.Tensor,
    rows: torch.Tensor | None,
    lse: torch.Tensor,
    ids: torch.Tensor,
    valid: torch.Tensor,
    g_new: torch.Tensor,
    new_lp: torch.Tensor,
    g_tail: torch.Tensor | None = None,
    tail_raw: torch.Tensor | None = None,
    log_floor: float = 0.0,
) -> torch.Tensor:
    """``∂L/∂logits`` (module docstring), a new ``(N_all, V)`` tensor in the logits' dtype.

    Args:
        logits: ``(N_all, V)`` fp32/bf16/fp16, last dim contiguous.
        rows: optional ``(N,)`` int64 selected rows (distinct); the others get zero gradient.
        lse: ``(N,)`` fp32 log-sum-exp of the selected rows.
        ids: ``(N, C)`` int support ids.
        valid: ``(N, C)`` bool.
        g_new: ``(N, C)`` upstream gradient of the support log-probs.
        new_lp: ``(N, C)`` fp32 log-probs.
        g_tail: ``(N,)`` upstream gradient of the tail (with ``tail_raw``, or neither).
        tail_raw: ``(N,)`` the unclamped tail.
        log_floor: the tail's clamp.
    """
    launch, grad = grad_launch(logits, rows, lse, ids, valid, g_new, new_lp, g_tail, tail_raw, log_floor)
    if launch.grid[0] > 0:
        launch()
    return grad

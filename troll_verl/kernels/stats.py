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
"""The statistics pass: one streaming read of each selected row of the logits (TROLL §5's normaliser).

Per selected row ``i`` (logits row ``rows[i]``, read in place in its own dtype, upcast in registers):

- ``lse[i] = log Σ_b exp(z_b)`` by an online max/sum, in fp32;
- with ``chunk_stats``, for every 128-column chunk ``c``: ``cmax[i, c] = max_{b∈c} z_b`` (exactly a logit, so the
  top-K prefilter of :mod:`.topk` compares logits, not roundings) and ``csum[i, c] = Σ_{b∈c} exp(z_b − cmax[i, c])``,
  from which the tail of :mod:`.topk` takes the mass of every chunk that holds no support token, by additions only;
- with ``target``, ``target_lp[i] = z[target[i]] − lse[i]`` (the clip objective's log-prob).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import Launch, unused

__all__ = ["CHUNK", "row_stats", "stats_launch", "num_chunks"]

CHUNK = 128  # columns per chunk: the prefilter's unit
_CHUNKS_PER_TILE = 16  # chunks per loop step (2048 columns)
_WARPS = 4


def num_chunks(vocab: int) -> int:
    """Number of 128-column chunks of a row of ``vocab`` logits."""
    return triton.cdiv(vocab, CHUNK)


@triton.jit
def _stats_kernel(
    z_ptr,
    stride_z,
    rows_ptr,
    lse_ptr,
    cmax_ptr,
    csum_ptr,
    target_ptr,
    target_lp_ptr,
    V,
    NC,
    HAS_ROWS: tl.constexpr,
    CHUNK_STATS: tl.constexpr,
    HAS_TARGET: tl.constexpr,
    CHUNK_: tl.constexpr,
    CPT: tl.constexpr,
):
    """One program per selected row; see the module docstring.

    Parameters:
        z_ptr: ``(N_all, V)`` logits (fp32/bf16/fp16), last dim contiguous; read only.
        stride_z: the logits' row stride (elements).
        rows_ptr: ``(N,)`` int64 logits row of each program (read with ``HAS_ROWS`` only).
        lse_ptr: out ``(N,)`` fp32 log-sum-exp.
        cmax_ptr: out ``(N, NC)`` fp32 chunk maxima (written with ``CHUNK_STATS`` only).
        csum_ptr: out ``(N, NC)`` fp32 chunk exp-sums about their maxima (written with ``CHUNK_STATS`` only).
        target_ptr: ``(N,)`` int64 column per row (read with ``HAS_TARGET`` only).
        target_lp_ptr: out ``(N,)`` fp32 ``z[target] − lse`` (written with ``HAS_TARGET`` only).
        V: vocabulary size.
        NC: chunks per row, ``ceil(V / CHUNK_)``.
        HAS_ROWS: programs read ``rows_ptr`` (else program ``i`` reads row ``i``).
        CHUNK_STATS: write the chunk statistics.
        HAS_TARGET: write the target log-probs.
        CHUNK_: columns per chunk (:data:`CHUNK`).
        CPT: chunks per loop step.
    """
    pid = tl.program_id(0)
    if HAS_ROWS:
        row = tl.load(rows_ptr + pid).to(tl.int64)
    else:
        row = pid.to(tl.int64)
    z_row = z_ptr + row * stride_z
    cc = tl.arange(0, CPT)
    jj = tl.arange(0, CHUNK_)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for c0 in range(0, NC, CPT):
        chunk = c0 + cc
        col = chunk[:, None] * CHUNK_ + jj[None, :]
        x = tl.load(z_row + col, mask=col < V, other=float("-inf")).to(tl.float32)
        cm = tl.max(x, axis=1)
        cm_ref = tl.where(cm == float("-inf"), 0.0, cm)  # an all −inf (or padding) chunk sums to 0, not NaN
        cs = tl.sum(tl.exp(x - cm_ref[:, None]), axis=1)
        if CHUNK_STATS:
            tl.store(cmax_ptr + pid.to(tl.int64) * NC + chunk, cm, mask=chunk < NC)
            tl.store(csum_ptr + pid.to(tl.int64) * NC + chunk, cs, mask=chunk < NC)
        m_new = tl.maximum(m, tl.max(cm, axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_ref) + tl.sum(cs * tl.exp(cm - m_ref), axis=0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(lse_ptr + pid, lse)
    if HAS_TARGET:
        t = tl.load(target_ptr + pid).to(tl.int64)
        tl.store(target_lp_ptr + pid, tl.load(z_row + t).to(tl.float32) - lse)


def stats_launch(
    logits: torch.Tensor,
    rows: torch.Tensor | None = None,
    chunk_stats: bool = False,
    target: torch.Tensor | None = None,
) -> tuple[Launch, tuple]:
    """The statistics pass's launch and its output buffers (arguments and outputs as :func:`row_stats`); nothing
    runs, so ``meta`` tensors give the launch's signature."""
    n_all, vocab = logits.shape
    n = n_all if rows is None else rows.shape[0]
    nc = num_chunks(vocab)
    dev = logits.device
    lse = torch.empty(n, dtype=torch.float32, device=dev)
    cmax = torch.empty((n, nc), dtype=torch.float32, device=dev) if chunk_stats else None
    csum = torch.empty((n, nc), dtype=torch.float32, device=dev) if chunk_stats else None
    target_lp = torch.empty(n, dtype=torch.float32, device=dev) if target is not None else None
    f32 = unused(torch.float32, dev)
    i64 = unused(torch.int64, dev)
    launch = Launch(
        _stats_kernel,
        (n,),
        dict(
            z_ptr=logits,
            stride_z=logits.stride(0),
            rows_ptr=i64 if rows is None else rows.contiguous(),
            lse_ptr=lse,
            cmax_ptr=f32 if cmax is None else cmax,
            csum_ptr=f32 if csum is None else csum,
            target_ptr=i64 if target is None else target.contiguous(),
            target_lp_ptr=f32 if target_lp is None else target_lp,
            V=vocab,
            NC=nc,
        ),
        dict(
            HAS_ROWS=rows is not None,
            CHUNK_STATS=chunk_stats,
            HAS_TARGET=target is not None,
            CHUNK_=CHUNK,
            CPT=_CHUNKS_PER_TILE,
        ),
        _WARPS,
    )
    return launch, (lse, cmax, csum, target_lp)


def row_stats(
    logits: torch.Tensor,
    rows: torch.Tensor | None = None,
    chunk_stats: bool = False,
    target: torch.Tensor | None = None,
):
    """Run the statistics pass.

    Args:
        logits: ``(N_all, V)`` fp32/bf16/fp16 logits, last dim contiguous.
        rows: optional ``(N,)`` int64 rows of ``logits`` to read (default: all, ``N = N_all``).
        chunk_stats: also return the chunks' maxima and exp-sums.
        target: optional ``(N,)`` int64 column per selected row.

    Returns:
        ``(lse (N,), cmax (N, NC) or None, csum (N, NC) or None, target_lp (N,) or None)``, fp32,
        ``NC = ceil(V / 128)``.
    """
    if logits.stride(-1) != 1:
        raise ValueError("the kernels read logits with a contiguous last dim; pass logits.contiguous().")
    launch, outputs = stats_launch(logits, rows, chunk_stats, target)
    if launch.grid[0] > 0:
        launch()
    return outputs

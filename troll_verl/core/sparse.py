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
"""Sparse top-K token distributions for TROLL (arXiv:2510.03817, §5), computed lean from logits.

Support rule (TROLL §5), applied to both the old and the current policy: keep the most likely tokens until
their cumulative mass reaches ``1 − mass_delta``, at most ``topk`` of them. The projection then runs on

    S = supp(π_old) ∪ supp(π̃) ∪ {o_t}          (the sampled token o_t is always included)

plus one **tail bucket** holding the mass of every token outside S.

Floor and tail treatment (decisions of this implementation):
- The current policy's log-probs on S are exact (gathered from its logits), whichever side put the token in S.
- The old policy is known only on its stored top-K and at the sampled token (verl's ``old_log_probs``). A token
  that only the current policy brought into S takes, on the old side, the paper's floor probability (default
  1e-12, ``old_estimate="floor"``) or another estimate registered with :mod:`.variants`
  (:func:`~troll_verl.core.old_side.old_side_estimate`).
- NOTE: the paper drops the tail. Here the tail is an explicit category on both sides: ``log(1 − Σ_S π)``,
  computed exactly from the logits (float64 accumulation) and **differentiable** for the current policy. So
  KL(π̃ ‖ π_old) and the regression term KL(π̃ ‖ sg π) see mass that leaks out of S, and the gradient pulls it
  back; a tail without gradient lets the network move mass outside S unpenalised (entropy blow-up). A tail below
  the floor is clamped to the floor, so every entry stays finite.
- How the coarse-grained KL on S + 1 relates to the full-vocabulary KL: *if the old values on S were exact* it
  would be a lower bound (data-processing inequality), exact when the tails are empty. They are not exact for the
  tokens only the current policy brought in: the floor puts them far below their true old probability, so the
  sparse KL can exceed the full KL by orders of magnitude (a sampled LLM at T=1: median 2.6×); an estimate bounded
  by what the old pass stored (:mod:`.variants`) can put them at or above it, and the sparse KL then falls slightly
  below.

Memory (the reason for the custom Functions): the forward pass streams over token chunks of the
``(N, V)`` logits, computing a fused softmax into one reused chunk buffer, the log-sum-exp, the top-K and the
gathers; it saves only the logits tensor it was given (no log-softmax copy) plus ``O(N·S)`` small tensors. The
backward pass writes ``∂L/∂z = softmax(z) · c_row + sparse corrections`` chunk by chunk straight into the
gradient buffer.

Vocabulary layouts: every chunk loop here takes the per-chunk statistics as a parameter (:class:`ChunkStatistics`).
The default holds the whole vocabulary on this rank; a backend that shards the vocabulary (Megatron's tensor
parallelism, :mod:`troll_verl.core.megatron.losses`) passes its own, and the streaming, the union, the tail and the
backward pass stay this module's.

NOTE: there is no fused-LM-head variant (hidden states and head weight in, logits never materialised): verl 0.9.1's
``use_fused_kernels`` path hands a loss no hidden states without patching the model's forward, and smaller
micro-batches save the same memory at no extra time on the lean path.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .fast_paths import fast_path
from .host import host_reads
from .projection import compute_dtype, full_precision
from .support import (
    OldTopK,
    SparseSupport,
    assemble_support,
    check_logits,
    check_rows,
    check_sparse_inputs,
    check_support_args,
)

__all__ = [
    "OldTopK",
    "SparseSupport",
    "ChunkStatistics",
    "old_topk_from_logits",
    "old_topk_from_pass",
    "troll_sparse_from_logits",
    "mass_rule_mask",
    "check_support_args",
    "MIN_CHUNKS",
    "MAX_CHUNK_BYTES",
]

# Auto chunk size (_chunk_rows): this many chunks per call, and one fp32 (rows, V) temporary at most this large.
MIN_CHUNKS = 8
MAX_CHUNK_BYTES = 2**30
_PRIO_SAMPLED, _PRIO_OLD, _PRIO_NEW, _PRIO_SHIFT = 0, 1, 2, 2  # sort key = id << 2 | priority


def _chunk_rows(n_rows: int, vocab: int, chunk_size: int | None) -> int:
    """Rows per chunk: ``chunk_size`` if given, else ``1 / MIN_CHUNKS`` of the rows, so that the chunk buffers stay a
    fixed share of the logits tensor itself (one fp32 buffer is a quarter of bf16 logits), in as few chunks as that
    allows (each chunk is a dozen kernel launches), and at most :data:`MAX_CHUNK_BYTES` of fp32 logits."""
    if chunk_size is not None:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int (tokens per chunk) or None, got {chunk_size!r}.")
        return chunk_size
    return max(1, min(-(-n_rows // MIN_CHUNKS), MAX_CHUNK_BYTES // (4 * max(vocab, 1))))


# ----------------------------------------------------------------------------------------------------------
# per-chunk pieces
# ----------------------------------------------------------------------------------------------------------
def mass_rule_mask(sorted_logprobs: torch.Tensor, mass_delta: float) -> torch.Tensor:
    """Keep the top tokens until their cumulative mass reaches ``1 − mass_delta`` (TROLL §5).

    Args:
        sorted_logprobs: ``(..., K)`` log-probs sorted in descending order (normalised over the vocabulary).
        mass_delta: δ in (0, 1).

    Returns:
        ``(..., K)`` bool: entry j is kept iff the mass of the entries before it is below ``1 − δ``. The first
        entry is always kept; the cap at K is the tensor's width.
    """
    p = sorted_logprobs.to(compute_dtype(sorted_logprobs.dtype)).exp()
    before = torch.cumsum(p, dim=-1) - p
    keep = before < (1.0 - mass_delta)
    keep[..., 0] = True
    return keep


class _Workspace:
    """Reusable ``(rows, V)`` buffers, one per name and dtype (the compute dtype unless named), so chunks do not
    re-allocate (and re-fault) vocabulary-sized memory. Lives for one forward or backward call."""

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device):
        self.rows, self.vocab, self.dtype, self.device = rows, vocab, dtype, device
        self._bufs: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, rows: int, width: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A ``(rows, width)`` view of buffer ``name`` (``width`` defaults to the vocabulary size, ``dtype`` to the
        compute dtype)."""
        width = self.vocab if width is None else width
        dtype = self.dtype if dtype is None else dtype
        buf = self._bufs.get((name, width, dtype))
        if buf is None:
            buf = self._bufs[(name, width, dtype)] = torch.empty((self.rows, width), dtype=dtype, device=self.device)
        return buf[:rows]

    def as_compute(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself if it already has the compute dtype, else a copy in the ``"z"`` buffer (one explicit
        upcast is several times cheaper on CPU than mixed-dtype arithmetic in every later kernel)."""
        return x if x.dtype == self.dtype else self.get("z", x.shape[0]).copy_(x)

    def take_rows(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``x[idx]`` in the compute dtype, gathered into the ``"z"`` buffer."""
        out = self.get("z", idx.shape[0])
        if x.dtype == self.dtype:
            return torch.index_select(x, 0, idx, out=out)
        return out.copy_(x.index_select(0, idx))

    def chunk(self, x: torch.Tensor, rows: torch.Tensor | None, sl: slice) -> torch.Tensor:
        """Chunk ``sl`` of the selected rows of ``x`` (all rows when ``rows`` is None) in the compute dtype."""
        return self.as_compute(x[sl]) if rows is None else self.take_rows(x, rows[sl])

    def raw_chunk(self, x: torch.Tensor, rows: torch.Tensor | None, sl: slice) -> torch.Tensor:
        """Chunk ``sl`` of the selected rows of ``x`` in ``x``'s own dtype: a view, or the rows gathered into the
        ``"x"`` buffer."""
        if rows is None:
            return x[sl]
        idx = rows[sl]
        return torch.index_select(x, 0, idx, out=self.get("x", idx.shape[0], dtype=x.dtype))


def _chunk_stats(z: torch.Tensor, k: int, p: torch.Tensor):
    """Softmax, log-sum-exp and top-k of one ``(c, V)`` chunk of logits.

    ``z`` may be of a lower precision than the compute dtype of ``p`` (bf16 logits): the softmax is one fused
    kernel that reads ``z`` and writes ``softmax(z)`` in the compute dtype into the preallocated buffer ``p``
    (``(c, V)``), so no upcast copy of the chunk is made. The top-k runs on the narrower of the two on a GPU (a bf16
    top-k over V = 151936 takes 9 ms per 8192 rows on an H100 against 14.5 ms in fp32) and on ``p`` on a CPU (where
    bf16 comparisons are emulated and slower than fp32 ones); softmax is monotone, so both give the same order. The
    log-sum-exp is recovered from the arg-max entry, ``LSE = z_max − log p_max`` (``p_max ≥ 1/V``, so this is exact
    to rounding), and the top-k values are the logits themselves, gathered and upcast exactly. Returns
    ``(lse (c,), topv (c, k), topi (c, k))`` in the compute dtype and leaves ``softmax(z)`` in ``p``.
    """
    torch.softmax(z, dim=-1, dtype=p.dtype, out=p)
    _, topi = torch.topk(z if z.is_cuda else p, k, dim=-1, sorted=True)
    topv = z.gather(1, topi).to(p.dtype)
    lse = topv[:, 0] - torch.log(p.gather(1, topi[:, :1]).squeeze(1))
    return lse, topv, topi


def _tail_logprob(p: torch.Tensor, support_ids: torch.Tensor) -> torch.Tensor:
    """log Σ_{b∉S} softmax(z)_b, exact: zero the support entries of ``p = softmax(z)`` and sum the rest.

    Summing only the tail (instead of 1 − Σ_S π) keeps full relative precision for tiny tails; −inf if empty.
    ``p`` is overwritten.
    """
    return torch.log(p.scatter_(1, support_ids, 0.0).sum(dim=-1))


def _union_support(
    old_ids: torch.Tensor,
    old_lp: torch.Tensor,
    new_ids: torch.Tensor,
    new_keep: torch.Tensor,
    sampled: torch.Tensor,
    sampled_old_lp: torch.Tensor,
    log_floor: float,
    dtype: torch.dtype,
):
    """Union of the old support, the new support and the sampled token, sorted by vocabulary id.

    Args:
        old_ids: ``(c, Ko)`` int, ``-1`` at invalid slots.
        old_lp: ``(c, Ko)`` their old log-probs.
        new_ids: ``(c, Kn)`` int64 current top-k ids.
        new_keep: ``(c, Kn)`` bool mass-rule mask.
        sampled: ``(c,)`` int64 sampled ids.
        sampled_old_lp: ``(c,)`` their old log-probs (exact).
        log_floor: log of the floor probability for tokens the old policy did not store.
        dtype: dtype of the returned old log-probs.

    Returns:
        ``ids (c, C)`` int64 (``-1`` at padding, valid entries first), ``old (c, C)`` old log-probs (floor where
        only the current policy knows the token), ``valid (c, C)`` bool and ``count (c,)``, with
        ``C = Ko + Kn + 1``. Duplicates keep the old value of the most trusted source: sampled > old top-K.
    """
    c = sampled.shape[0]
    dev = sampled.device
    cand = torch.cat([old_ids.long(), torch.where(new_keep, new_ids, -1), sampled[:, None]], dim=1)
    cand_old = torch.cat(
        [old_lp.to(dtype), torch.full_like(new_ids, log_floor, dtype=dtype), sampled_old_lp.to(dtype)[:, None]],
        dim=1,
    )
    prio = torch.cat(
        [
            torch.full_like(old_ids, _PRIO_OLD, dtype=torch.long),
            torch.full_like(new_ids, _PRIO_NEW),
            torch.full((c, 1), _PRIO_SAMPLED, dtype=torch.long, device=dev),
        ],
        dim=1,
    )
    big = torch.iinfo(torch.long).max
    key = torch.where(cand >= 0, (cand << _PRIO_SHIFT) | prio, big)
    key, order = key.sort(dim=-1)
    sid = torch.where(key == big, -1, key >> _PRIO_SHIFT)
    first = sid >= 0
    first[:, 1:] &= sid[:, 1:] != sid[:, :-1]
    s_old = cand_old.gather(1, order)
    # Compact the first occurrence of every id to the left (positions 0..count-1), padding to the right.
    C = cand.shape[1]
    pos = torch.where(first, first.long().cumsum(-1) - 1, C)
    ids = torch.full((c, C + 1), -1, dtype=torch.long, device=dev).scatter_(1, pos, sid)[:, :C]
    old = torch.full((c, C + 1), log_floor, dtype=dtype, device=dev).scatter_(1, pos, s_old)[:, :C]
    count = first.sum(-1)
    valid = torch.arange(C, device=dev)[None, :] < count[:, None]
    return ids, old, valid, count


def _safe_ids(ids: torch.Tensor, valid: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """Ids usable for gather/scatter: padding slots point at the (always valid) sampled token."""
    return torch.where(valid, ids, sampled[:, None])


class ChunkStatistics:
    """The per-chunk statistics of a vocabulary layout: this class, the whole vocabulary on this rank (FSDP).

    Every chunk loop of this module (:func:`old_topk_from_logits`, :func:`troll_sparse_from_logits` and its backward
    pass) asks these methods for what depends on where the vocabulary lives, and does the rest itself (mass rule,
    union, old side, tail bucket, chunking). A backend that shards the vocabulary subclasses it (Megatron's tensor
    parallelism: global statistics by small collectives, :mod:`troll_verl.core.megatron.losses`).

    Attributes:
        dump_columns: scratch columns after the ``V`` of every ``(c, V)`` buffer (scatters of ids another rank owns).
    """

    dump_columns = 0

    def vocab_size(self, width: int) -> int:
        """The full vocabulary size, for logits of ``width`` columns on this rank."""
        return width

    def chunk(self, ws: _Workspace, logits: torch.Tensor, rows: torch.Tensor | None, sl: slice) -> torch.Tensor:
        """Chunk ``sl`` of the selected rows of ``logits``, in the dtype :meth:`stats` reads (here their own)."""
        return ws.raw_chunk(logits, rows, sl)

    def grad_dtype(self, logits: torch.Tensor) -> torch.dtype:
        """The dtype :meth:`grad` writes a chunk's gradient in (here the logits' own, see :meth:`grad`)."""
        return logits.dtype

    def stats(self, z: torch.Tensor, k: int, p: torch.Tensor):
        """Log-sum-exp and top-``k`` of one ``(c, V)`` chunk ``z``, with scratch ``p`` (``(c, V + dump_columns)``,
        compute dtype).

        Returns:
            ``(lse (c,), topv (c, k), topi (c, k), aux)``: top-k logits and their global ids, sorted; ``aux`` is
            what :meth:`support` needs besides (here nothing). Leaves ``softmax(z)`` (up to a per-row factor) in
            ``p`` for :meth:`support`.
        """
        lse, topv, topi = _chunk_stats(z, k, p)
        return lse, topv, topi, None

    def support(self, z, p, lse, aux, safe, valid):
        """The log-probs at the support ids ``safe`` ``(c, S)`` and the tail's log-mass ``(c,)`` (−inf if empty);
        ``p`` as :meth:`stats` left it, overwritten. ``valid`` marks the real (not padding) slots."""
        return z.gather(1, safe).to(p.dtype) - lse[:, None], _tail_logprob(p, safe)

    def grad(self, z, out, coef, g_over_tail, g_new, new_lp, safe, valid, lse) -> torch.Tensor:
        """∂L/∂z for one chunk, written into ``out`` (``(c, V + dump_columns)``, :meth:`grad_dtype`); returns the
        ``(c, V)`` gradient. Derivation in :class:`_SparseFromLogits`: ``π_b · coef`` everywhere plus
        ``g_b − π_b · g_over_tail`` on the support.

        ``z`` and ``out`` have the logits' dtype, the other tensors the compute dtype. The dense term ``π_b · c_row``
        is computed in the logits' dtype: it is a gradient, which the bound does not depend on, and a bf16 model's
        logits gradient is bf16 (as clip's is). On the support the gradient is then overwritten with its value
        computed in the compute dtype and rounded once, so the terms that cancel there
        (``π_a · c_row + g_a − π_a · g_t / π_t``, e.g. at a sampled token of probability near 1) keep their
        precision.
        """
        grad = torch.softmax(z, dim=-1, out=out)  # π, recomputed (one fused kernel)
        grad.mul_(coef[:, None].to(grad.dtype))
        pi = torch.exp(new_lp)
        exact = pi * coef[:, None] + g_new - pi * g_over_tail[:, None]
        # padding slots point at the sampled token (_safe_ids), which is on the support exactly once: they take its
        # value, so every write to that entry agrees (a row without padding needs no such value)
        pad_id = safe.gather(1, (~valid).long().argmax(-1, keepdim=True))
        sampled_slot = (valid & (safe == pad_id)).long().argmax(-1, keepdim=True)
        exact = torch.where(valid, exact, exact.gather(1, sampled_slot))
        grad.scatter_(1, safe, exact.to(grad.dtype))
        return grad


_FULL_VOCABULARY = ChunkStatistics()


# ----------------------------------------------------------------------------------------------------------
# the old policy's sparse distribution (old-log-prob pass; no gradient)
# ----------------------------------------------------------------------------------------------------------
@torch.no_grad()
@full_precision
def old_topk_from_logits(
    logits: torch.Tensor,
    topk: int = 64,
    mass_delta: float = 1e-5,
    floor: float = 1e-12,
    value_dtype: torch.dtype = torch.float32,
    chunk_size: int | None = None,
    rows: torch.Tensor | None = None,
    statistics: ChunkStatistics = _FULL_VOCABULARY,
) -> OldTopK:
    """The old policy's top-K (mass rule) ids, log-probs and tail mass, streamed over token chunks.

    Args:
        logits: ``(N, V)`` logits of the old policy (temperature already applied).
        topk, mass_delta, floor: the support rule and the floor probability (TROLL §5).
        value_dtype: dtype to store the log-probs in (fp32, bf16 or fp16).
        chunk_size: tokens per chunk; None picks an eighth of the rows (at most 1 GiB of fp32). Only affects
            memory and speed, not results.
        rows: optional ``(N,)`` int64 indices of the rows of ``logits`` to process (e.g. response positions);
            default all rows.
        statistics: the per-chunk statistics of the logits' vocabulary layout (as in
            :func:`troll_sparse_from_logits`).

    Returns:
        :class:`OldTopK` with ``ids (N, K)`` int32, ``logprobs (N, K)`` and ``tail_logprob (N,)`` (fp32, or
        fp64 for fp64 logits), where ``K = min(topk, V)``.
    """
    fast = fast_path("old_topk") if statistics is _FULL_VOCABULARY else None
    if fast is not None:  # an extension's implementation (.fast_paths), where it serves these logits
        result = fast(logits, topk, mass_delta, floor, value_dtype, chunk_size, rows)
        if result is not None:
            return result
    check_logits(logits)
    check_support_args(topk, mass_delta, floor)
    V = logits.shape[1]
    N = logits.shape[0] if rows is None else check_rows(rows, logits.shape[0])
    k = min(topk, statistics.vocab_size(V))
    log_floor = math.log(floor)
    cdt = compute_dtype(logits.dtype)
    ids = torch.empty((N, k), dtype=torch.int32, device=logits.device)
    lps = torch.empty((N, k), dtype=value_dtype, device=logits.device)
    tail = torch.empty((N,), dtype=cdt, device=logits.device)
    step = _chunk_rows(N, V, chunk_size)
    ws = _Workspace(min(step, N), V, cdt, logits.device)
    for r0 in range(0, N, step):
        r1 = min(r0 + step, N)
        z = statistics.chunk(ws, logits, rows, slice(r0, r1))
        p = ws.get("p", r1 - r0, V + statistics.dump_columns)
        lse, topv, topi, aux = statistics.stats(z, k, p)
        lp = topv - lse[:, None]
        keep = mass_rule_mask(lp, mass_delta)
        _, tail[r0:r1] = statistics.support(z, p, lse, aux, torch.where(keep, topi, topi[:, :1]), keep)
        ids[r0:r1] = torch.where(keep, topi, -1).int()
        lps[r0:r1] = torch.where(keep, lp, log_floor).to(value_dtype)
    return OldTopK(ids, lps, tail.clamp_min(log_floor))


def old_topk_from_pass(
    ids: torch.Tensor,
    logprobs: torch.Tensor,
    tail_logprob: torch.Tensor,
    topk: int = 64,
    mass_delta: float = 1e-5,
    floor: float = 1e-12,
    value_dtype: torch.dtype = torch.float32,
) -> OldTopK:
    """TROLL's old top-K (the mass rule, TROLL §5) from a plain top-K the old-log-prob pass stored.

    Args:
        ids: ``(..., K')`` int vocabulary ids sorted by probability (verl's ``old_topk_ids``); the first
            ``min(topk, K')`` columns are used.
        logprobs: ``(..., K')`` their log-probs (``old_topk_log_probs``).
        tail_logprob: ``(...)`` log of the mass outside the K' ids, summed from the logits (``old_tail_log_prob``).
        topk, mass_delta, floor, value_dtype: as :func:`old_topk_from_logits`.

    Returns:
        :class:`OldTopK` as :func:`old_topk_from_logits` returns for the same logits: the first ``topk`` columns,
        ``-1`` / ``floor`` past the mass rule; the mass of every column not kept joins the tail.

    NOTE: the tail is ``log(tail' + Σ dropped)`` of the stored fp32 values, where :func:`old_topk_from_logits` sums
    it from the logits: equal up to fp32 rounding, not bit for bit.
    """
    k = min(topk, ids.shape[-1])  # the pass stores min(K', V) columns; the trainer checks K' >= topk
    lp = logprobs.float()
    keep = torch.zeros_like(lp, dtype=torch.bool)
    keep[..., :k] = mass_rule_mask(lp[..., :k], mass_delta)
    dropped = torch.logsumexp(torch.where(keep, float("-inf"), lp), dim=-1)
    tail = torch.logaddexp(tail_logprob.float(), dropped)
    log_floor = math.log(floor)
    ids_kept = torch.where(keep, ids.int(), -1)[..., :k]
    lps_kept = torch.where(keep, lp, log_floor)[..., :k].to(value_dtype)
    return OldTopK(ids_kept, lps_kept, tail.clamp_min(log_floor))


# ----------------------------------------------------------------------------------------------------------
# the current policy on the union support (update pass; differentiable, memory-lean)
# ----------------------------------------------------------------------------------------------------------
def _forward_chunk(statistics, z, p, k, mass_delta, log_floor, old_ids, old_lp, sampled, sampled_old_lp):
    """Everything the forward pass needs from one ``(c, V)`` chunk ``z`` of the current logits; ``p`` is a scratch
    buffer of the compute dtype, in which everything is returned: ``ids, old, valid, count, new, tail_raw, lse``."""
    lse, topv, topi, aux = statistics.stats(z, k, p)
    keep = mass_rule_mask(topv - lse[:, None], mass_delta)
    ids, old, valid, count = _union_support(old_ids, old_lp, topi, keep, sampled, sampled_old_lp, log_floor, p.dtype)
    safe = _safe_ids(ids, valid, sampled)
    new, tail_raw = statistics.support(z, p, lse, aux, safe, valid)
    return ids, old, valid, count, torch.where(valid, new, 0.0), tail_raw, lse


class _SparseFromLogits(torch.autograd.Function):
    """Gather the current policy's log-probs on the union support and its tail, lean in memory.

    Forward outputs ``new_lp (N, S)`` = z_a − LSE(z) on the support and ``tail (N,)`` = log Σ_{b∉S} softmax(z)_b.
    With upstream gradients g (support) and g_t (tail), π = softmax(z) and π_t the tail mass:

        tail = LSE_{b∉S}(z) − LSE(z)  ⇒  ∂tail/∂z_b = 1[b ∉ S] π_b / π_t − π_b,
        ∂L/∂z_b = π_b · (g_t / π_t − Σ_S g − g_t)  +  1[b ∈ S] · (g_b − π_b · g_t / π_t).

    The first term is dense but only needs softmax(z), recomputed per chunk by one fused kernel into a reused
    buffer; the second is a sparse scatter. Only ``logits`` (the caller's tensor, no copy) and ``O(N·S)``
    tensors are saved for backward.
    """

    @staticmethod
    @full_precision
    def forward(ctx, logits, rows, old_ids, old_lp, sampled, sampled_old_lp, k, mass_delta, log_floor, step, stats):
        """Chunked forward: union support, current log-probs on it and the tail (see the class docstring)."""
        V = logits.shape[1]
        N = logits.shape[0] if rows is None else rows.shape[0]
        cdt = compute_dtype(logits.dtype)
        dev = sampled.device
        C = old_ids.shape[1] + k + 1
        ids, old, valid, count, new, tail_raw, lse = bufs = (
            torch.empty((N, C), dtype=torch.long, device=dev),
            torch.empty((N, C), dtype=cdt, device=dev),
            torch.empty((N, C), dtype=torch.bool, device=dev),
            torch.zeros(N, dtype=torch.long, device=dev),
            torch.empty((N, C), dtype=cdt, device=dev),
            torch.empty(N, dtype=cdt, device=dev),
            torch.empty(N, dtype=cdt, device=dev),
        )
        ws = _Workspace(min(step, N), V, cdt, dev)
        for r0 in range(0, N, step):
            r1 = min(r0 + step, N)
            out = _forward_chunk(
                stats, stats.chunk(ws, logits, rows, slice(r0, r1)), ws.get("p", r1 - r0, V + stats.dump_columns),
                k, mass_delta, log_floor,
                old_ids[r0:r1], old_lp[r0:r1], sampled[r0:r1], sampled_old_lp[r0:r1],
            )  # fmt: skip
            for buf, val in zip(bufs, out, strict=True):
                buf[r0:r1] = val
        # trimmed to the widest union in the batch where reading it costs nothing; elsewhere the fixed width
        # K_old + K + 1, the unused slots masked (invalid)
        if host_reads(count):
            width = max(int(count.max().item()) if N > 0 else 1, 1)
            ids, old, valid, new = ids[:, :width], old[:, :width], valid[:, :width], new[:, :width]
        ctx.save_for_backward(logits, rows, ids, valid, new, tail_raw, sampled, lse)
        ctx.log_floor, ctx.step, ctx.statistics = log_floor, step, stats
        ctx.mark_non_differentiable(ids, old, valid)
        return new, tail_raw.clamp_min(log_floor), ids, old, valid

    @staticmethod
    @once_differentiable
    @full_precision
    def backward(ctx, g_new, g_tail, *_):
        """∂L/∂z written chunk by chunk into the gradient of the logits (derivation in the class docstring)."""
        logits, rows, ids, valid, new, tail_raw, sampled, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 11
        statistics = ctx.statistics
        V = logits.shape[1]
        N = logits.shape[0] if rows is None else rows.shape[0]
        cdt = new.dtype
        g_new = torch.zeros_like(new) if g_new is None else g_new.to(cdt)
        g_tail = torch.zeros_like(tail_raw) if g_tail is None else g_tail.to(cdt)
        g_tail_eff = torch.where(tail_raw > ctx.log_floor, g_tail, 0.0)  # the floor clamp has no gradient
        tiny = torch.finfo(cdt).tiny
        g_over_tail = torch.where(g_tail_eff != 0, g_tail_eff / torch.exp(tail_raw).clamp_min(tiny), 0.0)
        g_new = torch.where(valid, g_new, 0.0)
        coef = g_over_tail - g_new.sum(-1) - g_tail_eff
        safe = _safe_ids(ids, valid, sampled)
        grad = torch.empty_like(logits) if rows is None else torch.zeros_like(logits)
        gdt = statistics.grad_dtype(logits)
        # straight into the gradient where the rows are contiguous and the layout needs no scratch, else through a
        # chunk buffer
        in_place = rows is None and statistics.dump_columns == 0 and gdt == grad.dtype
        ws = _Workspace(min(ctx.step, N), V, cdt, sampled.device)
        for r0 in range(0, N, ctx.step):
            sl = slice(r0, min(r0 + ctx.step, N))
            out = grad[sl] if in_place else ws.get("g", sl.stop - sl.start, V + statistics.dump_columns, dtype=gdt)
            g = statistics.grad(
                statistics.chunk(ws, logits, rows, sl), out, coef[sl], g_over_tail[sl], g_new[sl], new[sl], safe[sl],
                valid[sl], lse[sl],
            )  # fmt: skip
            if not in_place:
                dest = rows[sl] if rows is not None else torch.arange(sl.start, sl.stop, device=grad.device)
                grad.index_copy_(0, dest, g.to(grad.dtype))
        return grad, None, None, None, None, None, None, None, None, None, None


def troll_sparse_from_logits(
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
    statistics: ChunkStatistics = _FULL_VOCABULARY,
) -> SparseSupport:
    """Both policies on ``supp(π_old) ∪ supp(π̃) ∪ {o_t}`` plus the tail bucket, from the current logits.

    Args:
        logits: ``(N, V)`` current logits (temperature applied), any float dtype; the gradient flows back here.
        sampled_ids: ``(N,)`` int sampled token ids o_t.
        old: the old policy's :class:`OldTopK` for the same N tokens.
        old_sampled_logprob: ``(N,)`` old log-prob of o_t (verl's ``old_log_probs``), exact.
        topk, mass_delta, floor: the support rule and floor (TROLL §5).
        chunk_size: tokens per chunk; None picks an eighth of the rows (at most 1 GiB of fp32). Only affects
            memory and speed, not results.
        rows: optional ``(N,)`` int64 indices of the rows of ``logits`` these N tokens are (e.g. the response
            positions of a packed sequence); the other rows get zero gradient. Default: all rows.
        old_estimate: old-side value of union tokens the old pass did not store: ``floor`` (the paper) or a
            registered estimate's name (see :func:`~troll_verl.core.old_side.old_side_estimate`).
        statistics: the per-chunk statistics of the logits' vocabulary layout; default the whole vocabulary on
            this rank (a backend that shards it passes its own, e.g. Megatron's vocabulary-parallel ones).

    Returns:
        :class:`SparseSupport` with ``(N, S + 1)`` fields (fp32, fp64 for fp64 logits), S the largest union
        size in the batch.
    """
    fast = fast_path("sparse_support") if statistics is _FULL_VOCABULARY else None
    if fast is not None:  # an extension's implementation (.fast_paths), where it serves these logits
        result = fast(
            logits, sampled_ids, old, old_sampled_logprob, topk=topk, mass_delta=mass_delta, floor=floor,
            chunk_size=chunk_size, rows=rows, old_estimate=old_estimate,
        )  # fmt: skip
        if result is not None:
            return result
    check_logits(logits)
    check_support_args(topk, mass_delta, floor)
    V = logits.shape[1]
    N = logits.shape[0] if rows is None else check_rows(rows, logits.shape[0])
    sampled = sampled_ids.long()
    check_sparse_inputs(N, sampled, old, old_sampled_logprob)
    log_floor = math.log(floor)
    step = _chunk_rows(N, V, chunk_size)
    new, tail, ids, old_u, valid = _SparseFromLogits.apply(
        logits, rows, old.ids, old.logprobs, sampled, old_sampled_logprob.detach(), min(topk, statistics.vocab_size(V)),
        mass_delta, log_floor, step, statistics,
    )  # fmt: skip
    return assemble_support(
        new, tail, ids, old_u, valid, old, sampled, old_sampled_logprob.detach(), floor, old_estimate
    )

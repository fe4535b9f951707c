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
"""Exact top-K, the mass rule, the union support and the exact tail, one program per row (TROLL §5).

After the statistics pass (:mod:`.stats`) has left each row's log-sum-exp and its 128-column chunks' maxima and
exp-sums, one kernel per pass finishes a row without another streaming read:

1. **Top-K by a chunk-max prefilter.** The K largest logits of a row lie in the ``KC = 2^⌈log2 K⌉`` chunks with the
   largest maxima: if a chunk outside them held one, the KC larger chunk maxima would be KC ≥ K distinct logits above
   it. So the exact top-K is taken over ``KC × 128`` candidates (8192 at K = 64) instead of V columns: a radix select
   on the logits' order-preserving integer keys (16 bit passes for bf16, 19 for fp16, 32 for fp32) finds the K-th
   largest key, the K winners are compacted and sorted. Ties pick the lowest column id among equal logits: ties
   change which tied id is chosen, never the values.
2. **Mass rule** (:func:`troll_verl.core.sparse.mass_rule_mask`): keep the sorted top tokens while the mass before
   them is below ``1 − δ``; the first always.
3. **Union** (update pass, as the torch path's in :mod:`troll_verl.core.sparse`): the old ids, the kept new ids and
   the sampled token, deduplicated with the old value of the most trusted source (sampled > old top-K > floor for a
   token only the current policy brought in), sorted by vocabulary id, padded to the fixed width
   ``C = K_old + K + 1``.
4. **Exact tail** ``log Σ_{b∉S} softmax(z)_b`` by additions only: every chunk without a support token contributes its
   stored exp-sum, and the chunks holding support tokens are re-read (at most |S| chunks of 128) and summed without
   them. A tail of 1e-9 next to a support of mass 1 − 1e-9 keeps its full relative precision.

NOTE: the union is not trimmed to the batch's largest support (``count.max().item()`` is a device sync): its width is
``K_old + K + 1`` with padding masked, and the values on the valid entries equal the torch path's. The mass rule's
cumulative sum is a parallel scan, so a row whose mass before an entry equals ``1 − δ`` to the last bit may keep one
entry more or less than the torch path's sequential sum.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import Launch, unused
from .stats import CHUNK, num_chunks, row_stats

__all__ = ["LOW_BITS", "TopKConfig", "topk_config", "old_topk", "old_topk_launch", "support_forward", "support_launch"]

# low bits of a logit's fp32 pattern that are zero for every value of the logits' dtype (the radix select skips them)
LOW_BITS = {torch.float32: 0, torch.bfloat16: 16, torch.float16: 13}
_SB = 8  # support tokens per block of the tail's chunk re-read
_RB = 16  # union candidates ranked per block


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


class TopKConfig:
    """The compile-time shape of one row's work: ``NC`` chunks (padded to ``NC_P2``), the ``KC`` top chunks, top-K
    padded to ``K_P2``, the old width padded to ``KO_P2`` and the union's ``C = KO + K + 1`` padded to ``C_P2``."""

    def __init__(self, vocab: int, k: int, ko: int):
        self.V, self.K, self.KO = vocab, k, ko
        self.NC = num_chunks(vocab)
        self.NC_P2 = _pow2(self.NC)
        self.K_P2 = _pow2(k)
        self.KC = min(self.K_P2, self.NC_P2)
        self.KO_P2 = _pow2(max(ko, 1))
        self.C = ko + k + 1
        self.C_P2 = max(_pow2(self.C), self.K_P2)
        self.SCR = self.KC + self.K_P2 + self.C_P2  # scratch per row: chunk ids | top-K positions | ids
        # warps per row: 16 spread the 1024+ chunk maxima of a large vocabulary; below that ptxas caps 16 warps at 64
        # registers and spills to the stack, 8 warps fit (tests/kernels/test_aot_compile_on_cpu.py)
        self.WARPS = 16 if self.NC_P2 >= 1024 else 8


def topk_config(vocab: int, k: int, ko: int = 0) -> TopKConfig:
    """The :class:`TopKConfig` for a vocabulary, a top-K and an old width."""
    return TopKConfig(vocab, k, ko)


# ------------------------------------------------------------------------------------------------------ helpers
@triton.jit
def _key(x):
    """fp32 → int32 with the same order (−0 just below +0)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _unkey(k):
    """Inverse of :func:`_key`."""
    b = tl.where(k < 0, k ^ 0x7FFFFFFF, k)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _top_mask(keys, valid, K, LOW_BIT: tl.constexpr):
    """1-D mask of exactly ``min(K, Σ valid)`` valid entries: every key above the K-th largest, then the first ties.

    Radix select: the K-th largest key is built bit by bit from the top, keeping a bit where at least K keys reach
    it; the ``LOW_BIT`` low bits (zero in every logit of a narrower dtype) are skipped.
    """
    u = ((keys ^ -2147483648).to(tl.uint32, bitcast=True)) >> LOW_BIT
    u = tl.where(valid, u, 0)
    bit = tl.full([], 1 << (31 - LOW_BIT), tl.uint32)
    t = tl.full([], 0, tl.uint32)
    for _ in range(0, 32 - LOW_BIT):
        cand = t | bit
        cnt = tl.sum((valid & (u >= cand)).to(tl.int32), axis=0)
        t = tl.where(cnt >= K, cand, t)
        bit = bit >> 1
    gt = valid & (u > t)
    eq = valid & (u == t)
    n_gt = tl.sum(gt.to(tl.int32), axis=0)
    rank = tl.cumsum(eq.to(tl.int32), axis=0)
    return gt | (eq & (rank <= K - n_gt))


@triton.jit
def _rank(keys, valid):
    """Each entry's position among the valid ``keys`` (distinct) in ascending order."""
    return tl.sum(((keys[None, :] < keys[:, None]) & valid[None, :]).to(tl.int32), axis=1)


@triton.jit
def _row_topk(
    z_row, cmax_row, scr_row, V, NC, K,
    KC: tl.constexpr, NC_P2: tl.constexpr, K_P2: tl.constexpr, CHUNK_: tl.constexpr, LOW_BIT: tl.constexpr,
):  # fmt: skip
    """The row's top-K logits, sorted descending: ``(values (K_P2,) fp32, columns (K_P2,) int32, valid (K_P2,))``.

    Ids and columns live in int32 registers (a vocabulary below 2^31); only row offsets are int64.
    """
    # the KC chunks with the largest maxima, compacted through the scratch row
    c = tl.arange(0, NC_P2)
    cvalid = c < NC
    cm = tl.load(cmax_row + c, mask=cvalid, other=0.0)
    csel = _top_mask(_key(cm), cvalid, KC, LOW_BIT)
    n_sel = tl.sum(csel.to(tl.int32), axis=0)
    cpos = tl.cumsum(csel.to(tl.int32), axis=0) - 1
    tl.store(scr_row + cpos, c.to(tl.int64), mask=csel)
    tl.debug_barrier()
    kc = tl.arange(0, KC)
    chunk = tl.load(scr_row + kc, mask=kc < n_sel, other=0).to(tl.int32)
    jj = tl.arange(0, CHUNK_)
    col = chunk[:, None] * CHUNK_ + jj[None, :]
    ok = (kc < n_sel)[:, None] & (col < V)
    x = tl.load(z_row + col, mask=ok, other=0.0).to(tl.float32)
    # the K largest candidates: their positions in the tile compacted (unordered) through the scratch row (only the
    # selection's keys stay live through the radix select), then their columns and logits looked up again
    sel = _top_mask(tl.reshape(_key(x), (KC * CHUNK_,)), tl.reshape(ok, (KC * CHUNK_,)), K, LOW_BIT)
    pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(scr_row + KC + pos, tl.arange(0, KC * CHUNK_).to(tl.int64), mask=sel)
    tl.debug_barrier()
    kk = tl.arange(0, K_P2)
    kvalid = kk < K
    flat = tl.load(scr_row + KC + kk, mask=kvalid, other=0).to(tl.int32)
    kcol = tl.load(scr_row + flat // CHUNK_, mask=kvalid, other=0).to(tl.int32) * CHUNK_ + flat % CHUNK_
    key = _key(tl.load(z_row + kcol, mask=kvalid, other=0.0).to(tl.float32))
    # by logit, then by lower column, ranked pairwise and placed by a one-hot reduction
    before = (key[None, :] > key[:, None]) | ((key[None, :] == key[:, None]) & (kcol[None, :] < kcol[:, None]))
    rank = tl.sum((before & kvalid[None, :]).to(tl.int32), axis=1)
    onehot = (rank[None, :] == kk[:, None]) & kvalid[None, :]
    vals = _unkey(tl.sum(tl.where(onehot, key[None, :], 0), axis=1))
    cols = tl.sum(tl.where(onehot, kcol[None, :], 0), axis=1)
    return vals, cols, kvalid


@triton.jit
def _mass_rule(vals, kvalid, lse, keep_mass, K_P2: tl.constexpr):
    """TROLL §5 on sorted values: ``(log-probs (K_P2,), keep (K_P2,))``; the first entry is always kept."""
    lp = vals - lse
    p = tl.where(kvalid, tl.exp(lp), 0.0)
    before = tl.cumsum(p, axis=0) - p
    keep = kvalid & ((before < keep_mass) | (tl.arange(0, K_P2) == 0))
    return lp, keep


@triton.jit
def _row_tail(
    z_row, cmax_row, csum_row, sids_row, count, V, NC, lse,
    S_P2: tl.constexpr, NC_P2: tl.constexpr, SB: tl.constexpr, CHUNK_: tl.constexpr,
):  # fmt: skip
    """``log Σ_{b∉S} exp(z_b − lse)`` for the ``count`` support ids at ``sids_row`` (sorted ascending), by additions
    only; overwrites the exp-sums of the chunks holding support tokens with 0."""
    tl.debug_barrier()  # the support ids were just written by this program
    i = tl.arange(0, S_P2)
    iv = i < count
    sid = tl.load(sids_row + i, mask=iv, other=0).to(tl.int32)
    sch = tl.where(iv, sid // CHUNK_, -1)
    tl.store(csum_row + sch, 0.0, mask=iv)
    tl.debug_barrier()
    # chunks without a support token: their stored exp-sums
    c = tl.arange(0, NC_P2)
    cv = c < NC
    cm = tl.load(cmax_row + c, mask=cv, other=float("-inf"))
    cs = tl.load(csum_row + c, mask=cv, other=0.0)
    outside = tl.sum(tl.where(cs > 0, cs * tl.exp(cm - lse), 0.0), axis=0)
    # chunks holding support tokens: re-read once (by the first support token in each), the support left out
    inside = tl.full([], 0.0, tl.float32)
    jj = tl.arange(0, CHUNK_)
    for b0 in range(0, count, SB):
        bi = b0 + tl.arange(0, SB)
        bv = bi < count
        bid = tl.load(sids_row + bi, mask=bv, other=0).to(tl.int32)
        bch = tl.where(bv, bid // CHUNK_, -1)
        has_prev = bv & (bi > 0)
        prev = tl.load(sids_row + bi - 1, mask=has_prev, other=0).to(tl.int32)
        owner = bv & (bch != tl.where(has_prev, prev // CHUNK_, -1))
        # support tokens in an owner's chunk: the run of positions from it with the same chunk
        n_le = tl.sum(((sch[None, :] <= bch[:, None]) & iv[None, :]).to(tl.int32), axis=1)
        max_run = tl.max(tl.where(owner, n_le - bi, 0), axis=0)
        col = bch[:, None] * CHUNK_ + jj[None, :]
        ok = owner[:, None] & (col < V)
        x = tl.load(z_row + col, mask=ok, other=float("-inf")).to(tl.float32)
        member = tl.zeros([SB, CHUNK_], dtype=tl.int32)
        for r in range(0, max_run):
            nb = bi + r
            nid = tl.load(sids_row + nb, mask=nb < count, other=-1).to(tl.int32)
            member = member | (col == nid[:, None]).to(tl.int32)
        e = tl.where(ok & (member == 0), tl.exp(x - lse), 0.0)
        inside += tl.sum(tl.sum(e, axis=1), axis=0)
    return tl.log(outside + inside)


@triton.jit
def _row_start(
    z_ptr,
    stride_z,
    rows_ptr,
    lse_ptr,
    cmax_ptr,
    csum_ptr,
    scr_ptr,
    V,
    NC,
    K,
    SCR,
    keep_mass,
    HAS_ROWS: tl.constexpr,
    KC: tl.constexpr,
    NC_P2: tl.constexpr,
    K_P2: tl.constexpr,
    CHUNK_: tl.constexpr,
    LOW_BIT: tl.constexpr,
):
    """What both passes do first for their program's row (parameters as the kernels'): locate the row and its
    statistics, take its sorted top-K and apply the mass rule. Returns ``(pid, pid64, z_row, lse, cmax_row, csum_row,
    scr_row, cols, kvalid, lp, keep)``: the row's pointers, the top-K's columns and valid slots, their log-probs and
    the mass rule's keep mask."""
    pid = tl.program_id(0)
    pid64 = pid.to(tl.int64)
    if HAS_ROWS:
        row = tl.load(rows_ptr + pid).to(tl.int64)
    else:
        row = pid64
    z_row = z_ptr + row * stride_z
    lse = tl.load(lse_ptr + pid)
    cmax_row = cmax_ptr + pid64 * NC
    csum_row = csum_ptr + pid64 * NC
    scr_row = scr_ptr + pid64 * SCR
    vals, cols, kvalid = _row_topk(z_row, cmax_row, scr_row, V, NC, K, KC, NC_P2, K_P2, CHUNK_, LOW_BIT)
    lp, keep = _mass_rule(vals, kvalid, lse, keep_mass, K_P2)
    return pid, pid64, z_row, lse, cmax_row, csum_row, scr_row, cols, kvalid, lp, keep


# ------------------------------------------------------------------------------------------------------ kernels
@triton.jit
def _old_topk_kernel(
    z_ptr,
    stride_z,
    rows_ptr,
    lse_ptr,
    cmax_ptr,
    csum_ptr,
    scr_ptr,
    ids_ptr,
    lps_ptr,
    tail_ptr,
    V,
    NC,
    K,
    SCR,
    keep_mass,
    log_floor,
    HAS_ROWS: tl.constexpr,
    KC: tl.constexpr,
    NC_P2: tl.constexpr,
    K_P2: tl.constexpr,
    C_P2: tl.constexpr,
    CHUNK_: tl.constexpr,
    LOW_BIT: tl.constexpr,
    SB: tl.constexpr,
):
    """The old pass: top-K ids (−1 past the mass rule), their log-probs (floor past it) and the clamped tail.

    Parameters:
        z_ptr: ``(N_all, V)`` logits (fp32/bf16/fp16), last dim contiguous.
        stride_z: the logits' row stride.
        rows_ptr: ``(N,)`` int64 logits row of each program (read with ``HAS_ROWS`` only).
        lse_ptr: ``(N,)`` fp32 log-sum-exp of the selected rows (:func:`.stats.row_stats`).
        cmax_ptr: ``(N, NC)`` fp32 chunk maxima.
        csum_ptr: ``(N, NC)`` fp32 chunk exp-sums; the chunks holding support tokens are overwritten with 0.
        scr_ptr: ``(N, SCR)`` int64 scratch per row: top chunk ids | top-K positions | sorted ids or candidates.
        ids_ptr: out ``(N, K)`` int32 top-K ids by descending logit, −1 past the mass rule.
        lps_ptr: out ``(N, K)`` their log-probs (the log-probs' dtype), ``log_floor`` past the mass rule.
        tail_ptr: out ``(N,)`` fp32 tail log-mass, clamped to ``log_floor``.
        V: vocabulary size.
        NC: chunks per row.
        K: the top-K.
        SCR: the scratch row's width.
        keep_mass: ``1 − δ``, the mass rule's threshold.
        log_floor: log of the floor probability.
        HAS_ROWS: programs read ``rows_ptr`` (else program ``i`` reads row ``i``).
        KC: the top chunks searched, ``min(K_P2, NC_P2)``.
        NC_P2: ``NC`` padded to a power of 2.
        K_P2: ``K`` padded to a power of 2.
        C_P2: the union's width padded (unused by this pass; shared with the update pass's configuration).
        CHUNK_: columns per chunk.
        LOW_BIT: low bits of the fp32 pattern that are zero in the logits' dtype (the radix select skips them).
        SB: support tokens per block of the tail's chunk re-read.
    """
    pid, pid64, z_row, lse, cmax_row, csum_row, scr_row, cols, kvalid, lp, keep = _row_start(
        z_ptr,
        stride_z,
        rows_ptr,
        lse_ptr,
        cmax_ptr,
        csum_ptr,
        scr_ptr,
        V,
        NC,
        K,
        SCR,
        keep_mass,
        HAS_ROWS,
        KC,
        NC_P2,
        K_P2,
        CHUNK_,
        LOW_BIT,
    )
    kk = tl.arange(0, K_P2)
    tl.store(ids_ptr + pid64 * K + kk, tl.where(keep, cols, -1).to(tl.int32), mask=kvalid)
    tl.store(lps_ptr + pid64 * K + kk, tl.where(keep, lp, log_floor), mask=kvalid)
    # the kept ids sorted by id, for the tail
    sids_row = scr_row + KC + K_P2
    tl.store(sids_row + _rank(cols, keep), cols, mask=keep)
    count = tl.sum(keep.to(tl.int32), axis=0)
    tail = _row_tail(z_row, cmax_row, csum_row, sids_row, count, V, NC, lse, K_P2, NC_P2, SB, CHUNK_)
    tl.store(tail_ptr + pid, tl.maximum(tail, log_floor))


@triton.jit
def _support_kernel(
    z_ptr,
    stride_z,
    rows_ptr,
    lse_ptr,
    cmax_ptr,
    csum_ptr,
    scr_ptr,
    old_ids_ptr,
    old_lp_ptr,
    sampled_ptr,
    sampled_old_lp_ptr,
    ids_ptr,
    old_ptr,
    valid_ptr,
    new_ptr,
    tail_ptr,
    V,
    NC,
    K,
    KO,
    C,
    SCR,
    keep_mass,
    log_floor,
    HAS_ROWS: tl.constexpr,
    KC: tl.constexpr,
    NC_P2: tl.constexpr,
    K_P2: tl.constexpr,
    KO_P2: tl.constexpr,
    C_P2: tl.constexpr,
    CHUNK_: tl.constexpr,
    LOW_BIT: tl.constexpr,
    SB: tl.constexpr,
    RB: tl.constexpr,
):
    """The update pass: the union support of a row (ids, old and new log-probs, mask) and its raw tail.

    Parameters:
        z_ptr: ``(N_all, V)`` logits (fp32/bf16/fp16), last dim contiguous.
        stride_z: the logits' row stride.
        rows_ptr: ``(N,)`` int64 logits row of each program (read with ``HAS_ROWS`` only).
        lse_ptr: ``(N,)`` fp32 log-sum-exp of the selected rows (:func:`.stats.row_stats`).
        cmax_ptr: ``(N, NC)`` fp32 chunk maxima.
        csum_ptr: ``(N, NC)`` fp32 chunk exp-sums; the chunks holding support tokens are overwritten with 0.
        scr_ptr: ``(N, SCR)`` int64 scratch per row: top chunk ids | top-K positions | sorted ids or candidates.
        old_ids_ptr: ``(N, KO)`` int stored old top-K ids, −1 at invalid slots.
        old_lp_ptr: ``(N, KO)`` their old log-probs.
        sampled_ptr: ``(N,)`` int64 sampled token ids.
        sampled_old_lp_ptr: ``(N,)`` the sampled tokens' exact old log-probs.
        ids_ptr: out ``(N, C)`` int64 union ids sorted ascending, −1 padding last.
        old_ptr: out ``(N, C)`` fp32 old log-probs (``log_floor`` for a token only the current policy brought in
            and at padding).
        valid_ptr: out ``(N, C)`` uint8 valid slots.
        new_ptr: out ``(N, C)`` fp32 current log-probs (0 at padding).
        tail_ptr: out ``(N,)`` fp32 unclamped tail log-mass.
        V: vocabulary size.
        NC: chunks per row.
        K: the current top-K.
        KO: the stored old width.
        C: the union's width, ``KO + K + 1``.
        SCR: the scratch row's width.
        keep_mass: ``1 − δ``, the mass rule's threshold.
        log_floor: log of the floor probability.
        HAS_ROWS: programs read ``rows_ptr`` (else program ``i`` reads row ``i``).
        KC: the top chunks searched, ``min(K_P2, NC_P2)``.
        NC_P2: ``NC`` padded to a power of 2.
        K_P2: ``K`` padded to a power of 2.
        KO_P2: ``KO`` padded to a power of 2.
        C_P2: ``C`` padded to a power of 2.
        CHUNK_: columns per chunk.
        LOW_BIT: low bits of the fp32 pattern that are zero in the logits' dtype (the radix select skips them).
        SB: support tokens per block of the tail's chunk re-read.
        RB: union candidates ranked per block.
    """
    pid, pid64, z_row, lse, cmax_row, csum_row, scr_row, cols, kvalid, lp, keep = _row_start(
        z_ptr,
        stride_z,
        rows_ptr,
        lse_ptr,
        cmax_ptr,
        csum_ptr,
        scr_ptr,
        V,
        NC,
        K,
        SCR,
        keep_mass,
        HAS_ROWS,
        KC,
        NC_P2,
        K_P2,
        CHUNK_,
        LOW_BIT,
    )
    # candidates: the old ids, the kept new ids, the sampled token; a duplicate keeps the most trusted source
    sampled = tl.load(sampled_ptr + pid).to(tl.int32)
    ko = tl.arange(0, KO_P2)
    kov = ko < KO
    oid = tl.load(old_ids_ptr + pid64 * KO + ko, mask=kov, other=-1).to(tl.int32)
    old_ok = kov & (oid >= 0) & (oid != sampled)
    in_old = tl.sum(((cols[:, None] == oid[None, :]) & (oid >= 0)[None, :]).to(tl.int32), axis=1)
    new_ok = keep & (cols != sampled) & (in_old == 0)
    kk = tl.arange(0, K_P2)
    cand_row = scr_row + KC + K_P2
    tl.store(cand_row + ko, tl.where(old_ok, oid, -1), mask=kov)
    tl.store(cand_row + KO + kk, tl.where(new_ok, cols, -1), mask=kvalid)
    tl.store(cand_row + KO + K, sampled)
    tl.debug_barrier()
    # the union sorted by id (each candidate's rank among the distinct survivors), padding after it
    p = tl.arange(0, C_P2)
    pv = p < C
    cand = tl.load(cand_row + p, mask=pv, other=-1).to(tl.int32)
    cv = cand >= 0
    count = tl.sum(cv.to(tl.int32), axis=0)
    out_row = pid64 * C
    pad = pv & (p >= count)
    tl.store(ids_ptr + out_row + p, tl.full([C_P2], -1, tl.int64), mask=pad)
    tl.store(old_ptr + out_row + p, tl.full([C_P2], 0.0, tl.float32) + log_floor, mask=pad)
    tl.store(valid_ptr + out_row + p, tl.full([C_P2], 0, tl.uint8), mask=pad)
    tl.store(new_ptr + out_row + p, tl.full([C_P2], 0.0, tl.float32), mask=pad)
    sampled_lp = tl.load(sampled_old_lp_ptr + pid).to(tl.float32)
    for b0 in range(0, C, RB):
        slot = b0 + tl.arange(0, RB)
        uid = tl.load(cand_row + slot, mask=slot < C, other=-1).to(tl.int32)
        uv = uid >= 0
        rank = tl.sum(((cand[None, :] < uid[:, None]) & cv[None, :]).to(tl.int32), axis=1)
        from_old = uv & (slot < KO)
        old_lp = tl.load(old_lp_ptr + pid64 * KO + slot, mask=from_old, other=0.0).to(tl.float32)
        oldv = tl.where(from_old, old_lp, tl.where(slot == KO + K, sampled_lp, log_floor))
        newv = tl.load(z_row + uid, mask=uv, other=0.0).to(tl.float32) - lse
        tl.store(ids_ptr + out_row + rank, uid, mask=uv)
        tl.store(old_ptr + out_row + rank, oldv, mask=uv)
        tl.store(valid_ptr + out_row + rank, tl.full([RB], 1, tl.uint8), mask=uv)
        tl.store(new_ptr + out_row + rank, newv, mask=uv)
    tail = _row_tail(z_row, cmax_row, csum_row, ids_ptr + pid64 * C, count, V, NC, lse, C_P2, NC_P2, SB, CHUNK_)
    tl.store(tail_ptr + pid, tail)


# ------------------------------------------------------------------------------------------------------ launchers
def _row_inputs(logits, rows, stats, cfg: TopKConfig, n: int) -> tuple[dict, dict]:
    """The parameters both top-K kernels take: the logits, the row selection, the statistics, the scratch; and the
    shared constexprs."""
    lse, cmax, csum = stats
    dev = logits.device
    args = dict(
        z_ptr=logits,
        stride_z=logits.stride(0),
        rows_ptr=unused(torch.int64, dev) if rows is None else rows.contiguous(),
        lse_ptr=lse,
        cmax_ptr=cmax,
        csum_ptr=csum,
        scr_ptr=torch.empty((n, cfg.SCR), dtype=torch.int64, device=dev),
    )
    constexprs = dict(
        HAS_ROWS=rows is not None,
        KC=cfg.KC,
        NC_P2=cfg.NC_P2,
        K_P2=cfg.K_P2,
        C_P2=cfg.C_P2,
        CHUNK_=CHUNK,
        LOW_BIT=LOW_BITS[logits.dtype],
        SB=_SB,
    )
    return args, constexprs


def old_topk_launch(logits, rows, k: int, mass_delta: float, log_floor: float, value_dtype: torch.dtype, stats):
    """The old top-K kernel's launch and its output buffers ``(ids, lps, tail)`` (arguments as :func:`old_topk`;
    ``stats``: the statistics pass's ``(lse, cmax, csum)`` of the same rows). Nothing runs: on ``meta`` tensors it
    gives the launch's signature."""
    n = logits.shape[0] if rows is None else rows.shape[0]
    cfg = topk_config(logits.shape[1], k)
    dev = logits.device
    ids = torch.empty((n, k), dtype=torch.int32, device=dev)
    lps = torch.empty((n, k), dtype=value_dtype, device=dev)
    tail = torch.empty(n, dtype=torch.float32, device=dev)
    args, constexprs = _row_inputs(logits, rows, stats, cfg, n)
    launch = Launch(
        _old_topk_kernel,
        (n,),
        dict(
            **args,
            ids_ptr=ids,
            lps_ptr=lps,
            tail_ptr=tail,
            V=cfg.V,
            NC=cfg.NC,
            K=k,
            SCR=cfg.SCR,
            keep_mass=1.0 - mass_delta,
            log_floor=log_floor,
        ),
        constexprs,
        cfg.WARPS,
    )
    return launch, (ids, lps, tail)


def old_topk(logits, rows, k: int, mass_delta: float, log_floor: float, value_dtype: torch.dtype):
    """The old pass on the selected rows (:func:`troll_verl.core.sparse.old_topk_from_logits`'s outputs).

    Args:
        logits: ``(N_all, V)`` fp32/bf16/fp16, last dim contiguous.
        rows: optional ``(N,)`` int64.
        k: the top-K (≤ V).
        mass_delta: δ.
        log_floor: log of the floor probability.
        value_dtype: the log-probs' dtype.

    Returns:
        ``(ids (N, k) int32, logprobs (N, k) value_dtype, tail (N,) fp32 clamped to log_floor)``.
    """
    n = logits.shape[0] if rows is None else rows.shape[0]
    if n == 0:
        return old_topk_launch(logits, rows, k, mass_delta, log_floor, value_dtype, (None, None, None))[1]
    lse, cmax, csum, _ = row_stats(logits, rows, chunk_stats=True)
    launch, outputs = old_topk_launch(logits, rows, k, mass_delta, log_floor, value_dtype, (lse, cmax, csum))
    launch()
    return outputs


def support_launch(logits, rows, old_ids, old_lp, sampled, sampled_old_lp, k: int, mass_delta: float,
                   log_floor: float, stats):  # fmt: skip
    """The support kernel's launch and its output buffers ``(ids, old, valid, new, tail)`` (arguments as
    :func:`support_forward`; ``stats``: the statistics pass's ``(lse, cmax, csum)`` of the same rows). Nothing runs:
    on ``meta`` tensors it gives the launch's signature."""
    n = logits.shape[0] if rows is None else rows.shape[0]
    ko = old_ids.shape[1]
    cfg = topk_config(logits.shape[1], k, ko)
    dev = logits.device
    ids = torch.empty((n, cfg.C), dtype=torch.int64, device=dev)
    old = torch.empty((n, cfg.C), dtype=torch.float32, device=dev)
    valid = torch.empty((n, cfg.C), dtype=torch.uint8, device=dev)
    new = torch.empty((n, cfg.C), dtype=torch.float32, device=dev)
    tail = torch.empty(n, dtype=torch.float32, device=dev)
    args, constexprs = _row_inputs(logits, rows, stats, cfg, n)
    launch = Launch(
        _support_kernel,
        (n,),
        dict(
            **args,
            old_ids_ptr=old_ids.contiguous(),
            old_lp_ptr=old_lp.contiguous(),
            sampled_ptr=sampled.contiguous(),
            sampled_old_lp_ptr=sampled_old_lp.contiguous(),
            ids_ptr=ids,
            old_ptr=old,
            valid_ptr=valid,
            new_ptr=new,
            tail_ptr=tail,
            V=cfg.V,
            NC=cfg.NC,
            K=k,
            KO=ko,
            C=cfg.C,
            SCR=cfg.SCR,
            keep_mass=1.0 - mass_delta,
            log_floor=log_floor,
        ),
        dict(**constexprs, KO_P2=cfg.KO_P2, RB=_RB),
        cfg.WARPS,
    )
    return launch, (ids, old, valid, new, tail)


def support_forward(logits, rows, old_ids, old_lp, sampled, sampled_old_lp, k: int, mass_delta: float,
                    log_floor: float):  # fmt: skip
    """The update pass's forward on the selected rows (the union, gathers and tail of the torch path's forward in
    :mod:`troll_verl.core.sparse`), at the fixed width ``C = K_old + k + 1``.

    Args:
        logits: ``(N_all, V)``.
        rows: optional ``(N,)`` int64.
        old_ids: ``(N, K_old)`` int (−1 invalid).
        old_lp: ``(N, K_old)``.
        sampled: ``(N,)`` int64.
        sampled_old_lp: ``(N,)``.
        k: the current top-K (≤ V).
        mass_delta: δ.
        log_floor: log of the floor probability.

    Returns:
        ``(ids (N, C) int64, old (N, C) fp32, valid (N, C) bool, new (N, C) fp32, tail_raw (N,) fp32, lse (N,) fp32)``;
        ids are sorted with −1 padding last, ``old`` is the floor and ``new`` 0 at padding, ``tail_raw`` unclamped.
    """
    n = logits.shape[0] if rows is None else rows.shape[0]
    args = (logits, rows, old_ids, old_lp, sampled, sampled_old_lp, k, mass_delta, log_floor)
    if n == 0:
        ids, old, valid, new, tail = support_launch(*args, (None, None, None))[1]
        return ids, old, valid.view(torch.bool), new, tail, torch.empty(0, dtype=torch.float32, device=logits.device)
    lse, cmax, csum, _ = row_stats(logits, rows, chunk_stats=True)
    launch, (ids, old, valid, new, tail) = support_launch(*args, (lse, cmax, csum))
    launch()
    return ids, old, valid.view(torch.bool), new, tail, lse

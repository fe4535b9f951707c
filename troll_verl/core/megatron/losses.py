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
"""Megatron backend: TROLL's sparse quantities from vocab-parallel logits (TROLL §5).

Under tensor parallelism each rank holds ``(rows, V/tp)`` logits for vocabulary ids ``[start, start + V/tp)``
(Megatron's equal partition). Every quantity TROLL needs is global but sparse, so a few small collectives suffice:

====================  =========================================================================================
max and LSE           all-reduce MAX of the row max, all-reduce SUM of Σ exp(z − m)
global top-K          local top-k, offset to global ids, all-gather, top-k again (as verl's top-K distillation)
support values        each rank gathers the union ids in its range, zeros elsewhere, all-reduce SUM
tail mass             each rank sums exp(z − m) outside the support ids it owns, all-reduce SUM
====================  =========================================================================================

The union, the projection and the loss are then identical on every TP rank. The backward pass needs no
collective: ∂L/∂z for the local shard is ``softmax(z)_b · c_row`` (global LSE saved) plus the sparse corrections
at the support ids this rank owns (see :class:`troll_verl.core.sparse._SparseFromLogits` for the derivation).
Out-of-range ids are written into a dump column so that scatters never collide. These per-chunk statistics are
:class:`VocabParallelStatistics`, a :class:`~troll_verl.core.sparse.ChunkStatistics`: the chunking, the mass rule,
the union, the old side and the backward pass's bookkeeping are the single-rank code's own.

Context parallelism: the engine-facing functions split TROLL's per-sequence tensors with verl's own
``preprocess_thd_engine`` / ``preprocess_bshd_engine`` (as verl's Megatron top-K distillation does), so they line up
with the engine's CP-split logits. The stored old top-K travels response-aligned, as on FSDP.

The entry points :func:`compute_troll_old_topk` and :func:`compute_troll_token_terms` have the same names and
signatures as in :mod:`..fsdp.losses`.
"""

import torch
import torch.distributed as dist
from tensordict import TensorDict

from ..config import TrollConfig
from ..layout import OLD_FIELDS, response_lengths, response_rows, response_values
from ..projection import compute_dtype
from ..sparse import ChunkStatistics, OldTopK, old_topk_from_logits, troll_sparse_from_logits
from ..terms import hook_outputs, troll_token_terms

__all__ = [
    "VocabParallelStatistics",
    "compute_troll_old_topk",
    "compute_troll_token_terms",
]


def _tp_group_info(group):
    rank = dist.get_rank(group) if group is not None else 0
    world = dist.get_world_size(group) if group is not None else 1
    return rank, world


def _all_reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def _all_gather_cat(t: torch.Tensor, group) -> torch.Tensor:
    """Concatenate ``t`` from every rank of ``group`` along the last dim (rank order)."""
    if group is None or dist.get_world_size(group) == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _vp_stats(z: torch.Tensor, k: int, p_full: torch.Tensor, group, start: int):
    """Global LSE and global top-k of one ``(c, V/tp)`` chunk; leaves exp(z − m) in ``p_full[:, :V/tp]``.

    Returns ``(lse (c,), m (c,), total (c,) = Σ_b exp(z_b − m) over the full vocabulary, topv, topi (c, k))``.
    """
    vp = z.shape[1]
    m = _all_reduce(z.amax(dim=-1), dist.ReduceOp.MAX, group)
    pv = p_full[:, :vp]
    torch.sub(z, m[:, None], out=pv).exp_()
    total = _all_reduce(pv.sum(dim=-1), dist.ReduceOp.SUM, group)
    lse = m + torch.log(total)
    topv, topi = torch.topk(z, min(k, vp), dim=-1, sorted=True)
    topv = _all_gather_cat(topv, group)
    topi = _all_gather_cat(topi + start, group)
    topv, pos = torch.topk(topv, k, dim=-1, sorted=True)
    return lse, m, total, topv, topi.gather(1, pos)


def _local_index(ids: torch.Tensor, valid: torch.Tensor, start: int, vp: int):
    """Local column of each global id on this shard, or the dump column ``vp`` when it lives elsewhere."""
    local = ids - start
    owned = valid & (local >= 0) & (local < vp)
    return torch.where(owned, local, vp), owned


def _vp_support_values(z, p_full, safe, valid, total, group, start):
    """Global logits at the support ids and the tail log-mass, by one all-reduce of the owned pieces."""
    vp = z.shape[1]
    idx, owned = _local_index(safe, valid, start, vp)
    zs = torch.where(owned, z.gather(1, idx.clamp(max=vp - 1)), 0.0)
    p_full.scatter_(1, idx, 0.0)  # zero the owned support entries of exp(z − m); the dump column absorbs the rest
    red = torch.cat([zs, p_full[:, :vp].sum(dim=-1, keepdim=True)], dim=1)
    red = _all_reduce(red, dist.ReduceOp.SUM, group)
    return red[:, :-1], torch.log(red[:, -1]) - torch.log(total)


class VocabParallelStatistics(ChunkStatistics):
    """The per-chunk statistics of this rank's vocabulary shard (see the module docstring); every other step of the
    sparse support is :mod:`troll_verl.core.sparse`'s. Pass it as ``statistics=`` to
    :func:`~troll_verl.core.sparse.old_topk_from_logits` and
    :func:`~troll_verl.core.sparse.troll_sparse_from_logits` with this rank's ``(N, V/tp)`` shard (Megatron's equal
    partition, rank-major) and global-id inputs, identical on every rank; their results are then identical on every
    rank, and gradients flow to this rank's shard.

    Args:
        group: the tensor-parallel process group (None: a single shard, i.e. the full vocabulary).
    """

    dump_columns = 1  # the column that absorbs scatters of ids another rank owns

    def __init__(self, group):
        self.group = group
        self.rank, self.world = _tp_group_info(group)

    def vocab_size(self, width: int) -> int:
        """The full vocabulary: ``width`` columns on each of the group's ranks."""
        return width * self.world

    def chunk(self, ws, logits, rows, sl):
        """The chunk in the compute dtype (the collectives and the shard's gradient run there)."""
        return ws.chunk(logits, rows, sl)

    def grad_dtype(self, logits):
        """The compute dtype (the gradient is rounded to the logits' dtype once, when written)."""
        return compute_dtype(logits.dtype)

    def stats(self, z, k, p):
        """Global LSE and global top-k by collectives; ``aux`` is Σ_b exp(z_b − m) over the full vocabulary."""
        lse, _, total, topv, topi = _vp_stats(z, k, p, self.group, self.rank * z.shape[1])
        return lse, topv, topi, total

    def support(self, z, p, lse, total, safe, valid):
        """Global log-probs at the support ids and the tail's log-mass, by one all-reduce of the owned pieces."""
        values, tail_raw = _vp_support_values(z, p, safe, valid, total, self.group, self.rank * z.shape[1])
        return values - lse[:, None], tail_raw

    def grad(self, z, out, coef, g_over_tail, g_new, new_lp, safe, valid, lse):
        """∂L/∂z for this shard of one chunk, into ``out[:, :V/tp]`` (``out`` has the dump column); no collective:
        the global LSE was saved."""
        vp = z.shape[1]
        grad = out[:, :vp]
        torch.sub(z, lse[:, None], out=grad).exp_().mul_(coef[:, None])  # π_b · c_row, global normalisation
        idx, owned = _local_index(safe, valid, self.rank * vp, vp)
        corr = torch.where(owned, g_new - torch.exp(new_lp) * g_over_tail[:, None], 0.0)
        out[:, vp] = 0.0
        out.scatter_add_(1, idx, corr.to(out.dtype))
        return grad


# ------------------------------------------------------------------------------------------------------------
# verl's Megatron engine hook
# ------------------------------------------------------------------------------------------------------------
def _tp_group():
    from megatron.core import parallel_state as mpu

    return mpu.get_tensor_model_parallel_group() if mpu.get_tensor_model_parallel_world_size() > 1 else None


def _cp_split(nested: torch.Tensor, data_format: str) -> torch.Tensor:
    """Split a nested per-sequence ``(bsz, j, ...)`` tensor the way verl splits the Megatron engine's inputs."""
    from verl.models.mcore.util import preprocess_bshd_engine, preprocess_thd_engine

    if data_format == "thd":
        split, *_ = preprocess_thd_engine(nested, pre_process=True)
    else:
        split, *_ = preprocess_bshd_engine(nested, pre_process=True)
    return split


def _full_sequence(data: TensorDict, values: torch.Tensor, fill) -> torch.Tensor:
    """Nested ``(bsz, prompt+response, ...)`` tensor holding response-aligned ``values`` at the rows predicting each
    response token (row p predicts token p+1) and ``fill`` elsewhere."""

    offsets = data["input_ids"].offsets()
    full = torch.full((int(offsets[-1]), *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
    full[response_rows(data).to(values.device)] = values
    return torch.nested.nested_tensor_from_jagged(full, offsets.to(values.device))


def _local_rows(data: TensorDict, n_local: int, data_format: str, device):
    """This CP rank's response rows: ``(local row indices, their positions in response-aligned order)``."""

    n_resp = response_rows(data).shape[0]
    order = torch.arange(1, n_resp + 1, dtype=torch.long, device=device)  # 1-based so padding (0) is distinct
    split = _cp_split(_full_sequence(data, order, 0), data_format).reshape(-1)[:n_local]
    local_rows = (split > 0).nonzero().squeeze(1)
    return local_rows, split[local_rows] - 1


@torch.no_grad()
def compute_troll_old_topk(
    student_logits: torch.Tensor, data: TensorDict, cfg: TrollConfig, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """Old policy's top-K at every response row of this CP/TP shard, as per-row outputs for verl's hook.

    Args:
        student_logits: ``(1, L, V/tp)`` vocab-parallel, temperature-scaled logits of this CP shard.
        data: the micro-batch. cfg: TROLL settings. data_format: ``"thd"`` or ``"bshd"`` (verl's).

    Returns:
        ``{"troll_old_ids": (1, L, K) int32 (-1 off response rows), "troll_old_logprobs": (1, L, K),
        "troll_old_tail": (1, L)}``; verl gathers the CP shards, nests them per sequence (full length) and keeps
        the response rows.
    """
    logits = student_logits.reshape(-1, student_logits.shape[-1])
    local_rows, _ = _local_rows(data, logits.shape[0], data_format, logits.device)
    old = old_topk_from_logits(
        logits, topk=cfg.topk, mass_delta=cfg.mass_delta, floor=cfg.floor, value_dtype=cfg.value_dtype,
        chunk_size=cfg.chunk_size, rows=local_rows, statistics=VocabParallelStatistics(_tp_group()),
    )  # fmt: skip
    L, k = logits.shape[0], old.ids.shape[1]
    ids = torch.full((L, k), -1, dtype=torch.int32, device=logits.device).index_copy_(0, local_rows, old.ids)
    lps = torch.zeros((L, k), dtype=old.logprobs.dtype, device=logits.device).index_copy_(0, local_rows, old.logprobs)
    tail = torch.zeros(L, dtype=torch.float32, device=logits.device).index_copy_(
        0, local_rows, old.tail_logprob.float()
    )
    return {"troll_old_ids": ids[None], "troll_old_logprobs": lps[None], "troll_old_tail": tail[None]}


def compute_troll_token_terms(
    student_logits: torch.Tensor, data: TensorDict, cfg: TrollConfig, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """TROLL's per-token terms for this CP/TP shard (update pass), as per-row outputs for verl's hook.

    Args: as in :func:`compute_troll_old_topk`; ``data`` carries the response-aligned ``troll_old_*`` fields and
    ``old_log_probs``.

    Returns:
        ``{"log_probs": (1, L), "troll_<field>": (1, L) for every other TrollTokenTerms field,
        "troll_solver_iters": (1, L)}``, identical on every TP rank.
    """

    logits = student_logits.reshape(-1, student_logits.shape[-1])
    L = logits.shape[0]
    local_rows, order = _local_rows(data, L, data_format, logits.device)
    lengths = response_lengths(data)
    rows = response_rows(data).to(logits.device)
    sampled = data["input_ids"].values().to(logits.device)[rows + 1][order]
    old = OldTopK(*(response_values(data[k], lengths)[order] for k in OLD_FIELDS))
    old_sampled = response_values(data["old_log_probs"], lengths)[order].to(torch.float32)
    support = troll_sparse_from_logits(
        logits, sampled, old, old_sampled, topk=cfg.topk, mass_delta=cfg.mass_delta, floor=cfg.floor,
        chunk_size=cfg.chunk_size, rows=local_rows, old_estimate=cfg.old_estimate,
        statistics=VocabParallelStatistics(_tp_group()),
    )  # fmt: skip
    terms, iters = troll_token_terms(support, cfg)
    return hook_outputs(terms, iters, local_rows, L, student_logits.shape[:-1])

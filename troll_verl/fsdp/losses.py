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
"""FSDP/FSDP2 backend: TROLL's sparse quantities from the logits inside verl's engine (TROLL §5).

verl's FSDP engine hands a logits processor the temperature-scaled logits of one micro-batch as
``student_logits`` of shape ``(1, L, V)``: the packed (remove-padding) sequence, or the concatenation of the
unpadded sequences, and under Ulysses sequence parallelism this rank's shard of the padded packed sequence
(``L = ceil(nnz / sp)``). Row ``p`` of the packed sequence predicts token ``p + 1``.

Only response-predicting rows matter to TROLL. Their global packed indices come from the nested
``input_ids``/``response_mask`` of the micro-batch; the old policy's data is stored response-aligned, i.e. in
exactly that row order (as verl stores ``old_log_probs``).

Both functions here have the same name and signature in :mod:`troll_verl.megatron.losses`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils.ulysses import (
    get_ulysses_sequence_parallel_group,
    get_ulysses_sequence_parallel_rank,
    get_ulysses_sequence_parallel_world_size,
)

from ..config import TrollPolicyLossConfig
from ..layout import OLD_FIELDS, response_lengths, response_rows, response_values
from ..losses import troll_token_terms
from ..sparse import OldTopK, old_topk_from_logits, troll_sparse_from_logits

__all__ = ["OLD_PASS_THROUGH_HOOK", "compute_troll_old_topk", "compute_troll_token_terms"]

# FSDP's logits hook only carries per-row scalars: the K-wide old top-K is attached in the final loss call.
OLD_PASS_THROUGH_HOOK = False


def _local(rows: torch.Tensor, n_local: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This SP rank's share of ``rows``: ``(local row indices, positions in rows)``."""
    sp = get_ulysses_sequence_parallel_world_size()
    if sp <= 1:
        return rows, torch.arange(rows.shape[0], device=rows.device)
    lo = get_ulysses_sequence_parallel_rank() * n_local
    sel = ((rows >= lo) & (rows < lo + n_local)).nonzero().squeeze(1)
    return rows[sel] - lo, sel


def _assemble_sp(local: torch.Tensor, sel: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Scatter this rank's rows into a full ``(n_rows, ...)`` tensor and sum over the SP group (each row has
    exactly one owner, so the sum is exact)."""
    if get_ulysses_sequence_parallel_world_size() <= 1:
        return local
    reduce_dtype = torch.float32 if local.is_floating_point() else local.dtype
    full = torch.zeros((n_rows, *local.shape[1:]), dtype=reduce_dtype, device=local.device)
    full[sel] = local.to(reduce_dtype)
    dist.all_reduce(full, op=dist.ReduceOp.SUM, group=get_ulysses_sequence_parallel_group())
    return full.to(local.dtype)


@torch.no_grad()
def compute_troll_old_topk(
    student_logits: torch.Tensor, data: TensorDict, cfg: TrollPolicyLossConfig, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """The old policy's sparse distribution at every response position (old-log-prob pass).

    Args:
        student_logits: ``(1, L, V)`` temperature-scaled logits of this rank's shard.
        data: the micro-batch.
        cfg: TROLL settings (``topk``, ``mass_delta``, ``floor``, ``old_value_dtype``, ``chunk_size``).
        data_format: unused on FSDP (the packed layout is implied); kept for the Megatron backend's signature.

    Returns:
        Response-aligned ``{"troll_old_ids": (R, K) int32, "troll_old_logprobs": (R, K), "troll_old_tail":
        (R,) fp32}``, identical on every SP rank.
    """
    logits = student_logits.squeeze(0)
    rows = response_rows(data).to(logits.device)
    local_rows, sel = _local(rows, logits.shape[0])
    old = old_topk_from_logits(
        logits, topk=cfg.topk, mass_delta=cfg.mass_delta, floor=cfg.floor, value_dtype=cfg.value_dtype,
        chunk_size=cfg.chunk_size, rows=local_rows,
    )  # fmt: skip
    n = rows.shape[0]
    return {
        "troll_old_ids": _assemble_sp(old.ids, sel, n),
        "troll_old_logprobs": _assemble_sp(old.logprobs, sel, n),
        "troll_old_tail": _assemble_sp(old.tail_logprob.float(), sel, n),
    }


def compute_troll_token_terms(
    student_logits: torch.Tensor, data: TensorDict, cfg: TrollPolicyLossConfig, data_format: str = "thd"
) -> tuple[dict[str, torch.Tensor], int]:
    """TROLL's per-token terms for this rank's shard (update pass), as per-row outputs for verl's hook.

    Args:
        student_logits: ``(1, L, V)`` temperature-scaled logits of this rank's shard (with gradient).
        data: the micro-batch, carrying the old pass's ``troll_old_*`` fields and ``old_log_probs``.
        cfg: TROLL settings.
        data_format: unused on FSDP.

    Returns:
        ``({"troll_<field>": (1, L)} for every :class:`~troll_verl.losses.TrollTokenTerms` field, solver
        iterations)``. Rows that do not predict a response token hold 0. verl gathers the shards and nests
        them per sequence.
    """
    missing = [k for k in (*OLD_FIELDS, "old_log_probs") if k not in data.keys()]
    if missing:
        raise ValueError(
            f"TROLL's update pass needs {missing} from the old-log-prob pass; they are written only when the "
            "old log-probs are recomputed by the actor (TROLL's trainer does this; rollout_correction.bypass_mode "
            "is not supported)."
        )
    logits = student_logits.squeeze(0)
    L = logits.shape[0]
    rows = response_rows(data).to(logits.device)
    local_rows, sel = _local(rows, L)
    sampled = data["input_ids"].values().to(logits.device)[rows[sel] + 1]
    lengths = response_lengths(data)
    old = OldTopK(*(response_values(data[k], lengths)[sel] for k in OLD_FIELDS))
    old_sampled = response_values(data["old_log_probs"], lengths)[sel].to(torch.float32)
    support = troll_sparse_from_logits(
        logits, sampled, old, old_sampled, topk=cfg.topk, mass_delta=cfg.mass_delta, floor=cfg.floor,
        chunk_size=cfg.chunk_size, rows=local_rows, old_estimate=cfg.old_estimate,
    )  # fmt: skip
    terms, iters = troll_token_terms(support, cfg)
    out = {}
    for name, value in zip(terms._fields, terms, strict=True):
        full = torch.zeros(L, dtype=value.dtype, device=value.device).index_put((local_rows,), value)
        out[f"troll_{name}"] = full.unsqueeze(0)
    return out, iters

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

verl's FSDP engine hands a logits hook the temperature-scaled logits of one micro-batch, ``(1, L, V)``: the packed
(remove-padding) sequence, or the concatenation of the unpadded sequences, and under Ulysses sequence parallelism
this rank's shard of the padded packed sequence (``L = ceil(nnz / sp)``). Row ``p`` of the packed sequence
predicts token ``p + 1``. The hook returns one value per row; verl gathers the shards and nests them per sequence.

Only response-predicting rows matter to TROLL. Their global packed indices come from the nested
``input_ids``/``response_mask`` of the micro-batch; the old policy's data is stored response-aligned, i.e. in
exactly that row order (as verl stores ``old_log_probs``).

Both functions here have the same name and signature in :mod:`..megatron.losses`.
"""

import torch
from tensordict import TensorDict
from verl.utils.ulysses import (
    get_ulysses_sequence_parallel_rank,
    get_ulysses_sequence_parallel_world_size,
)

from ..config import TrollConfig
from ..layout import OLD_FIELDS, response_lengths, response_rows, response_values
from ..sparse import OldTopK, old_topk_from_logits, troll_sparse_from_logits
from ..terms import hook_outputs, troll_token_terms

__all__ = [
    "compute_troll_old_topk",
    "compute_troll_token_terms",
]


def _local(rows: torch.Tensor, n_local: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This SP rank's share of ``rows``: ``(local row indices, positions in rows)``."""
    sp = get_ulysses_sequence_parallel_world_size()
    if sp <= 1:
        return rows, torch.arange(rows.shape[0], device=rows.device)
    lo = get_ulysses_sequence_parallel_rank() * n_local
    sel = ((rows >= lo) & (rows < lo + n_local)).nonzero().squeeze(1)
    return rows[sel] - lo, sel


def _per_row(values: torch.Tensor, local_rows: torch.Tensor, n_rows: int, fill=0) -> torch.Tensor:
    """``(1, n_rows, ...)``: ``values`` at ``local_rows``, ``fill`` elsewhere."""
    full = torch.full((n_rows, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
    return full.index_copy_(0, local_rows, values).unsqueeze(0)


@torch.no_grad()
def compute_troll_old_topk(
    student_logits: torch.Tensor, data: TensorDict, cfg: TrollConfig, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """The old policy's sparse distribution at every response row of this rank (old-log-prob pass).

    Args:
        student_logits: ``(1, L, V)`` temperature-scaled logits of this rank's shard.
        data: the micro-batch.
        cfg: TROLL settings (``topk``, ``mass_delta``, ``floor``, ``old_value_dtype``, ``chunk_size``).
        data_format: unused on FSDP (the packed layout is implied); kept for the Megatron backend's signature.

    Returns:
        ``{"troll_old_ids": (1, L, K) int32, "troll_old_logprobs": (1, L, K), "troll_old_tail": (1, L) fp32}``,
        one row per logits row; rows that do not predict a response token hold -1 / 0.
    """
    logits = student_logits.squeeze(0)
    n_rows = logits.shape[0]
    local_rows, _ = _local(response_rows(data).to(logits.device), n_rows)
    old = old_topk_from_logits(
        logits, topk=cfg.topk, mass_delta=cfg.mass_delta, floor=cfg.floor, value_dtype=cfg.value_dtype,
        chunk_size=cfg.chunk_size, rows=local_rows,
    )  # fmt: skip
    return {
        "troll_old_ids": _per_row(old.ids, local_rows, n_rows, fill=-1),
        "troll_old_logprobs": _per_row(old.logprobs, local_rows, n_rows),
        "troll_old_tail": _per_row(old.tail_logprob.float(), local_rows, n_rows),
    }


def compute_troll_token_terms(
    student_logits: torch.Tensor, data: TensorDict, cfg: TrollConfig, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """TROLL's per-token terms for this rank's shard (update pass), one value per logits row.

    Args:
        student_logits: ``(1, L, V)`` temperature-scaled logits of this rank's shard (with gradient).
        data: the micro-batch, carrying the old pass's ``troll_old_*`` fields and ``old_log_probs``.
        cfg: TROLL settings.
        data_format: unused on FSDP.

    Returns:
        ``{"log_probs": (1, L), "troll_<field>": (1, L) for every other TrollTokenTerms field,
        "troll_solver_iters": (1, L)}``; rows that do not predict a response token hold 0.
    """
    missing = [k for k in (*OLD_FIELDS, "old_log_probs") if k not in data.keys()]
    if missing:
        raise ValueError(
            f"TROLL's update pass needs {missing} from the old-log-prob pass; they are written only when the "
            "old log-probs are recomputed by the actor (rollout_correction.bypass_mode is not supported)."
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
    return hook_outputs(terms, iters, local_rows, L, (1, L))

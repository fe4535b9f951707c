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
"""Where TROLL's per-token data sits in verl's micro-batches; shared by the loss closure and every backend.

The old-log-prob pass stores the old policy's top-K *response-aligned*, next to verl's ``old_log_probs``: one row
per response token, sequence by sequence (:data:`OLD_FIELDS`). In a packed (remove-padding) sequence the row that
predicts response token ``j`` of sequence ``i`` is ``start_i + prompt_len_i − 1 + j`` (:func:`response_rows`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

__all__ = ["OLD_FIELDS", "OLD_TOPK_KEYS", "response_lengths", "response_values", "response_rows"]

# Response-aligned fields written by the old-log-prob pass: ids (R, K) int32, logprobs (R, K), tail (R,) fp32.
OLD_FIELDS = ("troll_old_ids", "troll_old_logprobs", "troll_old_tail")
# verl's named old-pass output where it has one (actor.calculate_old_topk = K; upstream/ PR C): the plain top-K ids
# (R, K) int32, their log-probs (R, K) and the log tail mass (R,), response-aligned as OLD_FIELDS; TROLL's update
# hook derives OLD_FIELDS from them (troll_verl.core.losses.troll_old_fields).
OLD_TOPK_KEYS = ("old_topk_ids", "old_topk_log_probs", "old_tail_log_prob")


def response_lengths(data: TensorDict) -> torch.Tensor:
    """``(bsz,)`` response lengths: from a nested ``response_mask`` (verl's v1 trainer), or, for left/right padded
    batches, from ``attention_mask`` over the response columns (as verl's ``no_padding_2_padding`` does)."""
    response_mask = data["response_mask"]
    if response_mask.is_nested:
        return response_mask.offsets().diff()
    n_prompt = data["prompts"].shape[1]
    return data["attention_mask"][:, n_prompt:].sum(-1)


def response_values(tensor: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Response-aligned values ``(R, ...)`` of a nested ``(bsz, j, ...)`` or padded ``(bsz, T, ...)`` tensor."""
    if tensor.is_nested:
        return tensor.values()
    return torch.cat([tensor[i, : int(n)] for i, n in enumerate(lengths)], dim=0)


def response_rows(data: TensorDict) -> torch.Tensor:
    """Global packed row index of every response-predicting position of a micro-batch.

    Args:
        data: micro-batch with nested ``input_ids`` ``(bsz, prompt+response)`` and ``response_mask``.

    Returns:
        ``(R,)`` int64, R the number of response tokens, in the order verl stores response-aligned fields:
        sequence ``i``'s response token ``j`` is predicted by packed row ``start_i + prompt_len_i − 1 + j``.
    """
    offsets = data["input_ids"].offsets()
    resp_lens = response_lengths(data).to(offsets.device)
    seq_lens = offsets.diff()
    if bool((seq_lens - resp_lens < 1).any()):
        raise ValueError("every sequence needs at least one prompt token before its response")
    first = offsets[:-1] + seq_lens - resp_lens - 1
    base = torch.repeat_interleave(first, resp_lens)
    resp_starts = torch.repeat_interleave(torch.cumsum(resp_lens, 0) - resp_lens, resp_lens)
    return base + torch.arange(base.shape[0], device=base.device) - resp_starts

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
"""The old policy's sparse distribution from the inference engine's top-K log-probs (bypass mode; no verl, no vLLM).

In bypass mode the distribution TROLL projects around is the rollout policy μ itself: the inference engine returns,
per generated token, the K most likely tokens and their log-probs (vLLM: ``SamplingParams(logprobs=K)`` with
``logprobs_mode=processed_logprobs``, i.e. after temperature). This module turns those into exactly what the actor's
old-log-prob pass stores (:func:`troll_verl.core.sparse.old_topk_from_logits`), so TROLL's update cannot tell the two
sources apart:

- ids ``(R, K)`` int32 sorted by probability, ``-1`` past the mass rule (TROLL §5: keep tokens until their mass
  reaches ``1 − δ``);
- log-probs ``(R, K)``, ``log(floor)`` past the mass rule;
- the tail ``log(1 − Σ_kept p)``, clamped to ``log(floor)``.

NOTE: the actor computes the tail exactly, summing the softmax outside the support; the engine only returns the
top-K, so here it is ``1 − Σ_kept p`` in float64 from fp32 log-probs. Below ~1e-6 that difference is rounding noise
(absolute error ≲ K·6e-8), which moves a token's KL by ~1e-6, far below any useful ``kl_bound``; the clamp keeps the
log finite when rounding makes it negative.

It also aligns the engine's per-token arrays with verl's response (:func:`align_rollout_topk`): truncated responses
keep their first rows, verl's synthetic padding samples get a point mass on their token, and anything else that does
not line up is refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from troll_verl.core.sparse import mass_rule_mask
from troll_verl.core.support import OldTopK, check_support_args

__all__ = [
    "old_topk_from_rollout",
    "topk_arrays_from_logprobs",
    "align_rollout_topk",
    "point_mass_rows",
    "RolloutTopKError",
]


class RolloutTopKError(ValueError):
    """The engine's top-K arrays do not line up with verl's response (the message names the cause and the fix)."""


def old_topk_from_rollout(
    ids: torch.Tensor,
    logprobs: torch.Tensor,
    topk: int = 64,
    mass_delta: float = 1e-5,
    floor: float = 1e-12,
    value_dtype: torch.dtype = torch.float32,
) -> OldTopK:
    """The old policy's stored top-K from the engine's top-K (TROLL §5's mass rule and tail, as the actor's pass).

    Args:
        ids: ``(N, K_e)`` int token ids the engine returned per position (any order; ``K_e >= 1``).
        logprobs: ``(N, K_e)`` their log-probs, normalised over the whole vocabulary.
        topk, mass_delta, floor: the support rule and the floor probability; only the ``min(topk, K_e)`` most likely
            entries are kept.
        value_dtype: dtype to store the log-probs in.

    Returns:
        :class:`~troll_verl.core.sparse.OldTopK` with ``ids (N, K)`` int32, ``logprobs (N, K)`` in ``value_dtype`` and
        ``tail_logprob (N,)`` fp32, ``K = min(topk, K_e)``.
    """
    check_support_args(topk, mass_delta, floor)
    if ids.dim() != 2 or ids.shape != logprobs.shape or ids.shape[1] < 1:
        raise ValueError(
            f"ids and logprobs must be (N, K) with K >= 1 and equal shapes, got {tuple(ids.shape)} and "
            f"{tuple(logprobs.shape)}."
        )
    if ids.is_floating_point() or not logprobs.is_floating_point():
        raise ValueError("ids must be an integer tensor and logprobs a floating one.")
    k = min(topk, ids.shape[1])
    log_floor = math.log(floor)
    lp64 = logprobs.to(torch.float64)
    sorted_lp, order = torch.sort(lp64, dim=-1, descending=True, stable=True)
    sorted_lp, order = sorted_lp[:, :k], order[:, :k]
    sorted_ids = ids.long().gather(1, order)
    keep = mass_rule_mask(sorted_lp, mass_delta)
    kept_mass = torch.where(keep, sorted_lp.exp(), 0.0).sum(-1)
    tail = torch.log((1.0 - kept_mass).clamp_min(floor))
    return OldTopK(
        torch.where(keep, sorted_ids, -1).to(torch.int32),
        torch.where(keep, sorted_lp, log_floor).to(value_dtype),
        tail.to(torch.float32),
    )


def topk_arrays_from_logprobs(position_logprobs: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` ids and log-probs per position of an engine's sample log-probs, as ``(T, k)`` numpy arrays.

    Args:
        position_logprobs: vLLM's ``CompletionOutput.logprobs`` for a request made with ``logprobs=k``: either a
            ``FlatLogprobs`` (``flat_logprobs=True``: per position the sampled token first, then ranks 1..k, no
            de-duplication) or a list of ``{token_id: Logprob(logprob, rank)}`` dicts (the sampled token may also
            be one of the ranked ones); None or empty for no tokens.
        k: how many ranked entries each position must carry.

    Returns:
        ``ids (T, k)`` int32 and ``logprobs (T, k)`` float32, rank order.

    Raises:
        RolloutTopKError: when a position carries fewer than ``k`` ranked entries.
    """
    if position_logprobs is None or len(position_logprobs) == 0:
        return np.zeros((0, k), dtype=np.int32), np.zeros((0, k), dtype=np.float32)
    starts = getattr(position_logprobs, "start_indices", None)
    if starts is not None:  # FlatLogprobs: fixed k + 1 entries per position
        n = len(starts)
        widths = np.asarray(position_logprobs.end_indices) - np.asarray(starts)
        if not (widths == k + 1).all():
            raise RolloutTopKError(
                f"the engine returned {sorted(set(widths.tolist()))} log-prob entries per position, expected {k + 1} "
                f"(the sampled token and the top {k}); the request's logprobs was not {k} (another plugin or a vLLM "
                "change altered TROLL's request). Check the rollout server class, or set "
                "algorithm.rollout_correction.bypass_mode=false (the actor recomputes the old distribution)."
            )
        ids = np.asarray(position_logprobs.token_ids, dtype=np.int32).reshape(n, k + 1)[:, 1:]
        lps = np.asarray(position_logprobs.logprobs, dtype=np.float32).reshape(n, k + 1)[:, 1:]
        return np.ascontiguousarray(ids), np.ascontiguousarray(lps)
    ids = np.empty((len(position_logprobs), k), dtype=np.int32)
    lps = np.empty((len(position_logprobs), k), dtype=np.float32)
    for t, entries in enumerate(position_logprobs):
        ranked = sorted((e.rank, tok, e.logprob) for tok, e in (entries or {}).items() if e.rank and e.rank <= k)
        if len(ranked) < k:
            raise RolloutTopKError(
                f"position {t} carries {len(ranked)} ranked log-probs, expected {k}; the request's logprobs was not "
                f"{k} (another plugin or a vLLM change altered TROLL's request). Check the rollout server class, or "
                "set algorithm.rollout_correction.bypass_mode=false (the actor recomputes the old distribution)."
            )
        ids[t] = [tok for _, tok, _ in ranked[:k]]
        lps[t] = [lp for _, _, lp in ranked[:k]]
    return ids, lps


def point_mass_rows(tokens: torch.Tensor, k: int, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine-style rows holding all the mass on ``tokens`` (``(R,)``): ids ``(R, k)``, log-probs ``(R, k)``.

    The old distribution of verl's synthetic padding samples (response = one EOS with rollout log-prob 0, masked out
    of every loss): consistent with that log-prob, so the masked rows stay finite.
    """
    ids = torch.full((tokens.shape[0], k), -1, dtype=torch.int32)
    lps = torch.full((tokens.shape[0], k), math.log(floor), dtype=torch.float32)
    ids[:, 0] = tokens.to(torch.int32)
    lps[:, 0] = 0.0
    return ids, lps


def align_rollout_topk(
    ids: Any,
    logprobs: Any,
    response: torch.Tensor,
    *,
    k: int,
    max_response_length: int,
    is_padding: bool = False,
    floor: float = 1e-12,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's top-K rows of one sample, aligned with verl's response tokens.

    Args:
        ids, logprobs: ``(T, k)`` arrays (numpy or torch) the rollout returned for the sample's generated tokens, or
            None when it returned none.
        response: ``(R,)`` the sample's response token ids in the batch.
        k: the engine's top-K width.
        max_response_length: verl's ``rollout.response_length``; the agent loop cuts longer generations to it.
        is_padding: verl's synthetic padding sample (tag ``is_padding``): its rows are a point mass on its token.
        floor: the floor probability (padding rows).

    Returns:
        ``ids (R, k)`` int32 and ``logprobs (R, k)`` float32.

    Raises:
        RolloutTopKError: when the rows do not line up with the response (fewer rows than tokens; more rows than
            tokens for a response that was not cut at ``max_response_length``), naming the likely cause.
    """
    r = int(response.shape[0])
    if is_padding:
        return point_mass_rows(response, k, floor)
    if ids is None or logprobs is None:
        if r == 0:
            return torch.zeros((0, k), dtype=torch.int32), torch.zeros((0, k), dtype=torch.float32)
        raise RolloutTopKError(
            f"the rollout returned no top-K log-probs for a response of {r} tokens. In bypass mode TROLL's old "
            "distribution comes from verl's vLLM rollout through TROLL's trainer (rollout name vllm, a single-turn "
            "agent loop); set algorithm.rollout_correction.bypass_mode=false to recompute it with the actor instead."
        )
    ids = torch.as_tensor(np.asarray(ids)).to(torch.int32)
    logprobs = torch.as_tensor(np.asarray(logprobs)).to(torch.float32)
    t = int(ids.shape[0])
    if ids.dim() != 2 or ids.shape != logprobs.shape or ids.shape[1] != k:
        raise RolloutTopKError(
            f"the rollout's top-K arrays have shapes {tuple(ids.shape)} and {tuple(logprobs.shape)}, expected (T, {k})."
        )
    if t < r:
        raise RolloutTopKError(
            f"the rollout returned top-K log-probs for {t} tokens but the response has {r}: tokens were added to the "
            "response after generation (a multi-turn or tool agent loop inserts tool and template tokens, which "
            "TROLL's bypass mode does not support). Use the single-turn agent loop, or set "
            "algorithm.rollout_correction.bypass_mode=false."
        )
    if t > r and r != max_response_length:
        raise RolloutTopKError(
            f"the rollout returned top-K log-probs for {t} tokens but the response has {r} and was not cut at "
            f"rollout.response_length={max_response_length}: the two no longer line up (the agent loop changed the "
            "response after generation). Use the single-turn agent loop, or set "
            "algorithm.rollout_correction.bypass_mode=false."
        )
    return ids[:r], logprobs[:r]

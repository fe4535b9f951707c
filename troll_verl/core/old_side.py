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
"""The old policy's side of the union support: values for the tokens the old pass did not store (TROLL §5).

The old-log-prob pass stores the old policy's top-K and the mass outside it; verl stores the sampled token's old
log-prob. A union token that only the current policy brought in has no stored old value: :func:`old_side_estimate`
gives it the paper's floor (or another estimate registered in :mod:`.variants`) and takes its mass out of the old
tail bucket. Called by :func:`troll_verl.core.support.assemble_support` for every backend.
"""

from __future__ import annotations

import torch

from .variants import variant

__all__ = ["old_side_estimate"]


def old_side_estimate(new, ids, old_u, valid, old, sampled, sampled_old_lp, floor, estimate):
    """Old log-probs for the union tokens the old pass did not store, and the old tail that is left.

    The old pass stored the old policy's top-K ``T`` (mass rule), the mass ``m_T = Σ_{b∉T} π_old(b)`` outside it, and
    verl stores the sampled token's old log-prob. A union token ``a`` that only the current policy brought in
    (``a ∉ T``, ``a ≠ o_t``) has an unknown old probability ``q_a``, and what is known bounds it:

        0 ≤ q_a ≤ p_K := min_{b∈T} π_old(b)     (T holds the most likely tokens, so every other one is at most
                                                   the least likely stored one)
        Σ_{a ∉ T} q_a ≤ m_T                       (they all come out of the mass outside T).

    ``estimate="floor"`` (the paper, TROLL §5, the core's) gives each ``q_a = floor`` (1e-12), far below the truth
    when π_old has a long tail (a sampled LLM at T=1), so ``π̃_a log(π̃_a / q_a)`` inflates KL(π̃ ‖ π_old) and TROLL
    projects tokens that are inside the ball. Another estimate registered under ``estimate``
    (:mod:`.variants`) gets ``(new, old_u, unknown, stored, old, room, floor)``: ``unknown`` and ``stored`` ``(c, S)``
    bool, ``room`` ``(c,)`` float64, the old tail mass the unknown tokens may take (``m_T`` less the sampled token's
    mass where it is outside T, less ``floor``); it returns ``(old_u, q)``, ``old_u`` with the unknown tokens' log
    ``q`` and ``q`` ``(c, S)`` float64, 0 where not unknown.

    The tokens' mass ``q`` is taken out of the old tail bucket, so the old distribution over S + 1 still sums to one.

    Args:
        new: ``(c, S)`` the current policy's log-probs on the union support (compute dtype).
        ids: ``(c, S)`` int64 union ids; ``valid``: ``(c, S)`` bool, False at padding slots.
        old_u: ``(c, S)`` old log-probs where known (the floor elsewhere).
        old: the stored :class:`~troll_verl.core.sparse.OldTopK` of the same ``c`` tokens.
        sampled, sampled_old_lp: ``(c,)`` the sampled ids and their exact old log-probs.
        floor: the floor probability. estimate: ``"floor"`` or a registered estimate's name.

    Returns:
        ``(old_u (c, S), old_tail (c,))`` log-probs in ``new``'s dtype.
    """
    estimate_fn = variant("old_estimate", estimate)  # None: the floor, the core's
    cdt = new.dtype
    dtype = torch.float64
    old_valid = old.ids >= 0
    sorted_old, _ = torch.where(old_valid, old.ids.long(), torch.iinfo(torch.long).max).sort(dim=-1)
    pos = torch.searchsorted(sorted_old, ids.clamp_min(0)).clamp_max(sorted_old.shape[1] - 1)
    stored = valid & (sorted_old.gather(1, pos) == ids)
    is_sampled = ids == sampled[:, None]
    unknown = valid & ~stored & ~is_sampled
    in_old = (old.ids.long() == sampled[:, None]).any(-1)
    sampled_extra = torch.where(in_old, 0.0, sampled_old_lp.to(dtype).exp())
    tail_mass = old.tail_logprob.to(dtype).exp()
    if estimate_fn is None:
        q = torch.where(unknown, torch.full_like(old_u, floor, dtype=dtype), 0.0)
    else:
        room = (tail_mass - sampled_extra - floor).clamp_min(0.0)
        old_u, q = estimate_fn(new, old_u, unknown, stored, old, room, floor)
    old_tail = torch.log((tail_mass - sampled_extra - q.sum(-1)).clamp_min(floor)).to(cdt)
    return old_u, old_tail

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
"""Old-side estimates ``upper`` and ``proportional``: values for the union tokens the old pass did not store, bounded
by what it did store, against the core's floor (TROLL §5).

Registered as :data:`troll_verl.core.variants` switch ``old_estimate``;
:func:`troll_verl.core.old_side.old_side_estimate` calls them (``policy_loss.troll.old_estimate`` in the config).
With ``T`` the stored top-K, ``m_T`` the mass outside it and ``p_K = min_{b∈T} π_old(b)``, an unknown token's old
probability ``q_a`` satisfies ``0 ≤ q_a ≤ p_K`` and ``Σ_a q_a ≤ m_T``:

- ``upper``: ``q_a = min(p_K, m_T)``, the largest value the bounds allow. ``x ↦ π̃_a log(π̃_a / x)`` falls in x,
  so each such term is at most the true one: the estimate can under-state the KL, never inflate it.
- ``proportional``: the old tail mass shared out like the current policy's mass outside T, capped by the bound,
  ``q_a = min(p_K, m_T · π̃_a / Σ_{b∉T} π̃_b)`` (π̃ detached): exact when the two policies agree outside T.

Where their sum would exceed the room left in the old tail, both are scaled down to fit (and never below the floor).
"""

from __future__ import annotations

import torch

__all__ = ["upper_estimate", "proportional_estimate"]


def upper_estimate(new, old_u, unknown, stored, old, room, floor):
    """``q_a = min(p_K, m_T)`` on the unknown tokens (module docstring); arguments and returns as
    :func:`troll_verl.core.old_side.old_side_estimate` hands a registered estimate."""
    cap, _ = _bounds(old)
    return _fit(cap[:, None].expand_as(old_u), old_u, unknown, room, floor)


def proportional_estimate(new, old_u, unknown, stored, old, room, floor):
    """``q_a = min(p_K, m_T · π̃_a / Σ_{b∉T} π̃_b)`` on the unknown tokens (module docstring); arguments and returns
    as :func:`troll_verl.core.old_side.old_side_estimate` hands a registered estimate."""
    dtype = torch.float64
    pi = torch.exp(new.detach().to(dtype))
    outside = (1.0 - torch.where(stored, pi, 0.0).sum(-1)).clamp_min(torch.finfo(dtype).tiny)
    cap, tail_mass = _bounds(old)
    q = torch.minimum(cap[:, None], tail_mass[:, None] * pi / outside[:, None])
    return _fit(q, old_u, unknown, room, floor)


def _bounds(old) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min(p_K, m_T), m_T)`` per row ``(c,)`` in float64: no unknown token's old probability is above the first,
    and their sum is not above the second."""
    dtype = torch.float64
    p_k = torch.where(old.ids >= 0, old.logprobs.to(dtype), float("inf")).amin(-1).exp()
    tail_mass = old.tail_logprob.to(dtype).exp()
    return torch.minimum(p_k, tail_mass), tail_mass


def _fit(q, old_u, unknown, room, floor):
    """``q`` on the unknown tokens (at least ``floor``), scaled down per row where its sum exceeds ``room``; returns
    ``(old_u with log q there, q (c, S) float64, 0 elsewhere)``."""
    dtype = torch.float64
    q = torch.where(unknown, q.clamp_min(floor), 0.0)
    total = q.sum(-1)
    scale = torch.where(total > room, room / total.clamp_min(torch.finfo(dtype).tiny), 1.0)
    q = torch.where(unknown, (q * scale[:, None]).clamp_min(floor), 0.0)
    return torch.where(unknown, torch.log(q).to(old_u.dtype), old_u), q

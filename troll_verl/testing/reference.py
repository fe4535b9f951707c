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
"""Brute-force float64 references for the tests: from the formulas, sharing no code with the modules they check."""

from __future__ import annotations

import math

import torch


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) over the last dim in float64; entries with p = 0 contribute 0."""
    logp, logq = logp.double(), logq.double()
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), torch.zeros_like(p)).sum(-1)


def logprob_pair(rows: int, S: int, scale: float, seed: int = 0, dtype=torch.float64):
    """``(new, old)`` log-probs ``(rows, S)`` in ``dtype``: random logits at ``scale`` for the old policy, the new one
    that far again from it (seeded)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, S, generator=g, dtype=torch.float64) * scale
    b = a + torch.randn(rows, S, generator=g, dtype=torch.float64) * scale
    return torch.log_softmax(b, -1).to(dtype), torch.log_softmax(a, -1).to(dtype)


def interpolate(new: torch.Tensor, old: torch.Tensor, eta: float) -> torch.Tensor:
    """log π_η = log_softmax((log π̃ + η log π_old) / (1 + η)) for one row (TROLL §1), float64."""
    return torch.log_softmax((new.double() + eta * old.double()) / (1.0 + eta), dim=-1)


def dense_project_row(new: torch.Tensor, old: torch.Tensor, eps: float, iters: int = 200):
    """Solve one row by bisection on log η ∈ [−40, 28], float64, until the bracket stops shrinking.

    Returns ``(logprobs, eta)``; η = 0 and the normalised input when KL(π̃ ‖ π_old) ≤ ε. The feasible
    (larger-η) end of the bracket is returned.
    """
    new = torch.log_softmax(new.double(), -1)
    old = torch.log_softmax(old.double(), -1)
    if kl(new, old) <= eps:
        return new, 0.0
    a, b = -40.0, 28.0
    for _ in range(iters):
        mid = 0.5 * (a + b)
        if mid in (a, b):
            break
        if kl(interpolate(new, old, math.exp(mid)), old) > eps:
            a = mid
        else:
            b = mid
    return interpolate(new, old, math.exp(b)), math.exp(b)


def adversarial_rows(n: int, S: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` rows of (new, old, mask) log-probs over S entries that stress the projection.

    Families (cycled): logit scales from 1e-3 to 1e3, near one-hot rows, identical old/new, floor entries
    (log 1e-12) on one side, disjoint peaks, tied values, random masks with support sizes 1..S.
    """
    g = torch.Generator().manual_seed(seed)
    new = torch.empty(n, S, dtype=torch.float64)
    old = torch.empty(n, S, dtype=torch.float64)
    mask = torch.ones(n, S, dtype=torch.bool)
    scales = [1e-3, 1e-2, 0.1, 1.0, 3.0, 10.0, 100.0, 1e3]
    floor = math.log(1e-12)
    for i in range(n):
        fam = i % 8
        scale = scales[(i // 8) % len(scales)]
        a = torch.randn(S, generator=g, dtype=torch.float64) * scale
        b = a + torch.randn(S, generator=g, dtype=torch.float64) * scale
        if fam == 1:  # near one-hot, different argmax
            a = torch.full((S,), -40.0, dtype=torch.float64)
            b = a.clone()
            a[0], b[min(1, S - 1)] = 0.0, 0.0
            b = b + 1e-3 * torch.randn(S, generator=g, dtype=torch.float64)
        elif fam == 2:  # identical
            b = a.clone()
        elif fam == 3:  # floor entries on the old side
            a = a.clone()
            a[torch.rand(S, generator=g) < 0.5] = floor
        elif fam == 4:  # floor entries on the new side
            b = b.clone()
            b[torch.rand(S, generator=g) < 0.5] = floor
        elif fam == 5:  # disjoint peaks
            a = torch.full((S,), floor, dtype=torch.float64)
            b = a.clone()
            a[: max(1, S // 2)] = 0.0
            b[S // 2 :] = 0.0
        elif fam == 6:  # ties
            a = torch.round(a)
            b = torch.round(b)
        new[i] = torch.log_softmax(b, -1)
        old[i] = torch.log_softmax(a, -1)
        if fam == 7 or (i // 8) % 3 == 0:
            keep = torch.rand(S, generator=g) < torch.rand(1, generator=g).item()
            keep[torch.randint(S, (1,), generator=g)] = True
            mask[i] = keep
    return new, old, mask


def brute_support(logp_row: torch.Tensor, k: int, delta: float) -> list[int]:
    """The mass rule by a Python loop: top tokens (descending) until their mass reaches 1 − δ, at most k."""
    order = torch.argsort(logp_row, descending=True).tolist()
    kept, mass = [], 0.0
    for j in order[:k]:
        if mass >= 1 - delta:
            break
        kept.append(j)
        mass += math.exp(logp_row[j].item())
    return kept

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
"""Solver ``bisection``: plain bisection for the projection's η (the baseline of the core's Newton solver).

Registered as :data:`troll_verl.core.variants` switch ``solver``; :func:`troll_verl.core.projection.project` calls
it with ``solver="bisection"`` (``policy_loss.troll.solver`` in the config).
"""

from __future__ import annotations

import math

import torch

__all__ = ["solve_bisection"]


def solve_bisection(moments, kl_before, target, w_min, max_iter, tol, active, host):
    """Plain bisection on v = log η ∈ [−8, log η_max] (TROLL §2): every row takes ``max_iter`` halvings, whatever
    its accuracy, and keeps the feasible (large-η) end, so its KL ends at or below ``target``.

    Args:
        moments: ``w (R,) -> (KL(π_w ‖ π_old) (R,), None)`` (:mod:`troll_verl.core.variants`).
        kl_before: ``(R,)`` KL(π̃ ‖ π_old), above ``target`` on the ``active`` rows.
        target: ``(R,)`` the rows' targets.
        w_min: ``1 / (1 + eta_max)``.
        max_iter: the number of halvings.
        tol: unused (no early stop).
        host: unused (no early stop).
        active: ``(R,)`` bool, the rows to project.

    Returns:
        ``(u (R,), iterations)``: ``u = log w`` at the feasible end, and ``max_iter`` as a 0-d int64 tensor (0 when
        no row is active).
    """
    a = torch.full_like(kl_before, -8.0)  # infeasible side: small η
    b = torch.full_like(kl_before, math.log(1.0 / w_min - 1.0))
    for _ in range(max_iter):
        v = 0.5 * (a + b)
        w = 1.0 / (1.0 + torch.exp(v))
        kl, _ = moments(w, need_var=False)
        feas = kl <= target
        b = torch.where(feas, v, b)
        a = torch.where(feas, a, v)
    iters = torch.where(active.any(), max_iter, 0).to(torch.long)
    return torch.log(1.0 / (1.0 + torch.exp(b))), iters

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
"""The projection kernels against the torch path (troll_verl.core.projection), fp32, on the adversarial rows of the
core's own tests plus non-finite and support-less rows: the same projected distributions, the bound on every row
(float64, from the returned values), the same gradients."""

from __future__ import annotations

import math
import os

import pytest
import torch

from troll_verl.core import projection as torch_projection
from troll_verl.core.projection import project
from troll_verl.testing.reference import adversarial_rows, kl

DEVICE = os.environ.get("TROLL_TEST_DEVICE", "cpu")  # conftest.py: the kernels run there
EPS = 0.05


def _kl_rows(logp, logq, mask):
    """KL between the distributions renormalised on the masked support, float64."""
    logp = logp.double().masked_fill(~mask, -math.inf)
    logq = logq.double().masked_fill(~mask, -math.inf)
    return kl(logp - torch.logsumexp(logp, -1, keepdim=True), logq - torch.logsumexp(logq, -1, keepdim=True))


@pytest.fixture(scope="module")
def rows():
    """64 adversarial rows (8 families x 8 logit scales, random masks) of 40 entries, then a NaN row and a row
    without support."""
    new, old, mask = adversarial_rows(64, 40, seed=5)
    new, old = new.float(), old.float()
    nan_row, empty_row = new[:1].clone(), new[:1].clone()
    nan_row[0, 3] = math.nan
    mask = torch.cat([mask, torch.ones(1, 40, dtype=torch.bool), torch.zeros(1, 40, dtype=torch.bool)])
    return torch.cat([new, nan_row, empty_row]), torch.cat([old, old[:2]]), mask


def test_the_solver_constants_are_the_torch_solvers(kernels):
    k = kernels.projection.SOLVER_CONSTANTS
    assert k["target_margin"] == torch_projection._TARGET_MARGIN[torch.float32]
    assert k["margin_ulps"] == torch_projection._MARGIN_ULPS
    assert k["tol"] == torch_projection._DEFAULT_TOL[torch.float32]
    assert k["trust_phi"] == torch_projection._NEWTON_TRUST_PHI
    assert k["phi_converged"] == torch_projection._PHI_CONVERGED


def test_projection_matches_the_torch_path_and_holds_the_bound(kernels, poisoned, rows):
    new, old, mask = rows
    ref = project(new, old, EPS, mask=mask)
    got = kernels.projection.triton_project(new.to(DEVICE), old.to(DEVICE), EPS, mask=mask.to(DEVICE))
    got = type(got)(*(t.cpu() for t in got))
    assert torch.equal(got.projected, ref.projected)
    p = ref.projected
    assert p[:64].float().mean() > 0.3 and (~p[:64]).float().mean() > 0.1
    # the non-finite row is NaN everywhere, the row without support unchanged; the others finite
    assert got.logprobs[64].isnan().all() and got.eta[64].isnan() and got.kl_after[64].isnan()
    assert torch.equal(got.logprobs[65], new[65]) and got.eta[65] == 0 and not got.projected[65]
    ok = slice(0, 64)
    assert torch.isfinite(got.logprobs[ok]).all() and torch.isfinite(got.eta[ok]).all()
    # the same solution: both solvers stop on the same test, to rounding (which scales with the row's |log p|)
    mag = torch.maximum(new[ok].abs(), old[ok].abs()).masked_fill(~mask[ok], 0).amax(-1)
    assert ((got.logprobs[ok] - ref.logprobs[ok]).abs().amax(-1) <= 1e-5 + 5e-6 * mag).all()
    torch.testing.assert_close(got.eta[ok], ref.eta[ok], rtol=1e-3, atol=0)
    torch.testing.assert_close(got.kl_before[ok], ref.kl_before[ok], rtol=1e-5, atol=1e-6)
    # as tight as the torch path's own test of the solution: 1e-4 of ε plus the fp32 rounding scale of the row
    assert ((got.kl_after[ok] - ref.kl_after[ok]).abs() <= 1e-4 * EPS + 1.2e-6 * mag).all()
    assert 1 <= int(got.num_iters) <= ref.num_iters
    # the bound on every row, recomputed in float64 from the returned log-probs; tight where projected
    kl_after = _kl_rows(got.logprobs[ok], old[ok], mask[ok])
    assert (kl_after <= EPS).all(), kl_after.max()
    assert ((kl_after - EPS).abs() <= 1e-4 * EPS + 10 * 1.2e-7 * mag.double())[p[ok]].all()
    # rows inside the ball and masked entries pass through bitwise
    assert torch.equal(got.logprobs[ok][~p[ok]], new[ok][~p[ok]]) and (got.eta[ok][~p[ok]] == 0).all()
    assert torch.equal(got.logprobs[ok][~mask[ok]], new[ok][~mask[ok]])


def test_projection_gradient_matches_the_torch_path(kernels, poisoned, rows):
    new, old, mask = rows
    g = torch.randn(new.shape, generator=torch.Generator().manual_seed(3))
    a = new.clone().requires_grad_(True)
    (ga,) = torch.autograd.grad((project(a, old, EPS, mask=mask).logprobs * g).sum(), a)
    b = new.to(DEVICE).requires_grad_(True)
    out = kernels.projection.triton_project(b, old.to(DEVICE), EPS, mask=mask.to(DEVICE)).logprobs
    (gb,) = torch.autograd.grad((out * g.to(DEVICE)).sum(), b)
    gb = gb.cpu()
    assert gb[64].isnan().all() and torch.equal(gb[65], g[65]) and torch.isfinite(gb[:64]).all()
    # NOTE: at logit scale 1e3 (|log p| ~ 6e3) the fp32 implicit gradient is ill-conditioned in both implementations
    # (they differ by ~10 % there; the torch path's float64 gradcheck is the reference); below, they agree to 2e-4
    mag = torch.maximum(new.abs(), old.abs()).masked_fill(~mask, 0).amax(-1)[:64]
    tame = mag < 1000
    assert tame.sum() >= 48
    err = (gb[:64] - ga[:64]).abs().amax(-1) / ga[:64].abs().amax(-1)
    assert (err[tame] <= 2e-4).all(), err[tame].max()

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
"""Tests of troll_verl.core.projection: exactness, gradients, properties and argument checks."""

import math

import pytest
import torch

from troll_verl.core.projection import project
from troll_verl.testing.reference import adversarial_rows, dense_project_row, kl, logprob_pair

EPS = 0.05


def _kl_rows(logp, logq, mask=None):
    """KL between the distributions renormalised on the (masked) support, float64."""
    logp, logq = logp.double(), logq.double()
    if mask is not None:
        logp = logp.masked_fill(~mask, -math.inf)
        logq = logq.masked_fill(~mask, -math.inf)
    logp = logp - torch.logsumexp(logp, -1, keepdim=True)
    logq = logq - torch.logsumexp(logq, -1, keepdim=True)
    return kl(logp, logq)


# ---------------------------------------------------------------------------------------------------------
# exactness against a brute-force dense solver
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0, 3.0, 30.0, 1e3])
def test_matches_brute_force_float64(scale):
    new, old = logprob_pair(24, 17, scale, seed=1)
    res = project(new, old, EPS)
    for i in range(new.shape[0]):
        ref, eta = dense_project_row(new[i], old[i], EPS)
        torch.testing.assert_close(res.logprobs[i], ref, atol=1e-7, rtol=0)
        assert math.isclose(res.eta[i].item(), eta, rel_tol=1e-5, abs_tol=1e-9)
        assert bool(res.projected[i]) == (eta > 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_return_input_dtype(dtype):
    new, old = logprob_pair(64, 33, 3.0, seed=2)
    res = project(new.to(dtype), old.to(dtype), EPS)
    assert res.logprobs.dtype == dtype
    assert res.eta.dtype == torch.float32
    ref = project(new.to(dtype).double(), old.to(dtype).double(), EPS)
    # fp32 aims slightly inside the ball (rounding margin ~ |log p|·eps), which moves far-tail log-probs by ~1e-3
    tol = {torch.float32: 3e-3, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(res.logprobs.double(), ref.logprobs, atol=tol, rtol=tol)


def test_eta_solution_is_optimal():
    """π* minimises KL(π ‖ π̃) over the feasible set: no random feasible perturbation does better."""
    new, old = logprob_pair(8, 9, 2.0, seed=3)
    res = project(new, old, EPS)
    g = torch.Generator().manual_seed(0)
    checked = 0
    for i in torch.nonzero(res.projected).flatten().tolist():
        star = res.logprobs[i]
        best = kl(star, new[i])
        for _ in range(300):
            cand = torch.log_softmax(star + 0.05 * torch.randn(9, generator=g, dtype=torch.float64), -1)
            if kl(cand, old[i]) <= EPS:
                checked += 1
                assert kl(cand, new[i]) >= best - 1e-12
    assert checked > 100


# ---------------------------------------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-3, 0.5, 3.0, 30.0, 1e3])
@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck_float64(scale, masked):
    new, old = logprob_pair(6, 7, scale, seed=4)
    mask = None
    if masked:
        mask = torch.rand(6, 7, generator=torch.Generator().manual_seed(5)) > 0.3
        mask[:, 0] = True
    new.requires_grad_(True)
    fn = lambda x: project(x, old, EPS, mask=mask).logprobs  # noqa: E731
    assert torch.autograd.gradcheck(fn, (new,), eps=1e-6, atol=1e-5, rtol=1e-3)


def test_gradient_is_not_detached_through_eta():
    """Projected rows must differ from the η-detached surrogate (the public port's approximation)."""
    new, old = logprob_pair(16, 11, 3.0, seed=6)
    new.requires_grad_(True)
    res = project(new, old, EPS)
    assert res.projected.any()
    g = torch.randn_like(new)
    (grad,) = torch.autograd.grad((res.logprobs * g).sum(), new)
    w = (1.0 / (1.0 + res.eta)).detach()[:, None]
    surrogate = torch.log_softmax((new + res.eta.detach()[:, None] * old) * w, -1)
    (grad_det,) = torch.autograd.grad((surrogate * g).sum(), new)
    rows = res.projected
    assert (grad[rows] - grad_det[rows]).abs().max() > 1e-3
    torch.testing.assert_close(grad[~rows], g[~rows])


def test_identity_inside_and_for_identical_inputs():
    new, old = logprob_pair(32, 13, 1e-3, seed=7)
    new.requires_grad_(True)
    res = project(new, old, EPS)
    assert not res.projected.any()
    assert torch.equal(res.logprobs, new) and torch.equal(res.eta, torch.zeros_like(res.eta))
    g = torch.randn_like(new)
    (grad,) = torch.autograd.grad((res.logprobs * g).sum(), new)
    assert torch.equal(grad, g)
    same = project(old, old, EPS)
    assert torch.equal(same.logprobs, old) and not same.projected.any()


def test_hits_eta_max_reports_violation():
    """At the solver's limit the residual violation shows in kl_after; it is never hidden."""
    new, old = logprob_pair(8, 9, 10.0, seed=8)
    res = project(new, old, EPS, eta_max=1e-3)
    assert res.projected.any()
    assert (res.kl_after[res.projected] > EPS).all()
    recomputed = _kl_rows(res.logprobs, old)
    torch.testing.assert_close(recomputed, res.kl_after, atol=1e-9, rtol=1e-6)
    assert (res.eta[res.projected] <= 1e-3 * (1 + 1e-9)).all()


# ---------------------------------------------------------------------------------------------------------
# property tests over >= 10^4 adversarial rows
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def adversarial():
    new, old, mask = adversarial_rows(12_000, 24, seed=11)
    return new, old, mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_properties_on_adversarial_rows(adversarial, dtype):
    new, old, mask = (t.to(dtype) if t.is_floating_point() else t for t in adversarial)
    new = new.clone().requires_grad_(True)
    res = project(new, old, EPS, mask=mask)
    out = res.logprobs
    # finite everywhere, gradients too
    assert torch.isfinite(out).all() and torch.isfinite(res.eta).all()
    (grad,) = torch.autograd.grad((out * torch.randn_like(out)).sum(), new)
    assert torch.isfinite(grad).all()
    # the bound holds on every row, recomputed in float64 from the returned (rounded) log-probs
    kl_after = _kl_rows(out.detach(), old, mask)
    assert (kl_after <= EPS).all(), kl_after.max()
    # tight where projected: within a relative 1e-4, plus the rounding scale of the row's log-probs
    # (|log p| up to ~5e3 at logit scale 1e3: fp32 cannot resolve the KL better than ~|log p|·eps)
    p = res.projected
    assert p.float().mean() > 0.3 and (~p).float().mean() > 0.05
    mag = torch.maximum(new.detach().abs(), old.abs()).masked_fill(~mask, 0).amax(-1).double()
    tight = 1e-4 * EPS + 10 * torch.finfo(dtype).eps * mag
    assert ((kl_after - EPS).abs() <= tight)[p].all(), ((kl_after - EPS).abs() / tight)[p].max()
    # identity (bitwise) and eta = 0 where not projected
    assert torch.equal(out[~p], new.detach()[~p]) and (res.eta[~p] == 0).all()
    assert (res.eta[p] > 0).all()
    # masked entries pass through unchanged
    assert torch.equal(out.detach()[~mask], new.detach()[~mask])


def test_permutation_invariance(adversarial):
    new, old, mask = (t[:3000] for t in adversarial)
    perm = torch.randperm(new.shape[-1], generator=torch.Generator().manual_seed(3))
    res = project(new, old, EPS, mask=mask)
    res_p = project(new[:, perm], old[:, perm], EPS, mask=mask[:, perm])
    torch.testing.assert_close(res_p.logprobs, res.logprobs[:, perm], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(res_p.eta, res.eta, atol=1e-9, rtol=1e-7)


def test_batched_equals_per_row(adversarial):
    new, old, mask = (t[:10_000:50] for t in adversarial)
    res = project(new, old, EPS, mask=mask)
    for i in range(new.shape[0]):
        one = project(new[i], old[i], EPS, mask=mask[i])
        torch.testing.assert_close(one.logprobs, res.logprobs[i], atol=1e-10, rtol=1e-10)
        assert one.eta.shape == () and math.isclose(one.eta.item(), res.eta[i].item(), rel_tol=1e-7, abs_tol=1e-12)


def test_leading_dims_and_empty():
    new, old = logprob_pair(2 * 3 * 4, 5, 3.0, seed=9)
    res = project(new.view(2, 3, 4, 5), old.view(2, 3, 4, 5), EPS)
    flat = project(new, old, EPS)
    assert res.eta.shape == (2, 3, 4)
    torch.testing.assert_close(res.logprobs.reshape(-1, 5), flat.logprobs)
    empty = project(torch.zeros(0, 5), torch.zeros(0, 5), EPS)
    assert empty.logprobs.shape == (0, 5) and empty.eta.shape == (0,)


def test_rows_without_support_are_unchanged():
    new, old = logprob_pair(4, 6, 3.0, seed=10)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[0] = True
    res = project(new, old, EPS, mask=mask)
    assert torch.equal(res.logprobs[1:], new[1:]) and (res.eta[1:] == 0).all()
    assert torch.isfinite(res.logprobs).all()


# ---------------------------------------------------------------------------------------------------------
# non-finite inputs and argument checks
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rows_become_nan_never_finite(bad):
    new, old = logprob_pair(4, 6, 3.0, seed=13)
    new = new.clone()
    new[1, 2] = bad
    old = old.clone()
    old[2, 0] = bad
    x = new.clone().requires_grad_(True)
    res = project(x, old, EPS)
    for r in (1, 2):
        assert torch.isnan(res.logprobs[r]).all() and torch.isnan(res.eta[r]) and torch.isnan(res.kl_after[r])
    ok = project(new[[0, 3]], old[[0, 3]], EPS)
    torch.testing.assert_close(res.logprobs[[0, 3]], ok.logprobs)
    (grad,) = torch.autograd.grad(res.logprobs[[0, 3]].sum(), x)
    assert torch.isfinite(grad[[0, 3]]).all() and torch.isnan(grad[[1, 2]]).all()
    # a non-finite value in a masked-out entry is not part of the support and is ignored
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 2] = mask[2, 0] = False
    masked = project(new, old, EPS, mask=mask)
    assert torch.isfinite(masked.logprobs[mask]).all() and torch.isfinite(masked.eta).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kl_bound": 0.0}, "kl_bound"),
        ({"kl_bound": -1.0}, "kl_bound"),
        ({"kl_bound": math.nan}, "kl_bound"),
        ({"solver": "brent"}, "solver"),
        ({"max_iter": 0}, "max_iter"),
        ({"tol": -1.0}, "tol"),
        ({"eta_max": 0.0}, "eta_max"),
    ],
)
def test_invalid_arguments(kwargs, match):
    new, old = logprob_pair(2, 3, 1.0)
    args = {"kl_bound": EPS} | kwargs
    with pytest.raises(ValueError, match=match):
        project(new, old, **args)


def test_invalid_tensors():
    new, old = logprob_pair(2, 3, 1.0)
    with pytest.raises(ValueError, match="same shape"):
        project(new, old[:, :2], EPS)
    with pytest.raises(ValueError, match="dtype"):
        project(new, old.float(), EPS)
    with pytest.raises(ValueError, match="floating"):
        project(new.long(), old.long(), EPS)
    with pytest.raises(ValueError, match="mask"):
        project(new, old, EPS, mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="detach"):
        project(new, old.clone().requires_grad_(True), EPS)


def test_rows_just_inside_the_ball_in_fp32_still_hold_the_bound_exactly():
    """Rows whose exact KL exceeds ε by ~1e-7 can read just under ε in fp32. They are projected
    (against the solver's margin, not ε itself), so the KL of every returned row, evaluated in float64, is ≤ ε."""
    eps = 0.05
    g = torch.Generator().manual_seed(11)
    rows, S = 400, 48
    old = torch.log_softmax(torch.randn(rows, S, generator=g, dtype=torch.float64) * 2, -1)
    d = torch.randn(rows, S, generator=g, dtype=torch.float64)

    def kl(new_lp, old_lp):
        new_lp = new_lp - torch.logsumexp(new_lp, -1, keepdim=True)
        return (new_lp.exp() * (new_lp - old_lp)).sum(-1)

    lo, hi = torch.zeros(rows, dtype=torch.float64), torch.full((rows,), 5.0, dtype=torch.float64)
    for _ in range(80):  # per row, the step t along d with exact KL = ε (1 + 1e-6)
        mid = (lo + hi) / 2
        over = kl(old + mid[:, None] * d, old) > eps * (1 + 1e-6)
        hi, lo = torch.where(over, mid, hi), torch.where(over, lo, mid)
    new32 = (old + hi[:, None] * d).float()
    old32 = old.float()
    assert bool((kl(new32.double(), old32.double()) > eps).all())  # all outside, evaluated exactly
    res = project(new32, old32, eps)
    assert bool(res.projected.all())
    assert float(kl(res.logprobs.double(), old32.double()).max()) <= eps


def test_autocast_does_not_reach_the_solver():
    """verl runs a bf16 actor's forward under torch.autocast; CPU autocast lowers vecdot to bf16, which made the
    solver miss the bound (0.0106 for ε = 0.01 on verl's engine). The core runs with autocast off."""
    g = torch.Generator().manual_seed(2)
    old = torch.log_softmax(torch.randn(300, 66, generator=g) * 6, -1)
    new = torch.log_softmax(torch.log_softmax(old, -1) * 1.3 + torch.randn(300, 66, generator=g) * 2, -1)
    plain = project(new, old, 0.01)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        under = project(new.clone().requires_grad_(), old, 0.01)
        under.logprobs.sum().backward()
    torch.testing.assert_close(under.logprobs, plain.logprobs, atol=0, rtol=0)
    assert float(under.kl_after.max()) <= 0.01

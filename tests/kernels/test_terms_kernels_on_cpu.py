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
"""The token-terms kernels (troll_verl.kernels.terms) against the torch path (troll_verl.core.terms), fp32: every
field of TrollTokenTerms and the gradient of the three differentiable terms, with a row mask, for both tails."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from troll_verl import ablations  # noqa: F401  (registers tail "renormalize")
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits
from troll_verl.core.terms import troll_token_terms

DEVICE = os.environ.get("TROLL_TEST_DEVICE", "cpu")  # conftest.py: the kernels run there
EPS = 0.05


def _support(N=10, V=600, K=8, seed=0):
    """A sparse support from the torch path (tail bucket, fixed union width padded), current policy a leaf."""
    gen = torch.Generator().manual_seed(seed)
    z_old = 2.0 * torch.randn(N, V, generator=gen)
    z = z_old + 0.3 * torch.randn(N, V, generator=gen)
    sampled = torch.multinomial(torch.softmax(z_old, -1), 1, generator=gen)[:, 0]
    old = old_topk_from_logits(z_old, topk=K, mass_delta=1e-4)
    old_lp = torch.log_softmax(z_old, -1).gather(1, sampled[:, None])[:, 0]
    sup = troll_sparse_from_logits(z, sampled, old, old_lp, topk=K, mass_delta=1e-4)
    return sup._replace(new_logprobs=sup.new_logprobs.detach())


@pytest.mark.parametrize("tail", ["bucket", "renormalize"])
def test_token_terms_match_the_torch_path(kernels, poisoned, tail):
    """Every field of TrollTokenTerms and the gradient of a loss of the three differentiable ones, with a row mask."""
    sup = _support()
    cfg = SimpleNamespace(kl_bound=EPS, tail=tail, solver="newton", solver_max_iter=30, solver_tol=None, eta_max=1e6)
    row_mask = torch.ones(10, dtype=torch.bool)
    row_mask[[2, 7]] = False
    weights = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))

    def run(fn, s, rm, w):
        leaf = s.new_logprobs.clone().requires_grad_(True)
        terms, iters = fn(s._replace(new_logprobs=leaf), cfg, row_mask=rm)
        loss = (w[0] * terms.proj_log_prob + w[1] * terms.log_prob + w[2] * terms.regression).sum()
        return terms, iters, torch.autograd.grad(loss, leaf)[0]

    ref, ref_iters, ga = run(troll_token_terms, sup, row_mask, weights)
    dev_sup = type(sup)(*(t.to(DEVICE) for t in sup))
    got, iters, gb = run(kernels.terms.triton_token_terms, dev_sup, row_mask.to(DEVICE), weights.to(DEVICE))
    got = got.map(lambda t: t.cpu())
    assert ref.projected.sum() >= 3 and not ref.projected[[2, 7]].any()
    for name in ("projected", "support_size", "covered_mass"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    # the masked-out rows have no support: their KLs are NaN on both paths
    close = dict(rtol=1e-5, atol=1e-6, equal_nan=True)
    for name in ("proj_log_prob", "log_prob", "kl_before"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), **close, msg=name)
    for name in ("regression", "kl_after", "eta"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), **{**close, "rtol": 1e-3}, msg=name)
    assert (got.regression[[2, 7]] == 0).all() and (got.regression[got.projected > 0] > 0).all()
    assert 1 <= int(iters) <= ref_iters
    torch.testing.assert_close(gb.cpu(), ga, rtol=1e-3, atol=1e-5)

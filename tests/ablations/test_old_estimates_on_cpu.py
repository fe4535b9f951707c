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
"""Tests of troll_verl.ablations.old_estimates: the upper and proportional old-side estimates against the core's
floor, through the core's sparse support."""

import math

import pytest
import torch

from troll_verl import ablations  # noqa: F401  (registers the variants)
from troll_verl.core.projection import project
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits


def _long_tail_pair(N=64, V=2000, seed=0, noise=1e-3):
    """A sampled-LLM-like long tail (hundreds of tokens needed for 1 − δ) and a current policy one tiny step away,
    so the two top-K sets swap tokens at the boundary."""
    g = torch.Generator().manual_seed(seed)
    z_old = torch.randn(N, V, generator=g, dtype=torch.float64) * 1.5
    z_new = z_old + noise * torch.randn(N, V, generator=g, dtype=torch.float64)
    sampled = torch.multinomial(torch.softmax(z_old, -1), 1, generator=g).squeeze(1)
    old_lp = torch.log_softmax(z_old, -1)
    return z_old, z_new, sampled, old_lp


def _support(z_new, sampled, old, old_lp, K, estimate):
    return troll_sparse_from_logits(
        z_new, sampled, old, old_lp.gather(1, sampled[:, None]).squeeze(1), topk=K, old_estimate=estimate
    )


@pytest.mark.parametrize("estimate", ["upper", "proportional"])
def test_old_estimates_keep_the_old_side_a_distribution_within_its_bounds(estimate):
    z_old, z_new, sampled, old_lp = _long_tail_pair()
    K = 16
    old = old_topk_from_logits(z_old, topk=K, mass_delta=1e-5, value_dtype=torch.float64)
    base = _support(z_new, sampled, old, old_lp, K, "floor")
    sup = _support(z_new, sampled, old, old_lp, K, estimate)
    mass = torch.where(sup.mask, sup.old_logprobs.exp(), 0.0).sum(-1)
    torch.testing.assert_close(mass, torch.ones_like(mass), atol=1e-9, rtol=0)
    p_k = torch.where(old.ids >= 0, old.logprobs, math.inf).amin(-1)
    changed = sup.mask & (sup.old_logprobs != base.old_logprobs)
    changed[:, -1] = False  # the tail bucket gives up what the estimates take
    assert changed.any(), "the long tail should put current-only tokens into the union"
    assert bool((sup.old_logprobs <= p_k[:, None] + 1e-12)[changed].all())
    # only tokens the old pass did not store (and that are not the sampled token) are estimated
    stored = torch.zeros_like(changed)
    for i in range(sup.ids.shape[0]):
        known = set(old.ids[i][old.ids[i] >= 0].tolist()) | {int(sampled[i])}
        stored[i, : sup.ids.shape[1]] = torch.tensor([int(t) in known for t in sup.ids[i]])
    assert not bool((changed & stored).any())
    # the current side is untouched
    torch.testing.assert_close(sup.new_logprobs, base.new_logprobs, atol=0, rtol=0)


def test_the_floor_inflates_the_kl_of_a_policy_that_barely_moved():
    """At a long tail the floor turns a 1e-3 logit change into KL(π̃ ‖ π_old) far above ε; the upper and
    proportional estimates stay at the scale of the full-vocabulary KL."""
    z_old, z_new, sampled, old_lp = _long_tail_pair()
    K = 16
    old = old_topk_from_logits(z_old, topk=K, mass_delta=1e-5, value_dtype=torch.float64)
    full = (torch.softmax(z_new, -1) * (torch.log_softmax(z_new, -1) - old_lp)).sum(-1)
    kls = {}
    for estimate in ("floor", "upper", "proportional"):
        sup = _support(z_new, sampled, old, old_lp, K, estimate)
        kls[estimate] = project(sup.new_logprobs, sup.old_logprobs, 0.05, mask=sup.mask).kl_before
    assert float(full.max()) < 1e-5
    assert float(kls["floor"].max()) > 0.05  # projected for nothing
    assert float(kls["upper"].max()) < 1e-3 and float(kls["proportional"].max()) < 1e-3

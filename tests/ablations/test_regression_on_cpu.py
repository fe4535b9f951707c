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
"""Tests of troll_verl.ablations.regression: the regression term only on tokens with a non-zero advantage, against
the core's (every token), through the core's loss."""

import torch
from verl.utils.metric import Metric
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.losses import compute_policy_loss_troll
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits


def _case(seed=0, B=4, T=5, V=60, K=8):
    """An update whose current policy moved away from the old one (tokens projected), float64."""
    g = torch.Generator().manual_seed(seed)
    z_old = torch.randn(B * T, V, generator=g, dtype=torch.float64) * 3
    z = (z_old + 1.5 * torch.randn(B * T, V, generator=g, dtype=torch.float64)).requires_grad_(True)
    sampled = torch.multinomial(torch.softmax(z_old, -1), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z_old, topk=K, mass_delta=1e-5, value_dtype=torch.float64)
    old_lp = torch.log_softmax(z_old, -1).gather(1, sampled[:, None]).squeeze(1)
    support = troll_sparse_from_logits(z, sampled, old, old_lp, topk=K, mass_delta=1e-5).reshape(B, T)
    return z, support, old_lp.view(B, T), torch.ones(B, T, dtype=torch.bool)


def _loss(regression, advantages, z, support, old_lp, mask):
    config = FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="token-mean",
        policy_loss=TrollPolicyLossConfig(regression=regression, topk=8),
    )  # fmt: skip
    loss, metrics = compute_policy_loss_troll(old_lp, None, advantages, mask, "token-mean", config, support=support)
    (grad,) = torch.autograd.grad(loss, z, retain_graph=True)  # the support's graph serves several losses
    return loss, grad, {k: float(v.aggregate()) if isinstance(v, Metric) else v for k, v in metrics.items()}


def test_no_advantage_no_gradient_where_the_paper_regresses():
    """Every advantage zero, tokens projected: the paper's rule moves the policy (the regression alone), ``advantage``
    gives exactly zero gradient, as clip would."""
    z, support, old_lp, mask = _case()
    zero = torch.zeros_like(old_lp)
    _, paper_grad, metrics = _loss("projected", zero, z, support, old_lp, mask)
    assert metrics["troll/projected_frac"] > 0.3 and paper_grad.abs().max() > 1e-3
    _, grad, metrics = _loss("advantage", zero, z, support, old_lp, mask)
    assert bool((grad == 0).all()) and metrics["troll/regression_loss"] == 0.0


def test_tokens_with_an_advantage_keep_the_papers_regression():
    """Sequences 0 and 1 with an advantage, 2 and 3 without: ``advantage``'s loss is the paper's less exactly the
    regression of sequences 2 and 3 (the policy-gradient term is the same)."""
    z, support, old_lp, mask = _case(seed=1)
    advantages = torch.tensor([1.0, -0.5, 0.0, 0.0], dtype=torch.float64)[:, None].expand_as(old_lp).clone()
    paper, _, paper_m = _loss("projected", advantages, z, support, old_lp, mask)
    gated, _, gated_m = _loss("advantage", advantages, z, support, old_lp, mask)
    assert gated_m["troll/pg_loss"] == paper_m["troll/pg_loss"]
    # the regression of sequences 2 and 3 alone, as a token mean over their 10 tokens
    _, _, rest_m = _loss("projected", torch.zeros_like(advantages), z, support, old_lp, mask & (advantages == 0))
    dropped = paper_m["troll/regression_loss"] - gated_m["troll/regression_loss"]
    assert dropped > 0
    assert abs(float(paper - gated) - dropped) < 1e-12
    assert abs(dropped - rest_m["troll/regression_loss"] * 10 / 20) < 1e-12  # token-mean over 10 of the 20 tokens

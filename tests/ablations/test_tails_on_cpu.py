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
"""Tests of troll_verl.ablations.tails: the paper's renormalised tail against the core's tail bucket, through the
policy loss."""

import pytest
import torch
from verl.utils.metric import Metric
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.losses import compute_policy_loss_troll
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits


def _loss(*args, **kwargs):
    loss, metrics = compute_policy_loss_troll(*args, **kwargs)
    return loss, {k: float(v.aggregate()) if isinstance(v, Metric) else v for k, v in metrics.items()}


def _actor_config(loss_agg_mode="token-mean", **troll):
    return FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
        policy_loss=TrollPolicyLossConfig(**troll),
    )


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_zero_advantages_give_exactly_zero_gradient_in_fp32(ratio_level):
    """As for the core's tail bucket (tests/core/test_losses_on_cpu.py): old and current policy identical, every
    advantage 0, the gradient is exactly zero with the renormalised tail too."""
    g = torch.Generator().manual_seed(3)
    B, T, V, K = 4, 6, 300, 16
    z = (torch.randn(B * T, V, generator=g) * 2).requires_grad_(True)
    sampled = torch.multinomial(torch.softmax(z.detach(), -1), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z.detach(), topk=K, mass_delta=1e-5)
    old_lp = torch.log_softmax(z.detach(), -1).gather(1, sampled[:, None]).view(B, T)
    cfg = _actor_config("seq-mean-token-mean", ratio_level=ratio_level, tail="renormalize", topk=K)
    sup = troll_sparse_from_logits(z, sampled, old, old_lp.view(-1), topk=K, mass_delta=1e-5).reshape(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    loss, m = _loss(old_lp, None, torch.zeros(B, T), mask, cfg.loss_agg_mode, cfg, support=sup)
    (grad,) = torch.autograd.grad(loss, z)
    assert m["troll/projected_frac"] == 0.0 and m["troll/regression_loss"] == 0.0
    assert bool((grad == 0).all()), f"max |grad| {grad.abs().max().item():.3g}"


def test_the_bucket_pulls_leaked_mass_back_and_the_renormalized_tail_does_not():
    """The core's tail bucket is differentiable: mass leaked outside S is penalised and pulled back. With
    tail="renormalize" (the paper's treatment) the logits outside S get exactly zero gradient, so nothing stops the
    network from moving mass there (the entropy blow-up seen by a public port)."""
    B, T, V, K = 1, 4, 400, 3
    g = torch.Generator().manual_seed(0)
    z_old = torch.randn(B * T, V, generator=g, dtype=torch.float64)
    z_old[:, :K] += 12.0  # peaked old policy: tiny tail
    z = z_old.clone()
    z[:, K:] += 4.0  # the current policy leaked mass into the tail
    z.requires_grad_(True)
    sampled = torch.zeros(B * T, dtype=torch.long)
    old = old_topk_from_logits(z_old, topk=K, mass_delta=1e-12, value_dtype=torch.float64)
    old_lp = torch.log_softmax(z_old, -1)[:, 0]
    mask = torch.ones(B, T, dtype=torch.bool)
    adv = torch.zeros(B, T, dtype=torch.float64)

    def tail_mass(x):
        return 1 - torch.softmax(x, -1)[:, :K].sum(-1)

    grads = {}
    for tail in ("bucket", "renormalize"):
        cfg = _actor_config(tail=tail, topk=K, mass_delta=1e-12)
        sup = troll_sparse_from_logits(z, sampled, old, old_lp, topk=K, mass_delta=1e-12).reshape(B, T)
        loss, _ = _loss(old_lp.view(B, T), None, adv, mask, "token-mean", cfg, support=sup)
        (grads[tail],) = torch.autograd.grad(loss, z)
    outside = torch.ones(V, dtype=torch.bool)
    outside[:K] = False
    assert grads["renormalize"][:, outside].abs().max() < 1e-12
    assert grads["bucket"][:, outside].abs().max() > 1e-4
    before, after = tail_mass(z), tail_mass(z - grads["bucket"])
    assert (after < before).all() and (before - after).sum() > 1e-3

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
"""Tests of troll_verl.core.losses against hand-written formulas (all loss_agg_modes, GSPO, IS weights)."""

import math

import pytest
import torch
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.losses import (
    LOSS_METRICS,
    MAX_METRICS,
    _loss_aggregation,
    compute_policy_loss_troll,
    with_aggregation,
)
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits
from troll_verl.core.terms import troll_token_terms
from troll_verl.testing.reference import dense_project_row


def _loss(*args, **kwargs):
    """compute_policy_loss_troll with every metric as a float (Metric values aggregated)."""
    loss, metrics = compute_policy_loss_troll(*args, **kwargs)
    return loss, {k: float(v.aggregate()) if isinstance(v, Metric) else v for k, v in metrics.items()}


AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _actor_config(loss_agg_mode="token-mean", **troll):
    return FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
        policy_loss=TrollPolicyLossConfig(**troll),
    )


def _batch(B=4, T=6, V=50, K=8, delta=1e-4, noise=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    z_old = torch.randn(B * T, V, generator=g, dtype=torch.float64) * 3
    z = (z_old + noise * torch.randn(B * T, V, generator=g, dtype=torch.float64)).requires_grad_(True)
    sampled = torch.multinomial(torch.softmax(z_old, -1), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z_old, topk=K, mass_delta=delta, value_dtype=torch.float64)
    old_lp = torch.log_softmax(z_old, -1).gather(1, sampled[:, None]).squeeze(1)
    lengths = torch.tensor([T, T - 2, 1, T - 3])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=torch.float64)[:, None].expand(B, T).clone()

    def support(logits=z):
        return troll_sparse_from_logits(logits, sampled, old, old_lp, topk=K, mass_delta=delta).reshape(B, T)

    return dict(z=z, support=support, old_lp=old_lp.view(B, T), mask=mask, adv=adv, K=K, delta=delta)


def _hand_token_terms(sup, old_lp, mask, eps):
    """Per-token projected sampled log-prob and regression KL(π̃ ‖ π), via the brute-force dense solver."""
    B, T = mask.shape
    proj_lp = torch.zeros(B, T, dtype=torch.float64)
    reg = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            m = sup.mask[b, t]
            new = sup.new_logprobs[b, t][m].detach()
            proj, _ = dense_project_row(new, sup.old_logprobs[b, t][m], eps)
            pos = int(m[: sup.sampled_index[b, t] + 1].sum()) - 1
            proj_lp[b, t] = proj[pos]
            reg[b, t] = (new.exp() * (new - proj)).sum()
    return proj_lp, reg


def _hand_agg(L, mask, mode):
    L = torch.where(mask, L, 0.0)
    n_tok = mask.sum(-1)
    has = n_tok > 0
    if mode == "token-mean":
        return L.sum() / mask.sum()
    if mode == "token-sum":
        return L.sum()
    if mode == "seq-mean-token-sum":
        return L.sum(-1)[has].mean()
    if mode == "seq-mean-token-mean":
        return (L.sum(-1)[has] / n_tok[has]).mean()
    if mode == "seq-mean-token-sum-norm":
        return L.sum(-1)[has].mean() / mask.shape[-1]
    raise AssertionError(mode)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_loss_matches_hand_formula_every_agg_mode(mode):
    d = _batch()
    cfg = _actor_config(mode, alpha=0.7)
    sup = d["support"]()
    loss, metrics = _loss(d["old_lp"], None, d["adv"], d["mask"], mode, cfg, support=sup)
    proj_lp, reg = _hand_token_terms(sup, d["old_lp"], d["mask"], 0.05)
    pg = -d["adv"] * torch.exp(proj_lp - d["old_lp"])
    expected = _hand_agg(pg, d["mask"], mode) + 0.7 * _hand_agg(reg, d["mask"], mode)
    torch.testing.assert_close(loss, expected, atol=1e-9, rtol=1e-7)
    assert metrics["troll/projected_frac"] > 0.2
    assert metrics["troll/kl_after_max"] <= 0.05
    assert math.isclose(metrics["troll/regression_loss"], _hand_agg(reg, d["mask"], mode).item(), rel_tol=1e-6)


def test_policy_term_gradient_is_its_derivative():
    """With α = 0 the loss is a plain function of the logits (η* included): gradcheck it."""
    d = _batch(B=2, T=3, V=20, K=4, delta=1e-3)
    cfg = _actor_config("seq-mean-token-mean", alpha=0.0)

    def fn(z):
        sup = d["support"](z)
        return _loss(d["old_lp"][:2], None, d["adv"][:2], d["mask"][:2], cfg.loss_agg_mode,
                                         cfg, support=sup)[0]  # fmt: skip

    assert torch.autograd.gradcheck(fn, (d["z"],), eps=1e-6, atol=1e-6)


def test_regression_term_gradient_stops_at_the_projection():
    """α·KL(π̃ ‖ sg π): the gradient treats π as a constant (it is not the derivative through η*)."""
    d = _batch()
    cfg = _actor_config("seq-mean-token-sum", alpha=1.0)
    zero_adv = torch.zeros_like(d["adv"])
    sup = d["support"]()
    loss, _ = _loss(d["old_lp"], None, zero_adv, d["mask"], cfg.loss_agg_mode, cfg, support=sup)
    (g,) = torch.autograd.grad(loss, d["z"])
    sup = d["support"]()
    B, T = d["mask"].shape
    reg = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if d["mask"][b, t]:
                m = sup.mask[b, t]
                new = sup.new_logprobs[b, t][m]
                proj, _ = dense_project_row(new.detach(), sup.old_logprobs[b, t][m], 0.05)
                reg[b, t] = (new.exp() * (new - proj)).sum()
    (g_hand,) = torch.autograd.grad(_hand_agg(reg, d["mask"], cfg.loss_agg_mode), d["z"])
    torch.testing.assert_close(g, g_hand, atol=1e-9, rtol=1e-6)


def test_gspo_sequence_ratio():
    d = _batch()
    cfg = _actor_config("seq-mean-token-mean", ratio_level="sequence", alpha=0.0)
    sup = d["support"]()
    loss, _ = _loss(d["old_lp"], None, d["adv"], d["mask"], "seq-mean-token-mean", cfg, support=sup)
    proj_lp, _ = _hand_token_terms(sup, d["old_lp"], d["mask"], 0.05)
    m = d["mask"]
    seq = torch.where(m, proj_lp - d["old_lp"], 0.0).sum(-1) / m.sum(-1)
    r = torch.exp(seq.clamp(max=10.0))[:, None].expand_as(m)
    torch.testing.assert_close(loss, _hand_agg(-d["adv"] * r, m, "seq-mean-token-mean"), atol=1e-9, rtol=1e-7)
    # gradient: sg(r_i) · ∇ log π(o_t), i.e. the token surrogate weighted by the detached sequence ratio
    (g,) = torch.autograd.grad(loss, d["z"])
    from troll_verl.core.projection import project

    sup2 = d["support"]()
    pl = project(sup2.new_logprobs, sup2.old_logprobs, 0.05, mask=sup2.mask & m[..., None]).logprobs
    lp = pl.gather(-1, sup2.sampled_index[..., None]).squeeze(-1)
    n = m.sum(-1, keepdim=True)
    surrogate = (torch.where(m, -d["adv"] * r.detach() * lp, 0.0) / n).sum(-1).mean()
    (g_hand,) = torch.autograd.grad(surrogate, d["z"])
    torch.testing.assert_close(g, g_hand, atol=1e-9, rtol=1e-7)


def test_gspo_log_ratio_is_capped():
    d = _batch()
    cfg = _actor_config("seq-mean-token-mean", ratio_level="sequence", alpha=0.0)
    cap = cfg.policy_loss.troll.seq_log_ratio_cap  # 10, the reference's
    old = d["old_lp"] - 50.0  # every sequence ratio ≫ exp(cap)
    loss, _ = _loss(old, None, d["adv"], d["mask"], "seq-mean-token-mean", cfg, support=d["support"]())
    expected = _hand_agg(-d["adv"] * math.exp(cap), d["mask"], "seq-mean-token-mean")
    torch.testing.assert_close(loss, expected, atol=1e-9, rtol=1e-7)


def test_rollout_is_weights_scale_the_policy_term_only():
    d = _batch()
    cfg = _actor_config(alpha=0.5)
    sup = d["support"]()
    w = torch.rand(d["mask"].shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    loss, m = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, w, support=sup)
    proj_lp, reg = _hand_token_terms(sup, d["old_lp"], d["mask"], 0.05)
    pg = -d["adv"] * torch.exp(proj_lp - d["old_lp"]) * w
    expected = _hand_agg(pg, d["mask"], "token-mean") + 0.5 * _hand_agg(reg, d["mask"], "token-mean")
    torch.testing.assert_close(loss, expected, atol=1e-9, rtol=1e-7)


def test_global_batch_info_is_used():
    d = _batch()
    cfg = _actor_config("token-mean")
    sup = d["support"]()
    local, _ = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, support=sup)
    cfg.global_batch_info.update(dp_size=2, batch_num_tokens=100, global_batch_size=8, loss_scale_factor=None)
    scaled, _ = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, support=sup)
    torch.testing.assert_close(scaled, local * d["mask"].sum() / 100 * 2)


def test_inside_trust_region_is_unclipped_ratio_without_regression():
    d = _batch(noise=1e-3)
    cfg = _actor_config()
    sup = d["support"]()
    loss, m = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, support=sup)
    assert m["troll/projected_frac"] == 0.0 and m["troll/regression_loss"] == 0.0
    new_lp = sup.new_logprobs.gather(-1, sup.sampled_index[..., None]).squeeze(-1)
    expected = _hand_agg(-d["adv"] * torch.exp(new_lp - d["old_lp"]), d["mask"], "token-mean")
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_zero_advantages_give_exactly_zero_gradient_in_fp32(ratio_level):
    """Old and current policy identical (the first mini-batch of a step), every advantage 0: the loss gradient is
    exactly zero, as clip's is: the regression term's fp32 rounding noise on unprojected rows (zero in exact
    arithmetic) must not leak into the logits' gradient, where Adam would turn it into a full-size step."""
    g = torch.Generator().manual_seed(3)
    B, T, V, K = 4, 6, 300, 16
    z = (torch.randn(B * T, V, generator=g) * 2).requires_grad_(True)
    sampled = torch.multinomial(torch.softmax(z.detach(), -1), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z.detach(), topk=K, mass_delta=1e-5)
    old_lp = torch.log_softmax(z.detach(), -1).gather(1, sampled[:, None]).view(B, T)
    cfg = _actor_config("seq-mean-token-mean", ratio_level=ratio_level, topk=K)
    sup = troll_sparse_from_logits(z, sampled, old, old_lp.view(-1), topk=K, mass_delta=1e-5).reshape(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    loss, m = _loss(old_lp, None, torch.zeros(B, T), mask, cfg.loss_agg_mode, cfg, support=sup)
    (grad,) = torch.autograd.grad(loss, z)
    assert m["troll/projected_frac"] == 0.0 and m["troll/regression_loss"] == 0.0
    assert bool((grad == 0).all()), f"max |grad| {grad.abs().max().item():.3g}"


def test_padding_garbage_does_not_leak():
    d = _batch()
    cfg = _actor_config()
    old, adv = d["old_lp"].clone(), d["adv"].clone()
    old[~d["mask"]] = math.nan
    adv[~d["mask"]] = math.inf
    loss, metrics = _loss(old, None, adv, d["mask"], "token-mean", cfg, support=d["support"]())
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values())
    loss.backward()
    assert torch.isfinite(d["z"].grad).all()


def test_metrics_carry_their_aggregation():
    """Maxima combine by max and the loss's parts like verl's actor/pg_loss (sum once normalised by the global
    batch); every other metric is a float that verl averages."""
    d = _batch()
    cfg = _actor_config()
    _, m = compute_policy_loss_troll(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, support=d["support"]())
    assert all(m[k].aggregation == AggregationType.MAX for k in MAX_METRICS)
    assert all(m[k].aggregation == AggregationType.MEAN for k in LOSS_METRICS)  # no global batch info: local mean
    assert all(isinstance(v, float) for k, v in m.items() if k not in MAX_METRICS | LOSS_METRICS)
    for info in ({"dp_size": 2}, {"dp_size": 1, "batch_num_tokens": 10}, {"loss_scale_factor": 4}):
        wrapped = with_aggregation({"troll/pg_loss": 1.0, "troll/eta_max": 2.0, "troll/kl_before": 3.0},
                                   _loss_aggregation(info))  # fmt: skip
        assert wrapped["troll/pg_loss"].aggregation == AggregationType.SUM
        assert wrapped["troll/eta_max"].aggregation == AggregationType.MAX and wrapped["troll/kl_before"] == 3.0


def test_metrics_equal_their_definitions_on_the_terms():
    """Every trust-region metric is its definition evaluated on the per-token terms of the response tokens: means,
    maxima, η over the projected tokens only, the k1 estimate of KL(π_old ‖ π̃) as verl's actor/ppo_kl; TROLL never
    clips."""
    d = _batch()
    cfg = _actor_config(kl_bound=1.0)  # about half the tokens projected
    support = d["support"]()
    _, m = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, support=support)
    mask = d["mask"]
    terms, iters = troll_token_terms(support, cfg.policy_loss.troll, row_mask=mask)
    t = {name: value[mask].detach().double() for name, value in zip(terms._fields, terms, strict=True)}
    projected = t["projected"] > 0
    kl_bound = cfg.policy_loss.troll.kl_bound
    expected = {
        "troll/kl_before": t["kl_before"].mean(),
        "troll/kl_after": t["kl_after"].mean(),
        "troll/kl_after_max": t["kl_after"].max(),
        "troll/bound_violation_max": (t["kl_after"] - kl_bound).clamp_min(0.0).max(),
        "troll/projected_frac": projected.double().mean(),
        "troll/eta_mean": t["eta"][projected].mean(),
        "troll/eta_max": t["eta"][projected].max(),
        "troll/support_size": t["support_size"].mean(),
        "troll/covered_mass": t["covered_mass"].mean(),
        "troll/solver_iters": float(iters),
        "actor/ppo_kl": (d["old_lp"][mask] - t["log_prob"]).mean(),
        "actor/pg_clipfrac": 0.0,
        "actor/pg_clipfrac_lower": 0.0,
    }
    assert 0.0 < float(expected["troll/projected_frac"]) < 1.0  # both kinds of token are in the batch
    assert MAX_METRICS <= set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(float(value), rel=1e-6, abs=1e-12), key  # projected_frac is fp32


def test_a_bound_the_solver_cannot_reach_is_reported():
    """With η capped far below what the projection needs, π̃ stays outside the KL ball: troll/bound_violation_max is
    the largest excess KL(π̃ ‖ π_old) − bound over the response tokens, and 0 where the solver may go as far as it
    needs."""
    d = _batch(noise=3.0)
    support = d["support"]()
    _, free = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", _actor_config(kl_bound=0.05),
                    support=support)  # fmt: skip
    assert free["troll/projected_frac"] > 0 and free["troll/bound_violation_max"] <= 1e-6
    capped = _actor_config(kl_bound=0.05, eta_max=1e-3)
    _, m = _loss(d["old_lp"], None, d["adv"], d["mask"], "token-mean", capped, support=support)
    terms, _ = troll_token_terms(support, capped.policy_loss.troll, row_mask=d["mask"])
    excess = (terms.kl_after[d["mask"]].double() - 0.05).clamp_min(0.0).max()
    assert m["troll/bound_violation_max"] > 0.05
    assert m["troll/bound_violation_max"] == pytest.approx(float(excess), rel=1e-6)
    assert m["troll/kl_after_max"] == pytest.approx(0.05 + m["troll/bound_violation_max"], rel=1e-6)


def test_missing_support_and_bad_shapes_raise():
    d = _batch()
    cfg = _actor_config()
    with pytest.raises(ValueError, match="token distributions"):
        compute_policy_loss_troll(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg)
    flat = d["support"]().reshape(-1)
    with pytest.raises(ValueError, match="reshape"):
        compute_policy_loss_troll(d["old_lp"], None, d["adv"], d["mask"], "token-mean", cfg, support=flat)
    with pytest.raises(ValueError, match="config"):
        compute_policy_loss_troll(d["old_lp"], None, d["adv"], d["mask"], support=d["support"]())


def test_a_backend_output_not_shaped_like_the_logits_is_refused(monkeypatch):
    import troll_verl.core.losses as losses
    from troll_verl.core.terms import TROLL_LOGITS_OUTPUT_KEYS

    logits = torch.zeros(1, 5, 7)
    good = {key: torch.zeros(1, 5) for key in ("log_probs", *TROLL_LOGITS_OUTPUT_KEYS)}
    returned = {}
    backend = type("Backend", (), {"compute_troll_token_terms": staticmethod(lambda *args: dict(returned))})
    monkeypatch.setattr(losses, "troll_backend", lambda strategy: backend)
    cfg = _actor_config()
    returned.update(good, troll_kl_after=torch.zeros(5))
    with pytest.raises(RuntimeError, match=r"'fsdp'.*'troll_kl_after' \(5,\), expected \(1, 5\)"):
        losses.troll_logits_fn(logits, {}, cfg)
    del returned["troll_kl_after"]
    with pytest.raises(RuntimeError, match="'troll_kl_after' missing"):
        losses.troll_logits_fn(logits, {}, cfg)

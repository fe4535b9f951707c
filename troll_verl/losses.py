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
"""The TROLL policy loss (arXiv:2510.03817 §4, §7) on padded ``(bsz, resp_len[, S + 1])`` tensors.

    J = E[ mean_t  π(o_t)/π_old(o_t) · A_t ]  −  α · KL(π̃ ‖ sg(π))                              # TROLL §4

π is the per-token KL projection of the current policy π̃ (:func:`troll_verl.projection.project`) on the
sparse support built by :mod:`troll_verl.sparse`. There is no clipping. Aggregation goes only through verl's
``agg_loss(..., **config.global_batch_info)``, so every ``loss_agg_mode`` and data-parallel split is honoured.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from verl.trainer.ppo.core_algos import agg_loss
from verl.utils import torch_functional as verl_F

from .config import TrollPolicyLossConfig, troll_settings
from .projection import full_precision, project
from .sparse import SparseSupport

__all__ = [
    "TrollTokenTerms",
    "troll_token_terms",
    "troll_policy_objective",
    "compute_policy_loss_troll",
    "MAX_METRICS",
]

# Metrics that must be reduced with max (not mean) across micro-batches and ranks.
MAX_METRICS = frozenset({"troll/kl_after_max", "troll/eta_max", "troll/bound_violation_max"})


class TrollTokenTerms(NamedTuple):
    """Per-token TROLL quantities, all of the same shape (e.g. ``(N,)`` or ``(bsz, T)``).

    ``proj_log_prob``, ``log_prob`` and ``regression`` carry gradients; the rest are detached diagnostics.

    Attributes:
        proj_log_prob: log π(o_t), the projected log-prob of the sampled token.
        log_prob: log π̃(o_t), the current (unprojected) log-prob of the sampled token.
        regression: KL(π̃ ‖ sg π) on the support plus tail (TROLL §4).
        kl_before: KL(π̃ ‖ π_old).   kl_after: KL(π ‖ π_old).   eta: η*.
        projected: 1.0 where the token was projected.   support_size: union size without the tail.
        covered_mass: mass of π̃ on the union.
    """

    proj_log_prob: torch.Tensor
    log_prob: torch.Tensor
    regression: torch.Tensor
    kl_before: torch.Tensor
    kl_after: torch.Tensor
    eta: torch.Tensor
    projected: torch.Tensor
    support_size: torch.Tensor
    covered_mass: torch.Tensor

    def map(self, fn) -> TrollTokenTerms:
        """Apply ``fn`` to every field (e.g. reshape, pad)."""
        return TrollTokenTerms(*(fn(t) for t in self))


@full_precision
def troll_token_terms(
    support: SparseSupport, cfg: TrollPolicyLossConfig, row_mask: torch.Tensor | None = None
) -> tuple[TrollTokenTerms, int]:
    """Project every token and form its TROLL terms (TROLL §1–4), on any leading shape.

    Args:
        support: :class:`SparseSupport` with ``(..., S + 1)`` fields.
        cfg: TROLL settings.
        row_mask: optional bool ``(...)``: tokens outside it are not projected (identity, zero terms).

    Returns:
        ``(terms, solver_iters)``: :class:`TrollTokenTerms` of shape ``(...)`` and the solver's iteration count.
    """
    new_lp = support.new_logprobs
    sup_mask = support.mask if row_mask is None else support.mask & row_mask[..., None]
    if cfg.tail == "renormalize":
        # NOTE: the paper's treatment (ablation): drop the tail bucket and renormalise on the union support.
        sup_mask = sup_mask.clone()
        sup_mask[..., -1] = False
        lse = torch.logsumexp(new_lp.masked_fill(~sup_mask, float("-inf")), dim=-1, keepdim=True)
        new_lp = new_lp - torch.where(torch.isfinite(lse), lse, 0.0)

    # TROLL §1-3: per-token projection onto KL(π ‖ π_old) ≤ ε, differentiable through η*.
    proj = project(
        new_lp,
        support.old_logprobs,
        cfg.kl_bound,
        mask=sup_mask,
        solver=cfg.solver,
        max_iter=cfg.solver_max_iter,
        tol=cfg.solver_tol,
        eta_max=cfg.eta_max,
    )
    idx = support.sampled_index[..., None]
    # TROLL §4: regression of the raw output onto its own projection, KL(π̃ ‖ sg π) on S + tail.
    # NOTE: computed on projected rows only. On a row inside the ball π = π̃ exactly (η = 0), so the term is zero
    # in value and in exact gradient; its floating-point gradient, π̃_a (1 − Σ_b π̃_b) w.r.t. log π̃_a, is rounding
    # noise (~1e-6 per row in fp32) that Adam normalises into a full-size step, moving a policy whose advantages
    # are all zero. Masking keeps the loss the same function with an exactly zero gradient there.
    reg_mask = sup_mask & proj.projected[..., None]
    reg = torch.where(reg_mask, torch.exp(new_lp) * (new_lp - proj.logprobs.detach()), 0.0).sum(-1)
    with torch.no_grad():
        projected = proj.projected.to(new_lp.dtype)
        eta = torch.where(proj.projected, proj.eta, 0.0)
        support_size = support.mask[..., :-1].sum(-1).to(new_lp.dtype)
        covered = 1.0 - torch.exp(support.new_logprobs[..., -1])
    terms = TrollTokenTerms(
        proj_log_prob=proj.logprobs.gather(-1, idx).squeeze(-1),
        log_prob=new_lp.gather(-1, idx).squeeze(-1),
        regression=reg,
        kl_before=proj.kl_before,
        kl_after=proj.kl_after,
        eta=eta,
        projected=projected,
        support_size=support_size,
        covered_mass=covered,
    )
    return terms, proj.num_iters


def troll_policy_objective(
    terms: TrollTokenTerms,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Aggregate per-token TROLL terms into the policy loss (TROLL §4, §7).

        loss = agg(−A_t · r_t) + α · agg(KL(π̃ ‖ sg π)),   r_t = π(o_t) / π_old(o_t)

    with no clipping, or GSPO's sequence-level ratio when ``ratio_level=sequence``.

    Args:
        terms: :class:`TrollTokenTerms` of shape ``(bsz, T)``.
        old_log_prob, advantages, response_mask: ``(bsz, T)``.
        loss_agg_mode: verl's aggregation mode.
        config: verl ``ActorConfig``; settings from ``config.policy_loss``, normalisation from
            ``config.global_batch_info`` (through ``agg_loss``).
        rollout_is_weights: optional ``(bsz, T)``, applied to the policy-gradient term only.

    Returns:
        ``(loss, metrics)`` with float metrics (keys in :data:`MAX_METRICS` are maxima).
    """
    cfg = troll_settings(config)
    mask = response_mask.bool()
    proj_log_prob = terms.proj_log_prob
    old_log_prob = torch.where(mask, old_log_prob, 0.0)
    log_ratio = torch.where(mask, proj_log_prob - old_log_prob, 0.0)
    if cfg.ratio_level == "token":
        # r_t = π(o_t) / π_old(o_t); clamped as in verl for exp() stability, no clipping (TROLL §4).
        log_ratio = log_ratio.clamp(-20.0, 20.0)
    else:
        # GSPO (TROLL §7): r_{i,t} = sg[exp(mean_t(log π(o_t) − log π_old(o_t)))] · π(o_t) / sg[π(o_t)],
        # log-ratio capped at seq_log_ratio_cap, no clipping.
        seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp_min(1)
        log_ratio = proj_log_prob - proj_log_prob.detach() + seq_log_ratio.detach()[:, None]
        log_ratio = log_ratio.clamp(max=cfg.seq_log_ratio_cap)
    pg_losses = -advantages * torch.exp(log_ratio)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_losses = torch.where(mask, pg_losses, 0.0)
    reg = torch.where(mask, terms.regression, 0.0)

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    reg_loss = agg_loss(loss_mat=reg, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    loss = pg_loss + cfg.alpha * reg_loss

    metrics = _metrics(terms, mask, old_log_prob, cfg.kl_bound)
    metrics["troll/pg_loss"] = pg_loss.detach().item()
    metrics["troll/regression_loss"] = reg_loss.detach().item()
    return loss, metrics


def compute_policy_loss_troll(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    support: SparseSupport | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Compute the TROLL policy objective and its metrics from a padded sparse support.

    See https://arxiv.org/abs/2510.03817 (TROLL). The signature is verl's ``PolicyLossFn`` plus ``support``; in a
    verl run the engine-side path (:mod:`troll_verl.loss_fn`) computes the same terms where the logits live.

    Args:
        old_log_prob: ``(bsz, T)`` old log-prob of the sampled tokens (the old-log-prob pass).
        log_prob: ``(bsz, T)`` current log-prob of the sampled tokens; unused (kept for the ``PolicyLossFn``
            signature; the value inside ``support`` is used).
        advantages: ``(bsz, T)`` advantages.
        response_mask: ``(bsz, T)`` mask of the tokens that enter the loss.
        loss_agg_mode: verl's aggregation mode (token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean,
            seq-mean-token-sum-norm).
        config: verl ``ActorConfig``; TROLL's settings come from ``config.policy_loss`` (see
            :func:`troll_verl.config.troll_settings`) and ``config.global_batch_info`` feeds ``agg_loss``.
        rollout_is_weights: optional ``(bsz, T)`` rollout-correction weights, applied to the policy-gradient
            term. NOTE: not to the regression term, which is a full-distribution KL at the visited state and does
            not depend on the sampled token.
        support: :class:`troll_verl.sparse.SparseSupport` with ``(bsz, T, S + 1)`` fields (current policy with
            gradient, old policy, mask, sampled positions).

    Returns:
        ``(loss, metrics)``: the scalar loss to minimise and a dict of floats (keys in :data:`MAX_METRICS` are
        maxima).
    """
    if config is None:
        raise ValueError("compute_policy_loss_troll needs the actor config (config=...).")
    if support is None:
        raise ValueError(
            "loss_mode=troll needs the sparse top-K distributions of both policies, which verl's generic policy-loss "
            "call (ppo_loss) does not provide. Run verl through TROLL's trainer: add "
            "trainer.v1.trainer_mode=troll to your overrides (or launch with python -m troll_verl.main)."
        )
    mask = response_mask.bool()
    if support.new_logprobs.shape[:-1] != mask.shape:
        raise ValueError(
            f"support fields must have shape (bsz, T, S + 1) matching response_mask {tuple(mask.shape)}, got "
            f"{tuple(support.new_logprobs.shape)}; reshape the support with SparseSupport.reshape(bsz, T)."
        )
    terms, iters = troll_token_terms(support, troll_settings(config), row_mask=mask)
    loss, metrics = troll_policy_objective(
        terms, old_log_prob, advantages, mask, loss_agg_mode, config, rollout_is_weights
    )
    metrics["troll/solver_iters"] = float(iters)
    return loss, metrics


@torch.no_grad()
def _metrics(terms: TrollTokenTerms, mask, old_log_prob, kl_bound) -> dict[str, float]:
    """Trust-region diagnostics over the tokens in ``mask``; verl-compatible keys included."""
    if int(mask.sum()) == 0:
        return {k: 0.0 for k in _METRIC_KEYS}
    projected = (terms.projected > 0) & mask
    n_proj = projected.sum().clamp_min(1)
    kl_after = torch.where(mask, terms.kl_after, 0.0)
    return {
        "troll/kl_before": verl_F.masked_mean(terms.kl_before, mask).item(),
        "troll/kl_after": verl_F.masked_mean(terms.kl_after, mask).item(),
        "troll/kl_after_max": kl_after.max().item(),
        # residual violation at the solver's limits (eta_max); 0 when every bound holds
        "troll/bound_violation_max": (kl_after - kl_bound).clamp_min(0.0).max().item(),
        "troll/projected_frac": verl_F.masked_mean(projected.float(), mask).item(),
        "troll/eta_mean": (torch.where(projected, terms.eta, 0.0).sum() / n_proj).item(),
        "troll/eta_max": torch.where(projected, terms.eta, 0.0).max().item(),
        "troll/support_size": verl_F.masked_mean(terms.support_size, mask).item(),
        "troll/covered_mass": verl_F.masked_mean(terms.covered_mass, mask).item(),
        "actor/ppo_kl": verl_F.masked_mean(torch.where(mask, old_log_prob - terms.log_prob, 0.0), mask).item(),
        # TROLL does not clip; kept so existing dashboards keep their panels
        "actor/pg_clipfrac": 0.0,
        "actor/pg_clipfrac_lower": 0.0,
    }


_METRIC_KEYS = (
    "troll/kl_before",
    "troll/kl_after",
    "troll/kl_after_max",
    "troll/bound_violation_max",
    "troll/projected_frac",
    "troll/eta_mean",
    "troll/eta_max",
    "troll/support_size",
    "troll/covered_mass",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
)

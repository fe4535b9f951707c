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

from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss
from verl.utils import torch_functional as verl_F

from .config import troll_settings
from .projection import project
from .sparse import SparseSupport

__all__ = ["compute_policy_loss_troll", "MAX_METRICS"]

# Metrics that must be reduced with max (not mean) across micro-batches and ranks.
MAX_METRICS = frozenset({"troll/kl_after_max", "troll/eta_max", "troll/bound_violation_max"})


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
    """Compute the TROLL policy objective and its metrics.

    See https://arxiv.org/abs/2510.03817 (TROLL). The signature is verl's ``PolicyLossFn`` plus ``support``.

    Args:
        old_log_prob: ``(bsz, T)`` old log-prob of the sampled tokens (the old-log-prob pass).
        log_prob: ``(bsz, T)`` current, unprojected log-prob of the sampled tokens (metrics only; taken from
            ``support`` if None).
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
            "call does not provide. Install the TROLL engine loss (troll_verl's verl plugin) instead of calling "
            "the registered function directly."
        )
    cfg = troll_settings(config)
    mask = response_mask.bool()
    if support.new_logprobs.shape[:-1] != mask.shape:
        raise ValueError(
            f"support fields must have shape (bsz, T, S + 1) matching response_mask {tuple(mask.shape)}, got "
            f"{tuple(support.new_logprobs.shape)}; reshape the support with SparseSupport.reshape(bsz, T)."
        )
    new_lp = support.new_logprobs
    sup_mask = support.mask & mask[..., None]
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
    proj_log_prob = proj.logprobs.gather(-1, idx).squeeze(-1)  # log π(o_t), (bsz, T)
    old_log_prob = torch.where(mask, old_log_prob, 0.0)
    log_ratio = torch.where(mask, proj_log_prob - old_log_prob, 0.0)

    if cfg.ratio_level == "token":
        # r_t = π(o_t) / π_old(o_t); clamped as in verl for exp() stability, no clipping (TROLL §4).
        log_ratio = log_ratio.clamp(-20.0, 20.0)
    else:
        # GSPO (TROLL §7): r_{i,t} = sg[exp(mean_t(log π(o_t) − log π_old(o_t)))] · π(o_t) / sg[π(o_t)],
        # log-ratio capped at seq_log_ratio_cap, no clipping.
        seq_len = mask.sum(-1).clamp_min(1)
        seq_log_ratio = log_ratio.sum(-1) / seq_len
        log_ratio = proj_log_prob - proj_log_prob.detach() + seq_log_ratio.detach()[:, None]
        log_ratio = log_ratio.clamp(max=cfg.seq_log_ratio_cap)
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_losses = torch.where(mask, pg_losses, 0.0)

    # TROLL §4: regression of the raw output onto its own projection, α · KL(π̃ ‖ sg π) on S + tail.
    reg = torch.where(sup_mask, torch.exp(new_lp) * (new_lp - proj.logprobs.detach()), 0.0).sum(-1)

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    reg_loss = agg_loss(loss_mat=reg, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    loss = pg_loss + cfg.alpha * reg_loss

    metrics = _metrics(proj, support, sup_mask, mask, old_log_prob, log_prob, cfg.kl_bound)
    metrics["troll/pg_loss"] = pg_loss.detach().item()
    metrics["troll/regression_loss"] = reg_loss.detach().item()
    return loss, metrics


@torch.no_grad()
def _metrics(proj, support, sup_mask, mask, old_log_prob, log_prob, kl_bound) -> dict[str, float]:
    """Trust-region diagnostics over the tokens in ``mask``; verl-compatible keys included."""
    if log_prob is None:
        log_prob = support.new_logprobs.gather(-1, support.sampled_index[..., None]).squeeze(-1)
    n = mask.sum()
    if int(n) == 0:
        return {k: 0.0 for k in _METRIC_KEYS}
    projected = proj.projected & mask
    n_proj = projected.sum().clamp_min(1)
    kl_after = torch.where(mask, proj.kl_after, 0.0)
    tail_mass = torch.exp(support.new_logprobs[..., -1])
    return {
        "troll/kl_before": verl_F.masked_mean(proj.kl_before, mask).item(),
        "troll/kl_after": verl_F.masked_mean(proj.kl_after, mask).item(),
        "troll/kl_after_max": kl_after.max().item(),
        # residual violation at the solver's limits (eta_max); 0 when every bound holds
        "troll/bound_violation_max": (kl_after - kl_bound).clamp_min(0.0).max().item(),
        "troll/projected_frac": verl_F.masked_mean(projected.float(), mask).item(),
        "troll/eta_mean": (torch.where(projected, proj.eta, 0.0).sum() / n_proj).item(),
        "troll/eta_max": torch.where(projected, proj.eta, 0.0).max().item(),
        "troll/support_size": verl_F.masked_mean(sup_mask[..., :-1].sum(-1).float(), mask).item(),
        "troll/covered_mass": verl_F.masked_mean(1.0 - tail_mass, mask).item(),
        "troll/solver_iters": float(proj.num_iters),
        "actor/ppo_kl": verl_F.masked_mean(torch.where(mask, old_log_prob - log_prob, 0.0), mask).item(),
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
    "troll/solver_iters",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
)

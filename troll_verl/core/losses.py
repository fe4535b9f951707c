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
"""The TROLL policy loss (arXiv:2510.03817 §4, §7) and its engine hooks.

    J = E[ mean_t  π(o_t)/π_old(o_t) · A_t ]  −  α · KL(π̃ ‖ sg(π))                              # TROLL §4

π is the per-token KL projection of the current policy π̃ (:func:`project`) on the sparse support built from the
logits (TROLL §5). There is no clipping. Aggregation goes only through verl's
``agg_loss(..., **config.global_batch_info)``, so every ``loss_agg_mode`` and data-parallel split is honoured.

TROLL needs the token distributions, not only the sampled tokens' log-probs, so it runs where the logits live, as
hooks inside the engine's forward pass (verl's policy-loss logits hook, ``PolicyLossSpec``)::

    old-log-prob pass (forward only)
      logits ─ troll_old_pass_fn ─→ old top-K ids, log-probs, tail per row ─→ stored response-aligned (OLD_FIELDS)
             (where verl stores its own top-K, OLD_TOPK_KEYS, troll_old_fields derives OLD_FIELDS in the update)
    update pass
      logits ─ troll_logits_fn ─→ union support ─→ projection ─→ per-token terms per row (TROLL_LOGITS_OUTPUT_KEYS)
             ─→ verl: SP/CP gather, nest, pad ─→ compute_policy_loss_troll ─→ verl's ppo_loss: entropy, KL to ref

The backend functions (``fsdp/losses.py``, ``megatron/losses.py``) share one signature (:class:`TrollBackend`) and
are picked by ``config.strategy`` (:data:`BACKENDS`). TROLL's settings are ``config.policy_loss.troll``
(:class:`TrollConfig`).
"""

import importlib
from typing import Any, Protocol

import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss
from verl.utils import torch_functional as verl_F
from verl.utils.metric import AggregationType, Metric

from .layout import OLD_FIELDS, OLD_TOPK_KEYS
from .sparse import SparseSupport, old_topk_from_pass
from .terms import TROLL_LOGITS_OUTPUT_KEYS, TrollTokenTerms, troll_token_terms
from .variants import variant

__all__ = [
    "TrollTokenTerms",
    "troll_token_terms",
    "troll_policy_objective",
    "compute_policy_loss_troll",
    "troll_logits_fn",
    "troll_old_pass_fn",
    "troll_old_fields",
    "troll_backend",
    "TrollBackend",
    "BACKENDS",
    "TROLL_LOGITS_OUTPUT_KEYS",
    "MAX_METRICS",
    "LOSS_METRICS",
    "with_aggregation",
]

# Metrics that must be reduced with max (not mean) across micro-batches and ranks.
MAX_METRICS = frozenset({"troll/kl_after_max", "troll/eta_max", "troll/bound_violation_max", "troll/solver_iters"})
# Metrics of the loss's parts: normalised like the loss, so aggregated like verl's actor/pg_loss.
LOSS_METRICS = frozenset({"troll/pg_loss", "troll/regression_loss"})


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
        config: verl ``ActorConfig``; settings from ``config.policy_loss.troll``, normalisation from
            ``config.global_batch_info`` (through ``agg_loss``).
        rollout_is_weights: optional ``(bsz, T)``, applied to the policy-gradient term only.

    Returns:
        ``(loss, metrics)`` with 0-d tensor metrics on the loss's device (keys in :data:`MAX_METRICS` are maxima),
        read back by the caller in one transfer (:func:`compute_policy_loss_troll` does, once per micro-batch).
    """
    cfg = config.policy_loss.troll
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
    regression_rule = variant("regression", cfg.regression)  # None: every token's, the core's
    if regression_rule is not None:
        reg = regression_rule(reg, advantages, mask)

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    reg_loss = agg_loss(loss_mat=reg, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    loss = pg_loss + cfg.alpha * reg_loss

    metrics = _metrics(terms, mask, old_log_prob, cfg.kl_bound)
    metrics["troll/pg_loss"] = pg_loss.detach()
    metrics["troll/regression_loss"] = reg_loss.detach()
    return loss, metrics


# ------------------------------------------------------------------------------------------------------------
# the engine hooks (verl's PolicyLossSpec): called with the logits of one micro-batch inside the forward pass
# ------------------------------------------------------------------------------------------------------------
class TrollBackend(Protocol):
    """What a backend module provides (``fsdp/losses.py``, ``megatron/losses.py``): the two engine functions, with one
    signature."""

    def compute_troll_old_topk(
        self, student_logits: torch.Tensor, data: TensorDict, cfg: Any, data_format: str = "thd"
    ) -> dict[str, torch.Tensor]:
        """The old-log-prob pass's hook: the old policy's top-K per logits row (:func:`troll_old_pass_fn`)."""

    def compute_troll_token_terms(
        self, student_logits: torch.Tensor, data: TensorDict, cfg: Any, data_format: str = "thd"
    ) -> dict[str, torch.Tensor]:
        """The update pass's hook: TROLL's per-token terms per logits row (:func:`troll_logits_fn`)."""


# Actor strategy -> the folder of its backend (a TrollBackend module, ``<folder>/losses.py``, imported on first use):
# the one list of the strategies TROLL supports.
BACKENDS = {"fsdp": "fsdp", "fsdp2": "fsdp", "megatron": "megatron"}


def troll_backend(strategy: str) -> TrollBackend:
    """The backend module for an actor strategy (:data:`BACKENDS`).

    Raises:
        NotImplementedError: for a strategy TROLL has no backend for, naming the supported ones.
    """
    if strategy not in BACKENDS:
        raise NotImplementedError(
            f"TROLL supports actor strategies {', '.join(BACKENDS)}, got {strategy!r}; "
            "set actor_rollout_ref.actor.strategy=fsdp2."
        )
    return importlib.import_module(f".{BACKENDS[strategy]}.losses", __package__)


def troll_logits_fn(
    logits: torch.Tensor, data: TensorDict, config: Any, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """Update-pass hook: TROLL's per-token terms from the logits of one micro-batch (TROLL §1–5).

    Args:
        logits: temperature-scaled logits, ``(1, L, V)`` on FSDP (packed; under Ulysses SP this rank's shard),
            vocab- and context-parallel on Megatron.
        data: the micro-batch, with the old pass's fields (:data:`~troll_verl.core.layout.OLD_FIELDS`) and
            ``old_log_probs``.
        config: verl ``ActorConfig`` (``strategy``; settings in ``policy_loss.troll``).
        data_format: ``"thd"`` or ``"bshd"`` (Megatron's layout).

    Returns:
        Per-row tensors shaped like the logits' leading dims: ``"log_probs"`` (the sampled tokens' current
        log-probs, with gradient) and every key of :data:`TROLL_LOGITS_OUTPUT_KEYS`; rows that do not predict a
        response token hold 0.
    """
    cfg = config.policy_loss.troll
    outputs = troll_backend(config.strategy).compute_troll_token_terms(logits, data, cfg, data_format)
    _check_outputs(outputs, logits.shape[:-1], config.strategy)
    # what the old-log-prob pass stored per response token and reached this update (measured)
    lengths = data["response_mask"].offsets().diff() if data["response_mask"].is_nested else None
    n_tokens = lengths.sum() if lengths is not None else data["response_mask"].sum()  # on the device: no host read
    stored = sum(_nbytes(data[key]) for key in OLD_FIELDS)
    ref = outputs["log_probs"]
    per_token = stored / n_tokens.to(device=ref.device, dtype=torch.float32).clamp_min(1.0)
    outputs["troll_old_bytes_per_token"] = per_token.expand(ref.shape).clone()
    return outputs


def _check_outputs(outputs: dict[str, torch.Tensor], shape: torch.Size, strategy: str) -> None:
    """Every per-row output of a backend is shaped like the logits' leading dims (the engine gathers them with the
    logits' layout); raises ``RuntimeError`` naming the backend and the key otherwise."""
    expected = ("log_probs", *(key for key in TROLL_LOGITS_OUTPUT_KEYS if key != "troll_old_bytes_per_token"))
    for key in expected:
        got = outputs.get(key)
        if got is None or got.shape != shape:
            raise RuntimeError(
                f"TROLL backend {BACKENDS[strategy]!r} (strategy {strategy!r}) returned "
                f"{key!r} {'missing' if got is None else tuple(got.shape)}, expected {tuple(shape)} (the logits' "
                "leading dims)"
            )


def troll_old_pass_fn(
    logits: torch.Tensor, data: TensorDict, config: Any, data_format: str = "thd"
) -> dict[str, torch.Tensor]:
    """Old-log-prob-pass hook: the old policy's sparse top-K at every row (TROLL §5).

    Args: as :func:`troll_logits_fn` (no gradient).

    Returns:
        ``{"troll_old_ids": (..., K) int32, "troll_old_logprobs": (..., K), "troll_old_tail": (...) fp32}`` per
        row (-1 / 0 off response rows); verl keeps the response rows and stores them next to ``old_log_probs``.
    """
    return troll_backend(config.strategy).compute_troll_old_topk(logits, data, config.policy_loss.troll, data_format)


def troll_old_fields(data: TensorDict, cfg: Any) -> TensorDict:
    """The update's micro-batch with TROLL's old top-K (:data:`~troll_verl.core.layout.OLD_FIELDS`) derived from the
    plain top-K verl's old-log-prob pass stored (:data:`~troll_verl.core.layout.OLD_TOPK_KEYS`, with
    ``actor.calculate_old_topk``), by TROLL's mass rule (:func:`~troll_verl.core.sparse.old_topk_from_pass`).

    Args:
        data: the micro-batch; the stored keys nested ``(bsz, j, ...)`` (v1 trainer) or padded ``(bsz, T, ...)``
            (legacy trainer).
        cfg: TROLL settings (``topk``, ``mass_delta``, ``floor``, ``value_dtype``).

    Returns:
        A shallow copy of ``data`` with the three OLD_FIELDS added, laid out as the stored keys (``data`` itself is
        not changed); ``data`` as is where it already carries OLD_FIELDS (TROLL's own old pass stored them).

    Raises:
        ValueError: where the old-log-prob pass stored no top-K, naming the setting.
    """
    if all(key in data.keys() for key in OLD_FIELDS):
        return data
    missing = [key for key in OLD_TOPK_KEYS if key not in data.keys()]
    if missing:
        raise ValueError(
            f"TROLL's update pass needs {missing} from verl's old-log-prob pass: set "
            f"actor_rollout_ref.actor.calculate_old_topk={cfg.topk} (rollout_correction.bypass_mode skips that pass "
            "and is not supported)."
        )
    stored = [data[key] for key in OLD_TOPK_KEYS]
    nested = stored[0].is_nested
    old = old_topk_from_pass(
        *(t.values() if nested else t for t in stored), topk=cfg.topk, mass_delta=cfg.mass_delta, floor=cfg.floor,
        value_dtype=cfg.value_dtype,
    )  # fmt: skip
    out = data.copy()
    for key, value in zip(OLD_FIELDS, old, strict=True):
        out[key] = torch.nested.nested_tensor_from_jagged(value, stored[0].offsets()) if nested else value
    return out


def _nbytes(tensor: torch.Tensor) -> int:
    return (tensor.values() if tensor.is_nested else tensor).numel() * tensor.element_size()


def compute_policy_loss_troll(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    logits_outputs: dict[str, torch.Tensor] | None = None,
    support: SparseSupport | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Compute the TROLL policy objective (trust-region projection instead of ratio clipping) and its metrics.

    See https://arxiv.org/abs/2510.03817 (TROLL). verl's ``ppo_loss`` calls it with the per-token terms that
    :func:`troll_logits_fn` computed inside the forward pass (``logits_outputs``); called directly, it computes them
    from a padded sparse support.

    Args:
        old_log_prob: ``(bsz, T)`` old log-prob of the sampled tokens (the old-log-prob pass).
        log_prob: ``(bsz, T)`` current (unprojected) log-prob of the sampled tokens.
        advantages: ``(bsz, T)`` advantages.
        response_mask: ``(bsz, T)`` mask of the tokens that enter the loss.
        loss_agg_mode: verl's aggregation mode (token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean,
            seq-mean-token-sum-norm).
        config: verl ``ActorConfig``; TROLL's settings are ``config.policy_loss.troll`` and
            ``config.global_batch_info`` feeds ``agg_loss``.
        rollout_is_weights: optional ``(bsz, T)`` rollout-correction weights, applied to the policy-gradient
            term. NOTE: not to the regression term, which is a full-distribution KL at the visited state and does
            not depend on the sampled token.
        logits_outputs: ``{key: (bsz, T)}`` for the keys in :data:`TROLL_LOGITS_OUTPUT_KEYS`, from verl.
        support: instead of ``logits_outputs``, a sparse support with ``(bsz, T, S + 1)`` fields (current policy
            with gradient, old policy, mask, sampled positions); ``log_prob`` is then taken from it.

    Returns:
        ``(loss, metrics)``: the scalar loss to minimise and its metrics; maxima (:data:`MAX_METRICS`) and the
        loss's parts (:data:`LOSS_METRICS`) come as ``Metric`` with their aggregation, the rest as floats (mean).
    """
    if config is None:
        raise ValueError("compute_policy_loss_troll needs the actor config (config=...).")
    cfg = config.policy_loss.troll
    mask = response_mask.bool()
    extra = {}
    if logits_outputs is not None:
        missing = [key for key in TROLL_LOGITS_OUTPUT_KEYS if key not in logits_outputs]
        if missing:
            raise ValueError(f"logits_outputs lacks {missing}: they come from troll_logits_fn in the forward pass.")
        terms = TrollTokenTerms(
            log_prob=log_prob,
            **{name: logits_outputs[f"troll_{name}"] for name in TrollTokenTerms._fields if name != "log_prob"},
        )
        iters = torch.where(mask, logits_outputs["troll_solver_iters"], 0.0).max()
        extra["troll/old_topk_bytes_per_token"] = _masked_mean(logits_outputs["troll_old_bytes_per_token"], mask)
    elif support is not None:
        if support.new_logprobs.shape[:-1] != mask.shape:
            raise ValueError(
                f"support fields must have shape (bsz, T, S + 1) matching response_mask {tuple(mask.shape)}, got "
                f"{tuple(support.new_logprobs.shape)}; reshape the support with SparseSupport.reshape(bsz, T)."
            )
        terms, iters = troll_token_terms(support, cfg, row_mask=mask)
    else:
        raise ValueError(
            "loss_mode=troll needs the token distributions, not only the sampled tokens' log-probs: its terms are "
            "computed by troll_logits_fn inside the engine's forward pass (logits_outputs=), which needs an engine "
            "with the policy-loss logits hook and use_fused_kernels=False."
        )
    loss, metrics = troll_policy_objective(
        terms, old_log_prob, advantages, mask, loss_agg_mode, config, rollout_is_weights
    )
    metrics["troll/solver_iters"] = iters
    metrics.update(extra)
    return loss, with_aggregation(_to_host(metrics), _loss_aggregation(config.global_batch_info))


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` as a 0-d tensor, 0 where the mask is empty (no host read)."""
    return torch.where(mask.any(), verl_F.masked_mean(values.float(), mask), 0.0)


def _to_host(metrics: dict[str, Any]) -> dict[str, float]:
    """Every 0-d tensor metric as a float, read back in one transfer (one device sync per micro-batch)."""
    keys = [key for key, value in metrics.items() if isinstance(value, torch.Tensor)]
    out = {key: value for key, value in metrics.items() if key not in keys}
    if keys:
        values = torch.stack([metrics[key].detach().to(torch.float64).reshape(()) for key in keys]).tolist()
        out.update(zip(keys, values, strict=True))
    return {key: out[key] for key in metrics}


def with_aggregation(metrics: dict[str, float], loss_aggregation: AggregationType) -> dict[str, Any]:
    """Wrap the metrics that do not average across micro-batches and ranks in a ``Metric`` naming how they combine.

    Args:
        metrics: float metrics by key.
        loss_aggregation: the aggregation of the loss's parts (:data:`LOSS_METRICS`), verl's for ``actor/pg_loss``.

    Returns:
        ``metrics`` with :data:`MAX_METRICS` as ``Metric(MAX)``, :data:`LOSS_METRICS` as ``Metric(loss_aggregation)``
        and every other value unchanged (a float, which verl averages).
    """
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if key in MAX_METRICS:
            out[key] = Metric(AggregationType.MAX, value)
        elif key in LOSS_METRICS:
            out[key] = Metric(loss_aggregation, value)
        else:
            out[key] = value
    return out


def _loss_aggregation(global_batch_info: dict) -> AggregationType:
    """How the loss's parts combine: as verl's ``ppo_loss`` decides for ``actor/pg_loss``.

    Normalised by the global batch (as ``agg_loss`` does whenever any global batch information is set) the parts are
    partial sums, so they add up. NOTE: verl's ``ppo_loss`` (``workers/utils/losses.py``) decides this for
    ``actor/pg_loss`` and hands a policy loss no such decision, so this mirrors its rule.
    """
    global_norm = (
        global_batch_info.get("dp_size", 1) > 1
        or global_batch_info.get("batch_num_tokens") is not None
        or global_batch_info.get("global_batch_size") is not None
        or global_batch_info.get("loss_scale_factor") is not None
    )
    return AggregationType.SUM if global_norm else AggregationType.MEAN


@torch.no_grad()
def _metrics(terms: TrollTokenTerms, mask, old_log_prob, kl_bound) -> dict[str, torch.Tensor]:
    """Trust-region diagnostics over the tokens in ``mask`` as 0-d tensors (0 when it is empty); verl-compatible
    keys included."""
    projected = (terms.projected > 0) & mask
    kl_after = torch.where(mask, terms.kl_after, 0.0)
    eta = torch.where(projected, terms.eta, 0.0)
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    metrics = {
        "troll/kl_before": _masked_mean(terms.kl_before, mask),
        "troll/kl_after": _masked_mean(terms.kl_after, mask),
        "troll/kl_after_max": kl_after.max() if kl_after.numel() else zero,
        # residual violation at the solver's limits (eta_max); 0 when every bound holds
        "troll/bound_violation_max": (kl_after - kl_bound).clamp_min(0.0).max() if kl_after.numel() else zero,
        "troll/projected_frac": _masked_mean(projected.float(), mask),
        "troll/eta_mean": eta.sum() / projected.sum().clamp_min(1),
        "troll/eta_max": eta.max() if eta.numel() else zero,
        "troll/support_size": _masked_mean(terms.support_size, mask),
        "troll/covered_mass": _masked_mean(terms.covered_mass, mask),
        "actor/ppo_kl": _masked_mean(torch.where(mask, old_log_prob - terms.log_prob, 0.0), mask),
        # TROLL does not clip; actor/pg_clipfrac(_lower) are kept so existing dashboards keep their panels
        "actor/pg_clipfrac": zero,
        "actor/pg_clipfrac_lower": zero,
    }
    return metrics

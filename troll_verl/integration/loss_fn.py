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
"""TROLL on a verl without the policy-loss logits hook (verl 0.9 as released): the actor worker's loss closure.

Where verl has the hook (``core_algos.PolicyLossSpec``, upstream B and C in ``upstream/``), TROLL registers its
hooks with the loss and verl's own ``ppo_loss`` does everything (:mod:`troll_verl.integration.plugin`); this module is
not used.

On verl 0.9 as released, verl's engines call the installed loss function in two ways (the pattern of verl's top-K
distillation):

(a) as a *logits processor* inside the forward pass, ``loss_fn(student_logits=..., data=micro_batch)``, when the
    micro-batch carries ``distillation_use_topk=True``; it returns per-row tensors that the engine gathers
    across sequence-parallel ranks and nests per sequence into ``model_output``;
(b) as the *final loss*, ``loss_fn(model_output=..., data=micro_batch, dp_group=...)`` → ``(loss, metrics)``.

TROLL's actor training worker (:class:`troll_verl.integration.workers.TrollActorTrainingWorker`) installs
:class:`TrollLossFn` and tags each of its calls with ``troll_mode``; the closure runs the old pass's hook
(:func:`~troll_verl.core.losses.troll_old_pass_fn`) and the update's, the one the seam registers
(:func:`~troll_verl.core.losses.troll_logits_fn`)::

    old-log-prob pass (troll_mode="old", forward only)
      logits ─(a)→ troll_old_pass_fn, per row ─→ response rows ─(b)→ the worker's OldTopKCache (old_cache.py)
      (where verl's engine keeps per-row scalars only, FSDP's, the K-wide rows are gathered across SP ranks in (a)
      and reach (b) on the micro-batch: _STOCK_ENGINE_OLD_ROWS; Megatron's engine carries them in the model
      output.) Nothing of the old top-K enters the pass's output.

    update pass (troll_mode="update", distillation_only: verl skips its own log-prob/CE on these logits; the worker
    put the old top-K on the update's batch)
      logits ─(a)→ troll_logits_fn, per row (log_probs and TROLL's terms) ─→ verl: SP gather + nest
      model_output ─(b)→ verl's ppo_loss: entropy bonus, KL to the reference, global-batch aggregation, metrics;
                         its call of loss "troll" reads TROLL's padded terms from this module (stock_policy_loss);
                         the metrics' aggregations are restored by key once it returns
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.utils.ulysses import gather_outputs_and_unpad, get_ulysses_sequence_parallel_world_size
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from troll_verl.core.layout import OLD_FIELDS, response_rows
from troll_verl.core.losses import (
    BACKENDS,
    LOSS_METRICS,
    MAX_METRICS,
    TROLL_LOGITS_OUTPUT_KEYS,
    compute_policy_loss_troll,
    troll_logits_fn,
    troll_old_pass_fn,
    with_aggregation,
)

from .config import troll_settings
from .diagnostics import FLOOR_ONLY_KEY, REGRESSION_MODE, floor_only_rows

__all__ = ["TrollLossFn", "TROLL_MODE_KEY", "stock_policy_loss"]

logger = logging.getLogger(__name__)

# Non-tensor key set by TROLL's worker on the micro-batches of the two passes.
TROLL_MODE_KEY = "troll_mode"


# NOTE: verl 0.9's ppo_loss calls a registered policy loss with the sampled tokens' log-probs and the config only
# (workers/utils/losses.py: policy_loss_fn(old_log_prob=, log_prob=, advantages=, response_mask=, loss_agg_mode=,
# config=, rollout_is_weights=)): no engine output reaches it, and the config is shared by every call. So TROLL's
# padded per-token terms go in through one window, TrollLossFn._update_loss's call of ppo_loss, which sets this
# variable before and resets it after (try/finally): inside it, stock_policy_loss reads that micro-batch's terms;
# outside it, the variable is None and stock_policy_loss refuses. Nothing comes back through it: the metrics return
# through ppo_loss's own return value. A context variable, so concurrent calls (threads, asyncio tasks) never see
# each other's terms. With verl's seam (upstream B and C) none of this is used.
_STOCK_ROUTE_TERMS: contextvars.ContextVar[dict[str, torch.Tensor] | None] = contextvars.ContextVar(
    "troll_stock_route_terms", default=None
)
# the old pass's K-wide rows, left on the micro-batch by the logits hook (a) for the final call (b): the engine passes
# the same micro-batch object to both (FSDP: prepare_model_outputs, then the loss)
_OLD_ROWS_KEY = "troll_old_rows"


def _fsdp_old_rows(old: dict[str, torch.Tensor], data: TensorDict) -> dict[str, torch.Tensor]:
    """This micro-batch's old top-K rows over its whole packed sequence, from this rank's hook outputs.

    Args:
        old: the FSDP backend's ``compute_troll_old_topk`` outputs ``(1, L, ...)`` of this rank's shard.
        data: the micro-batch (its nested ``input_ids`` give the packed length).

    Returns:
        ``{key: (n_tokens, ...)}``, gathered across Ulysses ranks as verl's FSDP engine gathers ``log_probs`` (every
        rank runs the hook); the shard itself without sequence parallelism.
    """
    n_tokens = int(data["input_ids"].offsets()[-1])
    sp = get_ulysses_sequence_parallel_world_size()
    if sp <= 1:
        return {key: value.squeeze(0) for key, value in old.items()}
    return {
        key: gather_outputs_and_unpad(
            value.squeeze(0), gather_dim=0, unpad_dim=0, padding_size=value.shape[1] * sp - n_tokens
        )
        for key, value in old.items()
    }


# verl 0.9's engines and the old pass's K-wide rows, by backend (the core's BACKENDS): FSDP's asserts that every
# logits-hook output is one value per row (prepare_model_outputs), so the rows go beside the hook on the micro-batch,
# gathered here (upstream PR B lifts the assert); Megatron's keeps per-row outputs with trailing dims, gathers them
# across CP ranks and nests them per sequence, so they travel through the hook itself (None).
_STOCK_ENGINE_OLD_ROWS: dict[str, Callable | None] = {"fsdp": _fsdp_old_rows, "megatron": None}


def stock_policy_loss(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
    rollout_is_weights=None,
):  # fmt: skip
    """Loss "troll" as verl 0.9's ``ppo_loss`` calls it from :class:`TrollLossFn`'s final call.

    verl 0.9's ``ppo_loss`` hands a policy loss no engine outputs, so the padded terms come from the final call's
    window (:data:`_STOCK_ROUTE_TERMS`). It wraps every metric the loss returns as a mean and refuses ``Metric``
    values, so the metrics go back as floats; :class:`TrollLossFn` restores their aggregations by key once
    ``ppo_loss`` has returned.

    Args: as :func:`~troll_verl.core.losses.compute_policy_loss_troll`, all ``(bsz, T)``.

    Returns:
        ``(loss, metrics)``: the scalar loss and float metrics.

    Raises:
        ValueError: outside TROLL's update pass, naming the override that routes verl through TROLL's passes.
    """
    terms = _STOCK_ROUTE_TERMS.get()
    if terms is None:
        raise ValueError(
            "loss_mode=troll needs the sparse top-K distributions of both policies, which verl's generic policy-loss "
            "call (ppo_loss) does not provide on this verl; TROLL's actor training worker provides them, and it is "
            "not installed in this worker process. verl installs it with troll-verl's plugin: check that troll-verl "
            "is installed in every node's Python and that VERL_USE_EXTERNAL_PLUGINS does not exclude 'troll' "
            "(docs/install.md#troubleshooting)."
        )
    loss, metrics = compute_policy_loss_troll(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
        logits_outputs=terms,
    )  # fmt: skip
    return loss, {key: value.aggregate() if isinstance(value, Metric) else value for key, value in metrics.items()}


class TrollLossFn:
    """verl loss closure for TROLL on verl 0.9 as released; picklable, one instance per actor worker.

    Args:
        config: the actor's ``ActorConfig``. A plain ``PolicyLossConfig`` (only ``loss_mode=troll`` set) is replaced
            by :class:`~troll_verl.config.TrollPolicyLossConfig` with the paper's defaults.
        old_sink: where the old-log-prob pass's old top-K goes, one micro-batch at a time:
            ``old_sink(micro_batch, rows, log_probs)`` with the response-aligned OLD_FIELDS rows and the sampled
            tokens' log-probs of the same pass (:meth:`troll_verl.integration.old_cache.OldTopKCache.put`).
    """

    def __init__(self, config: Any, old_sink: Callable[[TensorDict, dict, torch.Tensor], None] | None = None):
        self.config = dataclasses.replace(config, policy_loss=troll_settings(config))
        self.old_sink = old_sink
        # policy_loss.diagnostics (troll_verl.integration.diagnostics): the floor-only share per micro-batch, and the
        # regression-only loss of the extra pass (no entropy bonus, no KL loss: they belong to the other part)
        self.diagnostics = bool(getattr(self.config.policy_loss, "diagnostics", False))
        self._regression_config = dataclasses.replace(self.config, entropy_coeff=0.0, use_kl_loss=False)
        self._estimate_configs: dict[str, Any] = {}
        # bypass mode: the next update call is the step's first micro-batch (the train-inference mismatch)
        self._mismatch_pending = False
        self._mismatch_warned = False

    def measure_mismatch(self) -> None:
        """Report ``troll/mismatch_kl`` and ``troll/mismatch_projected_frac`` on the next update micro-batch.

        In bypass mode the old distribution is the rollout policy's; before the step's first optimizer step the
        actor's weights are the ones the rollout ran, so the sparse KL between the two on that micro-batch is the
        train–inference mismatch alone, and the share projected is what that mismatch costs.
        """
        self._mismatch_pending = True

    def __call__(
        self,
        model_output: dict | None = None,
        data: TensorDict | None = None,
        dp_group=None,
        student_logits: torch.Tensor | None = None,
        data_format: str = "thd",
    ):
        mode = tu.get_non_tensor_data(data=data, key=TROLL_MODE_KEY, default=None)
        if mode not in ("old", "update", REGRESSION_MODE):
            raise RuntimeError(
                "TROLL's loss function was called outside TROLL's old-log-prob or update pass (troll_mode is "
                f"{mode!r}): only TROLL's actor training worker (troll_verl.integration.workers."
                "TrollActorTrainingWorker) may call it, and it tags both passes."
            )
        if student_logits is not None:
            if mode == "old":
                return self._old_hook(student_logits, data, data_format)
            outputs = troll_logits_fn(student_logits, data, self.config, data_format)
            if self.diagnostics and mode == "update":
                outputs[FLOOR_ONLY_KEY] = floor_only_rows(
                    outputs,
                    lambda name: troll_logits_fn(student_logits.detach(), data, self._with_estimate(name), data_format),
                    self.config.policy_loss.troll.old_estimate,
                )
            return outputs
        if mode == "old":
            return self._old_pass_output(model_output, data)
        if mode == REGRESSION_MODE:
            return self._regression_loss(model_output, data, dp_group)
        return self._update_loss(model_output, data, dp_group)

    def _with_estimate(self, name: str) -> Any:
        """The actor config with TROLL's ``old_estimate`` set to ``name`` (the diagnostics' comparison)."""
        if name not in self._estimate_configs:
            policy_loss = dataclasses.replace(self.config.policy_loss, old_estimate=name)
            self._estimate_configs[name] = dataclasses.replace(self.config, policy_loss=policy_loss)
        return self._estimate_configs[name]

    # ---------------------------------------------------------------------------------------------------------
    # old-log-prob pass
    # ---------------------------------------------------------------------------------------------------------
    def _old_hook(self, logits: torch.Tensor, data: TensorDict, data_format: str) -> dict[str, torch.Tensor]:
        old = troll_old_pass_fn(logits, data, self.config, data_format)  # refuses a strategy without a backend
        old_rows = _STOCK_ENGINE_OLD_ROWS[BACKENDS[self.config.strategy]]
        if old_rows is None:
            return old  # per-row (1, L, K): gathered and nested by the engine
        # the engine keeps (L,) outputs only: the rows go beside the hook, on the micro-batch, to its final call (b)
        tu.assign_non_tensor(data, **{_OLD_ROWS_KEY: old_rows(old, data)})
        return {}

    def _old_pass_output(self, model_output: dict, data: TensorDict):
        handoff = tu.get_non_tensor_data(data=data, key=_OLD_ROWS_KEY, default=None)
        if handoff is not None:
            del data[_OLD_ROWS_KEY]
            full = handoff
        elif all(key in model_output for key in OLD_FIELDS):
            full = {key: model_output.pop(key).values() for key in OLD_FIELDS}  # through the hook (Megatron)
        else:
            raise RuntimeError(
                "TROLL's old-log-prob pass produced no logits: the engine did not call the logits hook. "
                "use_fused_kernels=True never materialises logits; set actor_rollout_ref.model.use_fused_kernels=False."
            )
        if self.old_sink is None:
            raise RuntimeError(
                "TROLL's old-log-prob pass has nowhere to keep the old top-K (TrollLossFn(old_sink=...))."
            )
        # full-sequence rows → response-aligned rows, as old_log_probs are stored; kept on this worker
        rows = response_rows(data)
        device = next(iter(full.values())).device
        response = {key: values[rows.to(device)] for key, values in full.items()}
        self.old_sink(data, response, no_padding_2_padding(model_output["log_probs"], data))
        return torch.zeros((), device=device), {}

    # ---------------------------------------------------------------------------------------------------------
    # update pass: verl's own ppo_loss, with TROLL's terms handed to loss "troll"
    # ---------------------------------------------------------------------------------------------------------
    def _regression_loss(self, model_output: dict, data: TensorDict, dp_group):
        """The diagnostics' extra pass: ``α·L_reg`` alone, aggregated as the update's loss is (verl's ``ppo_loss`` with
        every advantage zero, so the policy-gradient term is exactly zero, and no entropy bonus or KL loss)."""
        data = data.copy()
        data["advantages"] = torch.zeros_like(data["advantages"])
        loss, _ = self._update_loss(model_output, data, dp_group, self._regression_config)
        return loss, {}

    def _update_loss(self, model_output: dict, data: TensorDict, dp_group, config: Any = None):
        missing = [key for key in ("log_probs", *TROLL_LOGITS_OUTPUT_KEYS) if key not in model_output]
        if missing:
            raise RuntimeError(
                f"TROLL's per-token terms are missing from the model output ({missing}); the engine did not call the "
                "logits hook. use_fused_kernels=True never materialises logits; set "
                "actor_rollout_ref.model.use_fused_kernels=False."
            )
        terms = {key: no_padding_2_padding(model_output[key], data) for key in TROLL_LOGITS_OUTPUT_KEYS}
        token = _STOCK_ROUTE_TERMS.set(terms)
        try:
            loss, metrics = ppo_loss(config or self.config, model_output, data, dp_group)
        finally:
            _STOCK_ROUTE_TERMS.reset(token)
        if config is not None:
            return loss, metrics
        # verl 0.9's ppo_loss wrapped every policy-loss metric as a mean: the maxima become maxima again and the
        # loss's parts take verl's own aggregation of the loss (actor/pg_loss)
        retag = {key: metrics[key].aggregate() for key in MAX_METRICS | LOSS_METRICS if key in metrics}
        metrics.update(with_aggregation(retag, metrics["actor/pg_loss"].aggregation))
        if self._mismatch_pending:
            self._mismatch_pending = False
            metrics.update(self._mismatch_metrics(metrics))
        if FLOOR_ONLY_KEY in model_output:
            floor_only = no_padding_2_padding(model_output[FLOOR_ONLY_KEY], data)
            mask = data.select("response_mask").to_padded_tensor()["response_mask"].bool().to(floor_only.device)
            share = (floor_only * mask).sum() / mask.sum().clamp_min(1)
            metrics["troll/floor_only_frac"] = Metric(AggregationType.MEAN, float(share))
        return loss, metrics

    def _mismatch_metrics(self, metrics: dict) -> dict[str, Metric]:
        def value(key: str) -> float:
            item = metrics[key]
            return float(item.aggregate() if isinstance(item, Metric) else item)

        kl, projected = value("troll/kl_before"), value("troll/projected_frac")
        kl_bound = self.config.policy_loss.troll.kl_bound
        if kl > kl_bound and not self._mismatch_warned:
            self._mismatch_warned = True
            logger.warning(
                "TROLL bypass mode: the sparse KL between the rollout's and the actor's distributions is %.4g "
                "before any update, above kl_bound=%g: the trust region is spent on the train-inference mismatch "
                "(and, in the asynchronous trainers, the policy lag of stale rollouts) alone (%.1f%% of tokens "
                "projected). Raise actor_rollout_ref.actor.policy_loss.kl_bound, make the "
                "rollout's numerics match the actor's (dtype), or set algorithm.rollout_correction.bypass_mode="
                "false.",
                kl, kl_bound, 100 * projected,
            )  # fmt: skip
        return {
            "troll/mismatch_kl": Metric(AggregationType.MEAN, kl),
            "troll/mismatch_projected_frac": Metric(AggregationType.MEAN, projected),
        }

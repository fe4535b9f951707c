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
"""TROLL's engine-level loss closure for verl 0.9 (the ``set_loss_fn`` seam).

verl's engines call the installed loss function in two ways (the pattern of verl's top-K distillation):

(a) as a *logits processor* inside the forward pass, ``loss_fn(student_logits=..., data=micro_batch)``, when the
    micro-batch carries ``distillation_use_topk=True``; it returns per-token tensors that the engine gathers
    across sequence-parallel ranks and nests per sequence into ``model_output``;
(b) as the *final loss*, ``loss_fn(model_output=..., data=micro_batch, dp_group=...)`` → ``(loss, metrics)``.

TROLL's worker (:mod:`troll_verl.workers`) tags each call with ``troll_mode``::

    old-log-prob pass (troll_mode="old", forward only)
      logits ─(a)→ top-K + mass rule + tail at response rows ─→ stash ─(b)→ model_output["troll_old_*"]
      (stored response-aligned with old_log_probs; reaches update_actor through verl's TransferQueue)

    update pass (troll_mode="update", distillation_only: verl skips its own log-prob/CE on these logits)
      logits ─(a)→ union support ─→ projection ─→ per-token terms (1, L) ─→ verl: SP gather + nest
      model_output["troll_*"] ─(b)→ pad ─→ troll_policy_objective ─→ + entropy bonus + KL-to-ref ─→ loss

(b) mirrors verl's ``ppo_loss``: ``global_batch_info``, ``agg_loss`` for every term, ``rollout_is_weights``, metric
aggregation (SUM for losses normalised by the global batch, MEAN/MAX for diagnostics).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.padding import no_padding_2_padding

from .config import troll_settings
from .layout import OLD_FIELDS, response_lengths, response_rows
from .losses import MAX_METRICS, TrollTokenTerms, troll_policy_objective

__all__ = ["TrollLossFn", "TROLL_MODE_KEY"]

# Non-tensor key set by TROLL's worker on the micro-batches of the two passes.
TROLL_MODE_KEY = "troll_mode"


def _backend(strategy: str):
    """The backend module with ``compute_troll_old_topk`` / ``compute_troll_token_terms`` for ``strategy``."""
    match strategy:
        case "fsdp" | "fsdp2":
            from .fsdp import losses
        case "megatron":
            from .megatron import losses
        case _:
            raise NotImplementedError(
                f"TROLL supports actor strategies fsdp, fsdp2 and megatron, got {strategy!r}; "
                "set actor_rollout_ref.actor.strategy=fsdp2."
            )
    return losses


def _aggregation(key: str, loss_aggregation: AggregationType) -> AggregationType:
    """How a per-micro-batch TROLL metric combines: losses like the loss, maxima by max, the rest by mean."""
    if key in MAX_METRICS:
        return AggregationType.MAX
    if key in ("troll/pg_loss", "troll/regression_loss"):
        return loss_aggregation
    return AggregationType.MEAN


class TrollLossFn:
    """verl loss closure for TROLL; picklable, one instance per actor worker.

    Args:
        config: the actor's ``ActorConfig`` (TROLL settings in ``config.policy_loss``).
    """

    def __init__(self, config: Any):
        self.config = config
        self.settings = troll_settings(config)
        # what the logits hook (a) leaves for the final call (b) of the same micro-batch; see _handoff/_take
        self._handoff: tuple[int, str, Any] | None = None

    def __call__(
        self,
        model_output: dict | None = None,
        data: TensorDict | None = None,
        dp_group=None,
        student_logits: torch.Tensor | None = None,
        data_format: str = "thd",
    ):
        mode = tu.get_non_tensor_data(data=data, key=TROLL_MODE_KEY, default=None)
        if mode not in ("old", "update"):
            raise RuntimeError(
                "TROLL's loss function was called outside TROLL's old-log-prob or update pass (troll_mode is "
                f"{mode!r}). Run verl with trainer.v1.trainer_mode=troll so TROLL's worker tags its passes."
            )
        backend = _backend(self.config.strategy)
        if student_logits is not None:
            return self._logits_hook(backend, student_logits, data, mode, data_format)
        if mode == "old":
            return self._old_pass_output(model_output, data)
        return self._update_loss(model_output, data)

    # ---------------------------------------------------------------------------------------------------------
    # hook → final-call handoff. verl's engines call (a) then (b) for one micro-batch, with the same TensorDict
    # object, before the next micro-batch; anything else would silently mix micro-batches, so it is refused.
    # ---------------------------------------------------------------------------------------------------------
    def _give(self, data: TensorDict, mode: str, value: Any) -> None:
        if self._handoff is not None:
            raise RuntimeError(
                f"TROLL's logits hook ran for a new micro-batch ({mode} pass) before the final loss call of the "
                "previous one; the engine's call order changed (TROLL expects hook, then final call, per micro-batch)."
            )
        self._handoff = (id(data), mode, value)

    def _take(self, data: TensorDict, mode: str) -> Any:
        handoff, self._handoff = self._handoff, None
        if handoff is None:
            return None
        key, handoff_mode, value = handoff
        if key != id(data) or handoff_mode != mode:
            raise RuntimeError(
                f"TROLL's final loss call ({mode} pass) received a different micro-batch than its logits hook "
                f"({handoff_mode} pass); the engine's call order changed."
            )
        return value

    # ---------------------------------------------------------------------------------------------------------
    # (a) inside the forward pass
    # ---------------------------------------------------------------------------------------------------------
    def _logits_hook(self, backend, student_logits, data, mode, data_format) -> dict[str, torch.Tensor]:
        if mode == "old":
            old = backend.compute_troll_old_topk(student_logits, data, self.settings, data_format)
            if backend.OLD_PASS_THROUGH_HOOK:
                return old  # Megatron: per-row (1, L, K) tensors, gathered and nested by the engine
            # FSDP's hook carries per-row scalars only: attach the K-wide tensors in the final call.
            self._give(data, mode, old)
            return {}
        outputs, solver_iters = backend.compute_troll_token_terms(student_logits, data, self.settings, data_format)
        self._give(data, mode, solver_iters)
        return outputs

    # ---------------------------------------------------------------------------------------------------------
    # (b) after the forward pass
    # ---------------------------------------------------------------------------------------------------------
    def _old_pass_output(self, model_output: dict, data: TensorDict):
        pending = self._take(data, "old")
        if pending is None and all(k in model_output for k in OLD_FIELDS):
            # through the hook (Megatron): full-sequence rows → response-aligned rows, as old_log_probs are stored
            rows = response_rows(data)
            pending = {}
            for key in OLD_FIELDS:
                values = model_output.pop(key).values()
                pending[key] = values[rows.to(values.device)]
        if pending is None:
            raise RuntimeError(
                "TROLL's old-log-prob pass produced no logits: the engine did not call the logits hook. "
                "use_fused_kernels=True never materialises logits; set actor_rollout_ref.model.use_fused_kernels=False."
            )

        lengths = response_lengths(data)
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).to(next(iter(pending.values())).device)
        for key, values in pending.items():
            model_output[key] = torch.nested.nested_tensor_from_jagged(values, offsets)
        # (verl keeps no metric of a forward-only pass: the storage is measured in the update, where it arrives)
        return torch.zeros((), device=next(iter(pending.values())).device), {}

    def _update_loss(self, model_output: dict, data: TensorDict):
        config = self.config
        solver_iters = self._take(data, "update")
        try:
            terms = TrollTokenTerms(
                *(no_padding_2_padding(model_output[f"troll_{f}"], data) for f in TrollTokenTerms._fields)
            )
        except KeyError as e:
            raise RuntimeError(
                f"TROLL's per-token terms are missing from the model output ({e}); the engine did not call the "
                "logits hook. use_fused_kernels=True never materialises logits; set "
                "actor_rollout_ref.model.use_fused_kernels=False."
            ) from None
        entropy = model_output.get("entropy", None)
        if entropy is not None:
            entropy = no_padding_2_padding(entropy, data)

        # global batch info for loss aggregation (as verl's ppo_loss)
        config.global_batch_info["dp_size"] = data["dp_size"]
        config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]
        config.global_batch_info["global_batch_size"] = data["global_batch_size"]
        config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
        # A loss normalised by the global batch is a partial sum per micro-batch: aggregate its metric with SUM.
        global_norm = (
            data["dp_size"] > 1
            or data["batch_num_tokens"] is not None
            or data["global_batch_size"] is not None
            or config.loss_scale_factor is not None
        )
        loss_aggregation = AggregationType.SUM if global_norm else AggregationType.MEAN

        fields = ["response_mask", "old_log_probs", "advantages"]
        fields += [k for k in ("rollout_is_weights", "ref_log_prob") if k in data]
        padded = data.select(*fields).to_padded_tensor()
        response_mask = padded["response_mask"].bool()

        policy_loss, troll_metrics = troll_policy_objective(
            terms,
            padded["old_log_probs"],
            padded["advantages"],
            response_mask,
            config.loss_agg_mode,
            config,
            padded.get("rollout_is_weights", None),
        )
        metrics = {k: Metric(_aggregation(k, loss_aggregation), v) for k, v in troll_metrics.items()}
        # what the old-log-prob pass stored per response token and TransferQueue delivered here (measured)
        stored = [data[k] for k in OLD_FIELDS if k in data.keys()]
        n_tokens = max(int(response_mask.sum()), 1)
        nbytes = sum((t.values() if t.is_nested else t).numel() * t.element_size() for t in stored)
        metrics["troll/old_topk_bytes_per_token"] = Metric(AggregationType.MEAN, nbytes / n_tokens)
        metrics["troll/solver_iters"] = Metric(AggregationType.MAX, float(solver_iters or 0))
        metrics["actor/pg_loss"] = Metric(value=policy_loss, aggregation=loss_aggregation)

        if entropy is not None:
            entropy_loss = agg_loss(
                loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode,
                **config.global_batch_info,
            )  # fmt: skip
            policy_loss = policy_loss - config.entropy_coeff * entropy_loss
            metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=loss_aggregation)

        if config.use_kl_loss:
            # KL to the reference of the raw (unprojected) policy, as verl does with log_prob.
            kld = kl_penalty(logprob=terms.log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=config.kl_loss_type)
            kl_loss = agg_loss(
                loss_mat=kld, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
            )
            policy_loss = policy_loss + kl_loss * config.kl_loss_coef
            metrics["kl_loss"] = Metric(value=kl_loss, aggregation=loss_aggregation)
            metrics["kl_coef"] = config.kl_loss_coef
        return policy_loss, metrics

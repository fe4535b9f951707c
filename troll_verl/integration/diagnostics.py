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
"""TROLL's diagnostics (``policy_loss.diagnostics=true``): what each optimizer step of the update is made of.

The update's loss is ``L = L_pg + α·L_reg`` (TROLL §4): the policy-gradient term (with verl's entropy bonus and KL loss
where set) and the regression of π̃ onto its projection, KL(π̃ ‖ sg π). Per optimizer step (one mini-batch), logged by
verl under ``actor/``:

- ``troll/grad_norm_regression``: ‖∇ α·L_reg‖ and ``troll/grad_norm_pg``: ‖∇ L_pg‖, both before gradient clipping,
  so that with verl's ``actor/grad_norm`` = ‖∇ L‖ they say which part drove the step (the parts add up as vectors,
  not as norms);
- ``troll/zero_adv_frac``: 1 for a mini-batch whose advantages are all zero (every answer of each of its prompts got
  the same reward), else 0; its mean over a training step is the share of such optimizer steps;
- ``troll/zero_adv_grad_norm``: verl's gradient norm of those mini-batches only (absent where a step has none): what
  moved a policy that had no reward signal. Clip's is 0 there; TROLL's regression can make it any size.

Per micro-batch (a token mean, as ``troll/projected_frac``):

- ``troll/floor_only_frac``: the share of response tokens projected under the run's old-side estimate and not under
  the ``upper`` one (the largest old probability the stored top-K allows an unstored token,
  :mod:`troll_verl.ablations.old_estimates`): tokens projected only because of the floor's spurious KL (TROLL §5).

Cost when on: one extra forward and backward pass per optimizer step (the regression part alone, from the same
weights and mini-batch, before verl's own pass), a copy of the gradients, and one no-grad support under the upper
estimate per micro-batch. When off, nothing here runs.

How the parts are measured: the extra pass leaves ``r = ∇ α·L_reg`` in the gradients, which are copied; verl's own
pass then leaves ``g = ∇ L``, which verl clips to ``c = k·g`` before its optimizer step. A step pre-hook on the
optimizer (PyTorch's ``register_step_pre_hook``) reads ``⟨c, r⟩`` and ``‖c‖`` there; with verl's ``‖g‖`` the
unclipped ``⟨g, r⟩ = (‖g‖ / ‖c‖)·⟨c, r⟩`` gives ``‖g − r‖² = ‖g‖² − 2⟨g, r⟩ + ‖r‖²``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

__all__ = [
    "DIAGNOSTIC_METRICS",
    "FLOOR_ONLY_KEY",
    "REGRESSION_MODE",
    "GradientParts",
    "all_advantages_zero",
    "floor_only_rows",
]

# the diagnostics' metrics (logged under actor/): per optimizer step, and per micro-batch (floor_only_frac)
DIAGNOSTIC_METRICS = (
    "troll/grad_norm_pg",
    "troll/grad_norm_regression",
    "troll/zero_adv_frac",
    "troll/zero_adv_grad_norm",
    "troll/floor_only_frac",
)
# the per-row output of the update's logits hook that marks tokens projected only because of the floor
FLOOR_ONLY_KEY = "troll_floor_only"
# troll_mode of the extra pass: the loss function returns the regression part α·L_reg alone
REGRESSION_MODE = "regression"
# the estimate whose projection the floor's is compared with (troll_verl.ablations.old_estimates)
_BOUNDED_ESTIMATE = "upper"


def floor_only_rows(
    outputs: dict[str, torch.Tensor], terms_under: Callable[[str], dict[str, torch.Tensor]], estimate: str
) -> torch.Tensor:
    """Per logits row, 1.0 where the token was projected under ``estimate`` and would not be under ``upper``.

    Args:
        outputs: the update hook's per-row outputs under ``estimate`` (``troll_projected`` among them).
        terms_under: ``terms_under(name)`` computes the same outputs with the old-side estimate ``name``, without
            gradient.
        estimate: the run's ``old_estimate``.

    Returns:
        A float tensor shaped like ``outputs["troll_projected"]``; all zeros where ``estimate`` is ``upper`` itself.
    """
    projected = outputs["troll_projected"].detach() > 0
    if estimate == _BOUNDED_ESTIMATE:
        return torch.zeros_like(outputs["troll_projected"], dtype=torch.float32)
    with torch.no_grad():
        bounded = terms_under(_BOUNDED_ESTIMATE)["troll_projected"] > 0
    return (projected & ~bounded).to(torch.float32)


def all_advantages_zero(data: TensorDict, group=None) -> bool:
    """Whether every advantage on a response token of the mini-batch ``data`` is zero, on every rank of ``group``."""
    advantages, mask = data["advantages"], data["response_mask"]
    if advantages.is_nested:
        advantages, mask = advantages.values(), mask.values()
    largest = (advantages.abs() * mask.to(advantages.dtype)).amax() if advantages.numel() else advantages.new_zeros(())
    largest = largest.detach().float().reshape(1)
    if dist.is_initialized():
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return largest.item() == 0.0


def _square_norm(tensors: list[torch.Tensor], module) -> float:
    """‖tensors‖² over the whole model from this rank's gradient shards, in float64 (as verl's clipping measures it:
    torch's ``get_total_norm``; DTensors, FSDP2's, gather themselves; FSDP1's flat shards are summed over its
    process group)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not tensors:
        return 0.0
    norm = torch.nn.utils.get_total_norm([t.detach().double() for t in tensors], 2.0)
    full = getattr(norm, "full_tensor", None)
    square = (full() if full is not None else norm) ** 2
    if full is None and isinstance(module, FullyShardedDataParallel) and dist.is_initialized():
        dist.all_reduce(square, group=module.process_group)
    return float(square)


def _dot(a: list[torch.Tensor], b: list[torch.Tensor], module) -> float:
    """⟨a, b⟩ over the whole model, by ‖a + b‖² = ‖a‖² + 2⟨a, b⟩ + ‖b‖² (the norms as :func:`_square_norm`)."""
    both = [x.detach().double() + y.detach().double() for x, y in zip(a, b, strict=True)]
    return (_square_norm(both, module) - _square_norm(a, module) - _square_norm(b, module)) / 2


class GradientParts:
    """The gradient norms of the regression part and of the rest, for one optimizer step of verl's FSDP engine.

    Args:
        engine: verl's FSDP engine (``module``, ``optimizer``, ``forward_backward_batch``, ``optimizer_zero_grad``).
        loss_fn: the update's loss function; called with ``troll_mode`` ``"regression"`` it returns ``α·L_reg``.
    """

    def __init__(self, engine: Any, loss_fn: Callable):
        self.engine = engine
        self.loss_fn = loss_fn

    def _grads(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self.engine.module.parameters()]

    def measure(self, data: TensorDict, train_batch: Callable[[TensorDict], TensorDict | None]):
        """Run the extra pass, then ``train_batch(data)`` (verl's optimizer step); return its output with the parts.

        Args:
            data: the mini-batch, with the non-tensor keys verl's engine reads (the worker's defaults set).
            train_batch: verl's ``TrainingWorker.train_batch``.

        Returns:
            ``train_batch``'s output, its metrics with ``troll/grad_norm_pg`` and ``troll/grad_norm_regression`` added
            (on the rank that carries the output; none where verl skipped a non-finite step).
        """
        engine, module = self.engine, self.engine.module
        probe = data.copy()
        tu.assign_non_tensor(probe, troll_mode=REGRESSION_MODE)
        engine.optimizer_zero_grad()
        engine.forward_backward_batch(probe, loss_function=self.loss_fn, forward_only=False)
        regression = [None if g is None else g.detach().clone() for g in self._grads()]
        engine.optimizer_zero_grad()
        kept = [i for i, g in enumerate(regression) if g is not None]
        regression_sq = _square_norm([regression[i] for i in kept], module)
        seen: dict[str, float] = {}

        def at_step(optimizer, args, kwargs):
            # verl's clipped gradient c = k·g of every parameter the regression reached; the rest have r = 0
            grads = self._grads()
            both = [i for i in kept if grads[i] is not None]
            seen["clipped_sq"] = _square_norm([g for g in grads if g is not None], module)
            seen["dot"] = _dot([grads[i] for i in both], [regression[i] for i in both], module)

        handle = engine.optimizer.register_step_pre_hook(at_step)
        try:
            output = train_batch(data)
        finally:
            handle.remove()
        if output is None or "clipped_sq" not in seen:
            return output
        metrics = tu.get(output, "metrics")
        grad_norm = float(metrics["grad_norm"])
        clipped = math.sqrt(seen["clipped_sq"])
        dot = seen["dot"] * (grad_norm / clipped) if clipped > 0 else 0.0
        metrics["troll/grad_norm_regression"] = math.sqrt(regression_sq)
        metrics["troll/grad_norm_pg"] = math.sqrt(max(grad_norm**2 - 2 * dot + regression_sq, 0.0))
        return output

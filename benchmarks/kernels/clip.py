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
"""The sampled tokens' log-probs ``log softmax(z)[o_t]`` fused: what the clip objective needs from the logits.

Built from the same kernels as TROLL's path with the support ``S = {o_t}`` and no tail: the statistics pass (one read
per row, giving the log-sum-exp and ``z[o_t] − LSE``) and the backward pass (one read and one write per row,
``g · (1[b = o_t] − π_b)``). This is what a verl installation on a GPU runs for clip (flash-attn's Triton
cross-entropy), so it is the honest GPU baseline of the loss-step benchmark (``scripts/bench_kernels.py``).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from troll_verl.core.projection import full_precision
from troll_verl.kernels.grad import logits_grad
from troll_verl.kernels.stats import row_stats

__all__ = ["TokenLogProbs", "token_logprobs"]


class TokenLogProbs(torch.autograd.Function):
    """``(logits (N_all, V), labels (N,) int64, rows (N,) int64 or None)`` → ``(N,)`` fp32 log-probs of the labels
    at the selected rows; the gradient flows to the logits (zeros at unselected rows)."""

    @staticmethod
    @full_precision
    def forward(ctx, logits, labels, rows):
        """One launch: the statistics pass with a target."""
        lse, _, _, lp = row_stats(logits, rows, target=labels)
        ctx.save_for_backward(logits, rows, labels, lse, lp)
        return lp

    @staticmethod
    @once_differentiable
    @full_precision
    def backward(ctx, g):
        """One launch: :func:`troll_verl.kernels.grad.logits_grad` with ``S = {label}``."""
        logits, rows, labels, lse, lp = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        valid = torch.ones((labels.shape[0], 1), dtype=torch.bool, device=labels.device)
        grad = logits_grad(logits, rows, lse, labels[:, None], valid, g.float()[:, None], lp[:, None])
        return grad, None, None


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``log softmax(logits[rows])[labels]`` as ``(N,)`` fp32, differentiable (see :class:`TokenLogProbs`).

    Args:
        logits: ``(N_all, V)`` fp32/bf16/fp16 with a contiguous last dim. labels: ``(N,)`` token ids.
        rows: optional ``(N,)`` int64 distinct rows of ``logits`` (default all, ``N = N_all``).
    """
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be (N, V) with a contiguous last dim, got {tuple(logits.shape)}.")
    return TokenLogProbs.apply(logits, labels.long(), rows)

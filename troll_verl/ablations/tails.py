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
"""Tail ``renormalize``: the paper's treatment of the mass outside the support, against the core's tail bucket.

Registered as :data:`troll_verl.core.variants` switch ``tail``; :func:`troll_verl.core.support.projected_support`
calls it with ``tail="renormalize"`` (``policy_loss.troll.tail`` in the config).
"""

from __future__ import annotations

import torch

__all__ = ["renormalize_tail"]


def renormalize_tail(new_logprobs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the tail bucket and renormalise the current policy on the union support (TROLL §5, the paper's
    treatment). The logits outside the support then get no gradient at all, so nothing pulls back mass that leaks
    there (:mod:`troll_verl.core.sparse`: why the core keeps the bucket).

    Args:
        new_logprobs: ``(..., S + 1)`` the current policy's log-probs on the support, the tail bucket last.
        mask: ``(..., S + 1)`` bool, the slots the projection acts on.

    Returns:
        ``(new_logprobs, mask)``, both ``(..., S + 1)``: renormalised over the support, the bucket masked out.
    """
    mask = mask.clone()
    mask[..., -1] = False
    lse = torch.logsumexp(new_logprobs.masked_fill(~mask, float("-inf")), dim=-1, keepdim=True)
    return new_logprobs - torch.where(torch.isfinite(lse), lse, 0.0), mask

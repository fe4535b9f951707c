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
"""Regression rule ``advantage``: the regression term KL(π̃ ‖ sg π) only on tokens whose advantage is non-zero.

Registered as :data:`troll_verl.core.variants` switch ``regression`` (``policy_loss.regression=advantage``); the core's
rule, the paper's, regresses every token onto its projection (TROLL §4), whatever its advantage.

Why it is a candidate: a token outside the trust region gets the regression's pull back to the ball whether or not its
answer carried any reward signal. Where every advantage of a mini-batch is zero (each prompt's answers all right or all
wrong, common once a model masters its task), clip adds no gradient at all, while TROLL's regression alone is the
whole gradient, which verl's gradient clipping and Adam turn into a full-size step (docs/benchmarks.md, "After
mastery", H1). With this rule such a mini-batch adds no gradient, as clip's does; a token with a non-zero advantage
is still projected and regressed as in the paper.
"""

from __future__ import annotations

import torch

__all__ = ["advantage_regression"]


def advantage_regression(regression: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The regression term where the token's advantage is non-zero, zero elsewhere.

    # NOTE: a departure from the paper (TROLL §4 regresses every token): a candidate remedy, off by default.

    Args:
        regression: ``(bsz, T)`` per-token KL(π̃ ‖ sg π) (zero off the response and where not projected).
        advantages: ``(bsz, T)`` the tokens' advantages.
        mask: ``(bsz, T)`` bool, the tokens that enter the loss.

    Returns:
        ``(bsz, T)``: ``regression`` where ``mask`` and the advantage is non-zero, else 0.
    """
    return torch.where(mask & (advantages != 0), regression, 0.0)

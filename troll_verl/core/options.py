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
"""The choices of TROLL's variant switches, in one verl-free place (settings and kernels both read them).

Each tuple lists the values of one :class:`~troll_verl.core.config.TrollConfig` field; the first is the default. The
code that branches on each value lives with the math it changes (``docs/design.md``, "Extending").
"""

__all__ = ["RATIO_LEVELS", "TAILS", "OLD_ESTIMATES", "SOLVERS", "check_old_estimate"]

# ratio_level: the importance ratio per token (GRPO, Dr.GRPO, PPO) or GSPO's per sequence (TROLL §7); core/losses.py
RATIO_LEVELS = ("token", "sequence")
# tail: the mass outside the support as a differentiable bucket, or dropped and renormalised (the paper); core/terms.py
TAILS = ("bucket", "renormalize")
# old_estimate: the old-side value of a union token the old pass did not store; core/old_side.py
OLD_ESTIMATES = ("floor", "upper", "proportional")
# solver: the projection's root finder for η; core/projection.py
SOLVERS = ("newton", "bisection")


def check_old_estimate(old_estimate: str) -> None:
    """Raise ``ValueError`` unless ``old_estimate`` is one of :data:`OLD_ESTIMATES`."""
    if old_estimate not in OLD_ESTIMATES:
        raise ValueError(f"old_estimate must be one of {OLD_ESTIMATES}, got {old_estimate!r}.")

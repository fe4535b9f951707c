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
"""Whether the installed verl has the policy-loss logits seam (upstream B and C, ``upstream/``).

A policy loss registered with a ``core_algos.PolicyLossSpec`` gets the engine's logits in its own hooks and its
outputs carried through the passes by verl itself. Where the seam exists, troll-verl registers TROLL that way
(:mod:`troll_verl.integration.plugin`) and its worker and trainer leave the passes to verl; on verl 0.9 as released
they route them through verl's distillation logits hook (:mod:`troll_verl.integration.loss_fn`). The plugin asks once,
when it registers the loss.
"""

__all__ = ["seam_available"]


def seam_available() -> bool:
    """True when ``verl.trainer.ppo.core_algos`` has ``PolicyLossSpec``, which upstream B adds (TROLL's spec also
    uses C's ``old_pass_fn`` and ``old_pass_keys``)."""
    from verl.trainer.ppo import core_algos

    return hasattr(core_algos, "PolicyLossSpec")

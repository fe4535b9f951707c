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
when it registers the loss. The seam is present only when both hooks are: a verl with B but not C takes the stock
route.
"""

import dataclasses

__all__ = ["seam_available", "SEAM_SPEC_FIELDS"]

# every field of verl's PolicyLossSpec that TROLL's spec sets: B's update-pass hook and C's old-pass hook
SEAM_SPEC_FIELDS = ("logits_fn", "logits_output_keys", "provides_log_probs", "old_pass_fn", "old_pass_keys")


def seam_available() -> bool:
    """True when ``verl.trainer.ppo.core_algos.PolicyLossSpec`` has every field TROLL's spec sets
    (:data:`SEAM_SPEC_FIELDS`: upstream B and C). A partial seam (B without C) counts as none, so the plugin keeps its
    own route there instead of building a spec verl cannot take."""
    from verl.trainer.ppo import core_algos

    spec = getattr(core_algos, "PolicyLossSpec", None)
    if spec is None or not dataclasses.is_dataclass(spec):
        return False
    return set(SEAM_SPEC_FIELDS) <= {field.name for field in dataclasses.fields(spec)}

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

B: a policy loss registered with a ``core_algos.PolicyLossSpec`` gets the update's logits in its hook, switched on
by the trainer (``core_algos.POLICY_LOSS_LOGITS``). C: ``actor.calculate_old_topk = K`` makes the old-log-prob pass
store the old policy's top-K under fixed keys (``core_algos.OLD_TOPK_KEYS``), which the trainers carry to the update.
Where the seam exists, troll-verl registers TROLL that way (:mod:`troll_verl.integration.plugin`) and its actor
training worker leaves the passes to verl (in bypass mode it puts the rollout's top-K on the update batch); on verl
0.9 as released it routes them through verl's distillation logits hook (:mod:`troll_verl.integration.loss_fn`).
The seam is present only when every field and hook TROLL uses is: a verl with B but not C (or an earlier shape of
either) takes the stock route.

The route is decided once per process (:func:`route`) and read as a value where it matters: the plugin's
registration, the worker's loss function, the trainer's bypass warning and the run's validation and preparation.
"""

import dataclasses
import functools

__all__ = ["SEAM", "STOCK", "route", "seam_available", "SEAM_SPEC_FIELDS", "SEAM_SWITCH"]

# the two routes TROLL takes through verl (route())
SEAM, STOCK = "seam", "stock"

# every field of verl's PolicyLossSpec that TROLL's spec sets (B)
SEAM_SPEC_FIELDS = ("logits_fn", "logits_output_keys", "provides_log_probs")
# the update's switch verl's trainers write for a loss with a logits hook (B: core_algos.POLICY_LOSS_LOGITS)
SEAM_SWITCH = "policy_loss_logits"


def seam_available() -> bool:
    """True when verl has every part of the seam TROLL uses: ``core_algos.PolicyLossSpec`` with
    :data:`SEAM_SPEC_FIELDS` and the trainer-written switch :data:`SEAM_SWITCH` (upstream B), and the named old-pass
    output: ``ActorConfig.calculate_old_topk`` and ``core_algos.OLD_TOPK_KEYS`` equal to
    :data:`~troll_verl.core.layout.OLD_TOPK_KEYS` (upstream C). A partial seam counts as none, so the plugin keeps its
    own route there instead of building a spec verl cannot take."""
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    from troll_verl.core.layout import OLD_TOPK_KEYS

    spec = getattr(core_algos, "PolicyLossSpec", None)
    if spec is None or not dataclasses.is_dataclass(spec):
        return False
    if not set(SEAM_SPEC_FIELDS) <= {field.name for field in dataclasses.fields(spec)}:
        return False
    if getattr(core_algos, "POLICY_LOSS_LOGITS", None) != SEAM_SWITCH:
        return False
    if tuple(getattr(core_algos, "OLD_TOPK_KEYS", ())) != OLD_TOPK_KEYS:
        return False
    return dataclasses.is_dataclass(ActorConfig) and "calculate_old_topk" in {
        field.name for field in dataclasses.fields(ActorConfig)
    }


@functools.cache
def route() -> str:
    """:data:`SEAM` where this verl has the seam (:func:`seam_available`), else :data:`STOCK`; decided on the first
    call and kept for the process (the installed verl does not change under a running process)."""
    return SEAM if seam_available() else STOCK

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
"""verl's single-turn agent loop with a per-request sampling seed: paired runs share their samples.

Two runs that differ only in the loss (TROLL against clip, same ``seed``) should see the same responses wherever
their policies are still the same (step 1; every step after a shared checkpoint), so that a paired comparison differs
only by what the loss did. verl's rollout does not give that: every vLLM server draws from one generator per engine,
and the asynchronous agent loop submits requests in whatever order they arrive, so the same seed gives the same
*prompts* but not the same *samples*. (verl's ``rollout.full_determinism`` gives every request the same seed,
which makes the ``n`` answers to one prompt identical.)

``seeded_single_turn_agent`` is verl's ``single_turn_agent`` plus ``sampling_params["seed"]``, a seed of its own
for every request (:func:`sampling_seed`), derived from the rollout seed (``actor_rollout_ref.rollout.seed``), the
training step, the prompt (its dataset ``index``) and which of the prompt's ``n`` answers it is (verl's
``session_id``). vLLM then samples each request from its own generator, whatever else is in the batch. Select it
with ``actor_rollout_ref.rollout.agent.default_agent_loop=seeded_single_turn_agent`` (verl's v1 trainer: its agent
loop passes ``global_steps``, ``index`` and ``session_id`` to every request; verl's legacy trainer passes no step or
answer number, so it also needs :class:`SeededAgentLoopManager`, verl's documented
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``, which ``python -m troll_verl.main`` sets there; a request
without them is refused with the reason).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from troll_verl.compat import registered_agent_loop

from . import SEEDED_AGENT_LOOP

__all__ = ["SEEDED_AGENT_LOOP", "SeededSingleTurnAgentLoop", "SeededAgentLoopManager", "sampling_seed"]

# what every request must carry to derive its seed (verl's v1 agent loop passes all three)
_REQUEST_FIELDS = ("global_steps", "index", "session_id")


def sampling_seed(rollout_seed: int, step: int, index: int, session: int) -> int:
    """A request's sampling seed: a hash of (rollout seed, step, prompt index, answer number), in ``[0, 2**63)``.

    The same four numbers give the same seed in any process; changing any one gives an unrelated seed (a hash, not a
    sum, so ``(step, index + 1)`` and ``(step + 1, index)`` do not collide).
    """
    text = f"troll-verl/{int(rollout_seed)}/{int(step)}/{int(index)}/{int(session)}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & (2**63 - 1)


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's ``SingleTurnAgentLoop`` whose request carries its own sampling seed (see the module docstring)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> Any:
        """verl's single-turn run with ``sampling_params['seed']`` set from this request's step, prompt and answer
        number."""
        missing = [name for name in _REQUEST_FIELDS if kwargs.get(name) is None]
        if missing:
            raise ValueError(
                f"{SEEDED_AGENT_LOOP} derives each request's seed from {', '.join(_REQUEST_FIELDS)}, but verl's agent "
                f"loop passed no {', '.join(missing)} (verl's v1 trainer passes all three; the legacy trainer's agent "
                "loop passes no session_id). Set actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent."
            )
        seed = sampling_seed(self.rollout_config.seed, kwargs["global_steps"], kwargs["index"], kwargs["session_id"])
        # a copy: verl hands the same dict to every answer of a prompt
        return await super().run({**sampling_params, "seed": seed}, **kwargs)


class SeededAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager for its legacy trainer, with what the seeded loop reads from every request.

    verl's v1 agent loop passes each request the step (``global_steps``) and its answer's number within the prompt's
    group (``session_id``); the legacy trainer's passes neither. :meth:`generate_sequences` adds both as per-sample
    columns of the generation batch (from ``meta_info["global_steps"]`` and the order of equal ``uid``), runs verl's,
    and removes them from the batch and the output again. Selected with
    ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (:data:`troll_verl.rollout.SEEDED_AGENT_LOOP_MANAGER`).
    """

    _COLUMNS = ("global_steps", "session_id")

    def generate_sequences(self, prompts):
        """verl's ``generate_sequences`` on ``prompts`` (a ``DataProto``) with the two columns added for the call."""
        n = len(prompts)
        keys = prompts.non_tensor_batch.get("uid", np.arange(n))
        seen: Counter = Counter()
        sessions = []
        for key in keys:
            sessions.append(seen[key])
            seen[key] += 1
        step = int(prompts.meta_info.get("global_steps", 0))
        prompts.non_tensor_batch["session_id"] = np.array(sessions, dtype=object)
        prompts.non_tensor_batch["global_steps"] = np.full(n, step, dtype=object)
        try:
            output = super().generate_sequences(prompts)
        finally:
            for column in self._COLUMNS:
                prompts.non_tensor_batch.pop(column, None)
        for column in self._COLUMNS:
            output.non_tensor_batch.pop(column, None)
        return output


def _register() -> None:
    """Register the loop under :data:`SEEDED_AGENT_LOOP`, refusing the name where another class has it (verl's
    decorator overwrites silently)."""
    target = f"{SeededSingleTurnAgentLoop.__module__}.{SeededSingleTurnAgentLoop.__qualname__}"
    existing = registered_agent_loop(SEEDED_AGENT_LOOP)
    if existing is not None and existing != target:
        raise RuntimeError(
            f"verl's agent-loop registry already maps {SEEDED_AGENT_LOOP!r} to {existing}; uninstall the other plugin."
        )
    register(SEEDED_AGENT_LOOP)(SeededSingleTurnAgentLoop)


# verl's own agent loops register when their module loads; so does this one (troll_verl.integration.plugin loads it
# in every process where verl's single-turn loop loads)
_register()

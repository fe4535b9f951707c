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
"""The seeded agent loop: every request gets a seed of its own from (rollout seed, step, prompt, answer number), and
the plugin registers it in verl's agent-loop registry. (End to end, two runs sharing a checkpoint sample the same
responses: tests/e2e/test_tiny_runs_on_cpu.py.)"""

import asyncio
import itertools
import subprocess
import sys
from types import SimpleNamespace

import pytest
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from troll_verl.rollout import SEEDED_AGENT_LOOP
from troll_verl.rollout.agent_loop import SeededSingleTurnAgentLoop, sampling_seed


def test_every_request_of_a_step_gets_its_own_seed_and_the_same_one_in_every_run():
    grid = list(itertools.product(range(3), range(2), range(16), range(4)))  # seed, step, index, answer
    seeds = [sampling_seed(*key) for key in grid]
    assert len(set(seeds)) == len(grid)
    assert all(0 <= s < 2**63 for s in seeds)
    # neighbouring keys that a sum would merge stay apart
    assert sampling_seed(0, 1, 2, 0) != sampling_seed(0, 2, 1, 0) != sampling_seed(0, 1, 1, 1)
    # a fresh interpreter derives the same seeds (no per-process hash salt)
    code = "from troll_verl.rollout.agent_loop import sampling_seed; print(sampling_seed(7, 3, 11, 2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == sampling_seed(7, 3, 11, 2)


def _run(monkeypatch, **kwargs):
    seen = []

    async def parent_run(self, sampling_params, **kw):
        seen.append((sampling_params, kw))
        return "output"

    monkeypatch.setattr(SingleTurnAgentLoop, "run", parent_run)
    loop = SeededSingleTurnAgentLoop.__new__(SeededSingleTurnAgentLoop)
    loop.rollout_config = SimpleNamespace(seed=5)
    params = {"temperature": 1.0, "logprobs": False}
    out = asyncio.run(loop.run(params, **kwargs))
    return out, params, seen


def test_the_request_carries_the_derived_seed(monkeypatch):
    out, params, seen = _run(monkeypatch, global_steps=3, index=11, session_id=2, raw_prompt=["q"])
    assert out == "output"
    ((sent, kwargs),) = seen
    assert sent == {"temperature": 1.0, "logprobs": False, "seed": sampling_seed(5, 3, 11, 2)}
    assert "seed" not in params  # verl shares one dict among a prompt's answers: it is copied, not changed
    assert kwargs == {"global_steps": 3, "index": 11, "session_id": 2, "raw_prompt": ["q"]}


def test_a_request_without_its_answer_number_is_refused_with_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="session_id.*default_agent_loop=single_turn_agent"):
        _run(monkeypatch, global_steps=3, index=11, raw_prompt=["q"])


@pytest.mark.parametrize("first", ["verl.experimental.agent_loop", "troll_verl.rollout.agent_loop"])
def test_the_plugin_registers_the_loop_in_verls_registry(first):
    """In a fresh process (as in verl's agent-loop workers), whichever of the two modules is imported first."""
    code = (
        f"import {first}\nfrom troll_verl.compat import registered_agent_loop\n"
        f"print(registered_agent_loop({SEEDED_AGENT_LOOP!r}), registered_agent_loop('no_such_loop'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["troll_verl.rollout.agent_loop.SeededSingleTurnAgentLoop", "None"]

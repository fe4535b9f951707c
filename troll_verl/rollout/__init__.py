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
"""Rollout pieces independent of the loss: :mod:`.agent_loop`, verl's single-turn agent loop with a per-request
sampling seed (paired runs share their samples)."""

__all__ = ["SEEDED_AGENT_LOOP", "SEEDED_AGENT_LOOP_MANAGER", "prepare_seeded_loop"]

# the name of :class:`troll_verl.rollout.agent_loop.SeededSingleTurnAgentLoop` in verl's agent-loop registry
# (``actor_rollout_ref.rollout.agent.default_agent_loop``); here so that naming it imports no verl
SEEDED_AGENT_LOOP = "seeded_single_turn_agent"
# actor_rollout_ref.rollout.agent.agent_loop_manager_class for the seeded loop on verl's legacy trainer (its agent loop
# passes no step or answer number): troll_verl.rollout.agent_loop.SeededAgentLoopManager
SEEDED_AGENT_LOOP_MANAGER = "troll_verl.rollout.agent_loop.SeededAgentLoopManager"


def prepare_seeded_loop(config) -> bool:
    """Where a full verl config runs the seeded loop on verl's legacy trainer, select :data:`SEEDED_AGENT_LOOP_MANAGER`
    (in place; ``python -m troll_verl.main`` does, for every loss). Returns True where it did.

    Raises:
        ValueError: where the run names an agent-loop manager of its own there.
    """
    from omegaconf import OmegaConf, open_dict

    agent = "actor_rollout_ref.rollout.agent"
    if OmegaConf.select(config, "trainer.use_v1", default=True):
        return False
    if OmegaConf.select(config, f"{agent}.default_agent_loop", default=None) != SEEDED_AGENT_LOOP:
        return False
    own = OmegaConf.select(config, f"{agent}.agent_loop_manager_class", default=None)
    if own not in (None, SEEDED_AGENT_LOOP_MANAGER):
        raise ValueError(
            f"{SEEDED_AGENT_LOOP} on verl's legacy trainer needs {SEEDED_AGENT_LOOP_MANAGER} (the legacy agent loop "
            f"passes no step or answer number), and {agent}.agent_loop_manager_class={own}. Unset it, or set "
            f"{agent}.default_agent_loop=single_turn_agent."
        )
    with open_dict(config):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = SEEDED_AGENT_LOOP_MANAGER
    return True

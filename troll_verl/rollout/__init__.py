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

__all__ = ["SEEDED_AGENT_LOOP"]

# the name of :class:`troll_verl.rollout.agent_loop.SeededSingleTurnAgentLoop` in verl's agent-loop registry
# (``actor_rollout_ref.rollout.agent.default_agent_loop``); here so that naming it imports no verl
SEEDED_AGENT_LOOP = "seeded_single_turn_agent"

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
"""Bypass mode on verl's asynchronous v1 trainers: the agent-loop manager whose client keeps the rollout's top-K.

verl's ``colocate_async`` and ``separate_async`` trainers hand their agent loops ``FullyAsyncLLMServerClient``, which
rebuilds a rollout from its resumed chunks and keeps only tokens, log-probs and routed experts: the vLLM server's
top-K fields (:mod:`troll_verl.bypass.vllm_topk`) would be lost. verl's documented key
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` names the manager verl builds with the trainer's client;
:class:`TopKAgentLoopManager` is verl's v1 manager that hands its workers the same client as
:class:`~troll_verl.bypass.vllm_topk.TopKFullyAsyncLLMServerClient`, which keeps them. ``python -m troll_verl.main``
sets the key (``troll_verl.bypass.mode.TOPK_AGENT_LOOP_MANAGER``) in bypass mode on those two trainers
(:func:`troll_verl.bypass.mode.prepare_bypass`); the sync and legacy
trainers' plain client keeps every field, so they need no manager of TROLL's.
"""

from __future__ import annotations

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

from troll_verl.compat import rebuild_llm_client

from .vllm_topk import TopKFullyAsyncLLMServerClient

__all__ = ["TopKAgentLoopManager"]


class TopKAgentLoopManager(AgentLoopManagerTQ):
    """verl's v1 agent-loop manager, its client rebuilt where it is verl's abort-and-resume one (see the module).

    Args: as verl's ``AgentLoopManager`` (``config``, ``llm_client``, ``teacher_client``,
    ``reward_loop_worker_handles``).
    """

    def __init__(self, config, llm_client, *args, **kwargs):
        if type(llm_client) is FullyAsyncLLMServerClient:
            # NOTE: the same servers and load balancer as verl's client (compat.rebuild_llm_client)
            llm_client = rebuild_llm_client(llm_client, TopKFullyAsyncLLMServerClient)
        super().__init__(config, llm_client, *args, **kwargs)

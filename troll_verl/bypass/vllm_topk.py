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

verl's asynchronous trainers rebuild a rollout from resumed chunks in their client;
:class:`TopKFullyAsyncLLMServerClient` keeps the top-K of every chunk. The servers and replicas built from
:class:`TopKServerMixin` are in :mod:`troll_verl.bypass.vllm_replica` (which imports vLLM; this module does not).

Two context variables carry per-request data where verl's code sits between TROLL's two halves and passes nothing
on: :data:`_REQUEST_BOX` (server → engine client: the request asks for the top-K, and the log-probs come back) and
:data:`_CHUNKS` (asynchronous client → the recorder under verl's resume loop). Each is set and reset around one call
(try/finally), so concurrent requests never mix.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import numpy as np
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from .rollout_topk import topk_arrays_from_logprobs

logger = logging.getLogger(__name__)

__all__ = [
    "ROLLOUT_TOPK_KEY",
    "TOPK_IDS_FIELD",
    "TOPK_LOGPROBS_FIELD",
    "rollout_topk",
    "TopKEngineClient",
    "TopKServerMixin",
    "TopKFullyAsyncLLMServerClient",
]

# rollout.custom key holding K (set by TROLL's trainer in bypass mode; absent: the server behaves as verl's)
ROLLOUT_TOPK_KEY = "troll_topk"
# TokenOutput.extra_fields keys of the per-token top-K (response-aligned: row t predicts generated token t)
TOPK_IDS_FIELD = "troll_rollout_topk_ids"
TOPK_LOGPROBS_FIELD = "troll_rollout_topk_logprobs"

# Per request, between TopKServerMixin.generate (sets it) and TopKEngineClient.generate inside verl's server code:
# the list the engine client appends the final output's sample log-probs to (None: not asked for).
_REQUEST_BOX: contextvars.ContextVar[list | None] = contextvars.ContextVar("troll_topk_request", default=None)
# Per client call, between TopKFullyAsyncLLMServerClient.generate (sets it) and _ChunkRecorder.generate inside verl's
# resume loop: the list each resumed chunk's top-K is appended to (None: not inside such a call).
_CHUNKS: contextvars.ContextVar[list | None] = contextvars.ContextVar("troll_topk_chunks", default=None)


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
        """vLLM's ``generate`` with ``logprobs=K`` on this request, the top-K kept for the server."""
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
        """verl's server start, with the engine client wrapped so that requests carry the top-K."""
        await super().run_server(args)
        k = rollout_topk(self.config)
        if k is not None:
            self.engine = TopKEngineClient(self.engine, k)
            logger.info("TROLL: the vLLM rollout returns the top-%d log-probs of every generated token", k)

    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        """verl's ``generate``, returning each generated token's top-K ids and log-probs as extra fields."""
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


# ---------------------------------------------------------------------------------------------------------------------
# the asynchronous trainers' client: verl's FullyAsyncLLMServerClient rebuilds its output from resumed chunks and
# keeps only tokens, log-probs and routed experts; this keeps the top-K too.
# ---------------------------------------------------------------------------------------------------------------------
class _ChunkRecorder(LLMServerClient):
    """verl's client, recording each server call's top-K for the enclosing :class:`TopKFullyAsyncLLMServerClient`."""

    async def generate(self, request_id, **kwargs):
        output = await super().generate(request_id, **kwargs)
        chunks = _CHUNKS.get()
        if chunks is not None:
            fields = output.extra_fields
            chunks.append((fields.get(TOPK_IDS_FIELD), fields.get(TOPK_LOGPROBS_FIELD), len(output.token_ids)))
        return output


class TopKFullyAsyncLLMServerClient(FullyAsyncLLMServerClient, _ChunkRecorder):
    """verl's abort-and-resume client (``colocate_async``, ``separate_async``) keeping the rollout's top-K.

    verl's ``FullyAsyncLLMServerClient.generate`` calls ``super().generate`` once per resumed chunk; with
    :class:`_ChunkRecorder` next in the method resolution order, each of those calls records its chunk's top-K. Each
    chunk's arrays cover only its new tokens, so they are concatenated in order, like the tokens. A partial rollout
    that spans a weight update carries a top-K from mixed policies, exactly as ``rollout_log_probs``.
    """

    async def generate(self, request_id, **kwargs):
        """verl's abort-and-resume ``generate``, with the top-K of every chunk joined into the output's extra fields."""
        chunks: list = []
        token = _CHUNKS.set(chunks)
        try:
            output = await super().generate(request_id, **kwargs)
        finally:
            _CHUNKS.reset(token)
        present = [c for c in chunks if c[0] is not None]
        if not present:
            return output
        if len(present) != len(chunks) or sum(c[2] for c in chunks) != len(output.token_ids):
            raise RuntimeError(
                f"TROLL's bypass mode: the resumed chunks of request {request_id} carry top-K log-probs for "
                f"{sum(c[0].shape[0] for c in present)} of {len(output.token_ids)} tokens; they cannot be aligned. "
                "Another rollout client or server dropped TROLL's fields; use TROLL's trainer mode or set "
                "algorithm.rollout_correction.bypass_mode=false."
            )
        output.extra_fields[TOPK_IDS_FIELD] = np.concatenate([c[0] for c in present])
        output.extra_fields[TOPK_LOGPROBS_FIELD] = np.concatenate([c[1] for c in present])
        return output

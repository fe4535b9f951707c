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
"""Loss "troll" through verl's own ``ppo_loss`` and its policy-loss logits hooks (``PolicyLossSpec``).

The passes as an engine runs them, on random logits: the old-log-prob pass's hook and final call (the old top-K
stored response-aligned), then the update's hook and final call. Loss, gradient and metrics must equal TROLL's loss
computed directly from the same logits. Runs only where verl has the seam (upstream B and C); ``upstream/check.sh``
runs it there.
"""

import pytest
import torch
import torch.nn.functional as F
from verl.trainer.ppo import core_algos
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.losses import compute_policy_loss_troll
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits

pytestmark = pytest.mark.skipif(not hasattr(core_algos, "PolicyLossSpec"), reason="verl without the logits seam")

VOCAB, K, DELTA = 50, 8, 1e-4
PROMPTS, RESPONSE = (3, 5, 2), 4  # equal response lengths: the direct computation reshapes to (bsz, T)


def _actor_config(**troll):
    return FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=TrollPolicyLossConfig(**troll)
    )


def _ppo_loss():
    from verl.workers.utils.losses import POLICY_LOSS_OLD_PASS, ppo_loss

    return ppo_loss, POLICY_LOSS_OLD_PASS


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    fields = {key: [] for key in ("prompts", "responses", "input_ids", "response_mask", "advantages")}
    for p in PROMPTS:
        prompt, response = torch.randint(0, VOCAB, (p,), generator=g), torch.randint(0, VOCAB, (RESPONSE,), generator=g)
        fields["prompts"].append(prompt)
        fields["responses"].append(response)
        fields["input_ids"].append(torch.cat([prompt, response]))
        fields["response_mask"].append(torch.ones(RESPONSE, dtype=torch.int64))
        fields["advantages"].append(torch.randn(1, generator=g).expand(RESPONSE).clone())
    data = tu.get_tensordict({k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in fields.items()})
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=RESPONSE * len(PROMPTS), global_batch_size=len(PROMPTS))
    return data


def _response_rows(data):
    """Packed row predicting every response token: start + prompt_len − 1 + j."""
    offsets = data["input_ids"].offsets()
    starts = offsets[:-1] + torch.tensor(PROMPTS) - 1
    return (starts[:, None] + torch.arange(RESPONSE)[None, :]).reshape(-1)


def _nest(rows, data):
    return torch.nested.nested_tensor_from_jagged(rows, data["input_ids"].offsets())


def test_troll_through_ppo_loss_equals_the_direct_loss():
    ppo_loss, old_pass_flag = _ppo_loss()
    config = _actor_config(topk=K, mass_delta=DELTA, kl_bound=0.05)
    assert core_algos.get_policy_loss_spec("troll").needs_logits
    data = _batch()
    g = torch.Generator().manual_seed(1)
    n_rows = int(data["input_ids"].offsets()[-1])
    z_old = torch.randn(n_rows, VOCAB, generator=g, dtype=torch.float64) * 3
    z = (z_old + torch.randn(n_rows, VOCAB, generator=g, dtype=torch.float64)).requires_grad_(True)
    rows = _response_rows(data)
    sampled = data["input_ids"].values()[rows + 1]
    old_sampled = F.log_softmax(z_old, -1)[rows, sampled]

    # old-log-prob pass: the hook, then the final call stores the old top-K response-aligned
    old = data.clone()
    tu.assign_non_tensor(old, **{old_pass_flag: True})
    model_output = {k: _nest(v[0], data) for k, v in ppo_loss(config, logits=z_old[None], data=old).items()}
    loss, metrics = ppo_loss(config, model_output=model_output, data=old)
    assert float(loss) == 0.0 and metrics == {}

    # update pass: the hook computes TROLL's terms, the final call is verl's ppo_loss
    update = data.clone()
    for key in ("troll_old_ids", "troll_old_logprobs", "troll_old_tail"):
        update[key] = model_output[key]
    update["old_log_probs"] = torch.nested.as_nested_tensor(list(old_sampled.split(RESPONSE)), layout=torch.jagged)
    hook = ppo_loss(config, logits=z[None], data=update)
    loss, metrics = ppo_loss(config, model_output={k: _nest(v[0], data) for k, v in hook.items()}, data=update)
    loss.backward()

    # the direct computation from the same logits
    z_ref = z.detach().clone().requires_grad_(True)
    old_topk = old_topk_from_logits(z_old, topk=K, mass_delta=DELTA, rows=rows)
    old_topk = old_topk._replace(tail_logprob=old_topk.tail_logprob.float())  # stored in fp32, like the log-probs
    # the hooks read the sampled token's old log-prob in fp32, as verl stores old_log_probs
    support = troll_sparse_from_logits(
        z_ref, sampled, old_topk, old_sampled.float(), topk=K, mass_delta=DELTA, rows=rows
    )
    B = len(PROMPTS)
    padded = update.select("advantages", "response_mask").to_padded_tensor()
    config.global_batch_info.update(dp_size=1, batch_num_tokens=RESPONSE * B, global_batch_size=B)
    expected, expected_metrics = compute_policy_loss_troll(
        old_sampled.view(B, RESPONSE), None, padded["advantages"], padded["response_mask"], config.loss_agg_mode,
        config, support=support.reshape(B, RESPONSE),
    )  # fmt: skip
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-9, atol=1e-12)
    for key, value in expected_metrics.items():
        got = metrics[key]
        want = value.aggregate() if isinstance(value, Metric) else value
        assert got.aggregation == (value.aggregation if isinstance(value, Metric) else AggregationType.MEAN), key
        assert abs(float(got.aggregate()) - float(want)) <= 1e-9 * max(1.0, abs(float(want))), key
    assert metrics["troll/eta_max"].aggregation == AggregationType.MAX
    assert metrics["troll/pg_loss"].aggregation == AggregationType.SUM  # normalised by the global batch
    assert metrics["troll/old_topk_bytes_per_token"].aggregate() == K * (4 + 4) + 4  # int32 ids, fp32 log-probs, tail


def test_update_without_the_old_pass_names_it():
    ppo_loss, _ = _ppo_loss()
    data = _batch()
    n_rows = int(data["input_ids"].offsets()[-1])
    data["old_log_probs"] = torch.nested.as_nested_tensor([torch.zeros(RESPONSE)] * len(PROMPTS), layout=torch.jagged)
    with pytest.raises(ValueError, match="old-log-prob pass"):
        ppo_loss(_actor_config(), logits=torch.zeros(1, n_rows, VOCAB), data=data)

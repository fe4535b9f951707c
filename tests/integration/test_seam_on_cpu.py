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
"""Loss "troll" through verl's own ``ppo_loss`` and its policy-loss logits hook (``PolicyLossSpec``).

The passes as verl runs them, on random logits: the old-log-prob pass stores verl's plain top-K response-aligned
(``actor.calculate_old_topk``), then the update's hook and final call. Loss, gradient and metrics must equal TROLL's
loss computed directly from the same logits and stored top-K. Runs only where verl has the seam (upstream B and C);
``upstream/check.sh`` runs it there.
"""

import pytest
import torch
import torch.nn.functional as F
from verl.trainer.ppo import core_algos
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.layout import OLD_TOPK_KEYS
from troll_verl.core.losses import compute_policy_loss_troll
from troll_verl.core.sparse import old_topk_from_pass, troll_sparse_from_logits
from troll_verl.integration.seam import seam_available

pytestmark = [pytest.mark.skipif(not seam_available(), reason="verl without the logits seam"), pytest.mark.route]

VOCAB, K, DELTA = 50, 8, 1e-4
PROMPTS, RESPONSE = (3, 5, 2), 4  # equal response lengths: the direct computation reshapes to (bsz, T)


def _actor_config(**troll):
    return FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, calculate_old_topk=K,
        policy_loss=TrollPolicyLossConfig(**troll),
    )  # fmt: skip


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


def _per_response(values):
    return torch.nested.as_nested_tensor(list(values.split(RESPONSE)), layout=torch.jagged)


def test_troll_through_ppo_loss_equals_the_direct_loss():
    from verl.utils.torch_functional import calculate_topk_and_tail_from_logits
    from verl.workers.utils.losses import ppo_loss

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

    # old-log-prob pass: verl's engine computes the plain top-K, its trainer stores it response-aligned
    stored = calculate_topk_and_tail_from_logits(z_old[rows], config.calculate_old_topk)

    # update pass: the hook computes TROLL's terms, the final call is verl's ppo_loss
    update = data.clone()
    for key, value in zip(OLD_TOPK_KEYS, stored, strict=True):
        update[key] = _per_response(value)
    update["old_log_probs"] = _per_response(old_sampled)
    hook = ppo_loss(config, student_logits=z[None], data=update)
    assert set(OLD_TOPK_KEYS) <= set(update.keys()) and "troll_old_ids" not in update.keys()  # data left alone
    loss, metrics = ppo_loss(config, model_output={k: _nest(v[0], data) for k, v in hook.items()}, data=update)
    loss.backward()

    # the direct computation from the same logits
    z_ref = z.detach().clone().requires_grad_(True)
    old_topk = old_topk_from_pass(*stored, topk=K, mass_delta=DELTA)
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
    from verl.workers.utils.losses import ppo_loss

    data = _batch()
    n_rows = int(data["input_ids"].offsets()[-1])
    data["old_log_probs"] = torch.nested.as_nested_tensor([torch.zeros(RESPONSE)] * len(PROMPTS), layout=torch.jagged)
    with pytest.raises(ValueError, match="old-log-prob pass.*calculate_old_topk"):
        ppo_loss(_actor_config(), student_logits=torch.zeros(1, n_rows, VOCAB), data=data)

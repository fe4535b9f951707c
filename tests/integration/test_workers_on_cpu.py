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
"""TROLL on verl's real FSDP2 engine (in-process, CPU, tiny Qwen2): old top-K storage, update, gradients.

The workers are verl's ``ActorRolloutRefWorker`` driving TROLL's actor training worker (verl's ``TrainingWorker``
plus TROLL's passes) and verl's ``FSDPEngineWithLMHead``; nothing of the engine is mocked. Batches use verl v1's
TransferQueue layout.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from verl.utils import tensordict_utils as tu

from troll_verl import kernels
from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.layout import response_rows
from troll_verl.core.losses import troll_policy_objective, troll_token_terms
from troll_verl.core.sparse import OldTopK, troll_sparse_from_logits
from troll_verl.integration.seam import seam_available
from troll_verl.testing.reference import brute_support
from troll_verl.testing.verl_engine import (
    compose_config,
    kept_old_fields,
    make_actor_worker,
    make_batch,
    old_pass,
    tiny_model_dir,
    update_batch,
)

# TROLL's loss through verl's engine: upstream/check.sh runs these again on the seam route (pyproject's markers)
pytestmark = pytest.mark.route

VOCAB = 128
PROMPTS, RESPONSES = [3, 5, 2, 4], [4, 2, 5, 3]
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny_qwen2")), vocab=VOCAB)


def _hf_logits(model_dir, batch, temperature):
    """Per-sequence logits of a plain transformers forward, packed like verl's remove-padding layout."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    seqs = batch["input_ids"].unbind()
    logits = torch.cat([model(s[None]).logits[0] for s in seqs]) / temperature
    return model, logits


@pytest.mark.parametrize("remove_padding", [True, False])
def test_stored_old_topk_matches_plain_transformers(model_dir, remove_padding):
    cfg = compose_config(model_dir, f"actor_rollout_ref.model.use_remove_padding={remove_padding}")
    worker = make_actor_worker(cfg)
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=1)
    out = old_pass(worker, batch, TEMPERATURE)
    if seam_available():
        stored = out
    else:  # kept on the worker: nothing of it in the pass's output (verl's data plane)
        assert not [key for key in out.keys() if key.startswith("troll_")]
        stored = kept_old_fields(worker, batch)
    settings = TrollPolicyLossConfig()
    assert stored["troll_old_ids"].dtype == torch.int32 and stored["troll_old_ids"].shape[-1] == settings.topk

    _, logits = _hf_logits(model_dir, batch, TEMPERATURE)
    logp = torch.log_softmax(logits.double(), -1)
    rows = response_rows(batch)
    ids = stored["troll_old_ids"].values()
    lps = stored["troll_old_logprobs"].values()
    tails = stored["troll_old_tail"].values()
    assert ids.shape[0] == rows.shape[0] == sum(RESPONSES)
    for i, row in enumerate(rows.tolist()):
        kept = brute_support(logp[row], settings.topk, settings.mass_delta)
        n = int((ids[i] >= 0).sum())
        if n != len(kept):
            # the mass rule's boundary token, decided in fp32 here and float64 in the reference
            m = min(n, len(kept))
            assert abs(n - len(kept)) == 1 and abs(logp[row, kept[:m]].exp().sum().item() - (1 - 1e-5)) < 1e-6
        kept = kept[:n] if n <= len(kept) else ids[i, :n].tolist()
        assert ids[i, :n].tolist() == kept and (ids[i, n:] == -1).all()
        torch.testing.assert_close(lps[i, :n].double(), logp[row, kept], atol=2e-5, rtol=0)
        tail = math.log(max(1 - logp[row, kept].exp().sum().item(), settings.floor))
        assert math.isclose(tails[i].item(), tail, rel_tol=1e-3, abs_tol=1e-3)
    # verl's own old log-probs come from the same pass and agree with the sampled tokens' values
    sampled_lp = logp[rows, batch["input_ids"].values()[rows + 1]]
    from verl.workers.utils.padding import response_from_nested

    verl_lp = response_from_nested(out["log_probs"], batch["response_mask"]).values()
    torch.testing.assert_close(verl_lp.double(), sampled_lp, atol=2e-5, rtol=0)


def test_reference_pass_never_stores_old_topk(model_dir, capsys):
    """With LoRA, verl computes the reference through the actor (no_lora_adapter=True) with the same engine. The
    worker also takes its kernel choice from the config (policy_loss.kernels) and says so at start-up."""
    config = compose_config(
        model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.policy_loss.kernels=torch"
    )
    try:
        worker = make_actor_worker(config)
        assert kernels.kernel_choice() == "torch"
    finally:
        kernels.configure("auto")
    assert "TROLL kernels: torch (config): the torch path on every device." in capsys.readouterr().out
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=2)
    old = old_pass(worker, batch, TEMPERATURE)
    if seam_available():  # verl's trainer asks for its old top-K on the old-log-prob pass only (upstream C)
        assert {"troll_old_ids", "troll_old_logprobs", "troll_old_tail"} <= set(old.keys())
        ref = old_pass(worker, batch, TEMPERATURE, store=False, no_lora_adapter=True)
        assert not [k for k in ref.keys() if k.startswith("troll_")]
        return
    assert len(worker.actor.old_topk_cache) == len(PROMPTS)
    worker.actor.old_topk_cache.clear()
    ref = old_pass(worker, batch, TEMPERATURE, no_lora_adapter=True)
    assert not [k for k in ref.keys() if k.startswith("troll_")]
    assert len(worker.actor.old_topk_cache) == 0  # the reference pass kept nothing: the old policy's stays its own


def _capture_grads_before_step(worker) -> dict:
    """The engine zeroes gradients when it leaves train mode; copy them when the optimizer steps (after verl's
    gradient clipping, which the test config sets far above the gradient norm)."""
    grads = {}
    names = {id(p): n.replace("_fsdp_wrapped_module.", "") for n, p in worker.actor.engine.module.named_parameters()}

    def hook(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                grads[names[id(p)]] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()

    worker.actor.engine.optimizer.register_step_pre_hook(hook)
    return grads


@pytest.mark.parametrize("remove_padding", [True, False])
def test_update_loss_and_gradients_match_core_loss_from_full_logits(model_dir, remove_padding):
    """verl's engine + TROLL's hook and closure == the core loss on plain transformers logits (loss and grads)."""
    cfg = compose_config(
        model_dir,
        "actor_rollout_ref.actor.optim.lr=0.0",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
    )
    worker = make_actor_worker(cfg)
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=3)
    old = old_pass(worker, batch, TEMPERATURE)
    if not seam_available():
        old.update(kept_old_fields(worker, batch))
    # old = current policy here, so perturb the stored old distribution to make the projection act
    old["troll_old_logprobs"] = torch.nested.nested_tensor_from_jagged(
        old["troll_old_logprobs"].values()
        + torch.randn(old["troll_old_logprobs"].values().shape, generator=torch.Generator().manual_seed(5)),
        old["troll_old_logprobs"].offsets(),
    )
    adv = torch.randn(4, max(RESPONSES), generator=torch.Generator().manual_seed(0))
    data = update_batch(batch, old, adv, TEMPERATURE, mini_batch_size=4)
    grads = _capture_grads_before_step(worker)
    metrics = tu.get(worker.update_actor(data), "metrics")
    engine_loss = sum(metrics["loss"])
    assert grads
    assert metrics["troll/projected_frac"][0] > 0
    # measured on what reached the update: K=64 int32 ids + fp32 log-probs, and the fp32 tail, per response token
    assert metrics["troll/old_topk_bytes_per_token"][0] == 64 * (4 + 4) + 4

    model, logits = _hf_logits(model_dir, batch, TEMPERATURE)
    rows = response_rows(batch)
    sampled = batch["input_ids"].values()[rows + 1]
    old_sampled = data["old_log_probs"].values().float()
    old_topk = OldTopK(*(data[k].values() for k in ("troll_old_ids", "troll_old_logprobs", "troll_old_tail")))
    settings = TrollPolicyLossConfig()
    support = troll_sparse_from_logits(logits, sampled, old_topk, old_sampled, rows=rows)
    terms, _ = troll_token_terms(support, settings)
    lens = torch.tensor(RESPONSES)
    mask = torch.arange(max(RESPONSES))[None, :] < lens[:, None]
    padded = terms.map(lambda t: torch.zeros(mask.shape, dtype=t.dtype).masked_scatter(mask, t))
    actor_cfg = SimpleNamespace(
        policy_loss=settings,
        global_batch_info={
            "dp_size": 1,
            "batch_num_tokens": int(lens.sum()),
            "global_batch_size": 4,
            "loss_scale_factor": None,
        },
    )
    old_pad = torch.zeros(mask.shape).masked_scatter(mask, old_sampled)
    loss, _ = troll_policy_objective(padded, old_pad, adv, mask, "token-mean", actor_cfg)
    loss.backward()
    assert math.isclose(engine_loss, loss.item(), rel_tol=1e-5, abs_tol=1e-6)
    ref_grads = dict(model.named_parameters())
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def _full_params(worker) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in worker.actor.engine.module.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().clone()
    return out


def test_zero_advantages_leave_the_policy_unchanged(model_dir):
    """With every advantage 0 TROLL's gradient is exactly zero (as clip's is), so Adam steps leave the weights
    bit-for-bit unchanged, over several mini-batches and epochs, and nothing is ever projected: the regression term's
    fp32 rounding noise on unprojected rows (exactly zero in exact arithmetic) would reach Adam, which normalises it
    into a full-size step."""
    cfg = compose_config(
        model_dir,
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
    )
    worker = make_actor_worker(cfg)
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=6)
    before = _full_params(worker)
    old = old_pass(worker, batch, 1.0)
    grads = _capture_grads_before_step(worker)
    adv = torch.zeros(4, max(RESPONSES))
    history = []
    for _ in range(2):  # 2 epochs over 2 mini-batches: 4 optimizer steps
        data = update_batch(batch, old, adv, 1.0, mini_batch_size=2)
        history.append(tu.get(worker.update_actor(data), "metrics"))
    assert grads and all(bool((g == 0).all()) for g in grads.values()), "TROLL's gradient must be exactly zero"
    after = _full_params(worker)
    assert all(torch.equal(before[k], after[k]) for k in before), "an optimizer step moved the weights"
    for metrics in history:
        assert max(metrics["troll/projected_frac"]) == 0.0
        assert max(metrics["troll/kl_before"]) <= 1e-6
        assert max(metrics["troll/regression_loss"]) == 0.0


def _response_logprob(worker, batch):
    out = old_pass(worker, batch, TEMPERATURE, store=False)
    from verl.workers.utils.padding import response_from_nested

    return response_from_nested(out["log_probs"], batch["response_mask"]).values()


def test_few_steps_move_the_policy_and_tiny_bound_holds(model_dir):
    kl_bound = 2e-3
    cfg = compose_config(model_dir, f"actor_rollout_ref.actor.policy_loss.kl_bound={kl_bound}")
    worker = make_actor_worker(cfg)
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=4)
    before = _response_logprob(worker, batch)
    old = old_pass(worker, batch, TEMPERATURE)
    adv = torch.ones(4, max(RESPONSES))  # reinforce every sampled token
    # three PPO epochs on the same old data in one update: the policy leaves the trust region
    metrics = tu.get(worker.update_actor(update_batch(batch, old, adv, TEMPERATURE, 4, epochs=3)), "metrics")
    after = _response_logprob(worker, batch)
    assert (after - before).mean() > 1e-3
    last = {key: value[-1:] for key, value in metrics.items() if isinstance(value, list)}  # the third epoch
    assert max(last["troll/projected_frac"]) > 0.2
    # the projected distribution honours the bound on every token
    assert max(last["troll/kl_after_max"]) <= kl_bound
    assert max(last["troll/bound_violation_max"]) == 0.0
    assert max(last["troll/kl_before"]) > kl_bound

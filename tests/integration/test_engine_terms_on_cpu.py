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
"""TROLL's update on verl's real FSDP2 engine (CPU) against the core loss computed directly from full logits.

Each case runs the old-log-prob pass and one update on the engine, and recomputes the same loss from a plain
``transformers`` forward with :mod:`troll_verl.core.losses` and verl's ``agg_loss``/``kl_penalty``: the entropy bonus,
the
KL-to-reference term, GSPO's sequence ratio with ``rollout_is_weights``, two data-parallel ranks against one, and a
bf16-parameter run (bound and finiteness).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
from verl.utils import tensordict_utils as tu

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.layout import response_rows
from troll_verl.core.losses import troll_policy_objective, troll_token_terms
from troll_verl.core.sparse import OldTopK, troll_sparse_from_logits
from troll_verl.testing.dist import FileFunction, run_distributed
from troll_verl.testing.verl_engine import (
    compose_config,
    init_single_process_group,
    make_actor_worker,
    make_batch,
    old_pass,
    tiny_model_dir,
    update_batch,
    with_kept_old_fields,
)

# TROLL's loss through verl's engine: upstream/check.sh runs these again on the seam route (pyproject's markers)
pytestmark = pytest.mark.route

VOCAB = 128
PROMPTS, RESPONSES = [3, 5, 2, 4], [4, 2, 5, 3]
TEMPERATURE = 0.8
OLD_FIELDS = ("troll_old_ids", "troll_old_logprobs", "troll_old_tail")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny_qwen2")), vocab=VOCAB)


def _nested_like(values: torch.Tensor, nested: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(values, nested.offsets())


def _perturb_old(old):
    """old = current policy in these tests: shift the stored old distribution so the projection acts (the same
    shift for every token, so a data-parallel split perturbs each sequence as the full batch does).

    NOTE: moderate on purpose: with 3× this shift η grows large enough that fp32 itself moves the loss by ~1e-4
    relative (measured: a float64 recomputation of the core differs that much), too much for an exact comparison.
    """
    values = old["troll_old_logprobs"].values()
    shift = 0.5 * torch.cos(1.7 * torch.arange(values.shape[-1], dtype=values.dtype))
    old["troll_old_logprobs"] = _nested_like(values + shift, old["troll_old_logprobs"])
    return old


def _select(batch, index: list[int]):
    """The sequences ``index`` of a v1-layout batch (nested tensors), in that order."""
    picked = {key: [batch[key].unbind()[i] for i in index] for key in batch.keys()}
    return tu.get_tensordict({key: torch.nested.as_nested_tensor(v, layout=torch.jagged) for key, v in picked.items()})


def _capture_grads(worker) -> dict:
    grads = {}
    names = {id(p): n.replace("_fsdp_wrapped_module.", "") for n, p in worker.actor.engine.module.named_parameters()}

    def hook(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                grads[names[id(p)]] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()

    worker.actor.engine.optimizer.register_step_pre_hook(hook)
    return grads


def _padded(values: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.arange(int(lens.max()))[None, :] < lens[:, None]
    return torch.zeros(mask.shape, dtype=values.dtype).masked_scatter(mask, values), mask


def _core(model_dir, batch, data, settings, loss_agg_mode, gbi, extra=None):
    """The engine's loss recomputed from plain transformers logits; returns (model, loss)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    logits = torch.cat([model(s[None]).logits[0] for s in batch["input_ids"].unbind()]) / TEMPERATURE
    rows = response_rows(batch)
    sampled = batch["input_ids"].values()[rows + 1]
    old_sampled = data["old_log_probs"].values().float()
    old = OldTopK(*(data[k].values() for k in OLD_FIELDS))
    support = troll_sparse_from_logits(
        logits,
        sampled,
        old,
        old_sampled,
        rows=rows,
        topk=settings.topk,
        mass_delta=settings.mass_delta,
        old_estimate=settings.old_estimate,
    )
    terms, _ = troll_token_terms(support, settings)
    lens = torch.tensor(RESPONSES)
    padded = terms.map(lambda t: _padded(t, lens)[0])
    mask = _padded(old_sampled, lens)[1]
    actor = SimpleNamespace(policy_loss=settings, global_batch_info=gbi)
    weights = None
    if extra is not None and "rollout_is_weights" in extra:
        weights = _padded(extra["rollout_is_weights"], lens)[0]
    loss, _ = troll_policy_objective(
        padded,
        _padded(old_sampled, lens)[0],
        data["advantages"].to_padded_tensor(0.0),
        mask,
        loss_agg_mode,
        actor,
        weights,
    )
    return model, loss, logits, rows, padded, mask


def _engine_update(model_dir, overrides, *, mini_batch_size=4, extra=None, calculate_entropy=False, seed=3):
    cfg = compose_config(model_dir, "actor_rollout_ref.actor.optim.lr=0.0", *overrides)
    worker = make_actor_worker(cfg)
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=seed)
    old = _perturb_old(with_kept_old_fields(worker, batch, old_pass(worker, batch, TEMPERATURE)))
    adv = torch.randn(4, max(RESPONSES), generator=torch.Generator().manual_seed(0))
    data = update_batch(batch, old, adv, TEMPERATURE, mini_batch_size=mini_batch_size)
    for key, values in (extra or {}).items():
        data[key] = _nested_like(values, data["old_log_probs"])
    tu.assign_non_tensor(data, calculate_entropy=calculate_entropy)
    grads = _capture_grads(worker)
    metrics = tu.get(worker.update_actor(data), "metrics")
    return batch, data, metrics, grads


def _gbi():
    return {"dp_size": 1, "batch_num_tokens": sum(RESPONSES), "global_batch_size": 4, "loss_scale_factor": None}


def _check(engine_loss, grads, loss, model):
    loss.backward()
    # the engine's packed forward and the per-sequence one round differently; the projection's Newton solver (fp32,
    # step tolerance 1e-4 in log w) turns that into ~1e-5 relative differences of the projected terms
    assert math.isclose(engine_loss, loss.item(), rel_tol=1e-4, abs_tol=1e-6), (engine_loss, loss.item())
    reference = dict(model.named_parameters())
    assert grads
    for name, g in grads.items():
        assert_grad_close(g, reference[name].grad, rel=1e-4, name=name)


def assert_grad_close(actual: torch.Tensor, expected: torch.Tensor, *, rel: float, name: str) -> None:
    """``actual`` equals ``expected`` entry by entry within ``rel`` × (the tensor's largest |entry| + the entry's own
    |value|), plus 1e-7 so an all-zero gradient compares exactly enough.

    NOTE: scaled by the tensor, not per entry: the support's mass rule (cumulative mass < 1 − 1e-5, decided in fp32
    where the ulp near 1 is 6e-8) keeps or drops a 1e-6-mass token on rounding alone, so the engine's packed forward
    and the per-sequence one can differ there. Through the embeddings' RMSNorm (this model's gradients reach ~20
    there) that moves single entries by up to ~1e-3 absolute, ~4e-5 of the tensor's scale (measured on a 2-core AVX2
    machine, where earlier machines had matched entry by entry; with mass_delta=1e-3 the largest difference falls to
    5e-5). A missing or wrong term moves a tensor by O(1) of its scale.
    """
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, atol=rel * scale + 1e-7, rtol=rel, msg=lambda m: f"{name}: {m}")


def test_entropy_bonus_matches_the_core_loss(model_dir):
    coeff = 0.05
    batch, data, metrics, grads = _engine_update(
        model_dir, [f"actor_rollout_ref.actor.entropy_coeff={coeff}"], calculate_entropy=True
    )
    settings = TrollPolicyLossConfig()
    model, loss, logits, rows, _, mask = _core(model_dir, batch, data, settings, "token-mean", _gbi())
    logp = torch.log_softmax(logits[rows], -1)
    entropy, _ = _padded(-(logp.exp() * logp).sum(-1), torch.tensor(RESPONSES))
    entropy_loss = agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode="token-mean", **_gbi())
    assert math.isclose(metrics["actor/entropy_loss"][0], entropy_loss.item(), rel_tol=1e-5)
    loss = loss - coeff * entropy_loss
    assert "actor/entropy_loss" in metrics
    _check(sum(metrics["loss"]), grads, loss, model)


@pytest.mark.parametrize("kl_type", ["low_var_kl", "k1"])
def test_kl_to_reference_matches_the_core_loss(model_dir, kl_type):
    coef = 0.3
    g = torch.Generator().manual_seed(9)

    def extra_fields(batch_old_log_probs):
        return {"ref_log_prob": batch_old_log_probs + 0.3 * torch.randn(batch_old_log_probs.shape, generator=g)}

    # the reference log-probs are the old ones plus noise, from a separate worker on the same weights and batch
    probe_cfg = compose_config(model_dir, "actor_rollout_ref.actor.optim.lr=0.0")
    probe = make_actor_worker(probe_cfg)
    probe_batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=3)
    from verl.workers.utils.padding import response_from_nested

    ref = extra_fields(
        response_from_nested(
            old_pass(probe, probe_batch, TEMPERATURE, store=False)["log_probs"], probe_batch["response_mask"]
        ).values()
    )
    batch, data, metrics, grads = _engine_update(
        model_dir,
        [
            "actor_rollout_ref.actor.use_kl_loss=True",
            f"actor_rollout_ref.actor.kl_loss_coef={coef}",
            f"actor_rollout_ref.actor.kl_loss_type={kl_type}",
        ],
        extra=ref,
    )
    settings = TrollPolicyLossConfig()
    model, loss, _, _, padded, mask = _core(model_dir, batch, data, settings, "token-mean", _gbi())
    ref_padded, _ = _padded(ref["ref_log_prob"], torch.tensor(RESPONSES))
    kld = kl_penalty(logprob=padded.log_prob, ref_logprob=ref_padded, kl_penalty=kl_type)
    loss = loss + coef * agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode="token-mean", **_gbi())
    assert "kl_loss" in metrics
    _check(sum(metrics["loss"]), grads, loss, model)


def test_gspo_sequence_ratio_with_rollout_is_weights_matches_the_core_loss(model_dir):
    weights = {"rollout_is_weights": torch.rand(sum(RESPONSES), generator=torch.Generator().manual_seed(4)) + 0.5}
    overrides = [
        "actor_rollout_ref.actor.policy_loss.ratio_level=sequence",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    ]
    batch, data, metrics, grads = _engine_update(model_dir, overrides, extra=weights)
    settings = TrollPolicyLossConfig(ratio_level="sequence")
    model, loss, *_ = _core(model_dir, batch, data, settings, "seq-mean-token-mean", _gbi(), extra=weights)
    assert metrics["troll/projected_frac"][0] > 0
    _check(sum(metrics["loss"]), grads, loss, model)


def test_bf16_parameters_keep_the_bound_and_stay_finite(model_dir):
    overrides = [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        "actor_rollout_ref.actor.policy_loss.kl_bound=0.01",
    ]
    cfg = compose_config(model_dir, *overrides)
    worker = make_actor_worker(cfg)
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=3)
    old = _perturb_old(with_kept_old_fields(worker, batch, old_pass(worker, batch, TEMPERATURE)))
    adv = torch.randn(4, max(RESPONSES), generator=torch.Generator().manual_seed(0))
    grads = _capture_grads(worker)
    for _ in range(2):
        metrics = tu.get(worker.update_actor(update_batch(batch, old, adv, TEMPERATURE, 4)), "metrics")
        assert max(metrics["troll/projected_frac"]) > 0
        assert max(metrics["troll/kl_after_max"]) <= 0.01 and max(metrics["troll/bound_violation_max"]) == 0.0
        assert all(math.isfinite(v) for v in metrics["loss"])
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads.values())


# --------------------------------------------------------------------------------------------------------------
# two data-parallel ranks (gloo, 2 processes) against one rank on the same global batch
# --------------------------------------------------------------------------------------------------------------
# the aggregation modes whose normaliser needs verl's global batch info (token-mean: the all-reduced token count;
# seq-mean-token-mean: dp_size and the global sequence count); one spawn of each world size checks both
DP_AGG_MODES = ("token-mean", "seq-mean-token-mean")


def _dp_grads(rank, world, model_dir) -> dict[str, dict]:
    """Each aggregation mode's gradients (parameter name -> array) on this rank of the current gloo group of
    ``world`` ranks, which holds its share of the global batch."""
    full = make_batch(VOCAB, PROMPTS, RESPONSES, seed=3)
    mine = list(range(rank, 4, world))  # verl's dispatch gives each DP rank its share of the global batch
    batch = _select(full, mine)
    adv = torch.randn(4, max(RESPONSES), generator=torch.Generator().manual_seed(0))[mine]
    grads_by_mode = {}
    for loss_agg_mode in DP_AGG_MODES:  # a worker each, from the same weights (lr 0)
        cfg = compose_config(
            model_dir, "actor_rollout_ref.actor.optim.lr=0.0", f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode}"
        )
        worker = make_actor_worker(cfg)
        grads = _capture_grads(worker)
        old = _perturb_old(with_kept_old_fields(worker, batch, old_pass(worker, batch, TEMPERATURE)))
        worker.update_actor(update_batch(batch, old, adv, TEMPERATURE, mini_batch_size=4))
        grads_by_mode[loss_agg_mode] = {k: v.numpy() for k, v in grads.items()}
    return grads_by_mode


def _run_dp(world, model_dir) -> dict[str, dict]:
    """Each aggregation mode's gradients (parameter name -> array) on ``world`` gloo ranks, from rank 0: one rank in
    this process (its world-size-1 group), more as spawned processes."""
    if world == 1:
        init_single_process_group()
        return _dp_grads(0, 1, model_dir)
    return run_distributed(FileFunction(__file__, "_dp_grads"), world, model_dir, timeout=400)[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_data_parallel_ranks_equal_one(tmp_path):
    """The same 4 sequences as one rank's batch or split over 2 gloo ranks: verl's global batch info (all-reduced
    token count, dp_size) through agg_loss gives the same gradient, in each aggregation mode of ``DP_AGG_MODES``."""
    model_dir = tiny_model_dir(str(tmp_path), vocab=VOCAB)
    one, two = _run_dp(1, model_dir), _run_dp(2, model_dir)
    assert one.keys() == two.keys() == set(DP_AGG_MODES)
    for loss_agg_mode in DP_AGG_MODES:
        grads1, grads2 = one[loss_agg_mode], two[loss_agg_mode]
        assert grads1.keys() == grads2.keys() and grads1
        for key in grads1:
            name = f"{loss_agg_mode}: {key}"
            assert_grad_close(torch.from_numpy(grads2[key]), torch.from_numpy(grads1[key]), rel=1e-5, name=name)

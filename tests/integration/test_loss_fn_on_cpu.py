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
"""Tests of troll_verl.integration.loss_fn's guard rails (the happy paths run on the real engine in
test_workers_on_cpu)."""

import pytest
import torch
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.layout import response_rows
from troll_verl.core.losses import BACKENDS, LOSS_METRICS, MAX_METRICS, compute_policy_loss_troll
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits
from troll_verl.integration.loss_fn import _STOCK_ENGINE_OLD_ROWS, TROLL_MODE_KEY, TrollLossFn
from troll_verl.integration.old_cache import OldTopKCache
from troll_verl.testing.verl_engine import make_batch


def _loss_fn(strategy="fsdp2", old_sink=None):
    config = FSDPActorConfig(
        strategy=strategy, rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=TrollPolicyLossConfig()
    )
    return TrollLossFn(config, old_sink=old_sink or OldTopKCache().put)


def _sampled_log_probs(logits: torch.Tensor, data) -> torch.Tensor:
    """verl's model output ``log_probs``: nested, row t the log-prob of token t + 1 under ``logits`` ``(L, V)``."""
    ids = data["input_ids"].values()
    full = torch.log_softmax(logits.double(), -1)[torch.arange(ids.shape[0] - 1), ids[1:]]
    return torch.nested.nested_tensor_from_jagged(torch.cat([full, full.new_zeros(1)]), data["input_ids"].offsets())


def _batch(mode=None):
    batch = make_batch(50, [2, 3], [3, 2])
    if mode is not None:
        tu.assign_non_tensor(batch, **{TROLL_MODE_KEY: mode})
    return batch


def test_call_outside_troll_passes_names_the_fix():
    with pytest.raises(RuntimeError, match="TrollActorTrainingWorker"):
        _loss_fn()(model_output={}, data=_batch(), dp_group=None)


def test_missing_logits_hook_is_reported_as_fused_kernels():
    with pytest.raises(RuntimeError, match="use_fused_kernels=False"):
        _loss_fn()(model_output={}, data=_batch("old"), dp_group=None)
    with pytest.raises(RuntimeError, match="use_fused_kernels=False"):
        _loss_fn()(model_output={}, data=_batch("update"), dp_group=None)


def test_unsupported_strategy_is_named():
    fn = _loss_fn()
    object.__setattr__(fn.config, "strategy", "veomni")
    with pytest.raises(NotImplementedError, match="strategy=fsdp2"):
        fn(student_logits=torch.zeros(1, 5, 50), data=_batch("old"))


def test_every_backend_says_how_verl_0_9s_engine_carries_the_old_rows():
    """Each backend of the core's table has its entry: None (the engine keeps the hook's (1, L, K) rows) or the
    function that carries them beside the hook (FSDP's)."""
    assert set(_STOCK_ENGINE_OLD_ROWS) == set(BACKENDS.values())
    assert _STOCK_ENGINE_OLD_ROWS["megatron"] is None and callable(_STOCK_ENGINE_OLD_ROWS["fsdp"])


def test_update_without_old_pass_fields_is_refused():
    with pytest.raises(ValueError, match="old-log-prob pass"):
        _loss_fn()(student_logits=torch.zeros(1, 10, 50), data=_batch("update"))


def test_the_old_top_k_travels_on_its_own_micro_batch():
    """The old pass's top-K goes from the logits hook to the final call on the micro-batch itself, and from there to
    the worker's sink: whatever the order of the calls, each final call hands over the rows of its own micro-batch
    (and takes them off it), with the same pass's log-probs; nothing enters the model output; a final call whose
    micro-batch saw no hook is refused."""
    kept = []
    fn = _loss_fn(old_sink=lambda data, rows, log_probs: kept.append((data, rows, log_probs)))
    first, second = _batch("old"), _batch("old")
    logits_first, logits_second = torch.randn(1, 10, 50), torch.randn(1, 10, 50)
    assert fn(student_logits=logits_first, data=first) == {}
    assert fn(student_logits=logits_second, data=second) == {}  # interleaved: a second hook before the first final
    out_second = {"log_probs": _sampled_log_probs(logits_second[0], second)}
    out_first = {"log_probs": _sampled_log_probs(logits_first[0], first)}
    fn(model_output=out_second, data=second, dp_group=None)
    loss, metrics = fn(model_output=out_first, data=first, dp_group=None)
    assert float(loss) == 0.0 and metrics == {}
    assert set(out_first) == {"log_probs"} and set(out_second) == {"log_probs"}  # nothing into verl's output
    assert [data for data, _, _ in kept] == [second, first]
    # each micro-batch's rows are its own logits' old top-K at its response rows
    cfg = fn.config.policy_loss.troll
    for (batch, rows, log_probs), logits in zip(kept, (logits_second, logits_first), strict=True):
        assert rows["troll_old_ids"].shape[0] == 5  # 3 + 2 response tokens
        want = old_topk_from_logits(
            logits.squeeze(0),
            topk=cfg.topk,
            mass_delta=cfg.mass_delta,
            floor=cfg.floor,
            value_dtype=cfg.value_dtype,
            rows=response_rows(batch),
        )
        for key, value in zip(("troll_old_ids", "troll_old_logprobs", "troll_old_tail"), want, strict=True):
            torch.testing.assert_close(rows[key], value.to(rows[key].dtype), rtol=0, atol=0)
        # the same pass's sampled-token log-probs, response-aligned (bsz, T)
        logp = torch.log_softmax(logits.squeeze(0).double(), -1)
        resp = response_rows(batch)
        expected = logp[resp, batch["input_ids"].values()[resp + 1]]
        torch.testing.assert_close(log_probs[log_probs != 0].double(), expected, rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="use_fused_kernels=False"):
        fn(model_output=out_first, data=first, dp_group=None)  # its rows were taken: as if the hook had not run


def test_mismatch_above_the_bound_warns_once_naming_kl_bound(caplog):
    """Bypass mode: the first micro-batch's KL before any update is the train-inference mismatch; above kl_bound it is
    reported with a warning (once per worker) that names the key to change."""
    from verl.utils.metric import AggregationType, Metric

    import troll_verl.integration.loss_fn as loss_fn_module

    loss_fn = _loss_fn()
    bound = loss_fn.config.policy_loss.troll.kl_bound

    def metrics(kl):
        return {"troll/kl_before": Metric(AggregationType.MEAN, kl), "troll/projected_frac": 0.25}

    with caplog.at_level("WARNING", logger=loss_fn_module.logger.name):
        below = loss_fn._mismatch_metrics(metrics(bound / 2))
        assert not caplog.records
        above = [loss_fn._mismatch_metrics(metrics(2 * bound)) for _ in range(2)]
    assert below["troll/mismatch_kl"].aggregate() == pytest.approx(bound / 2)
    assert above[0]["troll/mismatch_projected_frac"].aggregate() == pytest.approx(0.25)
    assert len(caplog.records) == 1
    assert "actor_rollout_ref.actor.policy_loss.kl_bound" in caplog.records[0].getMessage()


def _nest(rows, data):
    return torch.nested.nested_tensor_from_jagged(rows, data["input_ids"].offsets())


@pytest.mark.parametrize("global_batch", [False, True])
def test_the_final_call_equals_the_direct_loss_and_keeps_each_metrics_aggregation(global_batch):
    """Both passes through the loss closure as verl's engine calls it (hook, then final call), against the core loss on
    the same logits: the same loss, and every metric with its value and aggregation, the maxima as MAX and the loss's
    parts as verl aggregated actor/pg_loss; nothing but ppo_loss's return value carries them out."""
    vocab, k, response = 50, 8, 4
    cache = OldTopKCache()
    fn = TrollLossFn(
        FSDPActorConfig(
            strategy="fsdp2",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            policy_loss=TrollPolicyLossConfig(topk=k, mass_delta=1e-4, kl_bound=0.05),
        ),
        old_sink=cache.put,
    )
    data = make_batch(vocab, [3, 5, 2], [response] * 3)
    bsz, n_tokens = 3, 3 * response
    if global_batch:
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=bsz)
    else:
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    g = torch.Generator().manual_seed(1)
    data["advantages"] = torch.nested.as_nested_tensor(
        [torch.randn(1, generator=g).expand(response).clone() for _ in range(bsz)], layout=torch.jagged
    )
    n_rows = int(data["input_ids"].offsets()[-1])
    z_old = torch.randn(n_rows, vocab, generator=g, dtype=torch.float64) * 3
    z = (z_old + torch.randn(n_rows, vocab, generator=g, dtype=torch.float64)).requires_grad_(True)
    rows = response_rows(data)
    sampled = data["input_ids"].values()[rows + 1]
    old_sampled = torch.log_softmax(z_old, -1)[rows, sampled].float()

    old = data.clone()
    tu.assign_non_tensor(old, **{TROLL_MODE_KEY: "old"})
    assert fn(student_logits=z_old[None], data=old) == {}
    fn(model_output={"log_probs": _sampled_log_probs(z_old, data)}, data=old, dp_group=None)
    update = data.clone()
    update["old_log_probs"] = torch.nested.as_nested_tensor(list(old_sampled.split(response)), layout=torch.jagged)
    kept, hits = cache.take(update)  # as the worker takes them: the same pass's log-probs as old_log_probs
    assert hits == bsz
    update.update(kept)
    tu.assign_non_tensor(update, **{TROLL_MODE_KEY: "update"})
    hook = fn(student_logits=z[None], data=update)
    loss, metrics = fn(model_output={key: _nest(v[0], data) for key, v in hook.items()}, data=update, dp_group=None)

    old_topk = old_topk_from_logits(z_old, topk=k, mass_delta=1e-4, rows=rows)
    old_topk = old_topk._replace(tail_logprob=old_topk.tail_logprob.float())
    support = troll_sparse_from_logits(z.detach(), sampled, old_topk, old_sampled, topk=k, mass_delta=1e-4, rows=rows)
    padded = update.select("advantages", "response_mask").to_padded_tensor()
    expected, expected_metrics = compute_policy_loss_troll(
        old_sampled.view(bsz, response),
        None,
        padded["advantages"],
        padded["response_mask"],
        "token-mean",
        fn.config,
        support=support.reshape(bsz, response),
    )
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-9, atol=1e-12)
    loss_aggregation = AggregationType.SUM if global_batch else AggregationType.MEAN
    assert metrics["actor/pg_loss"].aggregation == loss_aggregation
    for key, value in expected_metrics.items():
        want = AggregationType.MAX if key in MAX_METRICS else loss_aggregation if key in LOSS_METRICS else None
        assert metrics[key].aggregation == (want or AggregationType.MEAN), key
        want_value = value.aggregate() if isinstance(value, Metric) else value
        assert float(metrics[key].aggregate()) == pytest.approx(float(want_value), rel=1e-9, abs=1e-12), key

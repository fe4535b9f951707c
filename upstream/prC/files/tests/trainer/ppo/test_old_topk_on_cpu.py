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
"""The old-log-prob pass's named top-K output (``actor.calculate_old_topk``), as ``calculate_sum_pi_squared``.

With K > 0 the FSDP engine computes, per row, the top-K ids, their log-probs and the exact log tail mass; each
trainer asks for them on the old-log-prob pass only and stores them response-aligned under fixed keys
(``core_algos.OLD_TOPK_KEYS``) next to ``old_log_probs``. With K = 0 nothing changes. Workers, engines and
TransferQueue are stubs.
"""

import os

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tensordict import TensorDict

from verl import DataProto
from verl.trainer.ppo.core_algos import OLD_TOPK_KEYS
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.utils.torch_functional import calculate_topk_and_tail_from_logits
from verl.workers.config import FSDPActorConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

K, VOCAB, TEMPERATURE = 3, 9, 0.7
SEQ_LENS = [4, 2, 3]
PROMPTS, RESPONSES = (3, 2), (2, 4)


def _brute_force(logits, k):
    """Top-K ids, log-probs and the log of the remaining mass, row by row in float64."""
    probs = F.softmax(logits.double(), -1)
    order = probs.argsort(-1, descending=True)
    ids = order[:, :k]
    tail = torch.stack([probs[i, order[i, k:]].sum() for i in range(probs.shape[0])])
    return ids, probs.gather(-1, ids).log(), tail.log()


# ------------------------------------------------------------------------------------------------------------
# the computation
# ------------------------------------------------------------------------------------------------------------
def test_topk_and_tail_equal_a_brute_force():
    logits = torch.randn(7, 11, generator=torch.Generator().manual_seed(0)) * 3
    before = logits.clone()
    ids, log_probs, tail = calculate_topk_and_tail_from_logits(logits, 4, chunk_size=3)
    want_ids, want_log_probs, want_tail = _brute_force(logits, 4)
    assert ids.dtype == torch.int32 and log_probs.dtype == tail.dtype == torch.float32
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(log_probs, want_log_probs.float())  # fp32 outputs: fp32 tolerances
    torch.testing.assert_close(tail, want_tail.float())
    assert torch.equal(logits, before)  # the caller's logits are left alone


def test_the_tail_is_exact_where_one_minus_the_topk_mass_is_not():
    logits = torch.tensor([[30.0, 0.0, 0.0, 0.0, 0.0]])  # tail mass 4 e^-30 / (1 + 4 e^-30), 1 - Σ top-1 = 0 in fp32
    _, log_probs, tail = calculate_topk_and_tail_from_logits(logits, 1)
    assert float(1 - log_probs.exp().sum()) == 0.0
    torch.testing.assert_close(tail, torch.tensor([4.0]).log() - 30.0)


def test_k_at_least_the_vocabulary_keeps_every_token():
    ids, log_probs, tail = calculate_topk_and_tail_from_logits(torch.randn(2, 5), 8)
    assert ids.shape == log_probs.shape == (2, 5) and torch.isneginf(tail).all()


def test_the_config_key_is_validated():
    kwargs = dict(rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    assert FSDPActorConfig(strategy="fsdp2", **kwargs).calculate_old_topk == 0
    with pytest.raises(ValueError, match="calculate_old_topk"):
        FSDPActorConfig(strategy="fsdp2", calculate_old_topk=-1, **kwargs)
    with pytest.raises(NotImplementedError, match="strategy=megatron"):
        FSDPActorConfig(strategy="megatron", calculate_old_topk=K, **kwargs)


# ------------------------------------------------------------------------------------------------------------
# the FSDP engine
# ------------------------------------------------------------------------------------------------------------
def _fsdp_stub():
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.use_ulysses_sp = False
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
    return engine


def _engine_inputs(use_remove_padding, calculate_old_topk):
    g = torch.Generator().manual_seed(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(SEQ_LENS).cumsum(0)])
    nnz = int(offsets[-1])
    ids = torch.randint(0, VOCAB, (nnz,), generator=g)
    raw = torch.randn(nnz, VOCAB, generator=g) * 3
    rolled = torch.roll(ids, -1)
    if use_remove_padding:
        logits = raw.unsqueeze(0).clone()
        args = {"input_ids_rmpad_rolled": rolled, "temperature_rmpad": torch.full((nnz,), TEMPERATURE), "pad_size": 0}
    else:
        logits = torch.zeros(len(SEQ_LENS), max(SEQ_LENS), VOCAB)
        for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
            logits[i, : b - a] = raw[a:b]
        args = {"input_ids_rmpad_rolled": rolled, "temperature": torch.full((len(SEQ_LENS),), TEMPERATURE)}
    micro_batch = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets)}, batch_size=[])
    tu.assign_non_tensor(
        micro_batch, use_remove_padding=use_remove_padding, pad_mode=DatasetPadMode.NO_PADDING,
        use_fused_kernels=False, calculate_entropy=False, calculate_sum_pi_squared=False,
        calculate_old_topk=calculate_old_topk,
    )  # fmt: skip
    return SimpleNamespace(logits=logits), args, micro_batch, raw / TEMPERATURE, rolled, offsets


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_fsdp_computes_the_three_keys_per_row(use_remove_padding):
    output, args, micro_batch, scaled, rolled, offsets = _engine_inputs(use_remove_padding, K)
    out = _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=None)
    assert set(out) == {"log_probs", *OLD_TOPK_KEYS}
    want_ids, want_log_probs, want_tail = _brute_force(scaled, K)
    for key in OLD_TOPK_KEYS:
        assert out[key].is_nested and out[key].offsets().tolist() == offsets.tolist()
    assert torch.equal(out["old_topk_ids"].values().long(), want_ids)
    torch.testing.assert_close(out["old_topk_log_probs"].values(), want_log_probs.float())
    torch.testing.assert_close(out["old_tail_log_prob"].values(), want_tail.float())
    expected = F.log_softmax(scaled, -1).gather(-1, rolled.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out["log_probs"].values(), expected)  # the pass's own output is unchanged


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_fsdp_without_the_key_computes_nothing_more(use_remove_padding):
    output, args, micro_batch, *_ = _engine_inputs(use_remove_padding, 0)
    assert set(_fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=None)) == {
        "log_probs"
    }


# ------------------------------------------------------------------------------------------------------------
# the trainers
# ------------------------------------------------------------------------------------------------------------
def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _rows(seed=0):
    """The engine's per-row outputs over the packed prompt + response rows, one sequence after the other."""
    g = torch.Generator().manual_seed(seed)
    seqs = [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    return {
        "old_topk_ids": [torch.randint(0, VOCAB, (n, K), generator=g, dtype=torch.int32) for n in seqs],
        "old_topk_log_probs": [-torch.rand(n, K, generator=g) for n in seqs],
        "old_tail_log_prob": [-torch.rand(n, generator=g) for n in seqs],
    }


def _config(calculate_old_topk, bypass=False):
    actor = {
        "loss_agg_mode": "token-mean", "loss_scale_factor": None, "policy_loss": {"loss_mode": "vanilla"},
        "calculate_old_topk": calculate_old_topk, "calculate_entropy": False, "entropy_coeff": 0.0,
        "ppo_mini_batch_size": 2, "ppo_epochs": 1, "data_loader_seed": 0, "shuffle": False,
    }  # fmt: skip
    return OmegaConf.create(
        {
            "algorithm": {"rollout_correction": {"bypass_mode": bypass}},
            "actor_rollout_ref": {
                "rollout": {"n": 1, "temperature": 1.0, "calculate_log_probs": False},
                "actor": actor,
            },
        }
    )


class _Meta(SimpleNamespace):
    def __len__(self):
        return len(self.keys)


class _Store:
    """TransferQueue's kv_batch_get / kv_batch_put over a dict, holding what the actor's pass wrote."""

    def __init__(self, with_topk):
        self.fields = {
            "log_probs": _nested([-torch.rand(p + r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]),
            "entropy": _nested([torch.rand(p + r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]),
            "response_mask": _nested([torch.ones(r, dtype=torch.int64) for r in RESPONSES]),
        }
        if with_topk:
            self.fields.update({key: _nested(rows) for key, rows in _rows().items()})

    def kv_batch_get(self, keys, partition_id, select_fields):
        return tu.get_tensordict({k: self.fields[k] for k in select_fields})

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update(dict(fields.items()))
        return _Meta(keys=keys, partition_id=partition_id, extra_info={})


def _v1_trainer(monkeypatch, calculate_old_topk, seen):
    store = _Store(with_topk=calculate_old_topk > 0)
    monkeypatch.setattr(trainer_base, "tq", store)
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = _config(calculate_old_topk)
    trainer.ref_in_actor = True  # LoRA: the reference pass runs through the actor's compute_log_prob
    trainer.actor_rollout_wg = SimpleNamespace(
        compute_log_prob=lambda batch: (
            seen.append(batch.extra_info.get("calculate_old_topk")) or _Meta(keys=batch.keys, extra_info={})
        ),
        update_actor=lambda batch: (
            seen.append(batch.extra_info.get("calculate_old_topk")) or {"metrics": {"mfu": [0.0]}}
        ),
    )
    return trainer, store


def test_v1_trainer_asks_the_old_pass_only_and_stores_the_keys_response_aligned(monkeypatch):
    seen = []
    trainer, store = _v1_trainer(monkeypatch, K, seen)
    batch = _Meta(keys=["a", "b"], partition_id="train", extra_info={})
    trainer._compute_old_log_prob(batch, {})
    trainer._compute_ref_log_prob(batch, {})  # extra_info travels with the batch: each later pass rewrites it
    trainer._update_actor(batch, {})
    assert seen == [K, 0, 0]
    rows = _rows()
    for key in OLD_TOPK_KEYS:
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):  # row p - 1 + j predicts token j
            assert torch.equal(store.fields[key][i], rows[key][i][p - 1 : p - 1 + r])


def test_v1_trainer_without_the_key_writes_and_stores_nothing(monkeypatch):
    seen = []
    trainer, store = _v1_trainer(monkeypatch, 0, seen)
    batch = _Meta(keys=["a", "b"], partition_id="train", extra_info={})
    trainer._compute_old_log_prob(batch, {})
    trainer._compute_ref_log_prob(batch, {})
    trainer._update_actor(batch, {})
    assert seen == [None, None, None] and not set(OLD_TOPK_KEYS) & set(store.fields)


def test_v1_trainer_refuses_bypass_mode_with_the_key(monkeypatch):
    monkeypatch.setattr(trainer_base, "tq", _Store(with_topk=False))
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = _config(K, bypass=True)
    with pytest.raises(ValueError, match="bypass_mode"):
        trainer._compute_old_log_prob(_Meta(keys=["a", "b"], partition_id="train", extra_info={}), {})


def _legacy_batch():
    """A legacy trainer's DataProto: left-padded prompts (width 3), right-padded responses (width 4)."""
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    return DataProto.from_single_dict(
        {
            "input_ids": torch.arange(14).view(2, 7),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
            "prompts": torch.zeros(2, 3, dtype=torch.long),
            "responses": torch.zeros(2, 4, dtype=torch.long),
            "response_mask": attention_mask[:, 3:].clone(),
        }
    )


@pytest.mark.parametrize("calculate_old_topk", [K, 0])
def test_legacy_trainer_stores_the_keys_padded_next_to_old_log_probs(calculate_old_topk):
    seen = []
    rows = _rows()  # sequence 0: prompt 3 + response 2; sequence 1: prompt 2 (one left pad) + response 4

    def compute_log_prob(batch_td):
        seen.append(tu.get_non_tensor_data(batch_td, key="calculate_old_topk", default=None))
        offsets = batch_td["input_ids"].offsets()
        n = int(offsets[-1])
        fields = {
            "log_probs": torch.nested.nested_tensor_from_jagged(-torch.rand(n), offsets),
            "entropy": torch.nested.nested_tensor_from_jagged(torch.rand(n), offsets),
        }
        if calculate_old_topk:
            fields.update({key: _nested(value) for key, value in rows.items()})
        output = tu.get_tensordict(fields)
        tu.assign_non_tensor(output, metrics={"mfu": 0.0})
        return output

    trainer = object.__new__(RayPPOTrainer)
    trainer.config = _config(calculate_old_topk)
    trainer.actor_rollout_wg = SimpleNamespace(compute_log_prob=compute_log_prob)
    old_log_prob, _ = trainer._compute_old_log_prob(_legacy_batch())
    if not calculate_old_topk:
        assert seen == [None] and not set(OLD_TOPK_KEYS) & set(old_log_prob.batch.keys())
        return
    assert seen == [K]
    assert old_log_prob.batch["old_topk_ids"].shape == (2, 4, K) and old_log_prob.batch["old_log_probs"].shape == (2, 4)
    for key in OLD_TOPK_KEYS:
        stored = old_log_prob.batch[key]
        assert torch.equal(stored[0, :2], rows[key][0][2:4]) and torch.equal(stored[1], rows[key][1][1:5])

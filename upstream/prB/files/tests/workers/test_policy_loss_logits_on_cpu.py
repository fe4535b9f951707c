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
"""A policy loss with a hook on the logits, in the trainers, the actor worker and the FSDP engine (stubs, no model).

The trainers write the update's switch, ``policy_loss_logits``, for a loss with a hook only; the worker refuses,
when the actor is built, the setups whose engine would never call the hook. The FSDP engine then calls the loss as
its logits processor, as for top-K distillation, and nests the hook's per-row outputs per sequence, trailing dims
included. ``logprobs_from_logits`` is replaced by a recorder (the flash-attn kernel it may dispatch to does not run
on CPU tensors).
"""

import os

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")

from types import SimpleNamespace
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tensordict import TensorDict

from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import POLICY_LOSS_LOGITS, PolicyLossSpec, register_policy_loss
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.workers.config import FSDPActorConfig, FSDPEngineConfig, PolicyLossConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.engine_workers import _check_policy_loss_logits_supported

VOCAB, K, TEMPERATURE = 9, 3, 0.7
SEQ_LENS = [4, 2, 3]
TOY = "toy_logits_hook"
FLAGS = (POLICY_LOSS_LOGITS, "distillation_use_topk", "distillation_only")


def _hook(logits, data, config=None, data_format="thd"):
    return {}


SPEC = PolicyLossSpec(logits_fn=_hook, logits_output_keys=("a",))


@pytest.fixture
def toy_loss():
    """Register a loss with a hook for one test; restore the registry afterwards."""
    losses, specs = dict(core_algos.POLICY_LOSS_REGISTRY), dict(core_algos.POLICY_LOSS_SPECS)
    register_policy_loss(TOY, spec=SPEC)(lambda *args, **kwargs: None)
    yield
    core_algos.POLICY_LOSS_REGISTRY.clear()
    core_algos.POLICY_LOSS_REGISTRY.update(losses)
    core_algos.POLICY_LOSS_SPECS.clear()
    core_algos.POLICY_LOSS_SPECS.update(specs)


# ------------------------------------------------------------------------------------------------------------
# the trainers write the switch
# ------------------------------------------------------------------------------------------------------------
def _trainer_config(loss_mode):
    actor = {
        "policy_loss": {"loss_mode": loss_mode}, "calculate_entropy": False, "entropy_coeff": 0.0,
        "ppo_mini_batch_size": 2, "ppo_epochs": 1, "data_loader_seed": 0, "shuffle": False,
    }  # fmt: skip
    rollout = {"n": 1, "temperature": 1.0, "multi_turn": {"enable": False}}
    return OmegaConf.create({"actor_rollout_ref": {"actor": actor, "rollout": rollout}})


def _flags(data):
    return {key: tu.get_non_tensor_data(data, key=key, default=None) for key in FLAGS}


def _legacy_update_flags(loss_mode):
    seen = []

    def update_actor(batch_td):
        seen.append(_flags(batch_td))
        output = tu.get_tensordict({})
        tu.assign_non_tensor(output, metrics={"mfu": 0.0})
        return output

    trainer = object.__new__(RayPPOTrainer)
    trainer.config = _trainer_config(loss_mode)
    trainer.actor_rollout_wg = SimpleNamespace(update_actor=update_actor)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    batch = DataProto.from_single_dict(
        {
            "input_ids": torch.arange(14).view(2, 7),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
            "prompts": torch.zeros(2, 3, dtype=torch.long),
            "responses": torch.zeros(2, 4, dtype=torch.long),
            "response_mask": attention_mask[:, 3:].clone(),
        }
    )
    trainer._update_actor(batch)
    return seen


def _v1_update_flags(loss_mode):
    seen = []
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = _trainer_config(loss_mode)
    trainer.actor_rollout_wg = SimpleNamespace(
        update_actor=lambda batch: (
            seen.append({key: batch.extra_info.get(key) for key in FLAGS}) or {"metrics": {"mfu": [0.0]}}
        )
    )
    trainer._update_actor(SimpleNamespace(extra_info={}), {})
    return seen


@pytest.mark.parametrize("update_flags", [_legacy_update_flags, _v1_update_flags], ids=["legacy", "v1"])
@pytest.mark.parametrize("loss_mode, switch", [(TOY, True), ("vanilla", None)])
def test_trainers_write_the_switch_only_for_a_loss_with_a_hook(toy_loss, update_flags, loss_mode, switch):
    # distillation keeps its own flags, off here; the switch is absent for a built-in loss
    assert update_flags(loss_mode) == [
        {POLICY_LOSS_LOGITS: switch, "distillation_use_topk": False, "distillation_only": False}
    ]


def _actor_config(**fsdp_config):
    return FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode="toy"),
        fsdp_config=FSDPEngineConfig(**fsdp_config),
    )  # fmt: skip


def test_supported_setup_passes():
    _check_policy_loss_logits_supported(_actor_config(), {"use_fused_kernels": False}, distillation_enabled=False)


@pytest.mark.parametrize(
    "actor_kwargs, model_config, distillation, match",
    [
        ({}, {"use_fused_kernels": True}, False, "use_fused_kernels"),
        ({"pad_to_length": True}, {}, False, "pad_to_length"),
        ({}, {}, True, "distillation"),
    ],
)
def test_unsupported_setups_are_refused_when_the_actor_is_built(actor_kwargs, model_config, distillation, match):
    with pytest.raises(NotImplementedError, match=match):
        _check_policy_loss_logits_supported(_actor_config(**actor_kwargs), model_config, distillation)


def test_engines_without_the_hook_are_refused():
    config = _actor_config()
    object.__setattr__(config, "strategy", "veomni")
    with pytest.raises(NotImplementedError, match="strategy=veomni"):
        _check_policy_loss_logits_supported(config, {}, distillation_enabled=False)


# ------------------------------------------------------------------------------------------------------------
# the FSDP engine
# ------------------------------------------------------------------------------------------------------------
def _fsdp_stub():
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.use_ulysses_sp = False

    class _EngineConfig:
        entropy_checkpointing = False
        entropy_from_logits_with_chunking = False

    engine.engine_config = _EngineConfig()
    return engine


def _recorder(calls):
    def logprobs_from_logits(logits, labels, inplace_backward=True):
        calls.append(inplace_backward)
        return F.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)

    return logprobs_from_logits


def _inputs(use_remove_padding, seed=0):
    g = torch.Generator().manual_seed(seed)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(SEQ_LENS).cumsum(0)])
    nnz = int(offsets[-1])
    ids = torch.randint(0, VOCAB, (nnz,), generator=g)
    rolled = torch.roll(ids, -1)
    raw = torch.randn(nnz, VOCAB, generator=g)

    class _Output:
        pass

    output = _Output()
    if use_remove_padding:
        output.logits = raw.unsqueeze(0).clone()
        args = {"input_ids_rmpad_rolled": rolled, "temperature_rmpad": torch.full((nnz,), TEMPERATURE), "pad_size": 0}
    else:
        padded = torch.zeros(len(SEQ_LENS), max(SEQ_LENS), VOCAB)
        for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
            padded[i, : b - a] = raw[a:b]
        output.logits = padded
        args = {"input_ids_rmpad_rolled": rolled, "temperature": torch.full((len(SEQ_LENS),), TEMPERATURE)}
    micro_batch = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets)}, batch_size=[])
    tu.assign_non_tensor(
        micro_batch, use_remove_padding=use_remove_padding, pad_mode=DatasetPadMode.NO_PADDING,
        use_fused_kernels=False, calculate_entropy=False, calculate_sum_pi_squared=False,
    )  # fmt: skip
    return output, args, micro_batch, raw / TEMPERATURE, rolled, offsets


def _topk_processor(seen):
    """A logits processor as ppo_loss runs a hook: the next token's log-prob and the top-K logits of every row."""

    def processor(student_logits, data):
        seen.append(student_logits)
        rolled = torch.roll(data["input_ids"].values(), -1)
        log_probs = F.log_softmax(student_logits, -1).gather(-1, rolled.view(1, -1, 1)).squeeze(-1)
        return {"log_probs": log_probs, "toy_topk": student_logits.topk(K, dim=-1).values}

    return processor


SWITCHES = [{POLICY_LOSS_LOGITS: True}, {"distillation_use_topk": True, "distillation_only": True}]


@pytest.mark.parametrize("switch", SWITCHES, ids=["policy_loss_logits", "distillation"])
@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_fsdp_nests_per_row_outputs_with_trailing_dims(use_remove_padding, switch):
    output, args, micro_batch, scaled, rolled, offsets = _inputs(use_remove_padding)
    tu.assign_non_tensor(micro_batch, **switch)
    seen, calls = [], []
    with patch("verl.workers.engine.fsdp.transformer_impl.logprobs_from_logits", _recorder(calls)):
        out = _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=_topk_processor(seen))
    torch.testing.assert_close(seen[0][0], scaled)  # the temperature-scaled packed logits, (1, nnz, V)
    topk = out["toy_topk"]
    assert topk.is_nested and topk.offsets().tolist() == offsets.tolist() and topk.values().shape[-1] == K
    torch.testing.assert_close(topk.values(), scaled.topk(K, dim=-1).values)
    expected = F.log_softmax(scaled, -1).gather(-1, rolled.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out["log_probs"].values(), expected)
    assert calls == []  # the hook provides the log-probs: the engine's cross-entropy never runs on its logits


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_fsdp_without_the_switch_never_calls_the_processor(use_remove_padding):
    output, args, micro_batch, scaled, rolled, offsets = _inputs(use_remove_padding)
    seen, calls = [], []
    with patch("verl.workers.engine.fsdp.transformer_impl.logprobs_from_logits", _recorder(calls)):
        out = _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=_topk_processor(seen))
    assert seen == [] and set(out) == {"log_probs"} and len(calls) == 1
    expected = F.log_softmax(scaled, -1).gather(-1, rolled.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out["log_probs"].values(), expected)


def test_fsdp_refuses_outputs_with_a_wrong_row_count():
    output, args, micro_batch, *_ = _inputs(True)
    tu.assign_non_tensor(micro_batch, **{POLICY_LOSS_LOGITS: True})
    with pytest.raises(AssertionError, match="logits_rmpad len"):
        _fsdp_stub().prepare_model_outputs(
            output, args, micro_batch, logits_processor_func=lambda student_logits, data: {"x": student_logits[:, :-1]}
        )

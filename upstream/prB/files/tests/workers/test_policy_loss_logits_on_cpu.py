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
"""A policy loss with a hook on the logits, in the actor worker and the FSDP engine (stubs, no model).

The worker switches the engine's logits processor on for the update (the switch top-K distillation uses) and
refuses, when the actor is built, the setups whose engine would never call the hook. The FSDP engine nests the
hook's per-row outputs per sequence, trailing dims included. ``logprobs_from_logits`` is replaced by a recorder
(the flash-attn kernel it may dispatch to does not run on CPU tensors).
"""

import os

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")

from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from verl.trainer.ppo.core_algos import DEFAULT_POLICY_LOSS_SPEC, PolicyLossSpec
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.workers.config import FSDPActorConfig, FSDPEngineConfig, PolicyLossConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.engine_workers import ActorRolloutRefWorker, _check_policy_loss_logits_supported

VOCAB, K, TEMPERATURE = 9, 3, 0.7
SEQ_LENS = [4, 2, 3]
FLAGS = ("distillation_use_topk", "distillation_only")


def _hook(logits, data, config=None, data_format="thd"):
    return {}


SPEC = PolicyLossSpec(logits_fn=_hook, logits_output_keys=("a",))


# ------------------------------------------------------------------------------------------------------------
# the worker
# ------------------------------------------------------------------------------------------------------------
class _Actor:
    """Records the engine flags of what the worker hands its inner TrainingWorker."""

    def __init__(self):
        self.seen = []

    def train_mini_batch(self, data):
        self.seen.append({key: tu.get_non_tensor_data(data=data, key=key, default=None) for key in FLAGS})


def _worker(spec):
    worker = object.__new__(ActorRolloutRefWorker)
    worker.enable_routing_replay = False
    worker.policy_loss_spec = spec
    worker.actor = _Actor()
    return worker


def _data(**flags):
    data = TensorDict({"input_ids": torch.zeros(2, 3, dtype=torch.long)}, batch_size=[2])
    tu.assign_non_tensor(data, **flags)
    return data


def test_update_switches_the_logits_processor_on_only_for_a_loss_with_a_hook():
    trainer_flags = {"distillation_use_topk": False, "distillation_only": False}  # as the trainers send them
    built_in, hooked = _worker(DEFAULT_POLICY_LOSS_SPEC), _worker(SPEC)
    built_in.update_actor(_data(**trainer_flags))
    hooked.update_actor(_data(**trainer_flags))
    hooked.update_actor(_data())
    assert built_in.actor.seen == [trainer_flags]
    assert hooked.actor.seen == [{"distillation_use_topk": True, "distillation_only": True}] * 2


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


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_fsdp_nests_per_row_outputs_with_trailing_dims(use_remove_padding):
    output, args, micro_batch, scaled, rolled, offsets = _inputs(use_remove_padding)
    tu.assign_non_tensor(micro_batch, distillation_use_topk=True, distillation_only=True)
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
    tu.assign_non_tensor(micro_batch, distillation_use_topk=True, distillation_only=True)
    with pytest.raises(AssertionError, match="logits_rmpad len"):
        _fsdp_stub().prepare_model_outputs(
            output, args, micro_batch, logits_processor_func=lambda student_logits, data: {"x": student_logits[:, :-1]}
        )

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
"""The engines' policy-loss logits hook (``policy_loss_logits``), on stub engines.

FSDP: ``prepare_model_outputs`` on both padding branches. ``logprobs_from_logits`` is replaced by a recorder (the
flash-attn kernel it may dispatch to does not run on CPU tensors) that computes the same log-probs in torch and
records whether the backward may run in place. Megatron: ``_lm_head_logits_processor`` with the vocab-parallel
cross-entropy replaced by one that, like Megatron's, overwrites its input.
"""

import os

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")

from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

VOCAB = 9
K = 3
SEQ_LENS = [4, 2, 3]
TEMPERATURE = 0.7


def _fsdp_stub():
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.use_ulysses_sp = False

    class _EngineConfig:
        entropy_checkpointing = False
        entropy_from_logits_with_chunking = False

    engine.engine_config = _EngineConfig()
    return engine


class _Recorder:
    """Stands in for verl's logprobs_from_logits; records the in-place flag of every call."""

    def __init__(self):
        self.inplace = []

    def __call__(self, logits, labels, inplace_backward=True):
        self.inplace.append(inplace_backward)
        return F.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _inputs(use_remove_padding, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(SEQ_LENS)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
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


class _Hook:
    """A policy-loss hook: per-row log-probs of the next token and the top-K logits (trailing dim K)."""

    def __init__(self, provide_log_probs):
        self.provide_log_probs = provide_log_probs
        self.seen = []

    def __call__(self, logits, data, data_format="thd"):
        self.seen.append(logits)
        out = {"toy_topk": logits.topk(K, dim=-1).values}
        if self.provide_log_probs:
            rolled = torch.roll(data["input_ids"].values(), -1)
            out["log_probs"] = F.log_softmax(logits, -1).gather(-1, rolled.view(1, -1, 1)).squeeze(-1)
        return out


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_fsdp_without_the_flag_is_unchanged(use_remove_padding):
    output, args, micro_batch, scaled, rolled, offsets = _inputs(use_remove_padding)
    recorder = _Recorder()
    hook = _Hook(provide_log_probs=True)
    with patch("verl.workers.engine.fsdp.transformer_impl.logprobs_from_logits", recorder):
        out = _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=hook)
    assert hook.seen == [] and set(out) == {"log_probs"}
    expected = F.log_softmax(scaled, -1).gather(-1, rolled.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out["log_probs"].values(), expected)
    # remove-padding path: in-place backward as before; the other path passes no flag (the default, True)
    assert recorder.inplace == [True]


@pytest.mark.parametrize("use_remove_padding", [True, False])
@pytest.mark.parametrize("provide_log_probs", [True, False])
def test_fsdp_hook_gets_the_scaled_logits_and_its_outputs_are_nested(use_remove_padding, provide_log_probs):
    output, args, micro_batch, scaled, rolled, offsets = _inputs(use_remove_padding)
    tu.assign_non_tensor(micro_batch, policy_loss_logits=True, policy_loss_provides_log_probs=provide_log_probs)
    recorder = _Recorder()
    hook = _Hook(provide_log_probs)
    with patch("verl.workers.engine.fsdp.transformer_impl.logprobs_from_logits", recorder):
        out = _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=hook)
    (seen,) = hook.seen
    torch.testing.assert_close(seen[0], scaled)  # the temperature-scaled packed logits, (1, nnz, V)
    topk = out["toy_topk"]
    assert topk.is_nested and topk.offsets().tolist() == offsets.tolist() and topk.values().shape[-1] == K
    torch.testing.assert_close(topk.values(), scaled.topk(K, dim=-1).values)
    expected = F.log_softmax(scaled, -1).gather(-1, rolled.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out["log_probs"].values(), expected)
    # the engine's own log-prob is skipped when the hook provides it, and never runs its backward in place
    assert recorder.inplace == ([] if provide_log_probs else [False])


def test_fsdp_refuses_fused_kernels_and_wrong_row_counts():
    output, args, micro_batch, *_ = _inputs(True)
    tu.assign_non_tensor(micro_batch, policy_loss_logits=True, use_fused_kernels=True)
    with pytest.raises(NotImplementedError, match="use_fused_kernels=False"):
        _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=_Hook(True))

    output, args, micro_batch, *_ = _inputs(True)
    tu.assign_non_tensor(micro_batch, policy_loss_logits=True, policy_loss_provides_log_probs=True)

    def short(logits, data, data_format="thd"):
        return {"log_probs": logits[:, :-1, 0]}

    with pytest.raises(ValueError, match="rows"):
        _fsdp_stub().prepare_model_outputs(output, args, micro_batch, logits_processor_func=short)


@pytest.mark.parametrize("provide_log_probs", [True, False])
def test_megatron_hook_keeps_its_logits_from_the_in_place_cross_entropy(provide_log_probs):
    pytest.importorskip("megatron.core")
    from verl.workers.engine.megatron import transformer_impl as mcore

    calls = []

    def ce(logits, label):  # Megatron's vocab-parallel cross-entropy rewrites its input
        calls.append(logits)
        out = F.log_softmax(logits, -1).gather(-1, label.unsqueeze(-1)).squeeze(-1)
        logits.zero_()
        return out

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 7, VOCAB, generator=g)
    label = torch.randint(0, VOCAB, (1, 7), generator=g)
    scaled = logits / TEMPERATURE
    saved = {}

    def hook(logits, data, data_format):
        saved["logits"] = logits
        return {"toy_topk": logits.topk(K, dim=-1).values}

    engine = object.__new__(mcore.MegatronEngineWithLMHead)
    with patch.object(mcore, "vocab_parallel_log_probs_from_logits", ce):
        ret = engine._lm_head_logits_processor(
            logits, label, torch.full((1, 7), TEMPERATURE), calculate_sum_pi_squared=False, calculate_entropy=False,
            distillation_use_topk=False, distillation_only=False, logits_processor_func=hook, batch=None,
            data_format="thd", policy_loss_logits=True, skip_log_probs=provide_log_probs,
        )  # fmt: skip
    torch.testing.assert_close(saved["logits"], scaled)  # untouched by the cross-entropy
    torch.testing.assert_close(ret["toy_topk"], scaled.topk(K, dim=-1).values)
    assert ("log_probs" in ret) == (not provide_log_probs) and len(calls) == (0 if provide_log_probs else 1)
    if calls:
        assert calls[0] is not saved["logits"]

    # without the flag: the hook is not called and the cross-entropy runs on the logits themselves, as before
    calls.clear()
    saved.clear()
    logits = torch.randn(1, 7, VOCAB, generator=g)
    with patch.object(mcore, "vocab_parallel_log_probs_from_logits", ce):
        engine._lm_head_logits_processor(
            logits, label, torch.full((1, 7), TEMPERATURE), calculate_sum_pi_squared=False, calculate_entropy=False,
            distillation_use_topk=False, distillation_only=False, logits_processor_func=hook, batch=None,
            data_format="thd",
        )  # fmt: skip
    assert saved == {} and calls[0] is logits

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
"""TROLL on verl's legacy trainer (troll_verl.integration.legacy) without Ray: the old pass keeps the old top-K next
to verl's outputs, the passes carry TROLL's flags, the seeded requests get their step and answer numbers, and the
task runner chooses TROLL's workers. End to end (Ray, vLLM, the real engine): tests/e2e/test_tiny_runs_on_cpu.py."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from troll_verl.core.layout import OLD_FIELDS
from troll_verl.integration.legacy import SeededRequests, TrollRayPPOTrainer, TrollTaskRunner, pad_response_aligned
from troll_verl.integration.workers import (
    TROLL_OLD_PASS_KEY,
    TROLL_UPDATE_KEY,
    TrollActorRolloutRefWorker,
    TrollTrainingWorker,
)

PROMPT, RESPONSE, K = 3, 4, 2
LENGTHS = [2, 4, 1]  # response tokens per sequence


def _batch() -> DataProto:
    """Left-padded prompts of 2-3 tokens and right-padded responses of LENGTHS tokens, as verl's rollout returns."""
    bsz = len(LENGTHS)
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1]])
    response_mask = torch.stack([torch.arange(RESPONSE) < n for n in LENGTHS]).long()
    attention = torch.cat([prompt_mask, response_mask], 1)
    input_ids = torch.arange(bsz * (PROMPT + RESPONSE)).view(bsz, -1) + 10
    return DataProto.from_single_dict({
        "input_ids": input_ids, "attention_mask": attention, "position_ids": torch.cumsum(attention, 1) - 1,
        "prompts": input_ids[:, :PROMPT], "responses": input_ids[:, PROMPT:], "response_mask": response_mask,
    })  # fmt: skip


def _old_topk(lengths):
    """What TROLL's worker returns per sequence: response-aligned old top-K, nested (bsz, j, K)."""
    rows = sum(lengths)
    offsets = torch.tensor([0, *np.cumsum(lengths)])
    ids = torch.arange(rows * K, dtype=torch.int32).view(rows, K)
    logprobs = -torch.arange(rows * K, dtype=torch.float32).view(rows, K) / 10
    tail = -torch.arange(rows, dtype=torch.float32) - 20
    return {key: torch.nested.nested_tensor_from_jagged(value, offsets)
            for key, value in zip(OLD_FIELDS, (ids, logprobs, tail), strict=True)}  # fmt: skip


class _ActorGroup:
    """The actor worker group's compute_log_prob, as TROLL's worker answers it (no Ray)."""

    def __init__(self, with_old_topk=True):
        self.seen = []
        self.with_old_topk = with_old_topk

    def compute_log_prob(self, data):
        self.seen.append({key: tu.get_non_tensor_data(data, key, None)
                          for key in (TROLL_OLD_PASS_KEY, "calculate_entropy", "compute_loss")})  # fmt: skip
        seq = data["input_ids"].offsets().diff()
        offsets = data["input_ids"].offsets()
        log_probs = torch.nested.nested_tensor_from_jagged(-torch.arange(int(offsets[-1]), dtype=torch.float32) / 100,
                                                           offsets)  # fmt: skip
        out = {"log_probs": log_probs, "entropy": -2 * log_probs}
        if self.with_old_topk:
            out |= _old_topk(LENGTHS)
        assert seq.tolist() == [2 + 2, 3 + 4, 2 + 1]
        return tu.get_tensordict(out, non_tensor_dict={"metrics": {"mfu": 0.5}})


def _trainer(loss_mode="troll", group=None):
    trainer = TrollRayPPOTrainer.__new__(TrollRayPPOTrainer)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"calculate_sum_pi_squared": False}}})
    trainer.uses_troll = loss_mode == "troll"
    trainer.actor_rollout_wg = group or _ActorGroup()
    return trainer


def test_the_old_pass_keeps_the_old_top_k_padded_like_old_log_probs():
    trainer = _trainer()
    out, mfu = trainer._compute_old_log_prob(_batch())
    assert mfu == 0.5 and trainer.actor_rollout_wg.seen == [
        {TROLL_OLD_PASS_KEY: True, "calculate_entropy": True, "compute_loss": False}
    ]
    assert out.batch["old_log_probs"].shape == (3, RESPONSE) and out.batch["troll_old_ids"].shape == (3, RESPONSE, K)
    expected = _old_topk(LENGTHS)
    for key in OLD_FIELDS:
        for i, n in enumerate(LENGTHS):  # each response's rows are the worker's, in order; past its end, padding
            assert torch.equal(out.batch[key][i, :n], expected[key][i])
    assert (out.batch["troll_old_ids"][0, 2:] == -1).all() and (out.batch["troll_old_ids"][2, 1:] == -1).all()
    # verl's own fields as verl's pass computes them: the log-prob predicting response token j of sequence 1
    # (prompt 3 tokens, packed after sequence 0's 4) sits at packed row 4 + 3 - 1 + j
    assert out.batch["old_log_probs"][1].tolist() == pytest.approx([-(6 + j) / 100 for j in range(4)])


def test_without_troll_the_old_pass_is_verls_own(monkeypatch):
    calls = []
    monkeypatch.setattr(RayPPOTrainer, "_compute_old_log_prob", lambda self, batch: calls.append(batch) or "verl's")
    assert _trainer("vanilla")._compute_old_log_prob("b") == "verl's" and calls == ["b"]


def test_a_worker_without_troll_fields_is_refused_naming_the_runner():
    with pytest.raises(RuntimeError, match="TrollTaskRunner.*trainer.use_v1=false"):
        _trainer(group=_ActorGroup(with_old_topk=False))._compute_old_log_prob(_batch())


def test_the_update_and_reference_passes_carry_the_flags(monkeypatch):
    seen = {}

    def update(self, batch):
        seen["update"] = dict(batch.meta_info)
        return "updated"

    def reference(self, batch):
        seen["ref"] = dict(batch.meta_info)
        return "ref"

    monkeypatch.setattr(RayPPOTrainer, "_update_actor", update)
    monkeypatch.setattr(RayPPOTrainer, "_compute_ref_log_prob", reference)
    batch = _batch()
    assert _trainer()._update_actor(batch) == "updated" and seen["update"][TROLL_UPDATE_KEY] is True
    assert TROLL_UPDATE_KEY not in batch.meta_info  # taken off again: later passes of the step see none
    batch.meta_info[TROLL_OLD_PASS_KEY] = True
    assert _trainer()._compute_ref_log_prob(batch) == "ref" and TROLL_OLD_PASS_KEY not in seen["ref"]
    assert _trainer("vanilla")._update_actor(batch) == "updated" and TROLL_UPDATE_KEY not in seen["update"]


def test_seeded_requests_number_each_answer_of_a_prompt():
    seen = []

    class Manager:
        other = "verl's attribute"

        def generate_sequences(self, batch):
            seen.append({k: list(v) for k, v in batch.non_tensor_batch.items()})
            out = DataProto.from_single_dict({"x": torch.zeros(len(batch))})
            out.non_tensor_batch.update({k: v.copy() for k, v in batch.non_tensor_batch.items()})
            return out

    batch = DataProto.from_single_dict({"x": torch.zeros(6)}, meta_info={"global_steps": 7})
    batch.non_tensor_batch["uid"] = np.array(list("aaabbb"), dtype=object)  # interleaved repeat, n = 3
    wrapped = SeededRequests(Manager())
    out = wrapped.generate_sequences(batch)
    assert seen[0]["session_id"] == [0, 1, 2, 0, 1, 2] and seen[0]["global_steps"] == [7] * 6
    assert set(batch.non_tensor_batch) == {"uid"} and set(out.non_tensor_batch) == {"uid"}
    assert wrapped.other == "verl's attribute"


def test_the_task_runner_chooses_trolls_workers():
    runner_cls = TrollTaskRunner.__ray_actor_class__
    runner = runner_cls()
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"lora": {"rank": 0}}, "actor": {"use_kl_loss": False},
                                                     "ref": {}},
                               "algorithm": {"use_kl_in_reward": False}})  # fmt: skip
    cls, _ = runner.add_actor_rollout_worker(config)
    runner.add_critic_worker(config)
    assert cls is ActorRolloutRefWorker  # what verl's trainer is told the class is; the mapping holds TROLL's
    classes = {role: remote.__ray_actor_class__ for role, remote in runner.role_worker_mapping.items()}
    assert classes == {Role.ActorRollout: TrollActorRolloutRefWorker, Role.Critic: TrollTrainingWorker}
    assert issubclass(TrollTrainingWorker, TrainingWorker)


def test_pad_response_aligned():
    nested = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), torch.tensor([0, 2, 5]))
    assert pad_response_aligned(nested, 4, -1.0).tolist() == [[0, 1, -1, -1], [2, 3, 4, -1]]

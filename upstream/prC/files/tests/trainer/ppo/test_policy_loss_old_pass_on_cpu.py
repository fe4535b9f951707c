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
"""A policy loss with a hook on the actor's old-log-prob pass (``PolicyLossSpec.old_pass_fn``).

Each trainer writes the pass's flag in that pass's own metadata (as it writes ``calculate_entropy``); the worker turns
the logits processor on for the flagged pass and cuts the hook's outputs to the response rows, laid out like
``old_log_probs``; ``ppo_loss`` runs the old-pass hook and computes no loss there. Workers, engines and
TransferQueue are stubs.
"""

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import DEFAULT_POLICY_LOSS_SPEC, PolicyLossSpec, register_policy_loss
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPActorConfig, PolicyLossConfig
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.losses import POLICY_LOSS_OLD_PASS, ppo_loss
from verl.workers.utils.padding import left_right_2_no_padding

TOY = "toy_old_pass"
PROMPTS, RESPONSES = (3, 2), (2, 4)


def _update_hook(logits, data, config, data_format="thd"):
    return {"log_probs": logits[..., 0]}


def _old_hook(logits, data, config, data_format="thd"):
    return {"toy_old": logits[..., :2]}


SPEC = PolicyLossSpec(logits_fn=_update_hook, old_pass_fn=_old_hook, old_pass_keys=("toy_old",))


@pytest.fixture
def toy_loss():
    """Register the toy loss for one test; restore the registry afterwards."""
    losses, specs = dict(core_algos.POLICY_LOSS_REGISTRY), dict(core_algos.POLICY_LOSS_SPECS)
    register_policy_loss(TOY, spec=SPEC)(lambda *args, **kwargs: None)
    yield
    core_algos.POLICY_LOSS_REGISTRY.clear()
    core_algos.POLICY_LOSS_REGISTRY.update(losses)
    core_algos.POLICY_LOSS_SPECS.clear()
    core_algos.POLICY_LOSS_SPECS.update(specs)


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _rows(seed=0, width=3):
    """Per-row outputs of the packed prompt + response rows, one sequence after the other."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p + r, width, generator=g) for p, r in zip(PROMPTS, RESPONSES, strict=True)]


@pytest.mark.parametrize(
    "kwargs",
    [{"old_pass_fn": _old_hook}, {"old_pass_keys": ("x",)}, {"old_pass_fn": _old_hook, "old_pass_keys": ("entropy",)}],
)
def test_inconsistent_old_pass_specs_are_refused(kwargs):
    with pytest.raises(ValueError):
        PolicyLossSpec(**kwargs)


def test_ppo_loss_runs_the_old_pass_hook_and_computes_no_loss(toy_loss):
    config = FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode=TOY)
    )
    data = TensorDict({"input_ids": _nested([torch.zeros(5), torch.zeros(6)])}, batch_size=[2])
    logits = torch.randn(1, 11, 4)
    assert set(ppo_loss(config, student_logits=logits, data=data)) == {"log_probs"}  # the update's hook
    tu.assign_non_tensor(data, **{POLICY_LOSS_OLD_PASS: True})
    torch.testing.assert_close(ppo_loss(config, student_logits=logits, data=data)["toy_old"], logits[..., :2])
    model_output = {"log_probs": _nested([torch.zeros(5), torch.zeros(6)]), "toy_old": _nested(_rows())}
    before = dict(model_output)
    loss, metrics = ppo_loss(config, model_output=model_output, data=data)
    assert float(loss) == 0.0 and metrics == {} and model_output == before  # no side effect on the outputs


# ------------------------------------------------------------------------------------------------------------
# the worker
# ------------------------------------------------------------------------------------------------------------
class _Actor:
    """The inner TrainingWorker: records the flags it is handed and returns full-sequence per-row outputs."""

    FLAGS = ("compute_loss", "distillation_use_topk", "distillation_only", POLICY_LOSS_OLD_PASS)

    def __init__(self):
        self.seen = []

    def infer_batch(self, data):
        self.seen.append({key: tu.get_non_tensor_data(data, key=key, default=None) for key in self.FLAGS})
        return tu.get_tensordict({"log_probs": _nested([r[:, 0] for r in _rows()]), "toy_old": _nested(_rows())})

    def train_mini_batch(self, data):
        self.seen.append({key: tu.get_non_tensor_data(data, key=key, default=None) for key in self.FLAGS})


def _worker(spec=SPEC):
    worker = object.__new__(ActorRolloutRefWorker)
    worker.enable_routing_replay = False
    worker.policy_loss_spec = spec
    worker.actor = _Actor()
    return worker


def _v1_data(**flags):
    """The old pass's input in the v1 layout (nested prompts, responses and response_mask)."""
    data = tu.get_tensordict(
        {
            "prompts": _nested([torch.zeros(p, dtype=torch.long) for p in PROMPTS]),
            "responses": _nested([torch.zeros(r, dtype=torch.long) for r in RESPONSES]),
            "response_mask": _nested([torch.ones(r, dtype=torch.long) for r in RESPONSES]),
        }
    )
    tu.assign_non_tensor(data, compute_loss=False, **flags)
    return data


def _legacy_batch():
    """A legacy trainer's DataProto: left-padded prompts (width 3), right-padded responses (width 4)."""
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    response_mask = attention_mask[:, 3:].clone()
    return DataProto.from_single_dict(
        {
            "input_ids": torch.arange(14).view(2, 7),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
            "prompts": torch.zeros(2, 3, dtype=torch.long),
            "responses": torch.zeros(2, 4, dtype=torch.long),
            "response_mask": response_mask,
        }
    )


def test_worker_stores_the_old_pass_outputs_response_aligned(toy_loss):
    worker = _worker()
    output = worker.compute_log_prob(_v1_data(**{POLICY_LOSS_OLD_PASS: True}))
    assert worker.actor.seen == [
        {"compute_loss": True, "distillation_use_topk": True, "distillation_only": False, POLICY_LOSS_OLD_PASS: True}
    ]
    rows = _rows()
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):  # row p - 1 + j predicts response token j
        torch.testing.assert_close(output["toy_old"][i], rows[i][p - 1 : p - 1 + r])
    assert output["log_probs"].values().shape == (sum(PROMPTS) + sum(RESPONSES),)  # verl's own: the trainer cuts them


def test_worker_pads_the_old_pass_outputs_for_the_legacy_trainer(toy_loss):
    data = left_right_2_no_padding(_legacy_batch().to_tensordict())  # as RayPPOTrainer._compute_old_log_prob does
    tu.assign_non_tensor(data, compute_loss=False, **{POLICY_LOSS_OLD_PASS: True})
    output = _worker().compute_log_prob(data)
    assert output["toy_old"].shape == (2, 4, 3)
    rows = _rows()  # sequence 0: prompt 3 + response 2; sequence 1: prompt 2 (one left pad) + response 4
    torch.testing.assert_close(output["toy_old"][0, :2], rows[0][2:4])
    torch.testing.assert_close(output["toy_old"][1], rows[1][1:5])


@pytest.mark.parametrize("spec, flags", [(SPEC, {}), (DEFAULT_POLICY_LOSS_SPEC, {POLICY_LOSS_OLD_PASS: True})])
def test_other_passes_and_losses_are_untouched(toy_loss, spec, flags):
    worker = _worker(spec)
    output = worker.compute_log_prob(_v1_data(**flags))
    assert worker.actor.seen[0]["compute_loss"] is False and worker.actor.seen[0]["distillation_use_topk"] is None
    assert output["toy_old"].values().shape == (sum(PROMPTS) + sum(RESPONSES), 3)


def test_worker_refuses_the_flag_on_a_reference_pass_or_an_update(toy_loss):
    with pytest.raises(RuntimeError, match="reference pass"):
        _worker().compute_log_prob(_v1_data(**{POLICY_LOSS_OLD_PASS: True, "no_lora_adapter": True}))
    with pytest.raises(RuntimeError, match="only the old-log-prob pass"):
        _worker().update_actor(_v1_data(**{POLICY_LOSS_OLD_PASS: True}))


# ------------------------------------------------------------------------------------------------------------
# the trainers
# ------------------------------------------------------------------------------------------------------------
class _Meta(SimpleNamespace):
    def __len__(self):
        return len(self.keys)


class _Store:
    """TransferQueue's kv_batch_get / kv_batch_put over a dict, with the fields the old-log-prob pass reads."""

    def __init__(self):
        self.fields = {
            "log_probs": _nested([-torch.rand(p + r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]),
            "entropy": _nested([torch.rand(p + r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]),
            "response_mask": _nested([torch.ones(r, dtype=torch.int64) for r in RESPONSES]),
        }

    def kv_batch_get(self, keys, partition_id, select_fields):
        return tu.get_tensordict({k: self.fields[k] for k in select_fields})

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update(dict(fields.items()))
        return _Meta(keys=keys, partition_id=partition_id, extra_info={})


def _config(loss_mode, bypass=False):
    actor = {"loss_agg_mode": "token-mean", "loss_scale_factor": None, "policy_loss": {"loss_mode": loss_mode}}
    return OmegaConf.create(
        {
            "algorithm": {"rollout_correction": {"bypass_mode": bypass}},
            "actor_rollout_ref": {"rollout": {"temperature": 1.0, "calculate_log_probs": False}, "actor": actor},
        }
    )


@pytest.mark.parametrize("loss_mode, flags", [(TOY, [True, False]), ("vanilla", [None, None])])
def test_v1_trainer_writes_the_flag_in_each_pass(monkeypatch, toy_loss, loss_mode, flags):
    monkeypatch.setattr(trainer_base, "tq", _Store())
    seen = []
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = _config(loss_mode)
    trainer.ref_in_actor = True  # LoRA: the reference pass runs through the actor's compute_log_prob
    trainer.actor_rollout_wg = SimpleNamespace(
        compute_log_prob=lambda batch: seen.append(batch.extra_info.get(POLICY_LOSS_OLD_PASS))
        or _Meta(keys=batch.keys, extra_info={})
    )
    batch = _Meta(keys=["a", "b"], partition_id="train", extra_info={})
    trainer._compute_old_log_prob(batch, {})
    trainer._compute_ref_log_prob(batch, {})  # extra_info travels with the batch: the reference pass rewrites it
    assert seen == flags


def test_v1_trainer_refuses_bypass_mode_for_an_old_pass_loss(monkeypatch, toy_loss):
    monkeypatch.setattr(trainer_base, "tq", _Store())
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = _config(TOY, bypass=True)
    with pytest.raises(ValueError, match="bypass_mode"):
        trainer._compute_old_log_prob(_Meta(keys=["a", "b"], partition_id="train", extra_info={}), {})


def test_legacy_trainer_tags_its_old_pass_and_keeps_the_stored_outputs(toy_loss):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    seen = []

    def compute_log_prob(batch_td):
        seen.append(tu.get_non_tensor_data(batch_td, key=POLICY_LOSS_OLD_PASS, default=None))
        offsets = batch_td["input_ids"].offsets()
        output = tu.get_tensordict(
            {
                "log_probs": torch.nested.nested_tensor_from_jagged(-torch.rand(int(offsets[-1])), offsets),
                "entropy": torch.nested.nested_tensor_from_jagged(torch.rand(int(offsets[-1])), offsets),
                "toy_old": torch.randn(2, 4, 3),  # cut and padded by the worker
            }
        )
        tu.assign_non_tensor(output, metrics={"mfu": 0.0})
        return output

    trainer = object.__new__(RayPPOTrainer)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": TOY}}}})
    trainer.actor_rollout_wg = SimpleNamespace(compute_log_prob=compute_log_prob)
    old_log_prob, _ = trainer._compute_old_log_prob(_legacy_batch())
    assert seen == [True]
    assert old_log_prob.batch["toy_old"].shape == (2, 4, 3) and old_log_prob.batch["old_log_probs"].shape == (2, 4)

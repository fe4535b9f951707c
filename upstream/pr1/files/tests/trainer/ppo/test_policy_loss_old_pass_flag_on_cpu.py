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
"""The v1 trainer tags the actor's old-log-prob pass, and only it, for a policy loss with an ``old_pass_fn``.

``extra_info`` travels with a batch's metadata from pass to pass, so a flag left set would make the reference pass
or the update store old-pass outputs instead of computing a loss. TransferQueue is replaced by a dict.
"""

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import PolicyLossSpec, register_policy_loss
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import POLICY_LOSS_OLD_PASS

TOY = "toy_old_pass"


def _hook(logits, data, config, data_format="thd"):
    return {}


@pytest.fixture
def toy_loss():
    losses, specs = dict(core_algos.POLICY_LOSS_REGISTRY), dict(core_algos.POLICY_LOSS_SPECS)
    register_policy_loss(TOY, spec=PolicyLossSpec(old_pass_fn=_hook, old_pass_keys=("toy_old",)))(lambda *a, **k: 0)
    yield
    core_algos.POLICY_LOSS_REGISTRY.clear()
    core_algos.POLICY_LOSS_REGISTRY.update(losses)
    core_algos.POLICY_LOSS_SPECS.clear()
    core_algos.POLICY_LOSS_SPECS.update(specs)


class _Meta(SimpleNamespace):
    def __len__(self):
        return len(self.keys)


class _Store:
    """kv_batch_get / kv_batch_put over a dict, with the fields the old-log-prob pass reads."""

    def __init__(self):
        lens = [(3, 2), (2, 4)]
        nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
        self.fields = {
            "log_probs": nested([-torch.rand(p + r) for p, r in lens]),
            "entropy": nested([torch.rand(p + r) for p, r in lens]),
            "response_mask": nested([torch.ones(r, dtype=torch.int64) for _, r in lens]),
        }

    def kv_batch_get(self, keys, partition_id, select_fields):
        return tu.get_tensordict({k: self.fields[k] for k in select_fields})

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update(dict(fields.items()))
        return _Meta(keys=keys, partition_id=partition_id, extra_info={})


def _trainer(loss_mode, seen):
    trainer = object.__new__(PPOTrainerSync)
    actor = {"loss_agg_mode": "token-mean", "loss_scale_factor": None, "policy_loss": {"loss_mode": loss_mode}}
    trainer.config = OmegaConf.create(
        {
            "algorithm": {"rollout_correction": {"bypass_mode": False}},
            "actor_rollout_ref": {"rollout": {"temperature": 1.0, "calculate_log_probs": False}, "actor": actor},
        }
    )
    trainer.ref_in_actor = True  # LoRA: the reference pass runs through the actor's compute_log_prob

    def compute_log_prob(batch):
        seen.append(batch.extra_info.get(POLICY_LOSS_OLD_PASS))
        return _Meta(keys=batch.keys, extra_info=dict(batch.extra_info))

    trainer.actor_rollout_wg = SimpleNamespace(compute_log_prob=compute_log_prob)
    return trainer


@pytest.mark.parametrize("loss_mode, flagged", [(TOY, True), ("vanilla", False)])
def test_only_the_old_log_prob_pass_is_tagged(monkeypatch, toy_loss, loss_mode, flagged):
    monkeypatch.setattr(trainer_base, "tq", _Store())
    seen = []
    trainer = _trainer(loss_mode, seen)
    batch = _Meta(keys=["a", "b"], partition_id="train", extra_info={})
    trainer._compute_old_log_prob(batch, {})
    assert seen == [True if flagged else None]
    assert batch.extra_info.get(POLICY_LOSS_OLD_PASS) is (False if flagged else None)
    batch.extra_info[POLICY_LOSS_OLD_PASS] = True  # even a stale flag is cleared on the reference pass
    trainer._compute_ref_log_prob(batch, {})
    assert seen[-1] is (False if flagged else True)  # a built-in loss's batch is left exactly as it was


def test_legacy_trainer_refuses_an_old_pass_loss(toy_loss):
    """The legacy trainer copies only fixed fields of the old-log-prob pass, so it refuses losses that store more."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer = object.__new__(RayPPOTrainer)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": TOY}}}})
    with pytest.raises(NotImplementedError, match="trainer.use_v1=true"):
        trainer._compute_old_log_prob(batch=None)

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
"""The actor worker's flags for a policy loss whose ``PolicyLossSpec`` needs logits, on a stub worker."""

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo.core_algos import DEFAULT_POLICY_LOSS_SPEC, PolicyLossSpec
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.losses import POLICY_LOSS_OLD_PASS

FLAGS = ("policy_loss_logits", "policy_loss_provides_log_probs", POLICY_LOSS_OLD_PASS)


def _hook(logits, data, config, data_format="thd"):
    return {}


SPEC = PolicyLossSpec(
    logits_fn=_hook, logits_output_keys=("a",), provides_log_probs=True, old_pass_fn=_hook, old_pass_keys=("b",)
)


class _Actor:
    """Records the non-tensor flags of what the worker hands its inner TrainingWorker."""

    def __init__(self):
        self.seen = []

    def _record(self, data):
        self.seen.append({key: tu.get_non_tensor_data(data=data, key=key, default=None) for key in FLAGS})

    def infer_batch(self, data):
        self._record(data)

    def train_mini_batch(self, data):
        self._record(data)


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


def test_built_in_losses_get_no_flags():
    worker = _worker(DEFAULT_POLICY_LOSS_SPEC)
    worker.compute_log_prob(_data())
    worker.compute_log_prob(_data(**{POLICY_LOSS_OLD_PASS: True}))
    worker.update_actor(_data())
    assert worker.actor.seen[0] == worker.actor.seen[2] == dict.fromkeys(FLAGS)
    assert worker.actor.seen[1] == {**dict.fromkeys(FLAGS), POLICY_LOSS_OLD_PASS: True}  # passed through untouched


def test_old_pass_and_update_flags():
    worker = _worker(SPEC)
    worker.compute_log_prob(_data(**{POLICY_LOSS_OLD_PASS: True}))
    worker.compute_log_prob(_data())  # another log-prob pass of the actor: no hook
    worker.update_actor(_data(**{POLICY_LOSS_OLD_PASS: True}))  # a stale flag never reaches the update
    old, other, update = worker.actor.seen
    assert old == {"policy_loss_logits": True, "policy_loss_provides_log_probs": False, POLICY_LOSS_OLD_PASS: True}
    assert other["policy_loss_logits"] is False
    assert update == {"policy_loss_logits": True, "policy_loss_provides_log_probs": True, POLICY_LOSS_OLD_PASS: False}


def test_reference_pass_may_not_store_old_pass_outputs():
    worker = _worker(SPEC)
    with pytest.raises(RuntimeError, match="reference pass"):
        worker.compute_log_prob(_data(**{POLICY_LOSS_OLD_PASS: True, "no_lora_adapter": True}))

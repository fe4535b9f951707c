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
"""TROLL's task runner for verl's legacy trainer (troll_verl.integration.legacy) without Ray: the trainer keeps verl's
own passes (TROLL lives in the actor worker), the seeded requests get their step and answer numbers, and the task
runner chooses TROLL's critic. End to end (Ray, vLLM, the real engine): tests/e2e/test_tiny_runs_on_cpu.py."""

import numpy as np
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from troll_verl.integration.legacy import SeededRequests, TrollRayPPOTrainer, TrollTaskRunner
from troll_verl.integration.workers import TrollActorTrainingWorker, TrollTrainingWorker


def test_the_trainer_keeps_verls_own_passes():
    """The old-log-prob pass, the reference pass and the update are verl's: the old top-K never leaves the worker."""
    for name in ("_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor"):
        assert getattr(TrollRayPPOTrainer, name) is getattr(RayPPOTrainer, name), name


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


def test_the_task_runner_chooses_trolls_critic_and_verls_actor_worker():
    runner_cls = TrollTaskRunner.__ray_actor_class__
    runner = runner_cls()
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"lora": {"rank": 0}}, "actor": {"use_kl_loss": False}, "ref": {}},
            "algorithm": {"use_kl_in_reward": False},
        }
    )
    cls, _ = runner.add_actor_rollout_worker(config)
    runner.add_critic_worker(config)
    assert cls is ActorRolloutRefWorker
    classes = {role: remote.__ray_actor_class__ for role, remote in runner.role_worker_mapping.items()}
    # verl's actor worker, whose training worker is TROLL's (the plugin's hook); TROLL's critic (the CPU's gloo group)
    assert classes == {Role.ActorRollout: ActorRolloutRefWorker, Role.Critic: TrollTrainingWorker}
    assert ActorRolloutRefWorker.actor_worker_cls is TrollActorTrainingWorker
    assert issubclass(TrollTrainingWorker, TrainingWorker)

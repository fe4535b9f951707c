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
"""Smoke test through verl's Ray worker group: TROLL's worker class in a Ray actor, on the CPU platform.

verl's RayWorkerGroup places workers on "GPU" bundles; on this CPU host Ray is started with one logical GPU
(troll-verl's CPU platform names "GPU" as its Ray resource). The worker initialises a gloo process group itself.
"""

import pytest
import ray
import torch
from _verl_engine import compose_config, make_batch, tiny_model_dir, update_batch
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils import tensordict_utils as tu

from troll_verl.workers import TrollActorRolloutRefWorker

pytestmark = pytest.mark.slow  # starts Ray


@pytest.fixture(scope="module")
def ray_cpu():
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": {"VERL_PLATFORM": "cpu"}})
    yield
    ray.shutdown()


@pytest.mark.timeout(600)
def test_troll_worker_in_ray_worker_group(ray_cpu, tmp_path):
    model_dir = tiny_model_dir(str(tmp_path / "model"))
    cfg = compose_config(model_dir)
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1)
    cls = RayClassWithInitArgs(cls=ray.remote(TrollActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="actor")
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
    wg.init_model()

    batch = make_batch(128, [3, 5, 2, 4], [4, 2, 5, 3])
    data = batch.clone()
    tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False, temperature=1.0, troll_store_old_topk=True)
    old = wg.compute_log_prob(data)
    assert {"troll_old_ids", "troll_old_logprobs", "troll_old_tail", "log_probs"} <= set(old.keys())
    assert old["troll_old_ids"].values().shape == (sum([4, 2, 5, 3]), 64)

    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    out = wg.update_actor(update_batch(batch, old, adv, 1.0, 4))
    metrics = tu.get(out, "metrics")
    assert "troll/kl_after" in metrics and all(v == v for v in metrics["loss"])

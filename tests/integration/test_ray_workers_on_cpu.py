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
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker

from troll_verl.testing.verl_engine import compose_config, make_batch, tiny_model_dir, update_batch
from troll_verl.tools.lifetime import RUN_TAG_ENV, Watchdog, new_run_tag

pytestmark = pytest.mark.slow  # starts Ray


@pytest.fixture
def ray_cpu(monkeypatch):
    """A Ray session per test, whose processes never outlive it.

    Per test: a worker group holds the host's one logical GPU in a placement group that lives as long as the Ray
    session, so a session shared by two tests left the second waiting forever for that GPU. Never outliving it:
    Ray's daemons and workers inherit a run tag, and a watchdog stops every tagged process when the test ends or
    pytest itself is killed (``ray.shutdown`` does not run then)."""
    tag = new_run_tag()
    monkeypatch.setenv(RUN_TAG_ENV, tag)
    with Watchdog(tag):
        ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": {"VERL_PLATFORM": "cpu"}})
        monkeypatch.delenv(RUN_TAG_ENV)  # Ray's daemons have it; later subprocesses of this test must not
        try:
            yield
        finally:
            ray.shutdown()


def _old_pass_data(batch):
    data = batch.clone()
    tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False, temperature=1.0)
    return data


@pytest.mark.timeout(600)
def test_troll_worker_in_ray_worker_group(ray_cpu, tmp_path):
    """verl's actor worker in a Ray worker process: the plugin installs TROLL's training worker there, the old top-K
    stays in that process, and the update takes it from there."""
    model_dir = tiny_model_dir(str(tmp_path / "model"))
    cfg = compose_config(model_dir)
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1)
    cls = RayClassWithInitArgs(cls=ray.remote(ActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="actor")
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
    wg.init_model()

    batch = make_batch(128, [3, 5, 2, 4], [4, 2, 5, 3])
    old = wg.compute_log_prob(_old_pass_data(batch))
    assert "log_probs" in old.keys() and not [key for key in old.keys() if key.startswith("troll_")]

    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    out = wg.update_actor(update_batch(batch, old, adv, 1.0, 4))
    metrics = tu.get(out, "metrics")
    assert metrics["troll/old_pass_reused_frac"] == [1.0] and metrics["troll/old_pass_recompute_s"] == [0.0]
    assert "troll/kl_after" in metrics and all(v == v for v in metrics["loss"])


@pytest.mark.timeout(300)
def test_the_cpu_platforms_setup_hook_gives_every_worker_group_process_its_gloo_group(monkeypatch):
    """Ray's worker_process_setup_hook (platform/cpu.py, ray_worker_setup; what CPU_TRAINER_OVERRIDES set through
    verl's ray_kwargs): a worker of a verl worker group, of a class that sets up nothing itself (as verl's critic,
    ``ray.remote(TrainingWorker)``), starts with a gloo group of its group's size; a Ray worker outside any group
    (the task runner, vLLM's servers) gets none."""
    from troll_verl.platform.cpu import ray_worker_setup
    from troll_verl.testing import verl_engine

    @ray.remote
    def outside():
        return verl_engine._process_group()

    tag = new_run_tag()
    monkeypatch.setenv(RUN_TAG_ENV, tag)
    hook = f"{ray_worker_setup.__module__}.{ray_worker_setup.__name__}"
    with Watchdog(tag):
        ray.init(num_cpus=4, num_gpus=1, include_dashboard=False,
                 runtime_env={"env_vars": {"VERL_PLATFORM": "cpu"}, "worker_process_setup_hook": hook})  # fmt: skip
        monkeypatch.delenv(RUN_TAG_ENV)
        try:
            pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1)
            probe = RayClassWithInitArgs(cls=ray.remote(verl_engine.group_probe_class()))
            wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=probe, device_name="cpu")
            assert wg.group() == [("gloo", 1, 0)]
            assert ray.get(outside.remote()) is None
        finally:
            ray.shutdown()

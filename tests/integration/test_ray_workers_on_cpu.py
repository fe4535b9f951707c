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

from types import SimpleNamespace

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


@pytest.mark.timeout(900)
def test_separate_async_old_topk_comes_from_pi_old(ray_cpu, tmp_path, monkeypatch):
    """separate_async's old-log-prob pass runs on π_old's weights (verl saves them to CPU at the first mini-batch of a
    sync cycle and swaps them in for later ones); TROLL's old top-K must come from exactly that pass.

    verl's real worker group of TROLL's ``DetachActorWorker``, TROLL's separate_async trainer (verl's weight swap
    runs as it is); only the TransferQueue part of verl's base pass is replaced by a direct call. The worker keeps
    the old top-K of the pass on π_old, and the update after it is served from that (no pass on the current
    weights)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from troll_verl.integration.ray_workers import TrollDetachActorWorker
    from troll_verl.integration.trainer import TrollTrainerSeparateAsync

    model_dir = tiny_model_dir(str(tmp_path / "model"))
    cfg = compose_config(model_dir)
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1)
    cls = RayClassWithInitArgs(cls=ray.remote(TrollDetachActorWorker), config=cfg.actor_rollout_ref, role="actor")
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
    wg.init_model()
    batch = make_batch(128, [3, 5, 2, 4], [4, 2, 5, 3])

    outputs = []

    def base_old_pass(self, meta, metrics):  # verl's base pass without the TransferQueue
        data = _old_pass_data(batch)
        tu.assign_non_tensor(data, **meta.extra_info)
        outputs.append(self.actor_rollout_wg.compute_log_prob(data))
        return meta

    monkeypatch.setattr(PPOTrainer, "_compute_old_log_prob", base_old_pass)
    trainer = object.__new__(TrollTrainerSeparateAsync)
    trainer.config = OmegaConf.create({"algorithm": {"rollout_correction": {"bypass_mode": False}}})
    trainer.troll_bypass = False  # the actor's old pass (bypass mode takes the rollout's top-K: test_bypass_on_cpu.py)
    trainer.actor_rollout_wg = wg

    def old_pass_at(local_trigger_step):
        trainer.local_trigger_step = local_trigger_step
        trainer._compute_old_log_prob(SimpleNamespace(extra_info={}), {})
        return outputs[-1]

    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    first = old_pass_at(0)  # weights = π_old, saved to CPU slot 0
    metrics = tu.get(wg.update_actor(update_batch(batch, first, adv, 1.0, 4)), "metrics")  # the actor moves on
    assert metrics["troll/old_pass_reused_frac"] == [1.0]
    second = old_pass_at(1)  # π_old swapped in for the pass, current weights restored after it
    assert torch.equal(second["log_probs"].values(), first["log_probs"].values())
    # the update after the π_old pass: its kept top-K served every sequence (its log-probs are π_old's, as the
    # old_log_probs are), so no pass ran on the current weights, and the current policy is away from π_old
    metrics = tu.get(wg.update_actor(update_batch(batch, second, adv, 1.0, 4)), "metrics")
    assert metrics["troll/old_pass_reused_frac"] == [1.0] and metrics["troll/old_pass_recompute_s"] == [0.0]
    assert max(metrics["troll/kl_before"]) > 1e-6
    current = wg.compute_log_prob(_old_pass_data(batch))  # what the (twice updated) current weights give
    assert not torch.allclose(current["log_probs"].values(), first["log_probs"].values())

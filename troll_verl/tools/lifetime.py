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
"""Tie every process of a training run to its launcher's life, however the launcher ends.

A verl run is a process tree that no single signal reaches: the driver starts Ray's daemons (GCS, raylet, dashboard),
the raylet starts worker processes, and verl's vLLM server actor starts vLLM's EngineCore, which starts the vLLM
worker holding the model and KV cache. vLLM's EngineCore does not watch its parent, so when the launcher is killed
(SIGKILL, an outer ``timeout``) these processes live on, holding gigabytes.

What ties them together here is an environment variable: the launcher gives the run's driver a fresh
``TROLL_VERL_RUN_TAG`` (:func:`run_env`), and every descendant inherits it (Ray daemons and workers, vLLM's spawned
processes). :func:`stop_tagged` ends every process carrying the tag. :class:`Watchdog` is a small separate process,
in its own session, that holds the read end of a pipe whose write end only the launcher holds: when the launcher
ends for any reason, SIGKILL included, the pipe reports end-of-file and the watchdog stops everything tagged.

``python -m troll_verl.tools.lifetime TAG`` is the watchdog's entry point (reads its standard input until EOF).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

__all__ = ["RUN_TAG_ENV", "new_run_tag", "run_env", "tagged_processes", "stop_tagged", "Watchdog"]

RUN_TAG_ENV = "TROLL_VERL_RUN_TAG"


def new_run_tag() -> str:
    """A fresh tag naming one run's processes (in their environment), for cleanup and the watchdog."""
    return uuid.uuid4().hex


def run_env(tag: str) -> dict[str, str]:
    """The environment entry that marks a run's processes with ``tag``."""
    return {RUN_TAG_ENV: tag}


def _carries(proc, tag: str) -> bool:
    """Whether ``proc`` was started with ``RUN_TAG_ENV=tag`` in its environment.

    On Linux this reads ``/proc/PID/environ`` entry by entry. psutil's ``environ()`` stops at the first empty entry,
    and a process that retitles itself with a long title (Ray's dashboard and runtime-env agents, via setproctitle)
    zeroes the start of that block: psutil then reports an empty environment and the process escaped the watchdog.
    """
    path = f"/proc/{proc.pid}/environ"
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f"{RUN_TAG_ENV}={tag}".encode() in f.read().split(b"\0")
    return proc.environ().get(RUN_TAG_ENV) == tag


def tagged_processes(tag: str) -> list:
    """Live processes (``psutil.Process``) whose environment carries ``RUN_TAG_ENV=tag``, and every live descendant
    of one; this process excluded.

    Descendants count because a process that retitles itself with setproctitle can zero its whole environment block
    (Ray's dashboard and runtime-env agents do), so the tag alone does not find it, but its parent (the raylet) still
    carries it.
    """
    import psutil

    me = os.getpid()
    found: dict[int, object] = {}
    children: dict[int, list] = {}  # one snapshot of the parent links, for every descendant at once
    for proc in psutil.process_iter(["ppid", "status"]):
        if proc.pid == me or proc.info["status"] in (psutil.STATUS_ZOMBIE, None):
            continue
        children.setdefault(proc.info["ppid"], []).append(proc)
        try:
            if _carries(proc, tag):
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    pending = list(found)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child.pid not in found:
                found[child.pid] = child
                pending.append(child.pid)
    return list(found.values())


def stop_tagged(tag: str, grace_s: float = 10.0, also: tuple = ()) -> list[str]:
    """Terminate every process tagged ``tag`` (and their descendants), then kill what is left after ``grace_s``.

    Repeats until none is found (a dying Ray worker can start a child in between).

    Args:
        also: further ``psutil.Process`` objects to stop if they still run (psutil refuses to signal a reused PID),
            such as the watchdog's record of descendants whose tagged parent died first.

    Returns:
        The command lines of the processes that had to be signalled (empty when nothing was left).
    """
    import psutil

    signalled: list[str] = []
    extra = list(also)
    for _ in range(5):
        procs = {p.pid: p for p in tagged_processes(tag)}
        for proc in extra:
            if proc.pid not in procs and proc.pid != os.getpid() and proc.is_running():
                procs[proc.pid] = proc
        extra = []
        procs = list(procs.values())
        if not procs:
            break
        for proc in procs:
            try:
                signalled.append(" ".join(proc.cmdline())[:160])
                proc.terminate()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            try:
                proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        psutil.wait_procs(alive, timeout=grace_s)
    return signalled


class Watchdog:
    """A separate process that stops every process tagged ``tag`` once this process ends (or :meth:`close` is called).

    Use as a context manager around the launch of a tagged run. Only this process holds the pipe's write end
    (``subprocess`` closes it in every child), so the watchdog sees end-of-file exactly when this process exits or
    closes it, whatever ended it.
    """

    def __init__(self, tag: str):
        self.tag = tag
        self._proc: subprocess.Popen | None = None

    def start(self) -> Watchdog:
        """Start the watchdog process; it stops the tagged processes if this one dies."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "troll_verl.tools.lifetime", self.tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # outside the launcher's process group: an outer kill of the group spares it
        )
        return self

    def close(self, wait_s: float = 60.0) -> None:
        """Close the pipe (the watchdog then stops whatever is still tagged) and wait for the watchdog to finish."""
        if self._proc is None:
            return
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._proc = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _watch(tag: str, poll_s: float = 2.0) -> int:
    import select
    import signal

    # The launcher's terminal signals are not ours: only end-of-file on stdin ends the watch.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # While the run lives, remember the tagged processes' descendants: when the launcher dies, a parent can die
    # before its retitled child (whose own environment may no longer show the tag) is looked at. A psutil.Process
    # is identified by pid and start time, so a reused pid is a different element.
    seen: set = set()
    fd = sys.stdin.fileno()
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], poll_s)
            if ready and not os.read(fd, 4096):
                break
            if not ready:
                seen.update(tagged_processes(tag))
    except OSError:
        pass
    left = stop_tagged(tag, also=tuple(seen))
    if left:
        try:
            print(f"[troll-verl watchdog] stopped {len(left)} leftover process(es) of run {tag}", file=sys.stderr)
        except OSError:  # the launcher's terminal may be gone
            pass
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python -m {__spec__.name} TAG  (stops processes tagged TAG when stdin closes)")
    sys.exit(_watch(sys.argv[1]))

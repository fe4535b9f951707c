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
"""Killable child processes for the scorers: the math-verify worker pool and the local code runner share them.

- :func:`python_child_argv`: run ``module.function(*args)`` in a fresh interpreter with the caller's ``sys.path``
  (no fork of a threaded Ray actor, no ``multiprocessing`` re-import of ``__main__``);
- :func:`child_env`: the caller's environment with single-threaded numeric libraries;
- :class:`LineReader`: newline-delimited JSON from a pipe, with deadlines (``poll``);
- :func:`kill_process_group`: SIGKILL a child's whole session and reap it;
- :class:`WorkerPool` / :func:`worker_loop`: persistent workers answering JSON requests, killed and replaced on
  timeout;
- :func:`whole_seconds`: a time limit rounded up for ``signal.alarm`` and Sandbox Fusion.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

__all__ = [
    "LineReader",
    "WorkerError",
    "WorkerPool",
    "child_env",
    "kill_process_group",
    "python_child_argv",
    "whole_seconds",
    "worker_loop",
]

logger = logging.getLogger(__name__)


_BOOTSTRAP = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "import importlib, json\n"
    "sys.path[:] = json.loads(sys.argv[1])\n"
    "getattr(importlib.import_module(sys.argv[2]), sys.argv[3])(*json.loads(sys.argv[4]))\n"
)


def python_child_argv(module: str, function: str, *args: Any) -> list[str]:
    """Command line running ``module.function(*args)`` in a fresh interpreter with this process's ``sys.path``.

    The child imports only what the function needs (no ``__main__`` re-import as with ``multiprocessing``), and
    sees the same packages as the caller however it got them (venv, ``PYTHONPATH``, Ray ``working_dir``).
    ``args`` must be JSON-serializable.
    """
    paths = [os.path.abspath(p) for p in sys.path]
    return [sys.executable, "-c", _BOOTSTRAP, json.dumps(paths), module, function, json.dumps(list(args))]


def whole_seconds(seconds: float) -> int:
    """``seconds`` rounded up to a whole number, at least 1 (for ``signal.alarm`` and Sandbox Fusion limits)."""
    return max(1, int(-(-seconds // 1)))


def child_env() -> dict[str, str]:
    """Environment of scoring children: the caller's, with single-threaded numeric libraries."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[name] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONSTARTUP", None)
    return env


class LineReader:
    """Reads newline-terminated JSON messages from a pipe with deadlines (``poll``, no threads).

    ``poll`` rather than ``select``: a Ray actor can hold more than ``FD_SETSIZE`` (1024) descriptors, past which
    ``select`` refuses a descriptor.
    """

    def __init__(self, stream):
        self._fd = stream.fileno()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._buffer = b""

    def read(self, deadline: float) -> dict | None:
        """Returns the next message, or None if ``deadline`` (``time.monotonic()``) passes first.

        Raises:
            EOFError: If the pipe closes before a complete message.
        """
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not self._poll.poll(int(remaining * 1000) + 1):
                return None
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise EOFError("child closed its output")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILLs the session a child was started in (``start_new_session=True``) and reaps the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # before wait(): the unreaped leader keeps the group id ours
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered yet
        logger.warning("troll_verl.recipes.rewards: child %d did not exit after SIGKILL", proc.pid)


class WorkerError(RuntimeError):
    """A pool worker failed to start, died, or its call raised."""


class _Worker:
    def __init__(self, module: str, function: str, startup_timeout_s: float):
        self.proc = subprocess.Popen(
            python_child_argv(module, function),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=tempfile.gettempdir(),
            env=child_env(),
            start_new_session=True,
        )
        self.reader = LineReader(self.proc.stdout)
        try:
            hello = self.reader.read(time.monotonic() + startup_timeout_s)
        except (EOFError, ValueError) as e:
            self.kill()
            raise WorkerError(f"worker {module}.{function} died while starting") from e
        if hello is None or not hello.get("ready"):
            self.kill()
            raise WorkerError(f"worker {module}.{function} did not start: {hello}")

    def call(self, request: dict, timeout_s: float) -> dict:
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        reply = self.reader.read(time.monotonic() + timeout_s)
        if reply is None:
            raise TimeoutError(f"no reply within {timeout_s:g}s")
        return reply

    def kill(self) -> None:
        kill_process_group(self.proc)


class WorkerPool:
    """Persistent worker processes running ``module.function`` (a request loop), killed and replaced on timeout.

    Thread-safe; at most ``max_workers`` calls run at once, others wait for a free worker.
    """

    def __init__(self, module: str, function: str, max_workers: int, startup_timeout_s: float = 120.0):
        self.module, self.function = module, function
        self.max_workers = max(1, int(max_workers))
        self.startup_timeout_s = startup_timeout_s
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._idle: list[_Worker] = []

    def call(self, args: list, timeout_s: float, target: str | None = None) -> Any:
        """Runs ``target(*args)`` (``"module:function"``; the worker's default job if None) in a worker.

        Args:
            args: JSON-serializable positional arguments.
            timeout_s: Seconds to wait for the reply (worker start-up not included); the worker is killed past it.
            target: Optional ``"module:function"`` to run instead of the worker's default job.

        Returns:
            The JSON-decoded return value.

        Raises:
            TimeoutError: If no reply came within ``timeout_s``.
            WorkerError: If the worker could not start, died, or the call raised.
        """
        with self._lock:
            if os.getpid() != self._pid:  # forked: the workers belong to the parent
                self._reset()
            slots = self._slots
        with slots:
            reply = None
            for attempt in range(2):  # an idle worker may have died since its last call: retry once, fresh
                with self._lock:
                    worker = self._idle.pop() if self._idle and attempt == 0 else None
                reused = worker is not None
                if worker is None:
                    worker = _Worker(self.module, self.function, self.startup_timeout_s)
                try:
                    reply = worker.call({"target": target, "args": list(args)}, timeout_s)
                except TimeoutError:
                    worker.kill()
                    raise
                except (EOFError, OSError, ValueError) as e:
                    worker.kill()
                    if reused:
                        continue
                    raise WorkerError(f"worker died: {e!r}") from e
                except BaseException:
                    worker.kill()
                    raise
                with self._lock:
                    if os.getpid() == self._pid:
                        self._idle.append(worker)
                break
        if not reply.get("ok"):
            raise WorkerError(reply.get("error", "unknown error"))
        return reply.get("result")

    def close(self) -> None:
        """Kills the idle workers (busy ones are killed or returned by their callers)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


def worker_loop(
    default_target: str | None = None, preload: str | None = None, memory_limit_mb: int | None = None
) -> None:
    """Body of a pool worker: answers JSON requests ``{"target", "args"}`` from stdin, one per line.

    The replies go to the original stdout; fd 1 and 2 are pointed at ``/dev/null`` so stray prints of the called
    code cannot corrupt the protocol.

    Args:
        default_target: ``"module:function"`` run when a request names no target.
        preload: A module imported before announcing readiness (so start-up cost is not charged to a call).
        memory_limit_mb: Address-space limit (``RLIMIT_AS``) of the worker, set after the preload; a call that
            allocates past it fails with ``MemoryError``.
    """
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    logging.disable(logging.CRITICAL)

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        if preload:
            __import__(preload)
        if memory_limit_mb:
            import resource

            limit = int(memory_limit_mb) << 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except BaseException as e:
        send({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    send({"ready": True})
    functions: dict[str, Any] = {}
    for line in sys.stdin:
        try:
            request = json.loads(line)
            target = request.get("target") or default_target
            if target not in functions:
                module, _, name = target.partition(":")
                functions[target] = getattr(__import__(module, fromlist=[name]), name)
            send({"ok": True, "result": functions[target](*request["args"])})
        except BaseException as e:
            send({"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}"})

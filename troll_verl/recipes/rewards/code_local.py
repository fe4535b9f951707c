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
"""Run a code response on its test cases locally: verl's ``prime_code`` harness in a limited child.

verl's ``prime_code`` harness (``prime_code/testing_util.py::run_test``, loaded by
file path so the child never imports torch) runs in a fresh child interpreter in its own session and temporary
working directory, with its stdout/stderr sent to ``/dev/null`` and these limits:

* per test ``timeout_s`` (whole seconds): verl's ``signal.alarm``, turned into a :attr:`Reason.TIMEOUT`; the
  parent also kills the child if a test's result is ``timeout_s + 2`` s late (a hang in C code ignores signals);
* ``total_timeout_s`` wall clock over all tests (and ``RLIMIT_CPU`` just above it);
* ``memory_limit_mb`` of address space (``RLIMIT_AS``, interpreter included): an allocation past it raises
  ``MemoryError`` (:attr:`Reason.MEMORY_LIMIT`); also no core files and 64 MiB per written file.

Tests run in order, one ``run_test`` call each (not ``prime_code.compute_score``, which in verl 0.9.1 fails on a
failing test unless ``continuous=True``, and has no memory limit); a compile error, a time-out or a memory failure
stops the run (the rest count as failed), a wrong answer or an exception does not. When the run ends, the child's
whole process group is killed.

Where bubblewrap can run, the child runs inside it (:mod:`troll_verl.recipes.rewards.sandbox`): a read-only file system
except its work directory, no network, its own PID namespace (nothing it starts outlives the run) and death with its
parent; the limits above still apply inside. Without bubblewrap (not installed, or user namespaces off) it runs with
the limits only, as verl's own local scorer does, after a one-time warning: candidate code then runs as this user
and can write files or open connections. Sandbox Fusion remains the choice for untrusted models at scale.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from .processes import (
    LineReader,
    WorkerError,
    child_env,
    kill_process_group,
    python_child_argv,
    whole_seconds,
)
from .sandbox import sandbox_argv

__all__ = ["run_local", "STOP_STATUSES"]

# The test outcomes that end a run (the remaining tests count as failed).
STOP_STATUSES = frozenset({"compile_error", "timeout", "memory"})
_WATCHDOG_GRACE_S = 2.0
_STARTUP_TIMEOUT_S = 60.0
_FILE_SIZE_LIMIT = 64 << 20


def _testing_util_path() -> str:
    spec = importlib.util.find_spec("verl")  # finds the package without importing it (and torch)
    if spec is None or not spec.submodule_search_locations:
        raise WorkerError("verl is not installed")
    root = list(spec.submodule_search_locations)[0]
    return os.path.join(root, "utils", "reward_score", "prime_code", "testing_util.py")


class _TestTimeout(BaseException):
    """Raised by SIGALRM in the child; a BaseException so ``except Exception`` in the candidate cannot eat it."""


def _on_alarm(signum, frame):
    raise _TestTimeout()


def _snapshot_globals() -> tuple[list[tuple[Any, dict]], dict]:
    import builtins
    import shutil

    return [(module, dict(vars(module))) for module in (os, builtins, shutil, subprocess)], dict(sys.modules)


def _restore_globals(snapshot: tuple[list[tuple[Any, dict]], dict]) -> None:
    """Undoes what verl's ``reliability_guard`` (and the previous test) changed in these modules.

    ``run_test`` calls ``reliability_guard`` first, which sets ``os.putenv`` & co. to None and then sets an
    environment variable, so a second ``run_test`` in one process fails unless the functions come back. They
    are nulled again before the candidate runs.
    """
    modules, saved_sys_modules = snapshot
    for module, saved in modules:
        current = vars(module)
        for name, value in saved.items():
            if current.get(name) is not value:
                setattr(module, name, value)
    for name, value in list(sys.modules.items()):
        if value is None and name not in saved_sys_modules:
            del sys.modules[name]
    for name, value in saved_sys_modules.items():
        if sys.modules.get(name) is None and value is not None:
            sys.modules[name] = value


def _run_one(testing_util, code: str, case: dict, timeout: int) -> tuple[str, str]:
    try:
        results, metadata = testing_util.run_test(in_outs=copy.deepcopy(case), test=code, debug=False, timeout=timeout)
    except _TestTimeout:
        return "timeout", ""
    except MemoryError:
        return "memory", ""
    except BaseException as e:  # SystemExit from a call-based program, errors verl's harness does not catch
        return "runtime_error", repr(e)[:300]
    finally:
        signal.alarm(0)
    error = str(metadata.get("error", "")) if isinstance(metadata, dict) else ""
    if "MemoryError" in error:
        return "memory", error[:300]
    if results == [True]:
        return "pass", ""
    if results == [-2]:
        return "compile_error", error[:300]
    if results == [-1]:
        return "runtime_error", error[:300]
    return "wrong", ""


def _code_child_main() -> None:
    """Child process: runs the request read from stdin, one JSON result line per test on the original stdout."""
    request = json.loads(sys.stdin.buffer.read())
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    spec = importlib.util.spec_from_file_location("_troll_prime_code_testing_util", request["testing_util"])
    testing_util = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(testing_util)

    import resource

    memory = request["memory_limit_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = request["cpu_limit_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT))
    signal.signal(signal.SIGALRM, _on_alarm)
    snapshot = _snapshot_globals()
    send({"ready": True})
    for index, case in enumerate(request["tests"]):
        _restore_globals(snapshot)
        status, detail = _run_one(testing_util, request["code"], case, request["timeout"])
        send({"index": index, "status": status, "detail": detail})
        if status in STOP_STATUSES:
            break
    out.flush()
    os._exit(0)  # skip the candidate's atexit handlers and finalizers


def _status_from_exit(returncode: int | None) -> str:
    if returncode in (-signal.SIGXCPU, -signal.SIGALRM):
        return "timeout"
    if returncode == -signal.SIGKILL:  # not ours (we kill after the fact): the kernel's OOM killer
        return "memory"
    return "runtime_error"


def run_local(
    code: str,
    cases: dict,
    *,
    timeout_s: float,
    total_timeout_s: float,
    memory_limit_mb: int,
) -> list[str]:
    """Runs ``code`` on ``cases`` in a limited child process (see the module docstring).

    Args:
        code: The program.
        cases: Normalized test cases (:func:`parse_test_cases`).
        timeout_s: Per-test limit (rounded up to whole seconds).
        total_timeout_s: Wall-clock limit of the whole run.
        memory_limit_mb: Address-space limit of the child.

    Returns:
        One status per test run, in order (possibly fewer than the tests: the run stopped early).

    Raises:
        WorkerError: If the child could not be started (an infrastructure problem, not the program's fault).
    """
    per_test = whole_seconds(timeout_s)
    tests = [
        {"inputs": [x], "outputs": [y], "fn_name": cases["fn_name"]}
        for x, y in zip(cases["inputs"], cases["outputs"], strict=True)
    ]
    request = {
        "code": code,
        "tests": tests,
        "timeout": per_test,
        "memory_limit_mb": int(memory_limit_mb),
        "cpu_limit_s": int(total_timeout_s) + 2,
        "testing_util": _testing_util_path(),
    }
    start = time.monotonic()
    end = start + total_timeout_s
    statuses: list[str] = []
    with tempfile.TemporaryDirectory(prefix="troll_code_", ignore_cleanup_errors=True) as workdir:
        argv = python_child_argv(__name__, "_code_child_main")
        proc = subprocess.Popen(
            sandbox_argv(argv, workdir) or argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=child_env(),
            start_new_session=True,
        )
        started = crashed = False
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
            reader = LineReader(proc.stdout)
            hello = reader.read(start + max(_STARTUP_TIMEOUT_S, total_timeout_s))
            if hello is None or not hello.get("ready"):
                raise WorkerError(f"code runner did not start: {hello}")
            started = True
            while len(statuses) < len(tests):
                message = reader.read(min(end, time.monotonic() + per_test + _WATCHDOG_GRACE_S))
                if message is None:  # a hang the alarm did not catch, or the overall limit
                    statuses.append("timeout")
                    break
                statuses.append(message["status"])
                if message["status"] in STOP_STATUSES:
                    break
        except EOFError:
            crashed = True
        except (BrokenPipeError, ValueError) as e:
            raise WorkerError(f"code runner failed: {e!r}") from e
        finally:
            kill_process_group(proc)
    if crashed:
        if not started:
            raise WorkerError(f"code runner died while starting (exit status {proc.returncode})")
        statuses.append(_status_from_exit(proc.returncode))
    return statuses

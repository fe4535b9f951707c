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
"""Code reward (Eurus-2 code, CodeContests, APPS, TACO, Codeforces): run the last Python block on the test cases.

**Extraction.** The program is the last closed fenced block tagged ``python``/``py``/``python3``; without one,
the last closed untagged block. A response without a closed block scores 0 (:attr:`Reason.NO_ANSWER`): an
unclosed block is usually a response cut at the length limit.

**Test cases.** ``ground_truth`` is the format verl's ``prime_code`` scorer reads: a JSON string (or dict)
``{"inputs": [...], "outputs": [...], "fn_name": "..."}``. Without ``fn_name`` each input is fed as stdin and the
stdout compared with the output (verl's lenient comparison: whitespace, number tolerance). With ``fn_name`` the
program defines that function (or ``class Solution`` with that method); each input is a string of
newline-separated JSON arguments and each output the JSON of the return value. Lists instead of those strings
are accepted and converted.

**Score.** All or nothing: 1 only if every test passes, since a program that fails a test is wrong and partial
credit rewards special-casing the visible tests. ``pass_rate`` reports the fraction passed as a diagnostic;
``continuous=True`` scores with it instead. The reason is the first failing test's.

**Local execution** (default). verl's ``prime_code`` harness (``prime_code/testing_util.py::run_test``, loaded by
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

**Sandbox Fusion.** With ``sandbox_fusion_url`` (or ``TROLL_SANDBOX_FUSION_URL``) the tests run through verl's
client (``sandbox_fusion/utils.py::check_correctness``, which POSTs every test to the URL as given, i.e. the
``.../run_code`` endpoint; a URL without a path gets ``/run_code`` appended), with ``timeout_s`` rounded up as
compile and run limit (the sandbox's clock includes interpreter start-up) and ``memory_limit_mb``. Requests are
bounded by verl's ``concurrent_semaphore`` if passed, else by a per-process semaphore of
``sandbox_fusion_max_concurrent``. An unreachable or failing sandbox scores 0 with :attr:`Reason.SANDBOX_ERROR`
(logged); the run's wall clock is bounded by verl's HTTP timeouts. Judging follows the local harness:

* a standard-input program runs as a script; its stdout passes if verl's exact comparison (up to trailing
  newlines) or a line-by-line comparison up to surrounding white space and blank lines accepts it (the local
  harness's further leniency, number tolerance and token sets, is not reproduced);
* a call-based test does not use verl's client-side wrapper, which compares the printed return value as text (so
  ``"[2]"``, the APPS way of writing a return value of 2, never matches): the sandbox runs :func:`call_harness`,
  which defines the code and judges the return value as verl's local harness does, and prints a secret verdict.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import Reason, make_result
from .processes import (
    LineReader,
    WorkerError,
    child_env,
    kill_process_group,
    python_child_argv,
    whole_seconds,
)
from .sandbox import sandbox_argv

__all__ = [
    "DEFAULT_MEMORY_LIMIT_MB",
    "PRELUDE",
    "SANDBOX_FUSION_URL_ENV",
    "call_harness",
    "compute_score",
    "extract_code",
    "parse_test_cases",
    "run_local",
    "run_sandbox_fusion",
    "sandbox_fusion_endpoint",
]

logger = logging.getLogger(__name__)

SANDBOX_FUSION_URL_ENV = "TROLL_SANDBOX_FUSION_URL"
DEFAULT_MEMORY_LIMIT_MB = 1024

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3"})

# Per-test outcomes (child protocol and sandbox mapping) and the reasons they give.
_STATUS_REASON = {
    "pass": Reason.CORRECT,
    "wrong": Reason.WRONG_ANSWER,
    "compile_error": Reason.COMPILE_ERROR,
    "runtime_error": Reason.RUNTIME_ERROR,
    "timeout": Reason.TIMEOUT,
    "memory": Reason.MEMORY_LIMIT,
    "sandbox_error": Reason.SANDBOX_ERROR,
}
_STOP_STATUSES = frozenset({"compile_error", "timeout", "memory"})
_WATCHDOG_GRACE_S = 2.0
_STARTUP_TIMEOUT_S = 60.0
_FILE_SIZE_LIMIT = 64 << 20


# --------------------------------------------------------------------------------------------------- extraction
def extract_code(solution_str: str) -> str | None:
    """Extracts the program from a response, or None.

    Args:
        solution_str: The decoded response.

    Returns:
        The body of the last closed ```` ```python ```` / ```` ```py ```` / ```` ```python3 ```` block, else of the
        last closed untagged ```` ``` ```` block, else None (blank bodies count as none).
    """
    tagged = untagged = None
    for match in _FENCE.finditer(solution_str):
        tag, body = match.group(1).strip().lower(), match.group(2)
        if tag in _PYTHON_TAGS:
            tagged = body
        elif not tag:
            untagged = body
    code = tagged if tagged is not None else untagged
    return code if code is not None and code.strip() else None


def parse_test_cases(ground_truth: Any, max_tests: int | None = None) -> dict | None:
    """Reads ``ground_truth`` into ``{"inputs": [str], "outputs": [str], "fn_name": str | None}``, or None.

    Args:
        ground_truth: A JSON string or dict in verl's ``prime_code`` format.
        max_tests: Keep only the first this many tests.

    Returns:
        The normalized test cases (strings as verl's harness expects them), or None if unreadable or empty.
    """
    try:
        cases = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else dict(ground_truth)
    except (TypeError, ValueError):
        return None
    if not isinstance(cases, dict):
        return None
    inputs, outputs = cases.get("inputs"), cases.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs or len(inputs) != len(outputs):
        return None
    fn_name = cases.get("fn_name") or None
    if fn_name is not None and not isinstance(fn_name, str):
        return None
    if max_tests is not None:
        inputs, outputs = inputs[:max_tests], outputs[:max_tests]
    if fn_name:  # one JSON value per line and argument; the output's JSON
        inputs = [x if isinstance(x, str) else "\n".join(json.dumps(a) for a in x) for x in inputs]
        outputs = [y if isinstance(y, str) else json.dumps(y) for y in outputs]
    else:
        inputs = [x if isinstance(x, str) else "\n".join(map(str, x)) for x in inputs]
        outputs = [y if isinstance(y, str) else "\n".join(map(str, y)) for y in outputs]
    return {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}


# ----------------------------------------------------------------------------------------------- local execution
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
        if status in _STOP_STATUSES:
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
                if message["status"] in _STOP_STATUSES:
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


# ------------------------------------------------------------------------------------------------ Sandbox Fusion
_SEMAPHORES: dict[int, threading.Semaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


def _process_semaphore(max_concurrent: int) -> threading.Semaphore:
    with _SEMAPHORES_LOCK:
        if max_concurrent not in _SEMAPHORES:
            _SEMAPHORES[max_concurrent] = threading.Semaphore(max(1, int(max_concurrent)))
        return _SEMAPHORES[max_concurrent]


def sandbox_fusion_endpoint(url: str) -> str:
    """The URL verl's client should POST to: ``url`` itself, or ``url + "/run_code"`` if it has no path."""
    parts = urlsplit(url.strip())
    if parts.path in ("", "/"):
        parts = parts._replace(path="/run_code")
    return urlunsplit(parts)


_SANDBOX_STATUS = {-1: "sandbox_error", -2: "runtime_error", -3: "timeout", -4: "compile_error"}

_PRELUDE_MODULES = (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
    "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing",
)  # fmt: skip
#: What verl's local harness (``testing_util.py::run_test``, its ``sol``) puts before every program; the call-based
#: Sandbox Fusion harness does the same.
PRELUDE = (
    "".join(f"from {name} import *\n" for name in _PRELUDE_MODULES)
    + "".join(f"import {name}\n" for name in _PRELUDE_MODULES if name not in ("builtins", "typing"))
    + "sys.setrecursionlimit(6*10**5)\n"
)
_SETUP_FAILED = "troll-verl: the code failed while defining the function"

# A call-based test as one standalone program: stdin is the JSON pair [arguments, expected return]; the judging
# is verl's local harness's (the same module setup, argument decoding and comparisons); the one line on stdout is
# VERDICT if the test passes, "wrong" if not. Prints of the code under test are swallowed, as locally.
_CALL_HARNESS = """\
import io, json, os, sys, traceback, types

SOURCE, CODE, FN_NAME, VERDICT = json.loads({config!r})
RAW_INPUTS, RAW_OUTPUT = json.loads(sys.stdin.read())
REAL_STDOUT, sys.stdout = sys.stdout, io.StringIO()


def fail(mark=None):
    traceback.print_exc()
    if mark:
        sys.stderr.write(mark + "\\n")
    sys.stderr.flush()
    os._exit(1)


try:
    module = types.ModuleType("tmp_sol")
    sys.modules["tmp_sol"] = module
    exec(compile(SOURCE, "<string>", "exec"), module.__dict__)
    method = getattr(module.Solution() if "class Solution" in CODE else module, FN_NAME)
except BaseException:
    fail({setup_failed!r})
try:
    inputs = [json.loads(line) for line in RAW_INPUTS.split("\\n")]
    expected = json.loads(RAW_OUTPUT)
    try:
        if isinstance(inputs[0], dict):
            inputs = [{{int(k): v for k, v in inputs[0].items()}}]
    except Exception:
        pass
    try:
        if isinstance(expected, dict):
            expected = [{{int(k): v for k, v in expected.items()}}]
    except Exception:
        pass
    try:
        if isinstance(expected[0], dict):
            expected = [{{int(k): v for k, v in expected[0].items()}}]
    except Exception:
        pass
    output = method(*inputs)
    json.dumps(output)
    if isinstance(output, tuple):
        output = list(output)
    passed = output == expected
    if isinstance(expected, list) and expected:
        passed = passed or (output == expected[0])
    try:
        if isinstance(output[0], tuple):
            passed = passed or ([list(x) for x in output] == expected[0])
    except Exception:
        pass
except BaseException:
    fail()
REAL_STDOUT.write((VERDICT if passed is True else "wrong") + "\\n")
REAL_STDOUT.flush()
os._exit(0)
"""


def call_harness(code: str, fn_name: str, verdict: str) -> str:
    """The program Sandbox Fusion runs for a call-based test (see :func:`run_sandbox_fusion`).

    Args:
        code: The extracted code, which defines ``fn_name`` (or ``class Solution`` with that method).
        fn_name: The function the tests call.
        verdict: What the program prints if the test passes (it prints ``wrong`` otherwise).

    Returns:
        The program; it reads ``json.dumps([inputs, output])`` of one test case from stdin.
    """
    config = json.dumps([PRELUDE + code, code, fn_name, verdict])
    return _CALL_HARNESS.format(config=config, setup_failed=_SETUP_FAILED)


def _same_lines(stdout: Any, expected: str) -> bool:
    """Whether two outputs agree line by line up to surrounding white space and blank lines."""

    def lines(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip()]

    return isinstance(stdout, str) and lines(stdout) == lines(expected)


def run_sandbox_fusion(
    code: str,
    cases: dict,
    *,
    url: str,
    timeout_s: float,
    memory_limit_mb: int,
    semaphore: Any,
) -> list[str]:
    """Runs ``code`` on ``cases`` with verl's Sandbox Fusion client (see the module docstring).

    Args:
        code: The program.
        cases: Normalized test cases (:func:`parse_test_cases`).
        url: The sandbox's ``run_code`` endpoint.
        timeout_s: Compile and run limit per test (rounded up to whole seconds).
        memory_limit_mb: The sandbox's memory limit.
        semaphore: Bounds the concurrent requests (``with semaphore:``).

    Returns:
        One status per test, in order.
    """
    from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

    fn_name = cases["fn_name"]
    if fn_name:
        verdict = secrets.token_hex(16)
        generation = call_harness(code, fn_name, verdict)
        in_outs = {
            "inputs": [json.dumps([x, y]) for x, y in zip(cases["inputs"], cases["outputs"], strict=True)],
            "outputs": [verdict] * len(cases["inputs"]),
        }
    else:
        generation, in_outs = code, {"inputs": cases["inputs"], "outputs": cases["outputs"]}
    results, metadata = check_correctness(
        sandbox_fusion_url=url,
        in_outs=in_outs,
        generation=generation,
        timeout=whole_seconds(timeout_s),
        memory_limit_mb=int(memory_limit_mb),
        language="python",
        concurrent_semaphore=semaphore,
    )
    statuses = []
    for index, result in enumerate(results):
        meta = metadata[index] if index < len(metadata) and isinstance(metadata[index], dict) else {}
        stderr = str(meta.get("stderr") or "")
        if result is True:
            status = "pass"
        elif result is False:
            lenient = not fn_name and _same_lines(meta.get("stdout"), cases["outputs"][index])
            status = "pass" if lenient else "wrong"
        else:
            status = _SANDBOX_STATUS.get(result, "sandbox_error")
            if status == "runtime_error" and "MemoryError" in stderr:
                status = "memory"
            elif status == "runtime_error" and ("SyntaxError" in stderr or _SETUP_FAILED in stderr):
                status = "compile_error"
        if status == "sandbox_error":
            logger.warning(
                "troll_verl.recipes.rewards.code: Sandbox Fusion failed on a test: %s",
                meta.get("api_request_error") or meta.get("status") or meta.get("error"),
            )
        statuses.append(status)
    return statuses


# ------------------------------------------------------------------------------------------------------ scoring
def compute_score(
    solution_str: str,
    ground_truth: Any,
    *,
    continuous: bool = False,
    timeout_s: float = 5.0,
    total_timeout_s: float = 60.0,
    max_tests: int | None = None,
    memory_limit_mb: int | None = None,
    sandbox_fusion_url: str | None = None,
    sandbox_fusion_max_concurrent: int = 64,
    concurrent_semaphore: Any = None,
) -> dict[str, float | int]:
    """Scores a code response (see the module docstring).

    Args:
        solution_str: The decoded response.
        ground_truth: Test cases in verl's ``prime_code`` format (JSON string or dict).
        continuous: Score with the pass fraction instead of 1/0.
        timeout_s: Per-test time limit (whole seconds).
        total_timeout_s: Wall-clock limit of a local run over all tests.
        max_tests: Run only the first this many tests.
        memory_limit_mb: Memory limit; default 1024.
        sandbox_fusion_url: Sandbox Fusion endpoint; falls back to ``$TROLL_SANDBOX_FUSION_URL``; local if neither.
        sandbox_fusion_max_concurrent: Per-process bound on Sandbox Fusion requests without ``concurrent_semaphore``.
        concurrent_semaphore: verl's semaphore bounding Sandbox Fusion requests.

    Returns:
        The :func:`troll_verl.recipes.rewards.make_result` dict.

    Raises:
        WorkerError: If the local runner cannot start (reported by the caller as ``INTERNAL_ERROR``).
    """
    code = extract_code(solution_str)
    cases = parse_test_cases(ground_truth, max_tests=max_tests)
    if cases is None:
        logger.warning("troll_verl.recipes.rewards.code: unreadable test cases %r", str(ground_truth)[:200])
        return make_result(reason=Reason.BAD_GROUND_TRUTH, has_answer=code is not None, continuous=continuous)
    if code is None:
        return make_result(reason=Reason.NO_ANSWER, has_answer=False, continuous=continuous)
    memory_limit_mb = int(memory_limit_mb or DEFAULT_MEMORY_LIMIT_MB)
    url = sandbox_fusion_url or os.environ.get(SANDBOX_FUSION_URL_ENV) or None
    if url:
        try:
            statuses = run_sandbox_fusion(
                code,
                cases,
                url=sandbox_fusion_endpoint(url),
                timeout_s=timeout_s,
                memory_limit_mb=memory_limit_mb,
                semaphore=concurrent_semaphore or _process_semaphore(sandbox_fusion_max_concurrent),
            )
        except Exception:
            logger.exception("troll_verl.recipes.rewards.code: Sandbox Fusion client failed")
            statuses = ["sandbox_error"]
    else:
        statuses = run_local(
            code, cases, timeout_s=timeout_s, total_timeout_s=total_timeout_s, memory_limit_mb=memory_limit_mb
        )
    passed = sum(status == "pass" for status in statuses)
    failed = [status for status in statuses if status != "pass"]
    total = len(cases["inputs"])
    reason = _STATUS_REASON.get(failed[0], Reason.RUNTIME_ERROR) if failed else Reason.CORRECT
    if not failed and passed < total:  # cannot happen: a run stops early only on a failure
        reason = Reason.INTERNAL_ERROR
    return make_result(reason=reason, has_answer=True, pass_rate=passed / total, continuous=continuous)

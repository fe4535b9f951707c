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
"""Run a code response on its test cases through Sandbox Fusion, with verl's client.

With ``sandbox_fusion_url`` (or ``TROLL_SANDBOX_FUSION_URL``) the tests run through verl's
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

import json
import logging
import secrets
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .processes import whole_seconds

__all__ = ["PRELUDE", "call_harness", "run_sandbox_fusion", "sandbox_fusion_endpoint", "process_semaphore"]

logger = logging.getLogger(__name__)

_SEMAPHORES: dict[int, threading.Semaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


def process_semaphore(max_concurrent: int) -> threading.Semaphore:
    """The process-wide semaphore of this concurrency limit (one per limit, created on first use): it caps the
    concurrent requests to the sandbox service."""
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

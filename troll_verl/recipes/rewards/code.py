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

**Where the tests run.** Locally by default, in a child interpreter under limits and, where it can run, bubblewrap
(:mod:`troll_verl.recipes.rewards.code_local`); with ``sandbox_fusion_url`` (or ``TROLL_SANDBOX_FUSION_URL``) through
verl's Sandbox Fusion client (:mod:`troll_verl.recipes.rewards.code_sandbox_fusion`). :func:`compute_score` picks
one and turns the per-test outcomes into the score.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from . import Reason, make_result
from .code_local import run_local
from .code_sandbox_fusion import PRELUDE, call_harness, process_semaphore, run_sandbox_fusion, sandbox_fusion_endpoint

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
                semaphore=concurrent_semaphore or process_semaphore(sandbox_fusion_max_concurrent),
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

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
"""Math reward (DAPO-Math, AIME, AMC, Eurus-2 math): the last ``\\boxed{}`` answer, checked with math-verify.

**Extraction.** The prompt asks for the final answer ``within \\boxed{}``. The answer is the content of the last
``\\boxed{...}`` or ``\\fbox{...}`` whose braces balance (nested braces are fine; a truncated, unclosed box is
skipped), or of ``\\boxed 5``; without one, the text after the last ``Answer:`` (the DAPO prompt's last line),
with ``$`` and a trailing period dropped. No answer scores 0 (:attr:`Reason.NO_ANSWER`).

**Checking.** Identical strings (up to spaces, ``$`` and ``\\left``/``\\right``) and equal plain numbers are
decided here; everything else goes to math-verify (``math_verify.parse`` of both, then ``verify(gold, pred)``),
which accepts equivalent LaTeX (``\\frac{1}{2}`` = ``0.5`` = ``\\dfrac12``, ``2\\pi`` = ``2 \\pi``, ...).

**Time limit.** math-verify can hang on adversarial input, and its own timeouts use ``signal.alarm``, which only
works in a process's main thread: verl calls reward functions from a thread pool inside a Ray actor. So the check
runs in a small pool of persistent worker processes (plain ``subprocess`` children of whatever process scores:
no fork of a threaded Ray actor, no ``multiprocessing`` re-import of ``__main__``), where math-verify's alarms
work; the caller waits at most ``timeout_s`` and kills the worker past it (:attr:`Reason.VERIFY_TIMEOUT`), a
fresh worker replacing it on the next call. A worker's address space is limited to
:data:`VERIFY_MEMORY_LIMIT_MB` (an allocation past it fails the check: :attr:`Reason.VERIFY_ERROR` or a wrong
answer). Workers exit when their parent closes their stdin (parent exit). ``TROLL_MATH_VERIFY_WORKERS`` sets the
pool size (default ``min(4, cpu_count)``) per scoring process.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Any

from . import Reason, make_result
from .processes import WorkerError, WorkerPool, whole_seconds, worker_loop

__all__ = [
    "VERIFY_MEMORY_LIMIT_MB",
    "WorkerError",
    "check_answer",
    "compute_score",
    "extract_answer",
    "last_boxed",
    "quick_check",
    "verify_pool",
]

logger = logging.getLogger(__name__)

#: Address-space limit of a math-verify worker (sympy on adversarial input can grow without bound).
VERIFY_MEMORY_LIMIT_MB = 2048

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_LINE = re.compile(r"answer\**\s*[:：]\s*(.*)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_INTEGER = re.compile(r"[-+]?\d+")
_SPACES = re.compile(r"\s+")
_CANON = (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\!", ""), ("\\,", ""))


# --------------------------------------------------------------------------------------------------- extraction
def _brace_group(text: str, start: int) -> tuple[str, int] | None:
    """Returns the content of the brace group opening at ``text[start] == "{"`` and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        char = text[i]
        if i > start and text[i - 1] == "\\":  # \{ and \} are literal braces
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """Returns the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed x``), or None.

    Args:
        text: A response.

    Returns:
        The content between the balanced braces (stripped of nothing), or None if there is no complete box.
    """
    positions = sorted(
        (m.start(), len(cmd)) for cmd in _BOX_COMMANDS for m in re.finditer(re.escape(cmd) + r"(?![A-Za-z])", text)
    )
    for pos, length in reversed(positions):
        rest = pos + length
        while rest < len(text) and text[rest] == " ":
            rest += 1
        if rest < len(text) and text[rest] == "{":
            group = _brace_group(text, rest)
            if group is not None:
                return group[0]
        elif rest > pos + length and rest < len(text):  # "\boxed 5": one token
            token = re.match(r"[^\s$]+", text[rest:])
            if token is not None:
                return token.group(0)
    return None


def _clean_answer_line(text: str) -> str:
    text = text.strip().strip("*").strip()
    if text.startswith("$"):  # "$x$", "$$x$$", "$x$ (units)": the first math span
        inner = text.lstrip("$")
        end = inner.find("$")
        text = inner if end < 0 else inner[:end]
    return text.strip().rstrip(".").strip()


def extract_answer(solution_str: str) -> str | None:
    """Extracts the final answer of a math response, or None.

    Args:
        solution_str: The decoded response.

    Returns:
        The content of the last complete ``\\boxed{}``/``\\fbox{}``; else the text after the last ``Answer:``
        (``$...$`` and a trailing ``.`` removed); else None. An empty answer counts as none.
    """
    boxed = last_boxed(solution_str)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    lines = _ANSWER_LINE.findall(solution_str)
    for line in reversed(lines):
        answer = _clean_answer_line(line)
        if answer:
            return answer
    return None


def _gold_text(ground_truth: Any) -> str:
    text = str(ground_truth).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    return text.strip().strip("$").strip()


def _canonical(text: str) -> str:
    for old, new in _CANON:
        text = text.replace(old, new)
    return _SPACES.sub("", text).strip("$").rstrip(".")


def _plain_number(text: str) -> Decimal | None:
    if _NUMBER.fullmatch(text) is None:
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def quick_check(gold: str, answer: str) -> bool | None:
    """Decides the easy cases without math-verify: True/False when certain, None when math-verify must decide.

    Equal canonical strings are correct; two plain numbers that are equal are correct, two different integers
    are wrong. Different decimals are left to math-verify (it compares within its own precision).
    """
    gold_c, answer_c = _canonical(gold), _canonical(answer)
    if gold_c and gold_c == answer_c:
        return True
    gold_n, answer_n = _plain_number(gold_c), _plain_number(answer_c)
    if gold_n is not None and answer_n is not None:
        if gold_n == answer_n:
            return True
        if _INTEGER.fullmatch(gold_c) and _INTEGER.fullmatch(answer_c):
            return False
    return None


# --------------------------------------------------------------------------------------- math-verify workers
def _math_worker_main() -> None:
    worker_loop(default_target=f"{__name__}:_verify_job", preload="math_verify", memory_limit_mb=VERIFY_MEMORY_LIMIT_MB)


def _verify_job(gold: str, answer: str, timeout_s: float) -> str:
    """Runs math-verify (in a worker's main thread, so its ``signal.alarm`` timeouts work).

    Returns:
        ``"correct"``, ``"wrong"``, ``"bad_gold"`` (the gold answer does not parse) or ``"timeout"``.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    seconds = whole_seconds(timeout_s)
    configs = (LatexExtractionConfig(), ExprExtractionConfig())
    try:
        gold_parsed = parse(f"${gold}$", configs, parsing_timeout=seconds, raise_on_error=True)
    except TimeoutException:
        return "timeout"
    except Exception:
        return "bad_gold"
    if not gold_parsed:
        return "bad_gold"
    answer_parsed = parse(f"${answer}$", configs, parsing_timeout=seconds)
    if not answer_parsed:
        return "wrong"
    return "correct" if verify(gold_parsed, answer_parsed, timeout_seconds=seconds) else "wrong"


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def verify_pool() -> WorkerPool:
    """The process-wide math-verify worker pool (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            size = int(os.environ.get("TROLL_MATH_VERIFY_WORKERS", "0")) or min(4, os.cpu_count() or 1)
            _POOL = WorkerPool(__name__, "_math_worker_main", max_workers=size)
            atexit.register(_POOL.close)
        return _POOL


# ------------------------------------------------------------------------------------------------------ scoring
def check_answer(gold: str, answer: str, timeout_s: float = 10.0) -> Reason:
    """Checks an extracted answer against the gold answer.

    Args:
        gold: The reference answer (LaTeX or plain, without ``\\boxed``).
        answer: The extracted answer.
        timeout_s: math-verify's time limit.

    Returns:
        ``CORRECT``, ``WRONG_ANSWER``, ``BAD_GROUND_TRUTH``, ``VERIFY_TIMEOUT`` or ``VERIFY_ERROR``.
    """
    quick = quick_check(gold, answer)
    if quick is not None:
        return Reason.CORRECT if quick else Reason.WRONG_ANSWER
    try:
        verdict = verify_pool().call([gold, answer, timeout_s], timeout_s=timeout_s)
    except TimeoutError:
        logger.warning("troll_verl.recipes.rewards.math: math-verify timed out after %gs (worker killed)", timeout_s)
        return Reason.VERIFY_TIMEOUT
    except WorkerError as e:
        logger.warning("troll_verl.recipes.rewards.math: math-verify failed: %s", e)
        return Reason.VERIFY_ERROR
    if verdict == "bad_gold":
        logger.warning("troll_verl.recipes.rewards.math: ground truth %r does not parse", gold[:200])
        return Reason.BAD_GROUND_TRUTH
    return {"correct": Reason.CORRECT, "timeout": Reason.VERIFY_TIMEOUT}.get(verdict, Reason.WRONG_ANSWER)


def compute_score(solution_str: str, ground_truth: Any, timeout_s: float = 10.0) -> dict[str, float | int]:
    """Scores a math response.

    Args:
        solution_str: The decoded response.
        ground_truth: The reference answer (``"34"``, ``"\\frac{\\sqrt{3}}{2}"``, or with ``\\boxed{}``/``$``).
        timeout_s: math-verify's time limit.

    Returns:
        The :func:`troll_verl.recipes.rewards.make_result` dict.
    """
    answer = extract_answer(solution_str)
    if answer is None:
        return make_result(reason=Reason.NO_ANSWER, has_answer=False)
    gold = _gold_text(ground_truth)
    if not gold:
        logger.warning("troll_verl.recipes.rewards.math: empty ground truth %r", ground_truth)
        return make_result(reason=Reason.BAD_GROUND_TRUTH, has_answer=True)
    return make_result(reason=check_answer(gold, answer, timeout_s), has_answer=True)

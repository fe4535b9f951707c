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
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal, InvalidOperation
from typing import Any

from troll_verl.rewards import Reason, make_result

__all__ = [
    "VERIFY_MEMORY_LIMIT_MB",
    "LineReader",
    "WorkerError",
    "WorkerPool",
    "check_answer",
    "child_env",
    "compute_score",
    "extract_answer",
    "kill_process_group",
    "last_boxed",
    "python_child_argv",
    "quick_check",
    "verify_pool",
    "whole_seconds",
    "worker_loop",
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


# --------------------------------------------------------------------------------------- killable worker pool
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
        logger.warning("troll_verl.rewards: child %d did not exit after SIGKILL", proc.pid)


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
        logger.warning("troll_verl.rewards.math: math-verify timed out after %gs (worker killed)", timeout_s)
        return Reason.VERIFY_TIMEOUT
    except WorkerError as e:
        logger.warning("troll_verl.rewards.math: math-verify failed: %s", e)
        return Reason.VERIFY_ERROR
    if verdict == "bad_gold":
        logger.warning("troll_verl.rewards.math: ground truth %r does not parse", gold[:200])
        return Reason.BAD_GROUND_TRUTH
    return {"correct": Reason.CORRECT, "timeout": Reason.VERIFY_TIMEOUT}.get(verdict, Reason.WRONG_ANSWER)


def compute_score(solution_str: str, ground_truth: Any, timeout_s: float = 10.0) -> dict[str, float | int]:
    """Scores a math response.

    Args:
        solution_str: The decoded response.
        ground_truth: The reference answer (``"34"``, ``"\\frac{\\sqrt{3}}{2}"``, or with ``\\boxed{}``/``$``).
        timeout_s: math-verify's time limit.

    Returns:
        The :func:`troll_verl.rewards.make_result` dict.
    """
    answer = extract_answer(solution_str)
    if answer is None:
        return make_result(reason=Reason.NO_ANSWER, has_answer=False)
    gold = _gold_text(ground_truth)
    if not gold:
        logger.warning("troll_verl.rewards.math: empty ground truth %r", ground_truth)
        return make_result(reason=Reason.BAD_GROUND_TRUTH, has_answer=True)
    return make_result(reason=check_answer(gold, answer, timeout_s), has_answer=True)

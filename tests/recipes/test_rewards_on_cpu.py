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
"""Tests of troll_verl.recipes.rewards: extraction, math-verify under a time limit, limited code execution, Sandbox
Fusion through verl's client against a fake server, and the function loaded and run by verl's reward machinery."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from troll_verl.recipes.rewards import RESULT_KEYS, Reason, code_local, compute_score, gsm8k
from troll_verl.recipes.rewards import code as code_reward
from troll_verl.recipes.rewards import math as math_reward

# Tight limits so the whole file stays fast; generous slack for a loaded 2-core machine.
FAST = {"code_timeout_s": 1, "code_total_timeout_s": 10, "memory_limit_mb": 256}
SLACK_S = 6.0


def _check_shape(result):
    assert tuple(result) == RESULT_KEYS
    assert all(type(result[k]) is float for k in RESULT_KEYS if k != "reason")
    assert type(result["reason"]) is int


# ------------------------------------------------------------------------------------------------------ GSM8K
@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("so the total is\n#### 1,080", "1,080"),
        ("#### $18.00", "18.00"),
        ("#### 18.", "18."),
        ("#### -3 degrees", "-3"),
        ("#### **72**", "72"),
        ("#### 5\nwait, recheck\n#### 7", "7"),
        ("#### 5\n#### (see above)", "5"),
        ("The total is \\boxed{\\$1,080}.", "\\$1,080"),
        ("\\boxed{12} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("The answer is 72.", None),
    ],
)
def test_gsm8k_extract(text, expected):
    assert gsm8k.extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, value",
    [("1,080", 1080), ("18.00", 18), ("18.", 18), ("$-3", -3), ("\\frac{3}{4}", 0.75), ("50\\%", 50), ("3x", None)],
)
def test_gsm8k_parse_number(text, value):
    parsed = gsm8k.parse_number(text)
    assert (parsed is None) if value is None else (parsed == value)


@pytest.mark.parametrize(
    "solution, truth, reason",
    [
        ("#### 1,080", "1080", Reason.CORRECT),
        ("#### $18.00", "18", Reason.CORRECT),
        ("#### 72.0", "72", Reason.CORRECT),
        ("#### 18.5", "18", Reason.WRONG_ANSWER),
        ("#### 1,081", "1080", Reason.WRONG_ANSWER),
        ("#### 72\nso \\boxed{71}", "72", Reason.CORRECT),  # "####" wins over the box
        ("Total: \\boxed{72}", "72", Reason.CORRECT),
        ("\\boxed{72} and finally \\boxed{73}", "72", Reason.WRONG_ANSWER),  # the last box counts
        ("\\boxed{3x}", "3", Reason.WRONG_ANSWER),
        ("The answer is 72", "72", Reason.NO_ANSWER),
        ("#### 72", "Janet has 3 + 4 = 7 ducks... #### 72", Reason.CORRECT),
        ("#### 72", "seventy-two", Reason.BAD_GROUND_TRUTH),
    ],
)
def test_gsm8k_score(solution, truth, reason):
    result = compute_score("openai/gsm8k", solution, truth)
    _check_shape(result)
    assert result["reason"] == reason
    assert result["score"] == result["acc"] == float(reason == Reason.CORRECT)
    assert result["has_answer"] == float(reason not in (Reason.NO_ANSWER,))


# ------------------------------------------------------------------------------------------------------- math
@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} no wait \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{\\{1, 2\\} \\cup \\{x^{2}\\}}", "\\{1, 2\\} \\cup \\{x^{2}\\}"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{3} and then \\boxed{4", "3"),  # an unclosed (truncated) box is skipped
        ("Work...\nAnswer: $42$.", "42"),
        ("**Answer:** 3", "3"),
        ("Answer: 1\nAnswer: \\frac{7}{2}", "\\frac{7}{2}"),
        ("\\boxed{}", None),
        ("no answer here", None),
        ("\\boxed{34", None),
    ],
)
def test_math_extract(text, expected):
    assert math_reward.extract_answer(text) == expected


@pytest.mark.parametrize(
    "data_source, solution, truth, reason",
    [
        ("math_dapo", "\\boxed{\\frac{1}{2}}", "0.5", Reason.CORRECT),
        ("math_dapo", "\\boxed{0.5}", "\\frac{1}{2}", Reason.CORRECT),
        ("eurus2_math", "\\boxed{\\dfrac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}", Reason.CORRECT),
        ("eurus2_math", "\\boxed{\\frac{\\sqrt{3}}{3}}", "\\frac{\\sqrt{3}}{2}", Reason.WRONG_ANSWER),
        ("eurus2_math", "\\boxed{(x+1)^2}", "x^2+2x+1", Reason.CORRECT),
        ("eurus2_math", "\\boxed{\\pi \\cdot 2}", "2\\pi", Reason.CORRECT),
        ("eurus2_math", "\\boxed{x = 3}", "3", Reason.CORRECT),
        ("eurus2_math", "\\boxed{0.3}", "\\frac{1}{3}", Reason.WRONG_ANSWER),
        ("aime2024", "First \\boxed{12}, finally \\boxed{34}", "34", Reason.CORRECT),
        ("aime2025", "\\boxed{34} hmm, no: \\boxed{35}", "34", Reason.WRONG_ANSWER),
        ("amc23", "Answer: $34$", "34", Reason.CORRECT),
        ("aime2024", "\\boxed{034}", "34", Reason.CORRECT),
        ("math_dapo", "\\boxed{34}", "\\boxed{34}", Reason.CORRECT),
        ("math_dapo", "I think it is 34", "34", Reason.NO_ANSWER),
        ("math_dapo", "\\boxed{34", "34", Reason.NO_ANSWER),
    ],
)
def test_math_score(data_source, solution, truth, reason):
    result = compute_score(data_source, solution, truth)
    _check_shape(result)
    assert result["reason"] == reason, result
    assert result["score"] == result["acc"] == float(reason == Reason.CORRECT)


def test_math_verify_from_threads():
    """verl scores from a thread pool, where math-verify's signal.alarm cannot work: the worker pool must."""
    cases = [("\\boxed{\\frac{2}{4}}", "0.5"), ("\\boxed{\\sqrt{4}}", "2"), ("\\boxed{1/3}", "0.5")]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda c: compute_score("math_dapo", *c), cases))
    assert [r["acc"] for r in results] == [1.0, 1.0, 0.0]


def test_math_verify_timeout_kills_worker_and_recovers():
    pool = math_reward.verify_pool()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        pool.call([30], timeout_s=1.0, target="time:sleep")
    assert time.monotonic() - start < 1.0 + SLACK_S
    assert compute_score("math_dapo", "\\boxed{\\frac{6}{8}}", "0.75")["reason"] == Reason.CORRECT


def test_math_verify_failures_score_zero(monkeypatch):
    class Failing:
        def __init__(self, exc):
            self.exc = exc

        def call(self, *args, **kwargs):
            raise self.exc

    for exc, reason in [
        (TimeoutError("slow"), Reason.VERIFY_TIMEOUT),
        (math_reward.WorkerError("died"), Reason.VERIFY_ERROR),
    ]:
        monkeypatch.setattr(math_reward, "verify_pool", lambda e=exc: Failing(e))
        result = compute_score("math_dapo", "\\boxed{\\frac{1}{2}}", "0.5")
        _check_shape(result)
        assert (result["reason"], result["score"], result["has_answer"]) == (reason, 0.0, 1.0)


def test_math_verify_worker_memory_limit():
    pool = math_reward.verify_pool()
    limit = math_reward.VERIFY_MEMORY_LIMIT_MB << 20
    assert pool.call([9], timeout_s=10.0, target="resource:getrlimit") == [limit, limit]  # 9: RLIMIT_AS on Linux
    with pytest.raises(math_reward.WorkerError, match="MemoryError"):
        pool.call([limit + (64 << 20)], timeout_s=10.0, target="builtins:bytearray")
    assert compute_score("math_dapo", "\\boxed{\\frac{6}{8}}", "0.75")["reason"] == Reason.CORRECT


# ------------------------------------------------------------------------------------------------------- code
STDIN_TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -2\n"], "outputs": ["3\n", "7\n", "8\n"]})
CALL_TESTS = json.dumps({"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]})


def _block(program, tag="python"):
    return f"Here is my solution.\n```{tag}\n{program}```\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```", "print(2)\n"),
        ("```python\nprint(1)\n```\nOutput:\n```\n1\n```", "print(1)\n"),  # tagged beats a later output block
        ("```\nprint(3)\n```", "print(3)\n"),
        ("```cpp\nint main(){}\n```", None),
        ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)\n"),  # unclosed block ignored
        ("print(1)", None),
    ],
)
def test_code_extract(text, expected):
    assert code_reward.extract_code(text) == expected


@pytest.mark.parametrize(
    "name, program, tests, reason, pass_rate",
    [
        ("correct", "a, b = map(int, input().split())\nprint(a + b)\n", STDIN_TESTS, Reason.CORRECT, 1.0),
        (
            "main_guard",
            "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\n"
            "if __name__ == '__main__':\n    main()\n",
            STDIN_TESTS,
            Reason.CORRECT,
            1.0,
        ),
        ("wrong", "a, b = map(int, input().split())\nprint(a * b)\n", STDIN_TESTS, Reason.WRONG_ANSWER, 0.0),
        (
            "partial",
            "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n",
            STDIN_TESTS,
            Reason.WRONG_ANSWER,
            2 / 3,
        ),
        ("exception", "raise ValueError('boom')\n", STDIN_TESTS, Reason.RUNTIME_ERROR, 0.0),
        ("syntax_error", "def f(:\n    pass\n", STDIN_TESTS, Reason.COMPILE_ERROR, 0.0),
        ("infinite_loop", "while True:\n    pass\n", STDIN_TESTS, Reason.TIMEOUT, 0.0),
        (
            "alarm_ignored",
            "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
            STDIN_TESTS,
            Reason.TIMEOUT,
            0.0,
        ),
        (
            "memory_hog",
            "x = []\nwhile True:\n    x.append(bytearray(5 * 10**7))\n",
            STDIN_TESTS,
            Reason.MEMORY_LIMIT,
            0.0,
        ),
        ("huge_alloc", "x = bytearray(64 * 1024**3)\n", STDIN_TESTS, Reason.MEMORY_LIMIT, 0.0),
        ("call_based", "def add(a, b):\n    return a + b\n", CALL_TESTS, Reason.CORRECT, 1.0),
        (
            "call_based_class",
            "class Solution:\n    def add(self, a, b):\n        return a + b\n",
            CALL_TESTS,
            Reason.CORRECT,
            1.0,
        ),
        ("call_based_wrong", "def add(a, b):\n    return a\n", CALL_TESTS, Reason.WRONG_ANSWER, 0.0),
        ("call_based_exit", "import sys\ndef add(a, b):\n    sys.exit(0)\n", CALL_TESTS, Reason.RUNTIME_ERROR, 0.0),
    ],
)
def test_code_local(name, program, tests, reason, pass_rate):
    start = time.monotonic()
    result = compute_score("eurus2_code", _block(program), tests, **FAST)
    elapsed = time.monotonic() - start
    _check_shape(result)
    assert result["reason"] == reason, (name, result)
    assert result["pass_rate"] == pytest.approx(pass_rate)
    assert result["score"] == result["acc"] == float(reason == Reason.CORRECT)
    # one per-test limit (plus the watchdog's grace) at most: every stopping failure ends the run
    assert elapsed < FAST["code_timeout_s"] + code_local._WATCHDOG_GRACE_S + SLACK_S, (name, elapsed)


def test_code_continuous_partial_credit():
    program = _block("a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n")
    result = compute_score("apps", program, STDIN_TESTS, continuous=True, **FAST)
    assert result["score"] == pytest.approx(2 / 3) and result["acc"] == 0.0
    assert result["reason"] == Reason.WRONG_ANSWER


def test_code_total_time_limit():
    tests = json.dumps({"inputs": ["\n"] * 8, "outputs": ["ok\n"] * 8})
    start = time.monotonic()
    result = compute_score(
        "taco",
        _block("import time\ntime.sleep(0.7)\nprint('ok')\n"),
        tests,
        code_timeout_s=1,
        code_total_timeout_s=2.0,
        memory_limit_mb=512,
    )
    assert result["reason"] == Reason.TIMEOUT and 0 < result["pass_rate"] < 1
    assert time.monotonic() - start < 2.0 + SLACK_S


def test_code_no_block_bad_tests_and_infrastructure(monkeypatch):
    assert compute_score("codeforces", "print(1)", STDIN_TESTS)["reason"] == Reason.NO_ANSWER
    for bad in ["not json", json.dumps({"inputs": ["1"]}), json.dumps({"inputs": [], "outputs": []})]:
        result = compute_score("codecontests", _block("print(1)\n"), bad)
        assert (result["reason"], result["score"]) == (Reason.BAD_GROUND_TRUTH, 0.0)
    # lists instead of strings (APPS-style call-based tests) are converted
    listed = {"fn_name": "add", "inputs": [[1, 2], [[1], [2]]], "outputs": [3, [1, 2]]}
    assert compute_score("apps", _block("def add(a, b):\n    return a + b\n"), listed, **FAST)["acc"] == 1.0
    # our own runner failing to start is an internal error, scored 0, never raised
    monkeypatch.setattr(code_local, "_testing_util_path", lambda: "/nonexistent/testing_util.py")
    result = compute_score("eurus2_code", _block("print(1)\n"), STDIN_TESTS, **FAST)
    assert (result["reason"], result["score"]) == (Reason.INTERNAL_ERROR, 0.0)


def test_code_from_threads():
    """verl scores from a thread pool: concurrent runs must not mix up their children or results."""
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a - b)\n",
        "raise ValueError('boom')\n",
        "a, b = map(int, input().split())\nprint(b + a)\n",
    ]
    with ThreadPoolExecutor(len(programs)) as pool:
        reasons = list(pool.map(lambda p: compute_score("taco", _block(p), STDIN_TESTS, **FAST)["reason"], programs))
    assert reasons == [Reason.CORRECT, Reason.WRONG_ANSWER, Reason.RUNTIME_ERROR, Reason.CORRECT]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_code_process_group_killed(tmp_path, monkeypatch):
    """Without the sandbox (the fallback runner), processes the program starts (verl's guard removes fork and
    subprocess, not posix_spawn) still die with the run: the runner kills its process group."""
    monkeypatch.setenv("TROLL_CODE_SANDBOX", "off")
    pids = tmp_path / "pids"
    program = (
        "import os\n"
        "def add(a, b):\n"
        "    pid = os.posix_spawn('/bin/sleep', ['sleep', '60'], {})\n"
        f"    open({str(pids)!r}, 'a').write(f'{{pid}}\\n')\n"
        "    return a + b\n"
    )
    assert compute_score("eurus2_code", _block(program), CALL_TESTS, **FAST)["reason"] == Reason.CORRECT
    spawned = [int(line) for line in pids.read_text().split()]
    assert len(spawned) == 2
    deadline = time.monotonic() + SLACK_S
    while any(_alive(pid) for pid in spawned) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in spawned)


def test_code_many_open_descriptors():
    """A Ray actor can hold more than 1024 descriptors, past which ``select`` fails; the runner's pipes still work."""
    fds = []
    try:
        while not fds or fds[-1] < 1100:
            fds.append(os.open(os.devnull, os.O_RDONLY))
        result = compute_score(
            "eurus2_code", _block("a, b = map(int, input().split())\nprint(a + b)\n"), STDIN_TESTS, **FAST
        )
    finally:
        for fd in fds:
            os.close(fd)
    assert result["reason"] == Reason.CORRECT, result


def test_unknown_data_source_raises():
    match = r"unsupported data_source 'lighteval/MATH'.*eurus2_code.*openai/gsm8k.*aime\*"
    with pytest.raises(ValueError, match=match):
        compute_score("lighteval/MATH", "\\boxed{1}", "1")


# -------------------------------------------------------------------------------------------- Sandbox Fusion
# The fake sandbox's runner: ``run_timeout`` counted from the start of the code (a wall-clock timer whose SIGALRM
# ends the process), not from the interpreter's start: with 1 s including start-up, correct programs timed out on
# a busy 2-core machine. ``memory_limit_MB`` is the address space.
_FAKE_RUNNER = (
    "import resource, signal, sys\n"
    "seconds, megabytes, source = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "resource.setrlimit(resource.RLIMIT_AS, (megabytes << 20, megabytes << 20))\n"
    "del sys.argv[1:]\n"
    "signal.setitimer(signal.ITIMER_REAL, seconds)\n"
    "exec(compile(source, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})\n"
)


class _FakeSandbox(BaseHTTPRequestHandler):
    """Answers ``POST /run_code`` like Sandbox Fusion (its response fields and statuses), running the code with a
    local interpreter (see ``_FAKE_RUNNER``)."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, body))
        if self.path != "/run_code":
            self.send_error(404)
            return
        limits = [str(body["run_timeout"]), str(body["memory_limit_MB"])]
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _FAKE_RUNNER, *limits, body["code"]],
                input=body["stdin"] or "",
                capture_output=True,
                text=True,
                timeout=body["run_timeout"] + SLACK_S,
            )
            timed_out = proc.returncode == -signal.SIGALRM
        except subprocess.TimeoutExpired:
            proc, timed_out = None, True
        if timed_out:
            run, status = {"status": "TimeLimitExceeded", "stdout": "", "stderr": "", "return_code": None}, "Failed"
        else:
            run = {"status": "Finished", "stdout": proc.stdout, "stderr": proc.stderr, "return_code": proc.returncode}
            status = "Success" if proc.returncode == 0 else "Failed"
        payload = json.dumps({"status": status, "message": "", "compile_result": None, "run_result": run}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def sandbox():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSandbox)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("TROLL_SANDBOX_FUSION_URL", raising=False)


@pytest.mark.parametrize(
    "program, tests, reason",
    [
        ("a, b = map(int, input().split())\nprint(a + b)\n", STDIN_TESTS, Reason.CORRECT),
        ("a, b = map(int, input().split())\nprint(a * b)\n", STDIN_TESTS, Reason.WRONG_ANSWER),
        ("while True:\n    pass\n", STDIN_TESTS, Reason.TIMEOUT),
        ("raise ValueError('boom')\n", STDIN_TESTS, Reason.RUNTIME_ERROR),
        ("def f(:\n    pass\n", STDIN_TESTS, Reason.COMPILE_ERROR),
        ("def add(a, b):\n    return a + b\n", CALL_TESTS, Reason.CORRECT),
    ],
)
def test_sandbox_fusion(sandbox, program, tests, reason):
    sandbox.seen.clear()
    url = f"http://127.0.0.1:{sandbox.server_port}"  # no path: /run_code is appended
    result = compute_score("eurus2_code", _block(program), tests, sandbox_fusion_url=url, **FAST)
    _check_shape(result)
    assert result["reason"] == reason, result
    assert len(sandbox.seen) == len(json.loads(tests)["inputs"])
    path, body = sandbox.seen[0]
    assert path == "/run_code"
    assert body["language"] == "python" and body["memory_limit_MB"] == FAST["memory_limit_mb"]
    assert body["run_timeout"] == FAST["code_timeout_s"]


APPS_CALL_TESTS = {"fn_name": "vowels", "inputs": [["hello"], ["sky"]], "outputs": [[2], [0]]}  # as data/ writes them


@pytest.mark.parametrize(
    "name, program, tests, reason",
    [
        ("apps_outputs", "def vowels(s):\n    return sum(c in 'aeiou' for c in s)\n", APPS_CALL_TESTS, Reason.CORRECT),
        ("apps_wrong", "def vowels(s):\n    return len(s)\n", APPS_CALL_TESTS, Reason.WRONG_ANSWER),
        (
            "solution_class",
            "class Solution:\n    def vowels(self, s):\n        return sum(c in 'aeiou' for c in s)\n",
            APPS_CALL_TESTS,
            Reason.CORRECT,
        ),
        (
            "prints_swallowed",
            "def add(a, b):\n    print('debug', a, b)\n    return a + b\n",
            CALL_TESTS,
            Reason.CORRECT,
        ),
        (
            "tuple_result",
            "def add(a, b):\n    return tuple(a + b) if isinstance(a, list) else a + b\n",
            CALL_TESTS,
            Reason.CORRECT,
        ),
        ("prelude_names", "def add(a, b):\n    return reduce(operator.add, [a, b])\n", CALL_TESTS, Reason.CORRECT),
        ("missing_function", "def count(s):\n    return 0\n", APPS_CALL_TESTS, Reason.COMPILE_ERROR),
        ("raises", "def add(a, b):\n    raise KeyError(a)\n", CALL_TESTS, Reason.RUNTIME_ERROR),
        ("unserialisable", "def add(a, b):\n    return {a}\n", CALL_TESTS, Reason.RUNTIME_ERROR),
        ("trailing_space", "a, b = map(int, input().split())\nprint(a + b, end=' ')\n", STDIN_TESTS, Reason.CORRECT),
        ("huge_alloc", "x = bytearray(64 * 1024**3)\n", STDIN_TESTS, Reason.MEMORY_LIMIT),
    ],
)
def test_sandbox_fusion_judges_like_local(sandbox, name, program, tests, reason):
    """The same verdict through Sandbox Fusion as locally (verl's own client-side call wrapper fails apps_outputs)."""
    url = f"http://127.0.0.1:{sandbox.server_port}/run_code"
    remote = compute_score("eurus2_code", _block(program), tests, sandbox_fusion_url=url, **FAST)
    local = compute_score("eurus2_code", _block(program), tests, **FAST)
    assert (remote["reason"], local["reason"]) == (reason, reason), (name, remote, local)


def test_call_harness_prelude_is_verls():
    """The call-based harness defines the code as verl's local harness does: after the same imports."""
    from verl.utils.reward_score.prime_code import testing_util

    with open(testing_util.__file__) as f:
        tree = ast.parse(f.read())
    (sol,) = [
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["sol"]
        and isinstance(node.value, ast.Constant)
    ]
    assert code_reward.PRELUDE == sol


def test_sandbox_fusion_env_var_and_errors(sandbox, monkeypatch):
    program = _block("a, b = map(int, input().split())\nprint(a + b)\n")
    monkeypatch.setenv("TROLL_SANDBOX_FUSION_URL", f"http://127.0.0.1:{sandbox.server_port}/run_code")
    sandbox.seen.clear()
    assert compute_score("eurus2_code", program, STDIN_TESTS, **FAST)["reason"] == Reason.CORRECT
    assert [path for path, _ in sandbox.seen] == ["/run_code"] * 3
    # a sandbox answering with an HTTP error, and one nobody listens on: not judged, scored 0
    bad = f"http://127.0.0.1:{sandbox.server_port}/wrong_path"
    for url in (bad, f"http://127.0.0.1:{_free_port()}/run_code"):
        result = compute_score("eurus2_code", program, STDIN_TESTS, sandbox_fusion_url=url, **FAST)
        assert (result["reason"], result["score"]) == (Reason.SANDBOX_ERROR, 0.0)


def _free_port():
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------- through verl's machinery
class _ByteTokenizer:
    """The one tokenizer method verl's naive reward manager uses: token ids are UTF-8 bytes."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(int(i) for i in ids).decode("utf-8")


def _config(**reward_kwargs):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://troll_verl.recipes.rewards",
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": "naive"},
                "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
            }
        }
    )


def test_loaded_by_verl_custom_reward_fn():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(_config(code_timeout_s=1, memory_limit_mb=512))
    result = fn(data_source="openai/gsm8k", solution_str="#### 1,080", ground_truth="1080", extra_info={"index": 0})
    assert result["score"] == 1.0
    result = fn(
        data_source="eurus2_code",
        solution_str=_block("while True:\n    pass\n"),
        ground_truth=STDIN_TESTS,
        extra_info=None,
    )
    assert result["reason"] == Reason.TIMEOUT


def test_naive_reward_manager_batch_and_validation_metrics():
    """Scores a mixed batch as verl's reward loop does, then aggregates it as the reward loop and validation do."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import process_validation_metrics
    from verl.trainer.ppo.reward import load_reward_manager

    samples = [
        ("openai/gsm8k", "48 + 24 = 72\n#### 72", "72"),
        ("openai/gsm8k", "no idea", "72"),
        ("aime2024", "so \\boxed{\\frac{68}{2}}", "34"),
        ("math_dapo", "Answer: 7", "8"),
        ("eurus2_code", _block("a, b = map(int, input().split())\nprint(a + b)\n"), STDIN_TESTS),
        ("eurus2_code", _block("raise SystemExit(1)\n", tag="py"), STDIN_TESTS),
    ]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        manager = load_reward_manager(_config(**FAST), _ByteTokenizer())
        outputs = []
        for data_source, text, truth in samples:
            ids = list(text.encode())
            width = len(ids) + 3  # right padding, as in a batch
            responses = torch.tensor([ids + [0] * (width - len(ids))])
            attention = torch.tensor([[1] + [1] * len(ids) + [0] * (width - len(ids))])
            data = DataProto.from_dict(
                tensors={"prompts": torch.tensor([[1]]), "responses": responses, "attention_mask": attention},
                non_tensors={
                    "data_source": np.array([data_source], dtype=object),
                    "reward_model": np.array([{"ground_truth": truth}], dtype=object),
                    "extra_info": np.array([{"index": 0}], dtype=object),
                },
            )
            outputs.append(loop.run_until_complete(manager.run_single(data)))
    finally:
        asyncio.set_event_loop(None)
        loop.close()

    assert [o["reward_score"] for o in outputs] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    # RewardLoopManager.compute_rm_score: keys of the first sample, one array per key over all samples
    infos = [o["reward_extra_info"] for o in outputs]
    keys = list(infos[0].keys())
    columns = {key: np.array([info[key] for info in infos]) for key in keys}
    assert set(keys) == set(RESULT_KEYS) and all(col.dtype.kind in "fi" for col in columns.values())
    assert columns["reason"].tolist() == [
        Reason.CORRECT,
        Reason.NO_ANSWER,
        Reason.CORRECT,
        Reason.WRONG_ANSWER,
        Reason.CORRECT,
        Reason.WRONG_ANSWER,
    ]
    # validation metrics per data source (val-core/<source>/acc/mean@N)
    sources = [s[0] for s in samples]
    metrics = process_validation_metrics(sources, [str(i) for i in range(len(samples))], {**columns})
    assert metrics["openai/gsm8k"]["acc"]["mean@1"] == 0.5
    assert metrics["eurus2_code"]["pass_rate"]["mean@1"] == 0.5

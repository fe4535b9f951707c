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
"""Malicious programs against the local code scorer's bubblewrap sandbox (troll_verl.recipes.rewards.sandbox).

Each program attacks and prints the right answer only if the attack got through, or not at all; each must score 0
with a reason, and nothing it did may survive or leak. These tests require bubblewrap (``scripts/_venv.sh``
installs it where it can); ``TROLL_CODE_SANDBOX=require`` makes a missing one fail them instead of falling back.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

import psutil
import pytest

from troll_verl.recipes.rewards import Reason, compute_score, sandbox

STDIN_TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -2\n"], "outputs": ["3\n", "7\n", "8\n"]})
LIMITS = {"code_timeout_s": 2, "code_total_timeout_s": 15, "memory_limit_mb": 512}
ANSWER = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(autouse=True)
def _require_sandbox(monkeypatch):
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "require")


def _score(program: str) -> dict:
    return compute_score("eurus2_code", f"```python\n{program}```\n", STDIN_TESTS, **LIMITS)


def _with_marker(marker: str) -> list:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return [p for p in found if _alive(p)]


def _alive(proc) -> bool:
    try:  # a process may exit between the listing and this check
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _none_left(marker: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _with_marker(marker)


def _spawn(marker: str) -> str:
    """Program text starting a detached Python sleeper whose command line carries ``marker`` (verl's harness removes
    fork and subprocess, not posix_spawn)."""
    return (
        "import os, sys\n"
        f"os.posix_spawn(sys.executable, [sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(120)', "
        f"{marker!r}], dict(os.environ))\n"
    )


def test_sandbox_is_available_here():
    assert sandbox.sandbox_available(), sandbox._probe()[1]


def test_writing_outside_the_work_directory(tmp_path):
    target = tmp_path / "leak.txt"
    home = os.path.expanduser(f"~/troll_leak_{uuid.uuid4().hex}")
    for path in (target, home):
        result = _score(f"open({str(path)!r}, 'w').write('pwned')\n" + ANSWER)
        assert (result["score"], result["reason"]) == (0.0, Reason.RUNTIME_ERROR), result
        assert not os.path.exists(path)


def test_opening_a_socket_to_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        result = _score(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n" + ANSWER
        )
        assert (result["score"], result["reason"]) == (0.0, Reason.RUNTIME_ERROR), result
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected


def test_a_background_process_does_not_outlive_the_scorer():
    marker = f"troll-daemon-{uuid.uuid4().hex}"
    result = _score(_spawn(marker))  # starts a daemon in its own session, answers nothing
    assert (result["score"], result["reason"]) == (0.0, Reason.WRONG_ANSWER), result
    assert _none_left(marker)


def test_a_bounded_fork_bomb():
    marker = f"troll-bomb-{uuid.uuid4().hex}"
    start = time.monotonic()
    result = _score("for _ in range(50):\n" + "".join("    " + line + "\n" for line in _spawn(marker).splitlines()))
    # no answer; starting 50 interpreters on 2 cores may also run past the per-test limit
    assert result["score"] == 0.0 and result["reason"] in (Reason.WRONG_ANSWER, Reason.TIMEOUT), result
    assert _none_left(marker)
    assert time.monotonic() - start < LIMITS["code_total_timeout_s"] + 10


def test_a_50_gb_allocation():
    result = _score("x = bytearray(50 * 1024**3)\n" + ANSWER)
    assert (result["score"], result["reason"]) == (0.0, Reason.MEMORY_LIMIT), result


def test_killing_its_parent():
    """Its parent inside the sandbox is bubblewrap's init, which a process of the namespace cannot signal; the
    scorer (this process) and the runner are untouched and report the (missing) answer."""
    # NOTE: verl's harness sets os.kill to None; pidfd_send_signal gets through. Without the sandbox this program's
    # parent is the scorer itself, which it kills (measured: the scoring process exits with -9).
    program = "import os, signal, time\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)\n"
    result = _score(program)
    assert (result["score"], result["reason"]) == (0.0, Reason.WRONG_ANSWER), result
    assert _score(ANSWER)["reason"] == Reason.CORRECT  # the scorer still works


def test_an_infinite_loop():
    start = time.monotonic()
    result = _score("while True:\n    pass\n")
    assert (result["score"], result["reason"]) == (0.0, Reason.TIMEOUT), result
    assert time.monotonic() - start < LIMITS["code_timeout_s"] + 10


def test_a_correct_program_still_scores_inside_the_sandbox():
    result = _score("import os\nopen('scratch.txt', 'w').write('work dir is writable')\n" + ANSWER)
    assert (result["score"], result["reason"]) == (1.0, Reason.CORRECT), result


def test_fallback_without_bubblewrap_warns_once(monkeypatch, caplog):
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "auto")
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox, "_warned", False)
    sandbox._probe.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
            assert _score(ANSWER)["reason"] == Reason.CORRECT  # the plain runner still scores
            assert _score(ANSWER)["reason"] == Reason.CORRECT
        warnings = [r for r in caplog.records if "WITHOUT a sandbox" in r.getMessage()]
        assert len(warnings) == 1 and "apt-get install bubblewrap" in warnings[0].getMessage()
        monkeypatch.setenv(sandbox.SANDBOX_ENV, "require")
        with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
            sandbox.sandbox_argv(["true"], "/tmp")
    finally:
        sandbox._probe.cache_clear()


def test_paths_kept_under_tmp_are_resolved_existing_and_outermost(tmp_path):
    root = tmp_path / "tmp"
    (root / "clone" / ".venv" / "lib").mkdir(parents=True)
    (root / "other").mkdir()
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(root / "other")
    keep = sandbox.tmp_paths_to_keep(
        [
            str(root / "clone"),
            str(root / "clone" / ".venv" / "lib"),
            str(root / "link"),
            str(root / "missing"),
            str(tmp_path / "outside"),
            str(root),
            "",
        ],
        tmp=str(root),
    )
    assert keep == [str(root / "clone"), str(root / "other")]


def test_code_living_under_tmp_stays_visible_read_only(monkeypatch):
    """A checkout or environment in /tmp (a CI clone) must not vanish behind the sandbox's empty /tmp: a module on an
    import path under /tmp imports inside the sandbox, while the rest of /tmp stays hidden and nothing is writable."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as code_dir, tempfile.TemporaryDirectory(dir="/tmp") as secret_dir:
        with open(os.path.join(code_dir, "visible_mod.py"), "w") as f:
            f.write("VALUE = 7\n")
        with open(os.path.join(secret_dir, "secret.txt"), "w") as f:
            f.write("hidden")
        monkeypatch.setattr(sys, "path", [*sys.path, code_dir])
        sandbox._runner_paths.cache_clear()
        try:
            with tempfile.TemporaryDirectory() as workdir:
                probe = (
                    "import os, visible_mod\n"
                    f"assert not os.path.exists({os.path.join(secret_dir, 'secret.txt')!r})\n"
                    "try:\n"
                    f"    open({os.path.join(code_dir, 'x')!r}, 'w')\n"
                    "except OSError:\n"
                    "    print('ro', visible_mod.VALUE)\n"
                )
                argv = sandbox.sandbox_argv([sys.executable, "-c", probe], workdir)
                env = {**os.environ, "PYTHONPATH": code_dir}
                out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        finally:
            sandbox._runner_paths.cache_clear()
    assert out.returncode == 0 and out.stdout.strip() == "ro 7", out.stderr[-2000:]

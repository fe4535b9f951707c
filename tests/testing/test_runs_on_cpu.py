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
"""troll_verl.testing.runs: a module's launches run ``width`` at a time, in the order submitted, each result (or its
exception) where it is asked; a tag finds a launch's processes; a background command gives its status and output, and
leaves nothing running when it is cut short."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from troll_verl.testing.runs import LAUNCHES_ENV, BackgroundCommand, Launches, RunTag, wait_until


def test_launches_run_width_at_a_time_in_the_order_submitted():
    lock, running, peak, started = threading.Lock(), [0], [0], []

    def job(name):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            started.append(name)
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return name.upper()

    pool = Launches(width=2)
    for name in "abcde":
        pool.submit(name, job, name)
    assert [pool.result(name) for name in "edcba"] == list("EDCBA")
    pool.close()
    assert peak[0] == 2 and started == list("abcde")


def test_a_launch_waits_on_an_earlier_one_without_a_deadlock():
    pool = Launches(width=2)
    pool.submit("first", lambda: (time.sleep(0.2), 1)[1])
    pool.submit("second", lambda: (time.sleep(0.2), 2)[1])
    pool.submit("resumed", lambda: pool.result("first") + 10)
    pool.submit("resumed_again", lambda: pool.result("resumed") + pool.result("second"))
    assert pool.result("resumed_again") == 13
    pool.close()


def test_a_launchs_error_is_raised_where_its_result_is_asked():
    pool = Launches(width=1)
    pool.submit("bad", lambda: 1 / 0)
    pool.submit("good", lambda: "ok")
    assert pool.result("good") == "ok"
    with pytest.raises(ZeroDivisionError):
        pool.result("bad")
    with pytest.raises(ValueError, match="submitted twice"):
        pool.submit("good", lambda: None)
    pool.close()


def test_the_width_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(LAUNCHES_ENV, "1")
    assert Launches().width == 1
    monkeypatch.setenv(LAUNCHES_ENV, "0")
    with pytest.raises(ValueError, match=f"{LAUNCHES_ENV}=0: set it to 1"):
        Launches()


def test_a_tag_finds_its_own_processes_only():
    tag, other = RunTag("TROLL_TEST_TAG_A"), RunTag("TROLL_TEST_TAG_A")
    code = "import time; time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **tag.env})
    try:
        assert wait_until(lambda: tag.processes("time.sleep"), 10)
        assert other.processes() == [] and tag.processes("no such part") == []
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not tag.processes(), 10)


def test_a_background_command_gives_its_status_and_output(tmp_path):
    command = BackgroundCommand(["bash", "-c", "echo started; exit 3"], str(tmp_path / "log"))
    assert command.wait(30) == (3, "started\n")
    assert command.left() == []


def test_a_background_command_cut_short_leaves_nothing(tmp_path):
    # a child in its own session (as Ray's are): only the tag finds it
    script = "setsid sleep 300 & echo started; sleep 300"
    command = BackgroundCommand(["bash", "-c", script], str(tmp_path / "log"))
    assert wait_until(lambda: len(command.left()) == 2, 10), command.left()  # the two sleeps (bash exec-ed the last)
    returncode, output = command.wait(0.5)
    assert returncode is not None and returncode < 0 and output == "started\n"  # stopped by a signal
    assert command.left() == []

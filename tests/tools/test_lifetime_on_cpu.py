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
"""troll_verl.tools.lifetime: tagged process trees and the watchdog that stops them when their launcher dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from troll_verl.tools.lifetime import new_run_tag, stop_tagged, tagged_processes

# A launcher like the quickstart: a watchdog, then a tagged tree whose grandchild escapes into its own session (as
# vLLM's EngineCore escapes its Ray actor), then it waits to be killed.
_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from troll_verl.tools.lifetime import Watchdog, run_env
    tag = sys.argv[1]
    Watchdog(tag).start()
    tree = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", tree], env={**os.environ, **run_env(tag)}, start_new_session=True)
    print("ready", flush=True)
    time.sleep(600)
    """  # noqa: E501 -- the long line is code run verbatim by the launcher; wrapping would change the string
)


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_watchdog_stops_the_tagged_tree_when_the_launcher_dies(sig):
    tag = new_run_tag()
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, tag], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline().strip() == "ready"
        assert _wait_for(lambda: len(tagged_processes(tag)) == 2, 30), "the tagged tree did not start"
        launcher.send_signal(sig)
        launcher.wait(timeout=10)
        assert _wait_for(lambda: not tagged_processes(tag), 30), [p.cmdline() for p in tagged_processes(tag)]
    finally:
        launcher.kill()
        stop_tagged(tag, grace_s=1)


@pytest.mark.slow
def test_stop_tagged_ends_processes_that_ignore_sigterm():
    tag = new_run_tag()
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "TROLL_VERL_RUN_TAG": tag},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "up"
    left = stop_tagged(tag, grace_s=1)
    assert len(left) == 1 and proc.poll() is not None  # reaped by stop_tagged, after SIGKILL
    assert stop_tagged(tag) == [] and tagged_processes(tag) == []


# A child that retitles itself as Ray's agents do: setproctitle zeroes its environment block, tag included.
_RETITLED = "import setproctitle, time; setproctitle.setproctitle('ray::Agent'); print(1, flush=True); time.sleep(600)"
# A tagged parent of one such child: prints the child's pid, then lives argv[2] seconds.
_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(float(sys.argv[2]))
    """
)
# A launcher with a watchdog whose tagged parent ends (after the watchdog has polled) and leaves its child orphaned.
_ORPHANING_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from troll_verl.tools.lifetime import Watchdog, run_env
    tag, parent, retitled = sys.argv[1:4]
    Watchdog(tag).start()
    env = {**os.environ, **run_env(tag)}
    p = subprocess.Popen([sys.executable, "-c", parent, retitled, "6"], env=env, stdout=subprocess.PIPE, text=True)
    print(p.stdout.readline().strip(), flush=True)
    p.wait()
    print("orphaned", flush=True)
    time.sleep(600)
    """
)


def _pids(tag):
    return sorted(p.pid for p in tagged_processes(tag))


@pytest.mark.slow
def test_a_retitled_child_of_a_tagged_process_is_found():
    """Found by a killed test run whose Ray dashboard and runtime-env agents survived the watchdog: their environment
    no longer shows the tag, but their parent, the raylet, carries it."""
    tag = new_run_tag()
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _RETITLED, "600"],
        env={**os.environ, "TROLL_VERL_RUN_TAG": tag},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        child = int(parent.stdout.readline())
        with open(f"/proc/{child}/environ", "rb") as f:
            assert f"TROLL_VERL_RUN_TAG={tag}".encode() not in f.read().split(b"\0")  # the tag alone misses it
        assert _pids(tag) == sorted([parent.pid, child])
        assert len(stop_tagged(tag, grace_s=1)) == 2 and not tagged_processes(tag)
    finally:
        parent.kill()


@pytest.mark.slow
def test_watchdog_stops_a_retitled_orphan():
    """The watchdog remembers descendants while the run lives: a retitled child whose tagged parent died first is
    still stopped when the launcher dies."""
    tag = new_run_tag()
    launcher = subprocess.Popen(
        [sys.executable, "-c", _ORPHANING_LAUNCHER, tag, _PARENT, _RETITLED], stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        child = int(launcher.stdout.readline())
        assert launcher.stdout.readline().strip() == "orphaned"  # the tagged parent is gone, the child lives on
        assert not tagged_processes(tag) and not _gone(child)
        launcher.kill()
        launcher.wait(timeout=10)
        assert _wait_for(lambda: _gone(child), 30), "the orphan survived the watchdog"
    finally:
        launcher.kill()
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True

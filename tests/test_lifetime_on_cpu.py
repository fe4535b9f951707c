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
"""troll_verl.lifetime: tagged process trees and the watchdog that stops them when their launcher dies."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from troll_verl.lifetime import new_run_tag, stop_tagged, tagged_processes

# A launcher like the quickstart: a watchdog, then a tagged tree whose grandchild escapes into its own session (as
# vLLM's EngineCore escapes its Ray actor), then it waits to be killed.
_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from troll_verl.lifetime import Watchdog, run_env
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
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        "time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**__import__("os").environ, "TROLL_VERL_RUN_TAG": tag},
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "up"
    left = stop_tagged(tag, grace_s=1)
    assert len(left) == 1 and proc.poll() is not None  # reaped by stop_tagged, after SIGKILL
    assert stop_tagged(tag) == [] and tagged_processes(tag) == []

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
"""troll_verl.testing.deadline: past the suite's deadline no test starts, and pytest still prints its summary."""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from troll_verl.testing.deadline import DEADLINE_ENV, deadline

ROOT = pathlib.Path(__file__).resolve().parents[2]

# three tests; the second passes the deadline (as the clock would) when asked to, with a module fixture still set up
_SUITE = """
    import os, time
    import pytest

    @pytest.fixture(scope="module")
    def held():
        yield
        print("TORN DOWN", flush=True)

    def test_one():
        pass

    def test_two(held):
        if os.environ.get("PASS_THE_DEADLINE") == "1":
            os.environ["TROLL_TEST_DEADLINE"] = str(time.time() - 1)

    def test_three(held):
        pass
"""


def _pytest(tmp_path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(_SUITE))
    env = {k: v for k, v in os.environ.items() if k != DEADLINE_ENV} | env_vars
    cmd = [sys.executable, "-m", "pytest", "-p", "troll_verl.testing.deadline", "-p", "no:cacheprovider", "-s",
           "--durations=3", *args, "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_past_the_deadline_no_test_starts_and_the_summary_prints(tmp_path):
    out = _pytest(tmp_path, **{DEADLINE_ENV: str(time.time() + 3600), "PASS_THE_DEADLINE": "1"})
    assert out.returncode == 2, out.stdout[-2000:]  # interrupted
    assert "2 passed" in out.stdout and f"{DEADLINE_ENV} passed" in out.stdout and "1 test(s) not run" in out.stdout
    assert "slowest 3 durations" in out.stdout and "TORN DOWN" in out.stdout


@pytest.mark.slow
def test_past_the_deadline_on_two_workers_no_test_starts_and_the_summary_prints(tmp_path):
    """scripts/test.sh runs pytest -n 2: a worker past the deadline stops as above and the summary still prints (the
    module runs in one worker, troll_verl.testing.schedule; a worker's own output is not shown)."""
    env = {DEADLINE_ENV: str(time.time() + 3600), "PASS_THE_DEADLINE": "1"}
    out = _pytest(tmp_path, "-n", "2", "-p", "troll_verl.testing.schedule", **env)
    assert out.returncode == 2, out.stdout[-2000:]  # interrupted
    assert "2 passed" in out.stdout and f"{DEADLINE_ENV} passed" in out.stdout, out.stdout[-2000:]
    assert "slowest 3 durations" in out.stdout


def test_before_the_deadline_or_without_one_every_test_runs(tmp_path):
    for env_vars in ({DEADLINE_ENV: str(time.time() + 3600)}, {}):
        out = _pytest(tmp_path, **env_vars)
        assert out.returncode == 0 and "3 passed" in out.stdout, out.stdout[-2000:]


def test_a_deadline_that_is_not_a_number_names_the_variable(monkeypatch):
    monkeypatch.setenv(DEADLINE_ENV, "soon")
    with pytest.raises(ValueError, match=f"{DEADLINE_ENV}='soon': set it to seconds since the epoch"):
        deadline()
    monkeypatch.setenv(DEADLINE_ENV, " ")
    assert deadline() is None


def test_the_suite_sets_its_deadline_before_the_install_and_loads_the_plugin(request):
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert f'export {DEADLINE_ENV}="${{{DEADLINE_ENV}:-$(($(date +%s) + 85 * 60))}}"' in script
    assert script.index(f"export {DEADLINE_ENV}") < script.index("ensure_venv")
    assert request.config.pluginmanager.has_plugin("troll_verl.testing.deadline")

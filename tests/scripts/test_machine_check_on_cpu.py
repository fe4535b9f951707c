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
"""What the suite needs of the machine is named first: scripts/machine_check.py, and _venv.sh's Python check."""

import os
import subprocess

import pytest

from troll_verl.testing import REPO, load_script

machine = load_script("machine_check")


def test_this_machine_is_fit():
    assert machine.problems() == []


def test_each_shortfall_is_named_with_its_fix():
    found = machine.problems(free=lambda path: 0.5, sandbox=lambda: "bubblewrap (bwrap) is not installed")
    assert len(found) == 4
    assert found[0].startswith("the code sandbox cannot run: bubblewrap (bwrap) is not installed. Fix: apt-get")
    assert "/dev/shm has 0.5 GiB free, the suite needs 2. Fix: give the container a larger /dev/shm" in found[1]
    assert "TMPDIR" in found[3]
    # just enough passes
    assert machine.problems(free=lambda path: 5.0, sandbox=lambda: None) == []


def _check_python(python: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'source scripts/_venv.sh; check_python "{python}"; echo ok'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("version,fits", [("3.9", False), ("3.10", True), ("3.12", True), ("3.13", False)])
def test_venv_refuses_a_python_it_cannot_use_before_creating_anything(tmp_path, version, fits):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho {version}\n")
    fake.chmod(0o755)
    proc = _check_python(str(fake))
    assert (proc.returncode == 0 and proc.stdout.strip() == "ok") == fits, proc.stderr
    if not fits:
        assert f"is Python {version}; .venv needs 3.10, 3.11 or 3.12" in proc.stderr and "PYTHON=" in proc.stderr
    assert not os.path.exists(tmp_path / ".venv")


def test_the_suite_checks_the_machine_before_pytest():
    source = open(os.path.join(REPO, "scripts", "test.sh")).read()
    assert source.index("ensure_venv") < source.index("scripts/machine_check.py") < source.index("-m pytest")
    venv = open(os.path.join(REPO, "scripts", "_venv.sh")).read()
    assert venv.index('check_python "${PYTHON:-python3}"') < venv.index('-m venv "$VENV_DIR"')

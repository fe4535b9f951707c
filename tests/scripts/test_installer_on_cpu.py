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
"""scripts/installer.py: uv where the environment has it, with pip's configuration as uv's variables; else pip."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from troll_verl.testing import load_script

installer = load_script("installer")

LISTING = """\
:env:.constraint='/repo/scripts/constraints-cpu.txt'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/elsewhere'
global.index-url='https://mirror.example/simple'
install.index-url='https://install.example/simple'
global.cert='/etc/ssl/certs/ca-certificates.crt'
"""


def test_pip_settings_take_pips_precedence_and_keep_several_values():
    settings = installer.pip_settings(LISTING)
    # a PIP_* variable over the files; the install section over global; the listing's order does not decide
    assert settings["constraint"] == ["/repo/scripts/constraints-cpu.txt"]
    assert settings["find-links"] == ["/opt/wheels"]
    assert settings["index-url"] == ["https://install.example/simple"]
    assert settings["extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]


def test_uv_gets_pips_settings_under_its_own_names():
    env = installer.uv_environment(installer.pip_settings(LISTING + ":env:.no-index='1'\n"))
    assert env == {
        "UV_INDEX_STRATEGY": "unsafe-best-match",
        "UV_INDEX_URL": "https://install.example/simple",
        "UV_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "UV_FIND_LINKS": "/opt/wheels",
        "UV_CONSTRAINT": "/repo/scripts/constraints-cpu.txt",
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "UV_NO_INDEX": "1",
    }
    assert "UV_NO_INDEX" not in installer.uv_environment({"no-index": ["0"]})


@pytest.fixture
def env_dir(tmp_path, monkeypatch):
    """An environment's bin folder: a ``python`` that is this interpreter, and a ``uv`` that records its arguments
    and the variables it was given. pip sees one find-links folder and no index."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    record = tmp_path / "uv_call.json"
    (bin_dir / "uv").write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        json.dump({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith("UV_")}}}},
                  open({str(record)!r}, "w"))
        """)
    )
    for name in ("python", "uv"):
        (bin_dir / name).chmod(0o755)
    for key in list(os.environ):
        if key.startswith(("PIP_", "UV_")) or key == installer.INSTALLER_ENV:
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    return bin_dir, record


def test_an_environment_with_uv_installs_through_it_with_pips_settings(env_dir, tmp_path):
    bin_dir, record = env_dir
    python = str(bin_dir / "python")
    rc, _ = installer.install(python, ["-e", ".[test]"])
    call = json.loads(record.read_text())
    assert rc == 0 and call["argv"] == [
        "pip",
        "install",
        "--python",
        python,
        "--compile-bytecode",
        "-q",
        "-e",
        ".[test]",
    ]
    assert call["env"]["UV_FIND_LINKS"] == str(tmp_path / "wheels") and call["env"]["UV_NO_INDEX"] == "1"
    assert call["env"]["UV_INDEX_STRATEGY"] == "unsafe-best-match"


def test_pip_where_uv_is_missing_or_pip_is_asked_for(env_dir, monkeypatch):
    bin_dir, _ = env_dir
    python = str(bin_dir / "python")
    monkeypatch.setenv(installer.INSTALLER_ENV, "pip")
    assert installer.command(python, ["x"]) == (
        [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "x"],
        {},
    )
    monkeypatch.delenv(installer.INSTALLER_ENV)
    (bin_dir / "uv").unlink()
    assert installer.command(python, ["x"])[0][1:3] == ["-m", "pip"]


def test_pips_machine_noise_is_left_out_and_the_exit_status_kept(env_dir):
    bin_dir, _ = env_dir
    (bin_dir / "uv").write_text(
        "#!/bin/sh\necho \"WARNING: Location 'file:///opt/pypi/simple/x/' is ignored: it is neither a file nor a "
        "directory.\"\necho 'error: no such package' >&2\nexit 2\n"
    )
    rc, out = installer.install(str(bin_dir / "python"), ["x"])
    assert rc == 2 and out == "error: no such package"

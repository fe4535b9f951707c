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
"""``pip install`` for the CPU demo environment, through uv where the environment has it.

    .venv/bin/python scripts/installer.py [pip install arguments]     # e.g. -e ".[test]"

``scripts/_venv.sh`` puts uv into ``.venv`` first (``pip install uv``, within the pins) and installs everything else
through this script, as does ``scripts/install_vllm_cpu.py``: uv resolves and installs the same pins faster than pip
(a fresh ``.venv`` in 55 s against 165 s: ``docs/benchmarks.md``, "Test suite time"). Where ``.venv/bin/uv`` is
missing (uv could not be installed) or ``TROLL_VERL_INSTALLER=pip``, pip runs instead, with the same arguments.

uv does not read pip's configuration, so it gets pip's: ``pip config list`` (the configuration files and the
``PIP_*`` variables, as pip itself would use them) becomes uv's variables for the same settings: index, extra
indexes or none, find-links folders, constraints, certificate, timeout, and pip's way of choosing among indexes
(the best version on any of them: ``UV_INDEX_STRATEGY=unsafe-best-match``). Standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

INSTALLER_ENV = "TROLL_VERL_INSTALLER"  # "pip" forces pip; anything else (or unset) takes uv where it is
# pip's configuration key -> (uv's variable, separator uv reads between several values)
PIP_TO_UV = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
    "default-timeout": ("UV_HTTP_TIMEOUT", " "),
}
# what pip prints about this machine's file:// index mirrors for every package they lack
NOISE = ("is ignored: it is neither",)


def uv_next_to(python: str) -> str | None:
    """The ``uv`` of the environment ``python`` belongs to, or None (none there, or ``TROLL_VERL_INSTALLER=pip``)."""
    if os.environ.get(INSTALLER_ENV) == "pip":
        return None
    uv = Path(python).parent / "uv"
    return str(uv) if os.access(uv, os.X_OK) else None


def pip_settings(config_list: str) -> dict[str, list[str]]:
    """``pip config list`` output -> {key: values}, keys without their section: ``global.find-links='/opt/wheels'``
    -> ``{"find-links": ["/opt/wheels"]}``. A value may hold several, whitespace-separated (pip's own format). Where
    a key is set in several sections, pip's precedence picks it: a ``PIP_*`` variable (``:env:.``) over the
    ``install`` section over ``global`` (the listing is sorted by name, not by precedence)."""
    rank = {":env:": 2, "install": 1, "global": 0}
    found: dict[str, tuple[int, list[str]]] = {}
    for line in config_list.splitlines():
        match = re.match(r"^(:env:|[a-z]+)\.([a-z-]+)='(.*)'$", line.strip())
        if match and match.group(1) in rank:
            level = rank[match.group(1)]
            if match.group(2) not in found or found[match.group(2)][0] <= level:
                found[match.group(2)] = (level, match.group(3).split())
    return {key: values for key, (_, values) in found.items()}


def uv_environment(settings: dict[str, list[str]]) -> dict[str, str]:
    """uv's variables for pip's ``settings`` (:func:`pip_settings`), plus pip's index choice."""
    env = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    for key, (var, sep) in PIP_TO_UV.items():
        if settings.get(key):
            env[var] = sep.join(settings[key])
    if settings.get("no-index", ["0"])[0].lower() in ("1", "true", "yes", "on"):
        env["UV_NO_INDEX"] = "1"
    return env


def command(python: str, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The install command for ``python``'s environment and the variables to add to the caller's environment."""
    uv = uv_next_to(python)
    if uv is None:
        return [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args], {}
    listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    # --compile-bytecode: as pip does, so that no process compiles the sources at import (where the environment sets
    # PYTHONDONTWRITEBYTECODE, as this project's CI machines do, every process would, at every import)
    cmd = [uv, "pip", "install", "--python", python, "--compile-bytecode", "-q", *args]
    return cmd, uv_environment(pip_settings(listing.stdout))


def install(python: str, args: Sequence[str]) -> tuple[int, str]:
    """Run the install; returns its exit status and its output without the lines naming :data:`NOISE`."""
    cmd, extra = command(python, args)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **extra})
    out = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if not any(n in line for n in NOISE))
    return proc.returncode, out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rc, out = install(sys.executable, args)
    if out.strip():
        print(out, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())

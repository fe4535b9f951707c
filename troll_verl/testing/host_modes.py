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
"""Both of the core's paths for every test of a folder whose ``conftest.py`` imports :func:`host_mode` and
:func:`pytest_generate_tests` from here (``tests/core``, ``tests/ablations``).

The paths (``troll_verl.core.host``): ``host-reads``, the CPU's (trimmed support widths, the solver's early exit),
and ``sync-free``, the accelerator's (``TROLL_SYNC_FREE=1``: fixed widths, every row through the solver, no
read-back but the metrics). The second is how a GPU runs the core; here it catches, on the CPU, a test or a code
path that only holds where values are read back.

Not doubled: the kernels (they read nothing back), tests marked ``slow`` (their processes would not see the
variable), tests marked ``own_host_mode``, which set the variable themselves, and every test where the core runs on
an accelerator (``TROLL_TEST_DEVICE=cuda``: there both would be the sync-free path).
"""

from __future__ import annotations

import os

import pytest

from troll_verl.core.host import SYNC_FREE_ENV

__all__ = ["HOST_MODES", "host_mode", "pytest_generate_tests"]

HOST_MODES = ("host-reads", "sync-free")


def pytest_generate_tests(metafunc):
    """Parametrize the tests of the folder over :data:`HOST_MODES`, but those the module docstring names."""
    if "host_mode" not in metafunc.fixturenames or "kernels" in metafunc.definition.path.parts:
        return
    if os.environ.get("TROLL_TEST_DEVICE", "cpu") != "cpu":
        return
    if metafunc.definition.get_closest_marker("slow") or metafunc.definition.get_closest_marker("own_host_mode"):
        return
    metafunc.parametrize("host_mode", HOST_MODES, indirect=True)


@pytest.fixture(autouse=True)
def host_mode(request, monkeypatch):
    """The core path this test runs on: ``host-reads`` unless parametrized (see the module's docstring)."""
    mode = getattr(request, "param", "host-reads")
    if mode == "sync-free":
        monkeypatch.setenv(SYNC_FREE_ENV, "1")
    else:
        monkeypatch.delenv(SYNC_FREE_ENV, raising=False)
    return mode

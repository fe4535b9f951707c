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
"""``bash upstream/check.sh`` (5-7 minutes) starts in the background when collection ends, if its test is selected:
it reads the repository and writes only under ``upstream/.work``, so it runs beside the rest of the suite, and its test
takes the result at the end. ``TROLL_TEST_UPSTREAM_EARLY=0`` starts it in its test instead, as does a pytest-xdist
worker (``pytest -n 2``: every worker collects the whole suite, and this folder runs in one of them while the other
runs the rest, :mod:`troll_verl.testing.schedule`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from troll_verl.testing.runs import BackgroundCommand
from troll_verl.testing.schedule import in_worker

ROOT = Path(__file__).resolve().parents[2]
CHECK_TEST = "test_upstream_check_passes"
EARLY_ENV = "TROLL_TEST_UPSTREAM_EARLY"
_CHECK = pytest.StashKey[BackgroundCommand]()


def start_check() -> BackgroundCommand:
    work = ROOT / "upstream" / ".work"  # the check's own work folder (git ignores it)
    work.mkdir(parents=True, exist_ok=True)
    return BackgroundCommand(["bash", str(ROOT / "upstream/check.sh")], str(work / "pytest-check.log"), cwd=str(ROOT))


def pytest_collection_finish(session):
    if session.config.option.collectonly or os.environ.get(EARLY_ENV, "1") == "0" or in_worker():
        return
    if any(item.name == CHECK_TEST for item in session.items):
        session.stash[_CHECK] = start_check()


def pytest_sessionfinish(session):
    check = session.stash.get(_CHECK, None)
    if check is not None:
        check.stop()


@pytest.fixture
def upstream_check(request) -> BackgroundCommand:
    """The check started when collection ended, or now."""
    check = request.session.stash.get(_CHECK, None) or start_check()
    yield check
    check.stop()

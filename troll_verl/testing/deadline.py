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
"""A pytest plugin that stops the suite at a deadline, between two tests, so that pytest's summary and durations
print before an outer limit (CI's) kills it and loses them.

``scripts/test.sh`` sets ``TROLL_TEST_DEADLINE`` (seconds since the epoch) to its own start plus 85 minutes, five
under CI's limit, before the install step; past it, no further test starts, the run ends as interrupted (pytest's exit
status 2) and says how many tests did not run. Unset (pytest run directly), there is no deadline. A hung test is
pytest-timeout's to end (``timeout`` in pyproject.toml); this plugin only keeps the next one from starting.
"""

from __future__ import annotations

import os
import time

import pytest

DEADLINE_ENV = "TROLL_TEST_DEADLINE"


def deadline() -> float | None:
    """The deadline (seconds since the epoch) from :data:`DEADLINE_ENV`, or None when unset.

    Raises:
        ValueError: for a value that is not a number, naming the variable.
    """
    value = os.environ.get(DEADLINE_ENV, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{DEADLINE_ENV}={value!r}: set it to seconds since the epoch, or unset it") from None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Past the deadline, the test does not run and the session stops (pytest checks ``shouldstop`` after each
    test's protocol; the fixtures still set up are torn down as the session finishes)."""
    end = deadline()
    if end is None or time.time() <= end:
        return None
    session = item.session
    remaining = len(session.items) - session.items.index(item)
    session.shouldstop = (
        f"{DEADLINE_ENV} passed {time.time() - end:.0f} s ago: {remaining} test(s) not run, stopped so that the "
        "summary prints before the outer time limit"
    )
    return True

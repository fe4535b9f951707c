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
"""troll_verl/testing/dist.py: ``run_distributed`` on two spawned gloo ranks."""

import os
import time

import pytest

from troll_verl.testing.dist import FileFunction, run_distributed

pytestmark = pytest.mark.slow  # spawns processes


def _rank_and_world(rank, world, tag):
    return (rank, world, tag)


def _dies_on_rank_1(rank, world):
    if rank == 1:
        os._exit(3)  # no traceback, no report: a crash
    time.sleep(120)  # rank 0 waits, as one would at a collective its peer never joins


def test_every_rank_reports_in_rank_order():
    assert run_distributed(FileFunction(__file__, "_rank_and_world"), 2, "x") == [(0, 2, "x"), (1, 2, "x")]


def test_a_rank_that_dies_without_reporting_fails_the_run_at_once():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 exited with code 3 without reporting"):
        run_distributed(FileFunction(__file__, "_dies_on_rank_1"), 2, timeout=100)
    assert time.monotonic() - start < 60  # not the timeout

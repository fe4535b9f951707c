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
"""Synthetic per-step metric rows for the study harness's tests, as verl's file logger writes them."""

import pytest

from benchmarks.study.raw import LENGTH_KEY
from troll_verl.tools.quickstart import REWARD_KEY


def _metric_rows(rewards, staleness=None, kl=None, projected=None, clipped=None, ppo_kl=None):
    rows = []
    for i, reward in enumerate(rewards):
        row = {"step": i + 1, REWARD_KEY: reward, "actor/entropy": 1.0}
        if staleness is not None:
            row["training/off_policy/trajectory_staleness/mean"] = staleness[i]
        if kl is not None:
            row["rollout_corr/kl"] = kl[i]
        if projected is not None:
            row["actor/troll/projected_frac"] = projected
        if clipped is not None:
            row["actor/pg_clipfrac"] = clipped
        if ppo_kl is not None:
            row["actor/ppo_kl"] = ppo_kl[i]
        rows.append(row)
    return rows


def _stress_rows(rewards, length=10.0, projected=None, clipped=None, val=0.8):
    rows = _metric_rows(rewards, projected=projected, clipped=clipped)
    for row in rows:
        row[LENGTH_KEY] = length
    rows[-1]["val-core/troll_smollm2/addition/acc/mean@1"] = val
    return rows


@pytest.fixture
def metric_rows():
    """Rows of a run with these train rewards (and, per step or constant, staleness, rollout KL, the share
    projected or clipped, the update KL)."""
    return _metric_rows


@pytest.fixture
def stress_rows():
    """:func:`metric_rows` plus an answer length on every step and a held-out accuracy on the last."""
    return _stress_rows

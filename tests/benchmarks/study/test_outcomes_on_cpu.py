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
"""benchmarks.study.outcomes: one run's outcomes from its metric rows (staleness, KL, collapse rules)."""

import pytest

from benchmarks.study import outcomes


def test_run_stats_reports_staleness_and_kl_to_the_rollout(metric_rows):
    stats = outcomes.run_stats(
        metric_rows([0.1, 0.2, 0.3, 0.4], staleness=[0, 1, 1, 2], kl=[1e-3, 2e-3, 3e-3, 2e-3]), 0.5
    )
    assert stats["staleness"] == pytest.approx(1.0) and stats["kl_rollout"] == pytest.approx(2e-3)
    synchronous = outcomes.run_stats(metric_rows([0.1, 0.2, 0.3]), 0.5)
    assert synchronous["staleness"] is None and synchronous["kl_rollout"] is None and synchronous["kl_update"] is None


def test_run_stats_reports_how_far_the_update_moved_the_policy(metric_rows):
    stats = outcomes.run_stats(metric_rows([0.1, 0.2, 0.3, 0.4], ppo_kl=[0.0, 1e-3, 3e-3, 4e-3]), 0.5)
    assert stats["kl_update"] == pytest.approx(2e-3)


def test_collapse_and_learning_criteria(stress_rows):
    learned = outcomes.run_stats(stress_rows([0.1, 0.3, 0.6, 0.7, 0.8, 0.9]), 0.5)
    assert learned["learned"] and not learned["collapsed"] and learned["length_final"] == 10.0
    # final reward (last 2 of 6 steps) below the step-1 reward
    fell = outcomes.run_stats(stress_rows([0.3, 0.4, 0.2, 0.1, 0.1, 0.2]), 0.5)
    assert fell["collapsed"] and not fell["learned"]
    # answers shorter than 4 tokens, even with a reward above step 1's
    short = outcomes.run_stats(stress_rows([0.1, 0.2, 0.3, 0.3, 0.3, 0.3], length=3.5), 0.5)
    assert short["collapsed"] and short["length_final"] == 3.5


def test_the_half_peak_collapse_rule(stress_rows):
    peaked = outcomes.run_stats(stress_rows([0.1, 0.5, 0.8, 0.8, 0.8, 0.8, 0.8, 0.2, 0.1, 0.1, 0.1, 0.1]), 0.5)
    assert peaked["collapsed_peak"] and not peaked["collapsed"]  # final reward above step 1's: the map misses it
    rewards = [0.1, 0.5, 0.8, 0.8, 0.8, 0.8, 0.8, 0.6, 0.5, 0.5, 0.5, 0.5]
    steady = outcomes.run_stats(stress_rows(rewards), 0.5)
    assert not steady["collapsed_peak"] and steady["reward_mean"] == pytest.approx(sum(rewards) / 12)

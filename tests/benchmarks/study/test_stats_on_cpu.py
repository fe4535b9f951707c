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
"""benchmarks.study.stats: the paired statistics on small hand-computed cases."""

import pytest

from benchmarks.study import stats


def test_paired_intervals():
    mean, lo, hi = stats.t_interval([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.303
    assert mean == 2.0 and hi - mean == pytest.approx(4.303 / 3**0.5) and lo == pytest.approx(2 * mean - hi)
    b_lo, b_hi = stats.bootstrap_interval([1.0, 2.0, 3.0])
    assert 1.0 <= b_lo < 2.0 < b_hi <= 3.0
    assert stats.bootstrap_interval([0.1, 0.2, 0.4]) == stats.bootstrap_interval([0.1, 0.2, 0.4])  # fixed generator
    with pytest.raises(ValueError, match="at least 2"):
        stats.t_interval([1.0])


def test_study_statistics():
    # exact sign flips: 3 positive differences -> only the observed and the all-negative assignment are as extreme
    assert stats.sign_flip_p([0.1, 0.2, 0.3]) == pytest.approx(2 / 8)
    assert stats.sign_flip_p([0.1, -0.1]) == 1.0
    # the t test's power at the planning SD: about 80 % for +0.1 with 15 pairs, far less with 5
    assert 0.75 < stats.t_power(15, 0.13, 0.1) < 0.85 and stats.t_power(5, 0.13, 0.1) < 0.35
    # Fisher exact: 5/5 against 0/5 collapses, two-sided p = 2 / C(10, 5)
    assert stats.fisher_exact_p(5, 5, 0, 5) == pytest.approx(2 / 252)
    assert stats.fisher_exact_p(1, 5, 1, 5) == pytest.approx(1.0)
    # the entropy difference at equal final reward: y = 0.2 + 0.5 x exactly -> intercept 0.2, zero width
    adj, lo, hi = stats.adjusted_difference([0.2, 0.25, 0.3, 0.4], [0.0, 0.1, 0.2, 0.4])
    assert adj == pytest.approx(0.2) and hi - lo == pytest.approx(0.0, abs=1e-9)

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
"""benchmarks.study.after_mastery: the probes' signature arithmetic and P2's rule, on synthetic rows; the committed
P1 runs' table."""

import pytest

from benchmarks.study import after_mastery as am

A = "actor/troll/"


def _rows(zero_frac, zero_gn, grad_norm, pg=1.0, reg=0.5):
    """Steps 1-30 with the diagnostics' metrics; ``zero_gn`` None leaves the zero-advantage norm absent."""
    rows = []
    for step in range(1, 31):
        row = {"step": step, "actor/grad_norm": grad_norm, f"{A}zero_adv_frac": zero_frac,
               f"{A}grad_norm_pg": pg, f"{A}grad_norm_regression": reg}  # fmt: skip
        if zero_gn is not None:
            row[f"{A}zero_adv_grad_norm"] = zero_gn
        rows.append(row)
    return rows


def test_the_signature_splits_each_steps_mean_gradient_norm():
    """Half of each step's 8 optimizer steps without advantage, at norm 2, the step's mean 3: the others averaged 4."""
    sig = am.mastered_signature(_rows(0.5, 2.0, 3.0))
    assert sig["zero_share"] == pytest.approx(0.5)
    assert sig["zero_grad_norm"] == pytest.approx(2.0) and sig["other_grad_norm"] == pytest.approx(4.0)
    assert sig["pg_grad_norm"] == 1.0 and sig["regression_grad_norm"] == 0.5
    none = am.mastered_signature(_rows(0.0, None, 3.0))
    assert none["zero_share"] == 0.0 and none["zero_grad_norm"] == 0.0 and none["other_grad_norm"] == pytest.approx(3.0)
    assert am.mastered_signature([{"step": s, "actor/grad_norm": 1.0} for s in range(1, 31)]) is None  # no diagnostics


def _last10(control, adv, upper, a0):
    return {(v, s): x for s in am.SEEDS for v, x in
            (("probe_diag", control), ("cand_adv", adv), ("cand_upper", upper), ("cand_a0", a0))}  # fmt: skip


def test_the_rule_picks_the_advantage_gated_regression_where_h1_holds():
    h1 = {s: am.mastered_signature(_rows(0.5, 2.0, 3.0)) for s in am.SEEDS}  # share 0.5, 2.0 >= 0.5 * 4.0
    assert am.choose_candidate(h1, _last10(0.6, 0.55, 0.9, 0.9))[0] == "cand_adv"  # not more than 0.1 below
    # harmed on both seeds: then the best other candidate if 0.1 ahead of the control, else none
    assert am.choose_candidate(h1, _last10(0.6, 0.45, 0.75, 0.7))[0] == "cand_upper"
    assert am.choose_candidate(h1, _last10(0.6, 0.45, 0.65, 0.6))[0] is None


def test_the_rule_without_h1_needs_a_candidate_ahead_by_0_1():
    weak = {s: am.mastered_signature(_rows(0.5, 1.0, 3.0)) for s in am.SEEDS}  # 1.0 < 0.5 * 5.0: not H1
    rare = {s: am.mastered_signature(_rows(0.125, 4.0, 3.0)) for s in am.SEEDS}  # a share of 1/8 < 1/4: not H1
    for signatures in (weak, rare):
        assert am.choose_candidate(signatures, _last10(0.6, 0.75, 0.65, 0.6))[0] == "cand_adv"
        candidate, why = am.choose_candidate(signatures, _last10(0.6, 0.65, 0.65, 0.69))
        assert candidate is None and "no confirmatory study" in why


def test_the_committed_p1_runs_give_their_table():
    from troll_verl.testing import REPO

    out = am.report(f"{REPO}/benchmarks/results/after_mastery")
    rows = [line for line in out.splitlines() if line.startswith("| late8/") or line.startswith("| probe_")]
    assert len([r for r in rows if " | 300 | " in r or " | 301 | " in r]) >= 10
    assert "| late8/troll | 300 | 5.048 | 0.0760 | 0.550 |" in out  # step 1 of the committed run

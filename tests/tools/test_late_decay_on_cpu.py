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
"""troll_verl.tools.late_decay: the late-decay study's plan as code (docs/benchmarks.md, "Late-decay study")."""

import pytest

from troll_verl.tools import late_decay as ld

VAL = "val-core/troll_smollm2/addition/acc/mean@1"


def _run(rewards, val=None, kl=0.01):
    rows = [{"step": s, ld.REWARD_KEY: r, ld.KL_KEY: kl * s, ld.ENTROPY_KEY: 0.5} for s, r in enumerate(rewards, 1)]
    rows += [{"step": s, VAL: v} for s, v in (val or {}).items()]
    return rows


def test_a_run_that_masters_and_then_decays():
    rewards = [0.2, 0.4, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9] + [0.6] * 10 + [0.3] * 10
    out = ld.run_outcomes(_run(rewards, {0: 0.5, 10: 0.9, 20: 0.7, 30: 0.4}), VAL)
    assert out["last10"] == pytest.approx(0.3) and out["peak"] == pytest.approx(0.9)
    assert out["late_decay"] and not out["below_0_2"]
    assert out["held_out"] == {10: 0.9, 20: 0.7, 30: 0.4}
    assert out["steps_to_0_8"] == 7  # trailing 5-step means: 0.72 at step 6, 0.82 at step 7
    assert out["kl_mean"] == pytest.approx(0.01 * 15.5) and out["kl_max"] == pytest.approx(0.30)
    held = ld.run_outcomes(_run([0.9] * 30), VAL)
    assert not held["late_decay"] and held["steps_to_0_8"] == 5 and held["held_out"][10] is None
    never = ld.run_outcomes(_run([0.1] * 30), VAL)
    assert never["below_0_2"] and never["steps_to_0_8"] == 31
    with pytest.raises(ValueError, match=r"lacks the train reward of steps \[30\]"):
        ld.run_outcomes(_run([0.5] * 29), VAL)


def test_looks_happen_only_where_the_plan_put_them():
    for n in (2, 11, 13, 23, 25):
        with pytest.raises(ValueError, match="no unplanned look"):
            ld.look([0.1] * (n - 1) + [0.2])
    strong = ld.look([0.3, 0.2, 0.25, 0.35, 0.3, 0.28, 0.22, 0.31, 0.27, 0.33, 0.26, 0.29])
    assert strong["n"] == 12 and strong["bound"] == 3.474 and strong["crossed"] and strong["lo"] > 0
    assert strong["sign_flip_p"] == pytest.approx(2 / 2**12)
    weak = ld.look([0.3, -0.2, 0.1, -0.1, 0.05, 0.0, 0.2, -0.25, 0.1, -0.05, 0.15, -0.1] * 2)
    assert weak["n"] == 24 and weak["bound"] == 2.089 and not weak["crossed"]


def test_the_design_has_the_plans_power_and_size():
    """The plan's numbers (40,000 draws): 94 % for +0.15 and 65 % for +0.10 at SD 0.2, type I error 0.05; here with
    fewer draws, within their Monte Carlo error."""
    assert ld.sequential_power(0.15, 0.2, draws=2000) == pytest.approx(0.94, abs=0.02)
    assert ld.sequential_power(0.10, 0.2, draws=2000) == pytest.approx(0.65, abs=0.035)
    assert ld.sequential_power(0.0, 0.2, draws=2000) == pytest.approx(0.05, abs=0.015)


def test_the_reading_rules():
    ahead = ld.look([0.3, 0.2, 0.25, 0.35, 0.3, 0.28, 0.22, 0.31, 0.27, 0.33, 0.26, 0.29])
    assert ld.reading(ahead, final=True).startswith("clip decayed late where TROLL held: +0.280")
    behind = ld.look([-x for x in [0.3, 0.2, 0.25, 0.35, 0.3, 0.28, 0.22, 0.31, 0.27, 0.33, 0.26, 0.29]])
    assert ld.reading(behind, final=True).startswith("TROLL decayed late where clip held")
    level = ld.look([0.01, -0.02, 0.015, -0.01, 0.0, 0.02, -0.015, 0.01, -0.005, 0.0, 0.01, -0.01] * 2)
    assert ld.reading(level, final=True).startswith("no late-decay difference larger than 0.1")
    assert "run on" in ld.reading(level, final=False)
    counts = ld.late_decay_counts(
        [{"late_decay": False}] * 12, [{"late_decay": True}] * 6 + [{"late_decay": False}] * 6
    )
    assert counts["troll"] == 0 and counts["clip"] == 6 and counts["fisher_p"] == pytest.approx(0.0137, abs=1e-4)


def test_the_exact_sign_flip_p_equals_the_enumeration_of_every_assignment():
    """paired_stats.sign_flip_p counts by meeting in the middle; here against all 2**n assignments."""
    import random

    from troll_verl.tools.paired_stats import sign_flip_p

    def every_assignment(d):
        observed = abs(sum(d)) - 1e-12
        hits = sum(abs(sum(-x if m >> i & 1 else x for i, x in enumerate(d))) >= observed for m in range(2 ** len(d)))
        return hits / 2 ** len(d)

    rng = random.Random(1)
    cases = [[0.1, -0.1], [0.0] * 4, [0.1] * 7, [0.2, -0.1, -0.1]]
    cases += [[round(rng.gauss(0.05, 0.2), 2) for _ in range(n)] for n in (1, 2, 5, 8, 11) for _ in range(10)]
    for d in cases:
        assert sign_flip_p(d) == every_assignment(d), d

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
"""benchmarks.study.late_decay: the late-decay study's plan as code (docs/benchmarks.md, "Late-decay study")."""

import pytest

from benchmarks.study import late_decay as ld

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
    assert out["held_out"] == {0: 0.5, 10: 0.9, 20: 0.7, 30: 0.4}  # 0: the untrained model
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


def test_the_power_simulation_hits_as_statistics_exact_arithmetic_does():
    """The simulation computes each t in floats; with statistics' exact mean and SD the same draws cross the same
    bounds (the report's settings, and the null)."""
    import math
    import random
    import statistics

    def exact(effect, sd, draws):
        rng, hits = random.Random(0), 0
        for _ in range(draws):
            sample = [rng.gauss(effect, sd) for _ in range(ld.LOOKS[-1])]
            for n in ld.LOOKS:
                part = sample[:n]
                if abs(statistics.mean(part) / (statistics.stdev(part) / math.sqrt(n))) >= ld.T_BOUNDS[n]:
                    hits += 1
                    break
        return hits / draws

    for effect, sd in ((0.10, 0.2), (0.15, 0.2), (0.10, 0.231), (0.0, 0.2)):
        assert ld.sequential_power(effect, sd, draws=3000) == exact(effect, sd, 3000), (effect, sd)


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

    from benchmarks.study.stats import sign_flip_p

    def every_assignment(d):
        observed = abs(sum(d)) - 1e-12
        hits = sum(abs(sum(-x if m >> i & 1 else x for i, x in enumerate(d))) >= observed for m in range(2 ** len(d)))
        return hits / 2 ** len(d)

    rng = random.Random(1)
    cases = [[0.1, -0.1], [0.0] * 4, [0.1] * 7, [0.2, -0.1, -0.1]]
    cases += [[round(rng.gauss(0.05, 0.2), 2) for _ in range(n)] for n in (1, 2, 5, 8, 11) for _ in range(10)]
    for d in cases:
        assert sign_flip_p(d) == every_assignment(d), d


def _write_run(root, loss, seed, rewards, val=None):
    import json

    folder = root / ld.VARIANT / loss
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"seed{seed}.jsonl", "w") as f:
        for row in _run(rewards, val):
            f.write(json.dumps({"step": row.pop("step"), "data": row}) + "\n")
    (folder / f"seed{seed}.json").write_text(json.dumps({"val_key": VAL, "steps": 30}))


def test_the_report_shows_nothing_before_the_interim_look_and_the_look_at_it(tmp_path):
    held, decayed = [0.9] * 30, [0.9] * 20 + [0.2] * 10
    for i, seed in enumerate(ld.SEEDS[:11]):
        _write_run(tmp_path, "troll", seed, held, {10: 0.8, 20: 0.8, 30: 0.8})
        _write_run(tmp_path, "clip", seed, [r - 0.01 * i for r in decayed], {10: 0.8, 20: 0.7, 30: 0.5})
    _write_run(tmp_path, "troll", ld.SEEDS[11], held)  # the 12th pair is not finished
    out = ld.report(str(tmp_path))
    assert "11 of 24 pairs finished (12 TROLL and 11 clip runs" in out
    assert "No outcome is shown" in out and "|" not in out and "0.7" not in out
    _write_run(tmp_path, "clip", ld.SEEDS[11], decayed)
    out = ld.report(str(tmp_path), draws=500)
    assert "12 of 24 pairs" in out and "| interim | 12 | +0.7" in out and "| end |" not in out
    assert "Reading: clip decayed late where TROLL held: +0.7" in out  # crossed at the look: the stage's end
    assert "| late decay (runs) | 0/12 | 12/12" in out and "Achieved power" in out
    assert "held-out accuracy at step 30, TROLL − clip | +0.300" in out


def test_a_look_that_does_not_cross_runs_on_to_the_end(tmp_path):
    for i, seed in enumerate(ld.SEEDS[:12]):
        _write_run(tmp_path, "troll", seed, [0.5 + 0.02 * (i % 3 - 1)] * 30)
        _write_run(tmp_path, "clip", seed, [0.5] * 30)
    out = ld.report(str(tmp_path))
    assert "| interim | 12 |" in out and "run on" in out and "secondary" not in out

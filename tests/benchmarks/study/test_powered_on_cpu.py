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
"""benchmarks.study.powered: the powered study's tables and reading rules from synthetic raw results."""

import pytest

from benchmarks.study import powered, raw, run


def test_the_study_report_regenerates_from_raw_results(tmp_path, capsys, monkeypatch, stress_rows):
    """A stage of three seeds and a GSPO stage of three from synthetic raw results: the rows, the pairs, the readings;
    and an incomplete stage is not summarised at all (the plan: no interim look)."""
    stages = [
        powered.Stage("1", "main", "paper8", ("troll", "clip"), range(3), 30, [("troll", "clip")], "reward_mean", 10),
        powered.Stage(
            "3", "gspo", "paper8_gspo", ("troll", "clip"), range(3), 30, [("troll", "clip")], "collapses", 10
        ),
        powered.Stage("4", "late", "lr1e-4", ("troll", "clip"), range(5, 8), 10, [("troll", "clip")], "reward_mean", 4),
    ]
    monkeypatch.setattr(powered, "STUDY", stages)
    for seed in range(3):
        up = [0.1 + 0.02 * i for i in range(30)]
        flat = [0.1 + 0.01 * i + 0.01 * seed for i in range(30)]
        raw.save_raw(str(tmp_path), f"paper8/troll/seed{seed}", stress_rows(up, projected=0.1), {})
        raw.save_raw(str(tmp_path), f"paper8/clip/seed{seed}", stress_rows(flat, clipped=0.03), {})
        crash = [0.1, 0.6, 0.8] + [0.8] * 20 + [0.1] * 7
        raw.save_raw(str(tmp_path), f"paper8_gspo/clip/seed{seed}", stress_rows(crash), {})
        raw.save_raw(str(tmp_path), f"paper8_gspo/troll/seed{seed}", stress_rows(up), {})
    for seed in (5, 6):  # stage 4 has 2 of its 3 pairs
        for loss in ("troll", "clip"):
            raw.save_raw(str(tmp_path), f"lr1e-4/{loss}/seed{seed}", stress_rows([0.1 * seed] * 10), {})
    png, docs = tmp_path / "study.png", tmp_path / "page.md"
    marker = f"<!-- report: .venv/bin/python scripts/bench_learning.py --study --results-dir {tmp_path} -->"
    docs.write_text(f"# page\n\n{marker}\nstale\n<!-- end report -->\n\nafter\n")
    assert run.main(["--study", "--results-dir", str(tmp_path), "--plot", str(png), "--docs", str(docs)]) == 0
    out = capsys.readouterr().out
    page = docs.read_text()
    assert (
        "stale" not in page
        and page.startswith(f"# page\n\n{marker}\n")
        and page.endswith("<!-- end report -->\n\nafter\n")
    )
    assert out.split("\ndocs: 1 block(s)")[0].strip() in page and "| TROLL − clip | 3 |" in page
    assert "runs finished: TROLL 3/3, clip 3/3" in out
    (pair,) = [line for line in out.splitlines() if line.startswith("| TROLL − clip | 3 | +0.145, +0.135, +0.125")]
    assert "| 0.2500 |" in pair and "| 1/3 |" in pair  # sign-flip p = 2/8; step-1 rewards equal in seed 0 only
    assert "TROLL learned faster" in pair
    assert "collapses: TROLL 0/3, clip 3/3, Fisher exact p = 0.100: no difference in collapses detected" in out
    late = out[out.index("**Stage 4") :]
    assert "runs finished: TROLL 2/3, clip 2/3" in late and "Not summarised" in late and "| TROLL −" not in late
    assert png.exists()
    grid = [
        [(stage.name, loss) for stage, loss in row]
        for row in powered.study_panels(powered.collect_study(str(tmp_path)))
    ]
    assert grid == [[("1", "troll"), ("1", "clip")], [("3", "troll"), ("3", "clip")]]  # stage 4 incomplete: no row
    docs.write_text("no block here\n")  # --docs names the block it needs
    with pytest.raises(SystemExit, match="no '<!-- report: ... --study"):
        run.main(["--study", "--results-dir", str(tmp_path), "--docs", str(docs)])
    with pytest.raises(SystemExit):  # --docs without --study: argparse's error
        run.main(["--results-dir", str(tmp_path), "--docs", str(docs)])


def test_stage_4_confirms_the_maps_signal_only_when_the_interval_favours_troll(tmp_path, monkeypatch, stress_rows):
    """Stage 4's rule: an interval that excludes 0 in TROLL's favour confirms the map's lr 1e-4 signal, any other
    result (clip ahead, or an interval across 0) withdraws it; its reading names lr 1e-4, not the paper's schedule."""
    stage = powered.STUDY[3]
    assert stage.variant == "lr1e-4" and stage.confirms and stage.seeds == list(range(5, 19))
    small = powered.Stage(
        "4",
        "late",
        "lr1e-4",
        ("troll", "clip"),
        range(5, 8),
        10,
        [("troll", "clip")],
        "reward_mean",
        4,
        setting=stage.setting,
        confirms=stage.confirms,
    )
    monkeypatch.setattr(powered, "STUDY", [small])

    def report(gaps):
        for seed, gap in zip(range(5, 8), gaps, strict=True):
            raw.save_raw(str(tmp_path), f"lr1e-4/troll/seed{seed}", stress_rows([0.3 + gap] * 10), {})
            raw.save_raw(str(tmp_path), f"lr1e-4/clip/seed{seed}", stress_rows([0.3] * 10), {})
        return powered.study_report(powered.collect_study(str(tmp_path)))

    ahead = report([0.2, 0.21, 0.22])
    assert "TROLL learned faster at lr 1e-4 (+0.210" in ahead
    assert "(TROLL ahead in whole-run mean reward) confirmed" in ahead
    behind = report([-0.2, -0.21, -0.22])
    assert "clip learned faster at lr 1e-4" in behind and ") withdrawn (TROLL − clip -0.210" in behind
    across = report([0.3, -0.2, 0.05])
    assert "inconclusive at this scale" in across and ") withdrawn (" in across


def test_the_reading_rules():
    # an interval that excludes 0 names the faster arm; one inside ±0.1 reads no difference; else inconclusive
    assert powered.reading(0.02, 0.2, 0.11, "troll", "clip", 0.8).startswith("TROLL learned faster")
    assert powered.reading(-0.2, -0.02, -0.11, "troll", "clip", 0.8).startswith("clip learned faster")
    assert powered.reading(-0.05, 0.08, 0.01, "troll", "clip", 0.8).startswith("no difference larger than 0.1")
    assert "inconclusive" in powered.reading(-0.05, 0.2, 0.07, "troll", "clip", 0.4) and "power 40%" in powered.reading(
        -0.05, 0.2, 0.07, "troll", "clip", 0.4
    )

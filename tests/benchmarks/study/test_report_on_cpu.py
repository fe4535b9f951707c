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
"""benchmarks.study.report: the learning table's staleness columns and the stress map's tables, regenerated from
raw results."""

from benchmarks.study import outcomes, raw, report, run


def test_report_has_a_staleness_row_per_arm(metric_rows):
    results = {}
    for seed in (0, 1):
        results[f"async2/troll/seed{seed}"] = outcomes.run_stats(
            metric_rows([0.1, 0.3, 0.5, 0.6], staleness=[2, 2, 2, 2], kl=[4e-3] * 4, projected=0.2, ppo_kl=[1e-3] * 4),
            0.5,
        )
        results[f"async2/clip/seed{seed}"] = outcomes.run_stats(
            metric_rows([0.1, 0.2, 0.4, 0.5], staleness=[2, 2, 2, 2], kl=[8e-3] * 4, clipped=0.1, ppo_kl=[5e-4] * 4),
            0.5,
        )
    table = report.report(results, [0, 1], 4, 0.5, ["async2"])
    (row,) = [line for line in table.splitlines() if line.startswith("| async2 |") and "2.00" in line]
    assert row.rstrip().endswith("| 2.00 | 4.00e-03 / 8.00e-03 | 1.00e-03 / 5.00e-04 |")
    assert "0.200" in row and "0.100" in row  # projected (TROLL), clipped (clip)


def test_report_only_regenerates_the_stress_tables_from_raw_results(tmp_path, capsys, stress_rows):
    import json

    curves = {
        "troll": [[0.1, 0.3, 0.5, 0.6], [0.2, 0.4, 0.6, 0.7], [0.1, 0.5, 0.6, 0.6]],
        "clip": [[0.1, 0.2, 0.1, 0.0], [0.2, 0.3, 0.4, 0.5], [0.1, 0.0, 0.0, 0.0]],
    }
    for loss, per_seed in curves.items():
        for seed, rewards in enumerate(per_seed):
            rows = stress_rows(
                rewards,
                length=2.0 if loss == "clip" and seed != 1 else 9.0,
                **({"projected": 0.2} if loss == "troll" else {"clipped": 0.05}),
            )
            rows = [{**r, "unrelated/key": 1.0} for r in rows]
            path = raw.save_raw(str(tmp_path), f"lr1e-4/{loss}/seed{seed}", rows, {"worker_peak_rss_gb": 5.0})
    saved = [json.loads(line) for line in open(path)]
    assert len(saved) == 4 and "unrelated/key" not in saved[0]["data"] and raw.REWARD_KEY in saved[0]["data"]
    # a run with fewer steps than asked for is not a finished run
    raw.save_raw(str(tmp_path), "lr1e-4_upper/troll/seed0", stress_rows([0.1, 0.2]), {})
    png = tmp_path / "map.png"
    argv = [
        "--report-only",
        "--model",
        "smollm2",
        "--results-dir",
        str(tmp_path),
        "--variants",
        "lr1e-4",
        "lr1e-4_upper",
        "--seeds",
        "0",
        "1",
        "2",
        "--steps",
        "4",
        "--stress",
        "--plot",
        str(png),
    ]
    assert run.main(argv) == 0
    out = capsys.readouterr().out
    assert "not in" in out and "lr1e-4_upper/troll/seed0" in out
    (troll_row,) = [line for line in out.splitlines() if line.startswith("| lr1e-4 | troll | 3 |")]
    (clip_row,) = [line for line in out.splitlines() if line.startswith("| lr1e-4 | clip | 3 |")]
    assert "| 0/3 | 3/3 |" in troll_row and "| 2/3 | 1/3 |" in clip_row  # collapsed, learned
    (diff_row,) = [line for line in out.splitlines() if line.startswith("| lr1e-4 | 3 |")]
    diffs = [sum(t[-1:]) - sum(c[-1:]) for t, c in zip(curves["troll"], curves["clip"], strict=True)]
    # +0.47 on average, but t(2) = 4.3 makes three seeds' interval [-0.11, +1.04]: not separated
    assert ", ".join(f"{d:+.3f}" for d in diffs) in diff_row and diff_row.rstrip().endswith("| no |")
    assert png.exists()

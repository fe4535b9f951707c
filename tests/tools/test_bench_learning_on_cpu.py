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
"""scripts/bench_learning.py's statistics and table: the staleness arms and their columns (no training here)."""

import json

import pytest

from troll_verl.testing import load_script

bl = load_script("bench_learning")

from troll_verl.tools.quickstart import REWARD_KEY  # noqa: E402


def _rows(rewards, staleness=None, kl=None, projected=None, clipped=None, ppo_kl=None):
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


def test_staleness_arms_run_both_losses_on_the_colocate_async_trainer():
    for variant, warmup in (("async1", 1), ("async2", 2)):
        for loss in ("troll", "clip"):
            overrides = bl.VARIANTS[variant][loss]
            assert "trainer.v1.trainer_mode=troll_colocate_async" in overrides
            assert f"trainer.v1.colocate_async.num_warmup_batches={warmup}" in overrides
        assert "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla" in bl.VARIANTS[variant]["clip"]


def test_eight_updates_per_batch_on_each_model():
    from troll_verl.tools.quickstart import MODELS

    tiny = bl.arm_overrides("grpo8", "troll", MODELS["tiny"])  # 16 prompts x 8 samples: the schedule measured before
    assert tiny[-2:] == [
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    ]
    smollm2 = bl.arm_overrides("grpo8", "clip", MODELS["smollm2"])  # 8 prompts x 4 samples
    assert smollm2[-2:] == [
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]
    assert bl.arm_overrides("grpo", "troll", MODELS["smollm2"]) == bl.VARIANTS["grpo"]["troll"]
    with pytest.raises(ValueError, match="do not split into 3"):
        bl.updates_overrides(3, MODELS["tiny"])


def test_run_stats_reports_staleness_and_kl_to_the_rollout():
    stats = bl.run_stats(_rows([0.1, 0.2, 0.3, 0.4], staleness=[0, 1, 1, 2], kl=[1e-3, 2e-3, 3e-3, 2e-3]), 0.5)
    assert stats["staleness"] == pytest.approx(1.0) and stats["kl_rollout"] == pytest.approx(2e-3)
    synchronous = bl.run_stats(_rows([0.1, 0.2, 0.3]), 0.5)
    assert synchronous["staleness"] is None and synchronous["kl_rollout"] is None and synchronous["kl_update"] is None


def test_run_stats_reports_how_far_the_update_moved_the_policy():
    stats = bl.run_stats(_rows([0.1, 0.2, 0.3, 0.4], ppo_kl=[0.0, 1e-3, 3e-3, 4e-3]), 0.5)
    assert stats["kl_update"] == pytest.approx(2e-3)


def test_report_has_a_staleness_row_per_arm():
    results = {}
    for seed in (0, 1):
        results[f"async2/troll/seed{seed}"] = bl.run_stats(
            _rows([0.1, 0.3, 0.5, 0.6], staleness=[2, 2, 2, 2], kl=[4e-3] * 4, projected=0.2, ppo_kl=[1e-3] * 4), 0.5
        )
        results[f"async2/clip/seed{seed}"] = bl.run_stats(
            _rows([0.1, 0.2, 0.4, 0.5], staleness=[2, 2, 2, 2], kl=[8e-3] * 4, clipped=0.1, ppo_kl=[5e-4] * 4), 0.5
        )
    table = bl.report(results, [0, 1], 4, 0.5, ["async2"])
    (row,) = [line for line in table.splitlines() if line.startswith("| async2 |") and "2.00" in line]
    assert row.rstrip().endswith("| 2.00 | 4.00e-03 / 8.00e-03 | 1.00e-03 / 5.00e-04 |")
    assert "0.200" in row and "0.100" in row  # projected (TROLL), clipped (clip)


def _stress_rows(rewards, length=10.0, projected=None, clipped=None, val=0.8):
    rows = _rows(rewards, projected=projected, clipped=clipped)
    for row in rows:
        row[bl.LENGTH_KEY] = length
    rows[-1]["val-core/troll_smollm2/addition/acc/mean@1"] = val
    return rows


def test_stress_arms_set_the_learning_rate_the_clip_range_and_the_schedule():
    from troll_verl.tools.quickstart import MODELS

    assert bl.LEARNING_RATE["lr1e-4"] == 1e-4 and bl.LEARNING_RATE["lr5e-5_tight"] == 5e-5
    # verl's actor config sets both clip sides explicitly, so each arm sets both
    assert {"actor_rollout_ref.actor.clip_ratio_low=0.1", "actor_rollout_ref.actor.clip_ratio_high=0.1"} <= set(
        bl.VARIANTS["lr1e-4_tight"]["clip"]
    )
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in bl.VARIANTS["lr1e-4_loose"]["clip"]
    assert "actor_rollout_ref.actor.policy_loss.kl_bound=0.02" in bl.VARIANTS["lr1e-4_tight"]["troll"]
    gspo_clip = bl.arm_overrides("gspo8", "clip", MODELS["smollm2"])
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=0.0003",
        "actor_rollout_ref.actor.clip_ratio_high=0.0004",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    } <= set(gspo_clip)
    assert "actor_rollout_ref.actor.policy_loss.ratio_level=sequence" in bl.VARIANTS["gspo8"]["troll"]
    assert bl.BASELINE["lr1e-4_upper"] == "lr1e-4" and set(bl.VARIANTS["lr1e-4_upper"]) == {"troll"}
    assert "actor_rollout_ref.actor.policy_loss.old_estimate=upper" in bl.VARIANTS["gspo8_upper"]["troll"]


def test_the_learning_rate_reaches_the_run_overrides():
    from types import SimpleNamespace

    from troll_verl.tools.quickstart import MODELS, cpu_run_overrides

    assets = SimpleNamespace(train_file="t", val_file="v", model_dir="m")
    overrides = cpu_run_overrides(MODELS["smollm2"], assets, lr=bl.LEARNING_RATE["lr7e-5"])
    assert "actor_rollout_ref.actor.optim.lr=7e-05" in overrides


def test_collapse_and_learning_criteria():
    learned = bl.run_stats(_stress_rows([0.1, 0.3, 0.6, 0.7, 0.8, 0.9]), 0.5)
    assert learned["learned"] and not learned["collapsed"] and learned["length_final"] == 10.0
    # final reward (last 2 of 6 steps) below the step-1 reward
    fell = bl.run_stats(_stress_rows([0.3, 0.4, 0.2, 0.1, 0.1, 0.2]), 0.5)
    assert fell["collapsed"] and not fell["learned"]
    # answers shorter than 4 tokens, even with a reward above step 1's
    short = bl.run_stats(_stress_rows([0.1, 0.2, 0.3, 0.3, 0.3, 0.3], length=3.5), 0.5)
    assert short["collapsed"] and short["length_final"] == 3.5


def test_paired_intervals():
    mean, lo, hi = bl.t_interval([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.303
    assert mean == 2.0 and hi - mean == pytest.approx(4.303 / 3**0.5) and lo == pytest.approx(2 * mean - hi)
    b_lo, b_hi = bl.bootstrap_interval([1.0, 2.0, 3.0])
    assert 1.0 <= b_lo < 2.0 < b_hi <= 3.0
    assert bl.bootstrap_interval([0.1, 0.2, 0.4]) == bl.bootstrap_interval([0.1, 0.2, 0.4])  # fixed generator
    with pytest.raises(ValueError, match="at least 2"):
        bl.t_interval([1.0])


def test_report_only_regenerates_the_stress_tables_from_raw_results(tmp_path, capsys):
    import json

    curves = {
        "troll": [[0.1, 0.3, 0.5, 0.6], [0.2, 0.4, 0.6, 0.7], [0.1, 0.5, 0.6, 0.6]],
        "clip": [[0.1, 0.2, 0.1, 0.0], [0.2, 0.3, 0.4, 0.5], [0.1, 0.0, 0.0, 0.0]],
    }
    for loss, per_seed in curves.items():
        for seed, rewards in enumerate(per_seed):
            rows = _stress_rows(
                rewards,
                length=2.0 if loss == "clip" and seed != 1 else 9.0,
                **({"projected": 0.2} if loss == "troll" else {"clipped": 0.05}),
            )
            rows = [{**r, "unrelated/key": 1.0} for r in rows]
            path = bl.save_raw(str(tmp_path), f"lr1e-4/{loss}/seed{seed}", rows, {"worker_peak_rss_gb": 5.0})
    saved = [json.loads(line) for line in open(path)]
    assert len(saved) == 4 and "unrelated/key" not in saved[0]["data"] and bl.REWARD_KEY in saved[0]["data"]
    # a run with fewer steps than asked for is not a finished run
    bl.save_raw(str(tmp_path), "lr1e-4_upper/troll/seed0", _stress_rows([0.1, 0.2]), {})
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
    assert bl.main(argv) == 0
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


# ------------------------------------------------------------------------------------------------ powered study
def test_the_study_arms_are_the_papers_schedule_and_baselines():
    from troll_verl.tools.quickstart import MODELS

    smollm2 = MODELS["smollm2"]
    for loss in ("troll", "clip", "dppo"):  # 8 optimizer steps per batch: mini-batches of 1 prompt x 4 answers
        assert bl.arm_overrides("paper8", loss, smollm2)[-2:] == [
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        ]
    clip = set(bl.VARIANTS["paper8"]["clip"])
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.2",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
    } == clip
    dppo = set(bl.VARIANTS["paper8"]["dppo"])
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl",
        "actor_rollout_ref.actor.clip_ratio_low=0.05",
        "actor_rollout_ref.actor.clip_ratio_high=0.05",
        "actor_rollout_ref.actor.clip_ratio_c=10000.0",
    } == dppo
    assert bl.VARIANTS["paper8"]["troll"] == ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"]  # defaults
    gspo = set(bl.arm_overrides("paper8_gspo", "clip", smollm2))
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    } <= gspo
    assert "actor_rollout_ref.actor.policy_loss.ratio_level=sequence" in bl.VARIANTS["paper8_gspo"]["troll"]
    # the plan's stages: n fixed in advance
    assert [(s.variant, len(s.seeds), s.steps) for s in bl.STUDY] == [
        ("paper8", 15, 30),
        ("paper8", 8, 30),
        ("paper8_gspo", 5, 30),
        ("lr1e-4", 14, 10),
    ]
    assert bl.STUDY[3].seeds == list(range(5, 19))


def test_the_task_option_and_the_validation_interval_reach_the_runs(tmp_path):
    from types import SimpleNamespace

    from troll_verl.assets.smollm2 import SmolSpec
    from troll_verl.tools.quickstart import cpu_model

    model = cpu_model("smollm2", 20)
    assert model.build.keywords["spec"] == SmolSpec(hi=20, val_fraction=0.2)
    assert cpu_model("smollm2", 15).build.keywords["spec"].val_fraction == pytest.approx(80 / 225)
    with pytest.raises(ValueError, match="tiny model has its own task"):
        cpu_model("tiny", 20)
    args = bl.build_parser().parse_args(["--model", "smollm2", "--task-hi", "20", "--test-freq", "10", "--steps", "30"])
    overrides = bl._run_overrides(
        model, SimpleNamespace(train_file="t", val_file="v", model_dir="m"), args, "paper8", "dppo", 3
    )
    assert {
        "trainer.test_freq=10",
        "trainer.total_training_steps=30",
        "data.seed=3",
        "actor_rollout_ref.rollout.agent.default_agent_loop=seeded_single_turn_agent",
    } <= set(overrides)


def test_only_the_named_losses_are_planned(monkeypatch):
    planned = []
    monkeypatch.setattr(bl, "_run_plan", lambda plan, *a: planned.extend(plan) or 1)
    bl.main(["--model", "smollm2", "--variants", "paper8", "--losses", "dppo", "--seeds", "0", "1"])
    assert planned == [("paper8", "dppo", 0), ("paper8", "dppo", 1)]


def test_study_statistics():
    # exact sign flips: 3 positive differences -> only the observed and the all-negative assignment are as extreme
    assert bl.sign_flip_p([0.1, 0.2, 0.3]) == pytest.approx(2 / 8)
    assert bl.sign_flip_p([0.1, -0.1]) == 1.0
    # the t test's power at the planning SD: about 80 % for +0.1 with 15 pairs, far less with 5
    assert 0.75 < bl.t_power(15, 0.13) < 0.85 and bl.t_power(5, 0.13) < 0.35
    # Fisher exact: 5/5 against 0/5 collapses, two-sided p = 2 / C(10, 5)
    assert bl.fisher_exact_p(5, 5, 0, 5) == pytest.approx(2 / 252)
    assert bl.fisher_exact_p(1, 5, 1, 5) == pytest.approx(1.0)
    # the entropy difference at equal final reward: y = 0.2 + 0.5 x exactly -> intercept 0.2, zero width
    adj, lo, hi = bl.adjusted_difference([0.2, 0.25, 0.3, 0.4], [0.0, 0.1, 0.2, 0.4])
    assert adj == pytest.approx(0.2) and hi - lo == pytest.approx(0.0, abs=1e-9)
    # reading rules
    assert bl.reading(0.02, 0.2, 0.11, "troll", "clip", 0.8).startswith("TROLL learned faster")
    assert bl.reading(-0.2, -0.02, -0.11, "troll", "clip", 0.8).startswith("clip learned faster")
    assert bl.reading(-0.05, 0.08, 0.01, "troll", "clip", 0.8).startswith("no difference larger than 0.1")
    assert "inconclusive" in bl.reading(-0.05, 0.2, 0.07, "troll", "clip", 0.4) and "power 40%" in bl.reading(
        -0.05, 0.2, 0.07, "troll", "clip", 0.4
    )


def test_the_half_peak_collapse_rule():
    peaked = bl.run_stats(_stress_rows([0.1, 0.5, 0.8, 0.8, 0.8, 0.8, 0.8, 0.2, 0.1, 0.1, 0.1, 0.1]), 0.5)
    assert peaked["collapsed_peak"] and not peaked["collapsed"]  # final reward above step 1's: the map misses it
    rewards = [0.1, 0.5, 0.8, 0.8, 0.8, 0.8, 0.8, 0.6, 0.5, 0.5, 0.5, 0.5]
    steady = bl.run_stats(_stress_rows(rewards), 0.5)
    assert not steady["collapsed_peak"] and steady["reward_mean"] == pytest.approx(sum(rewards) / 12)


def test_the_study_report_regenerates_from_raw_results(tmp_path, capsys, monkeypatch):
    """A stage of three seeds and a GSPO stage of three from synthetic raw results: the rows, the pairs, the readings;
    and an incomplete stage is not summarised at all (the plan: no interim look)."""
    stages = [
        bl.Stage("1", "main", "paper8", ("troll", "clip"), range(3), 30, [("troll", "clip")], "reward_mean", 10),
        bl.Stage("3", "gspo", "paper8_gspo", ("troll", "clip"), range(3), 30, [("troll", "clip")], "collapses", 10),
        bl.Stage("4", "late", "lr1e-4", ("troll", "clip"), range(5, 8), 10, [("troll", "clip")], "reward_mean", 4),
    ]
    monkeypatch.setattr(bl, "STUDY", stages)
    for seed in range(3):
        up = [0.1 + 0.02 * i for i in range(30)]
        flat = [0.1 + 0.01 * i + 0.01 * seed for i in range(30)]
        bl.save_raw(str(tmp_path), f"paper8/troll/seed{seed}", _stress_rows(up, projected=0.1), {})
        bl.save_raw(str(tmp_path), f"paper8/clip/seed{seed}", _stress_rows(flat, clipped=0.03), {})
        crash = [0.1, 0.6, 0.8] + [0.8] * 20 + [0.1] * 7
        bl.save_raw(str(tmp_path), f"paper8_gspo/clip/seed{seed}", _stress_rows(crash), {})
        bl.save_raw(str(tmp_path), f"paper8_gspo/troll/seed{seed}", _stress_rows(up), {})
    for seed in (5, 6):  # stage 4 has 2 of its 3 pairs
        for loss in ("troll", "clip"):
            bl.save_raw(str(tmp_path), f"lr1e-4/{loss}/seed{seed}", _stress_rows([0.1 * seed] * 10), {})
    png, docs = tmp_path / "study.png", tmp_path / "page.md"
    marker = f"<!-- report: .venv/bin/python scripts/bench_learning.py --study --results-dir {tmp_path} -->"
    docs.write_text(f"# page\n\n{marker}\nstale\n<!-- end report -->\n\nafter\n")
    assert bl.main(["--study", "--results-dir", str(tmp_path), "--plot", str(png), "--docs", str(docs)]) == 0
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
    grid = [[(stage.name, loss) for stage, loss in row] for row in bl.study_panels(bl.collect_study(str(tmp_path)))]
    assert grid == [[("1", "troll"), ("1", "clip")], [("3", "troll"), ("3", "clip")]]  # stage 4 incomplete: no row
    docs.write_text("no block here\n")  # --docs names the block it needs
    with pytest.raises(SystemExit, match="no '<!-- report: ... --study"):
        bl.main(["--study", "--results-dir", str(tmp_path), "--docs", str(docs)])
    with pytest.raises(SystemExit):  # --docs without --study: argparse's error
        bl.main(["--results-dir", str(tmp_path), "--docs", str(docs)])


def test_each_study_rewrites_only_its_own_docs_block(tmp_path, capsys):
    """``--study`` and ``--study late_decay`` share a page (docs/benchmarks.md): each command rewrites the block whose
    marker names it and leaves the other's as it is."""
    powered = "<!-- report: .venv/bin/python scripts/bench_learning.py --study --results-dir a -->"
    late = "<!-- report: .venv/bin/python scripts/bench_learning.py --study late_decay --results-dir b -->"
    docs = tmp_path / "page.md"
    docs.write_text(f"{powered}\npowered tables\n<!-- end report -->\n{late}\nold\n<!-- end report -->\n")
    assert bl.main(["--study", "late_decay", "--results-dir", str(tmp_path / "none"), "--docs", str(docs)]) == 0
    page = docs.read_text()
    assert "powered tables" in page and "old" not in page
    assert "0 of 24 pairs finished" in page and "No outcome is shown before the interim look" in page
    docs.write_text(f"{powered}\npowered tables\n<!-- end report -->\n")
    with pytest.raises(SystemExit, match="no '<!-- report: ... --study late_decay"):
        bl.main(["--study", "late_decay", "--results-dir", str(tmp_path / "none"), "--docs", str(docs)])
    with pytest.raises(SystemExit):  # the late-decay report has no plot: argparse's error, naming --plot
        bl.main(["--study", "late_decay", "--results-dir", str(tmp_path / "none"), "--plot", str(tmp_path / "p.png")])
    assert "drop --plot" in capsys.readouterr().err and not (tmp_path / "p.png").exists()


def test_stage_4_confirms_the_maps_signal_only_when_the_interval_favours_troll(tmp_path, monkeypatch):
    """Stage 4's rule: an interval that excludes 0 in TROLL's favour confirms the map's lr 1e-4 signal, any other
    result (clip ahead, or an interval across 0) withdraws it; its reading names lr 1e-4, not the paper's schedule."""
    stage = bl.STUDY[3]
    assert stage.variant == "lr1e-4" and stage.confirms and stage.seeds == list(range(5, 19))
    small = bl.Stage(
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
    monkeypatch.setattr(bl, "STUDY", [small])

    def report(gaps):
        for seed, gap in zip(range(5, 8), gaps, strict=True):
            bl.save_raw(str(tmp_path), f"lr1e-4/troll/seed{seed}", _stress_rows([0.3 + gap] * 10), {})
            bl.save_raw(str(tmp_path), f"lr1e-4/clip/seed{seed}", _stress_rows([0.3] * 10), {})
        return bl.study_report(bl.collect_study(str(tmp_path)))

    ahead = report([0.2, 0.21, 0.22])
    assert "TROLL learned faster at lr 1e-4 (+0.210" in ahead
    assert "(TROLL ahead in whole-run mean reward) confirmed" in ahead
    behind = report([-0.2, -0.21, -0.22])
    assert "clip learned faster at lr 1e-4" in behind and ") withdrawn (TROLL − clip -0.210" in behind
    across = report([0.3, -0.2, 0.05])
    assert "inconclusive at this scale" in across and ") withdrawn (" in across


def test_the_late_decay_arms_are_the_plans(tmp_path):
    # docs/benchmarks.md, "Late-decay study": TROLL's defaults against clip 0.2 / 0.2 with dual-clip 3, 8 updates
    late = bl.VARIANTS["late8"]
    assert late["troll"] == ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"]
    assert "actor_rollout_ref.actor.clip_ratio_c=3.0" in late["clip"]
    assert "actor_rollout_ref.actor.clip_ratio_low=0.2" in late["clip"]
    assert "actor_rollout_ref.actor.clip_ratio_high=0.2" in late["clip"]
    assert bl.UPDATES_PER_BATCH["late8"] == 8


def test_a_failed_run_is_recorded_with_its_log_and_code(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("x" * 5000 + "\nRuntimeError: the planted failure\n")
    path = bl.record_failed_attempt(str(tmp_path / "results"), "late8/clip/seed200", 1, str(log), 12.34)
    bl.record_failed_attempt(str(tmp_path / "results"), "late8/troll/seed201", -9, str(tmp_path / "gone.log"), 1.0)
    lines = [json.loads(line) for line in open(path)]
    assert [(e["key"], e["returncode"]) for e in lines] == [("late8/clip/seed200", 1), ("late8/troll/seed201", -9)]
    assert lines[0]["log_tail"].endswith("the planted failure\n") and len(lines[0]["log_tail"]) == 2000
    assert lines[1]["log_tail"] is None
    assert lines[0]["wall_s"] == 12.3
    assert len(lines[0]["commit"]) == 40 and isinstance(lines[0]["tree_clean"], bool)

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
"""benchmarks.study.run: the command line's plan, its options reaching the runs, and the docs blocks it writes."""

import pytest

from benchmarks.study import run


def test_the_task_option_and_the_validation_interval_reach_the_runs(tmp_path):
    from types import SimpleNamespace

    from troll_verl.assets.smollm2 import SmolSpec
    from troll_verl.tools.quickstart import cpu_model

    model = cpu_model("smollm2", 20)
    assert model.build.keywords["spec"] == SmolSpec(hi=20, val_fraction=0.2)
    assert cpu_model("smollm2", 15).build.keywords["spec"].val_fraction == pytest.approx(80 / 225)
    with pytest.raises(ValueError, match="tiny model has its own task"):
        cpu_model("tiny", 20)
    args = run.build_parser().parse_args(
        ["--model", "smollm2", "--task-hi", "20", "--test-freq", "10", "--steps", "30"]
    )
    overrides = run._run_overrides(
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
    monkeypatch.setattr(run, "_run_plan", lambda plan, *a: planned.extend(plan) or 1)
    run.main(["--model", "smollm2", "--variants", "paper8", "--losses", "dppo", "--seeds", "0", "1"])
    assert planned == [("paper8", "dppo", 0), ("paper8", "dppo", 1)]


def test_each_study_rewrites_only_its_own_docs_block(tmp_path, capsys):
    """``--study`` and ``--study late_decay`` share a page (docs/benchmarks.md): each command rewrites the block whose
    marker names it and leaves the other's as it is."""
    powered = "<!-- report: .venv/bin/python scripts/bench_learning.py --study --results-dir a -->"
    late = "<!-- report: .venv/bin/python scripts/bench_learning.py --study late_decay --results-dir b -->"
    docs = tmp_path / "page.md"
    docs.write_text(f"{powered}\npowered tables\n<!-- end report -->\n{late}\nold\n<!-- end report -->\n")
    assert run.main(["--study", "late_decay", "--results-dir", str(tmp_path / "none"), "--docs", str(docs)]) == 0
    page = docs.read_text()
    assert "powered tables" in page and "old" not in page
    assert "0 of 24 pairs finished" in page and "No outcome is shown before the interim look" in page
    docs.write_text(f"{powered}\npowered tables\n<!-- end report -->\n")
    with pytest.raises(SystemExit, match="no '<!-- report: ... --study late_decay"):
        run.main(["--study", "late_decay", "--results-dir", str(tmp_path / "none"), "--docs", str(docs)])
    with pytest.raises(SystemExit):  # the late-decay report has no plot: argparse's error, naming --plot
        run.main(["--study", "late_decay", "--results-dir", str(tmp_path / "none"), "--plot", str(tmp_path / "p.png")])
    assert "drop --plot" in capsys.readouterr().err and not (tmp_path / "p.png").exists()

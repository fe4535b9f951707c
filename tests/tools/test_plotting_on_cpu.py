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
"""Log readers and plots (:mod:`troll_verl.tools.plotting`, ``scripts/plot_runs.py``) on real runs of verl's trainer.

The fixtures in ``tests/fixtures/runs/`` are the first 12 steps of a TROLL and a clip run of
``scripts/bench_learning.py`` (see the README there): verl's console output as the run printed it (Ray prefixes,
ANSI colours, tqdm carriage returns, lines Ray's log monitor split) and verl's file-logger JSONL of the same run.
The tensorboard event file is written here, from the JSONL, the way verl's tensorboard logger writes it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import sys

import matplotlib.figure
import matplotlib.image
import numpy as np
import pytest

from troll_verl.tools import metrics_io, plotting
from troll_verl.tools.metrics_io import (
    REWARD_KEY,
    LogFormatError,
    ReaderUnavailableError,
    detect_format,
    load_run,
    read_console,
    read_jsonl,
    read_metrics,
    read_tensorboard,
)
from troll_verl.tools.plotting import PANELS, val_keys, write_plots

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "runs")
RUNS = ("grpo_troll_seed0", "grpo_clip_seed0")
STEPS = list(range(13))  # step 0 (validation before training) .. 12
VAL_KEY = "val-core/troll_tiny/addition/acc/mean@1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fixture(name: str, ext: str) -> str:
    return os.path.join(FIXTURES, f"{name}.{ext}")


def _load_cli():
    spec = importlib.util.spec_from_file_location("plot_runs_cli", os.path.join(ROOT, "scripts", "plot_runs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_tensorboard(jsonl_path: str, log_dir: str) -> str:
    """What verl's ``_TensorboardAdapter`` does with each logged dict: ``add_scalar(key, value, step)`` per key."""
    from torch.utils.tensorboard import SummaryWriter  # tensorboard: a dependency of verl

    writer = SummaryWriter(log_dir)
    with open(jsonl_path) as f:
        for line in f:
            record = json.loads(line)
            for key, value in record["data"].items():
                writer.add_scalar(key, value, record["step"])
    writer.close()
    return log_dir


def _float32(rows: list[dict]) -> list[dict]:
    return [{k: (v if k == "step" else float(np.float32(v))) for k, v in row.items()} for row in rows]


# ------------------------------------------------------------------------------------------------------- readers


@pytest.mark.parametrize("name", RUNS)
def test_three_readers_give_the_same_rows(name, tmp_path):
    """Console, JSONL and tensorboard logs of one run read to the same rows (tensorboard: float32 of the same)."""
    from_jsonl = read_jsonl(_fixture(name, "jsonl"))
    from_console = read_console(_fixture(name, "log"))
    assert [row["step"] for row in from_jsonl] == STEPS
    assert from_console == from_jsonl  # exact: verl's console logger prints repr()s, which round-trip
    tb_dir = _write_tensorboard(_fixture(name, "jsonl"), str(tmp_path / "tb"))
    from_tb = read_tensorboard(tb_dir)
    assert [sorted(r) for r in from_tb] == [sorted(r) for r in from_jsonl]
    assert from_tb == _float32(from_jsonl)  # tensorboard stores float32
    # and through detection: a run directory with event files, the event file itself, both text logs
    assert load_run(tb_dir).fmt == "tensorboard"
    (event_file,) = [f for f in os.listdir(tb_dir) if f.startswith("events.out.tfevents")]
    assert load_run(os.path.join(tb_dir, event_file)).rows == from_tb
    assert load_run(_fixture(name, "log")).fmt == "console"
    assert load_run(_fixture(name, "jsonl")).fmt == "jsonl"


def test_fixture_content_is_what_the_plots_need():
    """The fixtures are a TROLL and a clip run with training, validation and each side's trust-region metrics."""
    troll = read_jsonl(_fixture("grpo_troll_seed0", "jsonl"))
    clip = read_jsonl(_fixture("grpo_clip_seed0", "jsonl"))
    for rows in (troll, clip):
        assert sum(REWARD_KEY in r for r in rows) == 12
        assert [r["step"] for r in rows if VAL_KEY in r] == [0, 10]
        assert val_keys(rows) == [VAL_KEY]
    assert all("actor/troll/kl_after" in r for r in troll if REWARD_KEY in r)
    assert not any("actor/troll/kl_after" in r for r in clip)
    assert [s.key for s in PANELS["kl"].series(troll)] == ["actor/troll/kl_before", "actor/troll/kl_after"]
    assert [s.key for s in PANELS["kl"].series(clip)] == ["actor/ppo_kl"]
    assert [s.key for s in PANELS["constrained"].series(troll)] == ["actor/troll/projected_frac"]
    assert [s.key for s in PANELS["constrained"].series(clip)] == ["actor/pg_clipfrac"]
    assert PANELS["eta"].series(clip) == []


def test_console_values_and_ray_prefixes(tmp_path):
    """np.float64(...)/np.int32(...) values, Ray prefixes with and without ip, ANSI colours, dedup suffixes."""
    log = tmp_path / "out.log"
    log.write_text(
        "\x1b[36m(TaskRunnerV1 pid=123)\x1b[0m ('Initial validation metrics: {'val-core/x/acc/mean@4': "
        "np.float64(0.5)}')\n"
        "\x1b[36m(TaskRunnerV1 pid=123)\x1b[0m step:0 - val-core/x/acc/mean@4:np.float64(0.5)\n"
        "(WorkerDict pid=7) warnings.warn(\n"
        "\x1b[36m(TaskRunnerV1 pid=123, ip=10.0.0.2)\x1b[0m step:1 - critic/score/mean:np.float64(0.25) - "
        "a/int:np.int32(2) - a/f32:np.float32(1e-07) - a/plain:0.125 - a/neg:-3.5e-05 - a/nan:nan - "
        "a/npnan:np.float64(nan) - a/inf:inf - a/bool:True - timing_s/step:4.2\n"
        "\x1b[36m(TaskRunnerV1 pid=123)\x1b[0m \rTraining Progress:  50%|#####     | 1/2 [00:04<00:04, 4.2s/it]\n"
        "step:2 - critic/score/mean:0.5 [repeated 2x across cluster]\n"
        "global_step:3 - not/a:1.0\n"
    )
    rows = read_console(str(log))
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"step": 0, "val-core/x/acc/mean@4": 0.5}
    one = rows[1]
    assert one[REWARD_KEY] == 0.25 and one["a/int"] == 2.0 and one["a/f32"] == 1e-07
    assert one["a/plain"] == 0.125 and one["a/neg"] == -3.5e-05 and one["a/bool"] == 1.0
    assert math.isnan(one["a/nan"]) and math.isnan(one["a/npnan"]) and one["a/inf"] == math.inf
    assert one["timing_s/step"] == 4.2
    assert rows[2] == {"step": 2, REWARD_KEY: 0.5}
    assert detect_format(str(log)) == ("console", str(log))
    assert val_keys(rows) == ["val-core/x/acc/mean@4"]


@pytest.mark.parametrize("cuts", [[6], [8], [9], [57], [1000, 2500], [2000, 2001, 2002]])
def test_console_line_split_by_ray_is_joined(cuts, tmp_path):
    """Ray's log monitor splits long lines (the fixtures' config dump shows it): a split step line is joined.

    The pieces come back as separate lines of the same process, other processes' lines in between.
    """
    name = "grpo_troll_seed0"
    lines = open(_fixture(name, "log"), encoding="utf-8", newline="").read().split("\n")
    index = next(i for i, line in enumerate(lines) if " step:5 - " in line)
    prefix, body = lines[index].split(" step:5 - ", 1)
    body = "step:5 - " + body
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    split = []
    for n, piece in enumerate(pieces):
        split.append(f"{prefix} {piece}")
        split.append(f"\x1b[36m(SimpleStorageUnit pid=99)\x1b[0m WARNING line {n} of another process")
    log = tmp_path / "split.log"
    log.write_text("\n".join(lines[:index] + split + lines[index + 1 :]), encoding="utf-8", newline="")
    assert read_console(str(log)) == read_jsonl(_fixture(name, "jsonl"))


def test_console_killed_run_and_bad_values(tmp_path):
    """A truncated last metric line is read up to the cut; an unparseable value elsewhere is an error."""
    text = open(_fixture("grpo_clip_seed0", "log"), encoding="utf-8", newline="").read()
    last = text.rindex(" step:12 - ")
    cut = text.index("critic/score/mean:", last) + len("critic/score/mean:np.float6")
    killed = tmp_path / "killed.log"
    killed.write_text(text[:cut], encoding="utf-8", newline="")
    rows = read_console(str(killed))
    assert [r["step"] for r in rows] == STEPS
    assert REWARD_KEY not in rows[-1] and "actor/entropy" in rows[-1]

    bad = tmp_path / "bad.log"
    bad.write_text("step:1 - critic/score/mean:0.5\nstep:2 - critic/score/mean:tensor(0.5)\nstep:3 - x:1\n")
    with pytest.raises(LogFormatError, match=r"bad\.log:2: cannot parse 'critic/score/mean:tensor\(0\.5\)'"):
        read_console(str(bad))


def test_jsonl_tolerates_a_partial_last_line_and_rejects_garbage(tmp_path):
    src = open(_fixture("grpo_troll_seed0", "jsonl")).read().splitlines()
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(src[:5]) + "\n" + src[5][:100])
    assert [r["step"] for r in read_jsonl(str(partial))] == [0, 1, 2, 3, 4]
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(src[0] + "\nnot json\n" + src[1] + "\n")
    with pytest.raises(LogFormatError, match=r"garbage\.jsonl:2: not a verl file-logger line"):
        read_jsonl(str(garbage))
    # the quickstart's polling reader: [] before the file exists, bad lines skipped
    assert read_metrics(str(tmp_path / "missing.jsonl")) == []
    assert [r["step"] for r in read_metrics(str(garbage))] == [0, 1]
    # a resumed run logs some steps twice: one row per step, the later values win
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text(
        '{"step": 1, "data": {"a": 1.0, "b": 2.0}}\n{"step": 2, "data": {"a": 3.0}}\n'
        '{"step": 1, "data": {"a": 5.0}}\n{"step": 0, "data": {"v": null}}\n'
    )
    rows = read_jsonl(str(resumed))
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1] == {"step": 1, "a": 5.0, "b": 2.0}
    assert math.isnan(rows[0]["v"])  # orjson writes NaN as null


def test_bad_inputs_name_the_path(tmp_path):
    with pytest.raises(LogFormatError, match="nowhere.*no such file"):
        load_run(str(tmp_path / "nowhere"))
    prose = tmp_path / "notes.txt"
    prose.write_text("this is not a log\nstep by step\n")
    with pytest.raises(LogFormatError, match=r"notes\.txt: not a verl metrics log; expected verl's file-logger"):
        load_run(str(prose))
    empty_dir = tmp_path / "empty_run"
    empty_dir.mkdir()
    with pytest.raises(LogFormatError, match=r"empty_run: no verl metrics in this directory"):
        load_run(str(empty_dir))
    fake = tmp_path / "events.out.tfevents.123.host"
    fake.write_bytes(b"not an event file" * 10)
    with pytest.raises(LogFormatError, match=r"events\.out\.tfevents\.123\.host"):
        load_run(str(fake))
    with pytest.raises(LogFormatError, match="unknown format"):
        load_run(_fixture("grpo_troll_seed0", "log"), fmt="csv")


def test_tensorboard_missing_is_reported_and_skipped(tmp_path, monkeypatch, capsys):
    tb_dir = _write_tensorboard(_fixture("grpo_troll_seed0", "jsonl"), str(tmp_path / "tb"))
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_file_loader", None)
    with pytest.raises(ReaderUnavailableError, match="needs the 'tensorboard' package"):
        read_tensorboard(tb_dir)
    cli = _load_cli()
    code = cli.main([f"tb={tb_dir}", f"clip={_fixture('grpo_clip_seed0', 'jsonl')}", "--out-dir", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 0 and "skipping tb" in err and "tensorboard" in err
    assert os.path.exists(tmp_path / "p" / "overview.png")


# --------------------------------------------------------------------------------------------------------- plots


def _assert_png(path: str, min_size: tuple[int, int] = (300, 400)) -> None:
    """A PNG that decodes to at least ``min_size`` (rows, columns) pixels and is not blank (what is drawn on it is
    checked on the figure itself)."""
    import matplotlib.image

    with open(path, "rb") as f:
        head = f.read(8)
    assert head == PNG_MAGIC, path
    image = matplotlib.image.imread(path)
    assert image.shape[0] >= min_size[0] and image.shape[1] >= min_size[1], (path, image.shape)
    assert len({tuple(p) for p in image[::5, ::5, :3].reshape(-1, 3)}) > 20, path


@contextlib.contextmanager
def _recording_figures():
    """Every matplotlib figure saved inside the block, in order (they are still written)."""
    drawn = []
    original = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        drawn.append(fig)
        return original(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", record)
        yield drawn


def test_cli_renders_troll_vs_clip(tmp_path, capsys):
    """Every panel for TROLL (console log) vs clip (run directory with its JSONL), and the run table."""
    run_dir = tmp_path / "clip_run"
    run_dir.mkdir()
    with open(_fixture("grpo_clip_seed0", "jsonl")) as src, open(run_dir / "metrics.jsonl", "w") as dst:
        dst.write(src.read())
    out = tmp_path / "plots"
    cli = _load_cli()
    with _recording_figures() as drawn:
        code = cli.main(
            [
                f"TROLL={_fixture('grpo_troll_seed0', 'log')}",
                str(run_dir),
                "--out-dir",
                str(out),
                "--smooth",
                "3",
                "--title",
                "GRPO seed 0",
            ]
        )
    printed = capsys.readouterr().out
    assert code == 0, printed
    panels = ["reward", "val", "entropy", "kl", "eta", "constrained"]
    for name in [*panels, "overview"]:
        assert f"wrote {out / name}.png" in printed
        _assert_png(str(out / f"{name}.png"))
    # what each panel draws is each run's data: every series of every run, step by step, smoothed where the panel
    # smooths, and each run in its own colour
    rows = {
        "TROLL": read_jsonl(_fixture("grpo_troll_seed0", "jsonl")),
        "clip_run": read_jsonl(_fixture("grpo_clip_seed0", "jsonl")),
    }
    for fig, name in zip(drawn, panels, strict=False):
        panel = PANELS[name]
        lines = {line.get_label(): line for line in fig.axes[0].lines if not line.get_label().startswith("_")}
        expected = {}
        for label, run_rows in rows.items():
            for series in panel.series(run_rows):
                points = [(r["step"], r[series.key]) for r in run_rows if series.key in r]
                values = [v for _, v in points]
                expected[f"{label}: {series.name}" if series.name else label] = (
                    [step for step, _ in points],
                    plotting.smooth(values, 3) if panel.smoothed else values,
                )
        assert expected and set(lines) == set(expected), name
        for label, (steps, values) in expected.items():
            assert list(lines[label].get_xdata()) == steps, (name, label)
            np.testing.assert_allclose(lines[label].get_ydata(), values, rtol=1e-6, err_msg=f"{name}: {label}")
        colours = {label.split(":")[0]: line.get_color() for label, line in lines.items()}
        assert len(set(colours.values())) == len(colours), name
    overview, reward = (matplotlib.image.imread(str(out / f"{n}.png")) for n in ("overview", "reward"))
    assert overview.shape[0] * overview.shape[1] > reward.shape[0] * reward.shape[1]  # every panel in one figure
    # the table: labels, formats, steps and first/last reward and validation of each run
    troll = read_jsonl(_fixture("grpo_troll_seed0", "jsonl"))
    table = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith(("TROLL ", "clip_run "))}
    assert table["TROLL"][1:3] == ["console", "12"] and table["clip_run"][1:3] == ["jsonl", "12"]
    rewards = [r[REWARD_KEY] for r in troll if REWARD_KEY in r]
    assert table["TROLL"][3:5] == [f"{rewards[0]:.3f}", f"{rewards[-1]:.3f}"]


def test_cli_metrics_labels_and_usage_errors(tmp_path, capsys):
    cli = _load_cli()
    out = tmp_path / "plots"
    runs = [_fixture("grpo_troll_seed0", "jsonl"), _fixture("grpo_clip_seed0", "log")]
    assert cli.main([*runs, "--labels", "TROLL", "clip", "--metrics", "reward", "kl", "--out-dir", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["kl.png", "overview.png", "reward.png"]
    assert "TROLL" in capsys.readouterr().out
    # a panel only TROLL has, for clip alone: nothing to draw is an error, not an empty PNG
    assert cli.main([runs[1], "--metrics", "eta", "--out-dir", str(tmp_path / "none")]) == 2
    assert "no run has data" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "missing_run"), "--out-dir", str(out)]) == 2
    assert "missing_run: no such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*runs, "--labels", "only-one"])
    with pytest.raises(SystemExit):
        cli.main([*runs, "--metrics", "nonsense"])


def test_write_plots_and_quickstart_api(tmp_path):
    """The quickstart keeps its names: plot_runs(label → rows, path, title=...) and read_metrics(path)."""
    from troll_verl.tools import quickstart

    for name in ("REWARD_KEY", "VAL_KEY", "read_metrics", "run_trainer", "tiny_cpu_overrides", "plot_runs"):
        assert hasattr(quickstart, name), name
    assert quickstart.read_metrics is metrics_io.read_metrics and quickstart.plot_runs is plotting.plot_runs
    runs = {
        "TROLL": read_metrics(_fixture("grpo_troll_seed0", "jsonl")),
        "clip (vanilla)": read_metrics(_fixture("grpo_clip_seed0", "jsonl")),
    }
    path = quickstart.plot_runs(runs, str(tmp_path / "curves.png"), title="GRPO on the built-in addition task")
    assert path == str(tmp_path / "curves.png")
    _assert_png(path)
    with _recording_figures() as drawn:
        written = write_plots(runs, str(tmp_path / "all"), smooth_window=1)
    # what is drawn is the data: the reward panel's TROLL line is the run's reward series, step by step
    reward_ax = drawn[0].axes[0]
    (troll_line,) = [line for line in reward_ax.lines if line.get_label() == "TROLL"]
    expected = [r[REWARD_KEY] for r in runs["TROLL"] if REWARD_KEY in r]
    assert list(troll_line.get_ydata()) == pytest.approx(expected)
    assert list(written) == ["reward", "val", "entropy", "kl", "eta", "constrained", "overview"]
    with pytest.raises(ValueError, match="unknown panel"):
        write_plots(runs, str(tmp_path / "x"), metrics=["loss"])


def test_quickstart_summary_prints_the_configured_bound(tmp_path, capsys):
    """The summary line names the run's own ε (not a fixed 0.05), the largest bound violation, and verl's
    ``training/rollout_probs_diff_max`` as the token-probability difference it is (the old key kept as an alias)."""
    from troll_verl.tools import quickstart

    key = "actor_rollout_ref.actor.policy_loss.kl_bound"
    assert quickstart.configured_kl_bound([]) == 0.05  # TrollConfig's default
    assert quickstart.configured_kl_bound(["a.b=1", f"{key}=0.1", f"+{key}=0.02"]) == 0.02  # the last one wins
    saved = tmp_path / "run" / "hydra" / ".hydra"
    saved.mkdir(parents=True)
    (saved / "config.yaml").write_text("actor_rollout_ref:\n  actor:\n    policy_loss:\n      kl_bound: 0.03\n")
    assert quickstart.configured_kl_bound([f"{key}=0.1"], str(tmp_path / "run")) == 0.03  # the composed config
    assert quickstart.configured_kl_bound([f"{key}=0.1"], str(tmp_path / "elsewhere")) == 0.1

    rows = read_metrics(_fixture("grpo_troll_seed0", "jsonl"))
    for row in rows:
        row["training/rollout_probs_diff_max"] = 1.5e-5
    summary = quickstart.summarize(rows, 60.0, "troll", kl_bound=0.02)
    assert summary["troll"]["kl_bound"] == 0.02
    assert summary["rollout_actor_prob_diff_max"] == summary["rollout_actor_logprob_gap_max"] == 1.5e-5
    quickstart._print_summary("TROLL", summary)
    out = capsys.readouterr().out
    assert "bound 0.02)" in out and "bound 0.05" not in out
    violation = summary["troll"]["bound_violation_max"]
    assert f"bound violation (max, 0 unless the solver hit eta_max): {violation:.1e}" in out
    assert "rollout vs actor token-probability difference (max): 1.5e-05" in out and "log-prob gap" not in out

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
"""Learning benchmark: TROLL vs clip (GRPO, GSPO), several seeds, verl's real trainer and vLLM rollout on CPU.

``--model tiny`` (default) is the built-in task; ``--model smollm2`` the real pretrained LLM (SmolLM2-135M-Instruct,
:mod:`troll_verl.assets.smollm2`). For every (variant, loss, seed) it runs the quickstart's configuration for that model
(:func:`troll_verl.tools.quickstart.cpu_run_overrides`) and reports, per variant, TROLL against its clip baseline
measured in the same invocation:

- steps to target: the first step whose trailing 5-step mean train reward reaches ``--target`` (a run that never
  gets there counts as ``steps + 1`` and is marked ``>``);
- final reward: mean train reward over the last min(10, steps // 3) steps (at least 1: 3 of 10, 10 of 40); gain:
  that minus the mean of the first min(5, steps // 4) steps (at least 1: 2 of 10, 5 of 40); the step-1 reward
  (sampled from the same initial model by both losses: the paired sampling noise); final greedy validation accuracy;
- entropy over the same last steps; the share of tokens projected (TROLL) or clipped (clip), mean over steps;
- per phase (generation, old-log-prob pass, update) and per step the median seconds, and the trainer worker's peak
  resident memory, as TROLL / clip ratios per seed.

Variants: ``grpo`` (token ratio; clip = verl's ``vanilla`` with clip 0.2 and dual-clip 3; 2 optimizer steps per
batch, the quickstart's), ``grpo8`` (the same with 8 optimizer steps per batch, the paper's schedule), ``async1`` and
``async2`` (``grpo`` on verl's ``colocate_async`` trainer with 1 or 2 warm-up batches: stale data, reported with
its staleness and verl's KL(rollout ‖ old) estimate) and ``gspo``
(sequence ratio, ``seq-mean-token-mean``; clip = verl's ``gspo`` with clip 0.2 both ways; TROLL with
``ratio_level=sequence``).
Runs are interleaved seed by seed so machine noise spreads over all configurations. Each finished run's per-step
metrics (filtered) and its record are written to ``--results-dir`` at once; finished runs are reused, so an
interrupted benchmark loses nothing that finished and continues where it stopped, and ``--report-only`` regenerates
every table and plot from those files without running anything.

The stress map (``--stress``; docs/benchmarks.md, "Stress map", states its criteria): ``lr3e-5`` ... ``lr1e-4``
(``grpo`` at a larger learning rate), ``gspo8`` (GSPO with verl's own GSPO clip range 3e-4 / 4e-4 and 8 optimizer
steps per batch, against TROLL's sequence-level ratio), each with ``_tight`` / ``_loose`` second settings and an
``_upper`` TROLL arm; ``--stress`` adds per-arm collapse counts and the paired differences with 95 % intervals:

    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants lr1e-4 gspo8 lr5e-5 --seeds 0 1 2 \
        --steps 10 --stress --results-dir benchmarks/results/stress_map --out-dir outputs/stress_map

    .venv/bin/python scripts/bench_learning.py --seeds 0 1 2 --steps 60
    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants grpo grpo_upper --seeds 0 1 2 --steps 10
    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants async1 async2 grpo8 --steps 10 \
        --out-dir outputs/bench_staleness_smollm2   # the staleness study

``grpo8``'s mini-batches follow from the model's batch (``UPDATES_PER_BATCH``, :func:`arm_overrides`).

``grpo_upper`` is TROLL with ``old_estimate=upper`` (no clip arm of its own: compare it with ``grpo``'s).

``bypass`` is TROLL in verl's bypass mode (:mod:`troll_verl.bypass.mode`: the old distribution is the vLLM rollout's
top-K, no old-log-prob pass), ``bypass_bf16`` the same with a bf16 rollout against the fp32 actor (a stand-in for a
GPU's train-inference mismatch); neither has a clip arm of its own: run them with ``grpo`` (TROLL recomputing the old
distribution, and clip), and the report adds their mismatch table:

    .venv/bin/python scripts/bench_learning.py --model smollm2 --variants grpo bypass bypass_bf16 --steps 10 \
        --out-dir outputs/bench_bypass_smollm2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from troll_verl.tools.quickstart import MODELS, cpu_model, cpu_run_overrides, run_trainer

from . import after_mastery, late_decay, summary
from .arms import LEARNING_RATE, VARIANTS, arm_overrides
from .docs_block import STUDIES, write_study_docs
from .outcomes import collect, finished, run_stats
from .plots import plot_curves, plot_study
from .powered import collect_study, study_report
from .raw import load_raw, raw_path, record_failed_attempt, save_raw, versions
from .report import report, stress_report

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench_learning.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--target", type=float, default=0.5)
    default_variants = [v for v in VARIANTS if v in ("grpo", "grpo8", "grpo_upper", "gspo")]
    parser.add_argument(
        "--variants",
        nargs="+",
        default=default_variants,
        choices=list(VARIANTS),
        help=f"default: {' '.join(default_variants)}",
    )
    parser.add_argument("--out-dir", default="outputs/bench_learning", help="the runs' logs and full metrics")
    parser.add_argument(
        "--results-dir",
        default=None,
        help="finished runs' filtered per-step metrics, the input of every table and plot (commit "
        "it; default: <out-dir>/raw)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: print the tables (and --plot) from --results-dir"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run nothing: check every planned run's config with TROLL's dry run (no Ray, no model)",
    )
    parser.add_argument(
        "--stress",
        action="store_true",
        help="add the stress map's tables: collapses, and paired differences with 95 %% intervals",
    )
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument(
        "--task-hi",
        type=int,
        default=None,
        help="smollm2: addition with operands in [0, TASK_HI) (default: one-digit sums)",
    )
    losses = sorted({loss for arms in VARIANTS.values() for loss in arms})
    parser.add_argument(
        "--losses",
        nargs="+",
        default=None,
        choices=losses,
        help="run only these arms of each variant (default: all of them)",
    )
    parser.add_argument(
        "--test-freq", type=int, default=None, help="greedy validation every so many steps (default: the model's)"
    )
    parser.add_argument(
        "--study",
        nargs="?",
        const="powered",
        default=None,
        choices=STUDIES,
        help="run nothing: print a study's tables from --results-dir: the powered study's (and --plot) with --study "
        "alone, the late-decay study's stage 1 with --study late_decay (before its interim look only the progress), "
        "the README's results with --study summary (--results-dir benchmarks/results: every study's folder), the "
        "after-mastery probes' with --study after_mastery",
    )
    parser.add_argument(
        "--docs",
        default=None,
        help="with --study: also write the tables into this Markdown file, replacing its block "
        "between '<!-- report: <the --study command> -->' and '<!-- end report -->'",
    )
    parser.add_argument("--plot", default=None, help="write the reward curves here (PNG)")
    return parser


def main(argv=None) -> int:
    """Run the planned arms not yet finished (or none: ``--report-only``, ``--dry-run``, ``--study``) and print the
    tables; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.docs and not args.study:
        parser.error("--docs writes a study's tables: add --study (or --study late_decay)")
    if args.plot and args.study in ("late_decay", "summary", "after_mastery"):
        parser.error(f"--plot draws the powered study's curves; --study {args.study} has none: drop --plot")

    model = cpu_model(args.model, args.task_hi)
    results_dir = args.results_dir or os.path.join(args.out_dir, "raw")
    if args.study:
        results = collect_study(results_dir) if args.study == "powered" else None
        if args.study == "summary":
            tables = summary.report(results_dir)
        elif args.study == "after_mastery":
            tables = after_mastery.report(results_dir)
        else:
            tables = study_report(results) if results is not None else late_decay.report(results_dir)
        print(tables)
        if args.docs:
            print(f"docs: {write_study_docs(args.docs, tables, args.study)} block(s) of {args.docs} rewritten")
        if args.plot:
            print("plot: " + plot_study(results_dir, results, args.plot))
        return 0
    plan = [
        (v, loss, s)
        for s in args.seeds
        for v in args.variants
        for loss in VARIANTS[v]
        if args.losses is None or loss in args.losses
    ]
    if args.dry_run:
        return _dry_run_plan(plan, model, args)
    if not args.report_only:
        code = _run_plan(plan, model, args, results_dir)
        if code:
            return code
    results = collect(results_dir, plan, args.target, model.val_key, args.steps)
    missing = [f"{v}/{loss}/seed{s}" for v, loss, s in plan if f"{v}/{loss}/seed{s}" not in results]
    if missing:
        print(f"not in {results_dir} (not run, or fewer than {args.steps} steps): {' '.join(missing)}\n")
    print(report(results, args.seeds, args.steps, args.target, args.variants))
    if args.stress:
        print()
        print(stress_report(results, args.seeds, args.steps, args.variants))
    if args.plot:
        print(
            "\nplot: "
            + plot_curves(
                results_dir,
                args.variants,
                args.seeds,
                args.plot,
                f"GRPO on the {model.name} model's task, seeds {args.seeds}",
            )
        )
    return 0


def _run_overrides(model, assets, args, variant: str, loss: str, seed: int) -> list[str]:
    key = f"{variant}/{loss}/seed{seed}"
    run_dir = os.path.join(args.out_dir, variant, loss, f"seed{seed}")
    return cpu_run_overrides(
        model,
        assets,
        steps=args.steps,
        seed=seed,
        run_dir=run_dir,
        experiment=key.replace("/", "_"),
        lr=LEARNING_RATE.get(variant),
        test_freq=args.test_freq,
    ) + arm_overrides(variant, loss, model)


def _dry_run_plan(plan, model, args) -> int:
    """Every planned run's command through ``python -m troll_verl.tools.dry_run`` (one process, CPU platform)."""
    import tempfile

    assets = model.build(args.cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for variant, loss, seed in plan:
            path = os.path.join(tmp, f"{variant}.{loss}.seed{seed}")
            command = ["-m", "troll_verl.main", *_run_overrides(model, assets, args, variant, loss, seed)]
            with open(path, "wb") as f:
                f.write(b"".join(part.encode() + b"\0" for part in command))
            files.append(path)
        env = {**os.environ, "VERL_PLATFORM": "cpu"}
        return subprocess.run([sys.executable, "-m", "troll_verl.tools.dry_run", *files], env=env).returncode


def _run_plan(plan, model, args, results_dir: str) -> int:
    """Run every planned arm not yet in ``results_dir``, seed by seed; each finished run is saved at once."""
    assets = None
    for index, (variant, loss, seed) in enumerate(plan, 1):
        key = f"{variant}/{loss}/seed{seed}"
        rows, _ = load_raw(results_dir, key)
        if finished(rows, args.steps):
            print(f"[{index}/{len(plan)}] {key}: reusing finished run ({raw_path(results_dir, key)})", flush=True)
            continue
        assets = assets or model.build(args.cache_dir)
        print(f"[{index}/{len(plan)}] {key}: running {args.steps} steps ...", flush=True)
        run_dir = os.path.join(args.out_dir, variant, loss, f"seed{seed}")
        start = time.perf_counter()
        overrides = _run_overrides(model, assets, args, variant, loss, seed)
        result = run_trainer(overrides, run_dir, track_memory=True)
        if result.returncode != 0:
            print(f"  failed (exit {result.returncode}); see {result.log_path}", file=sys.stderr)
            record_failed_attempt(results_dir, key, result.returncode, result.log_path, time.perf_counter() - start)
            return 1
        wall = time.perf_counter() - start
        peak = result.worker_peak_rss_bytes
        record = {
            "key": key,
            "model": model.name,
            "steps": args.steps,
            "wall_s": round(wall, 1),
            "worker_peak_rss_gb": peak / 2**30 if peak else None,
            "overrides": overrides,
            "task_hi": args.task_hi,
            "val_key": model.val_key,
            "date": time.strftime("%Y-%m-%d"),
            **versions(),
        }
        save_raw(results_dir, key, result.rows(), record)
        r = run_stats(result.rows(), args.target, model.val_key, peak)
        print(
            f"  done in {wall:.0f} s: reward {r['reward_start']:.3f} -> {r['reward_final']:.3f}, steps to "
            f"target {r['steps_to_target']}, collapsed {r['collapsed']}",
            flush=True,
        )
    return 0

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
"""Plot verl runs against each other (TROLL vs clip): reward, validation, entropy, KL, η, constrained tokens.

Each RUN is a run directory, a log file, or LABEL=PATH. The format is detected per path:

- verl's file-logger JSONL (``trainer.logger=[...,file]``, path in ``VERL_FILE_LOGGER_PATH``; ``metrics.jsonl``);
- verl's console output (``trainer.log``, a ``tee`` of stdout, Ray job logs: ``step:N - key:value - ...`` lines);
- verl's tensorboard event files (``events.out.tfevents.*``, or the directory holding them; needs ``tensorboard``).

A run directory is searched for ``metrics.jsonl`` / ``*.jsonl``, then event files, then ``trainer.log`` / ``*.log``.
Writes ``<panel>.png`` per panel and ``overview.png`` into ``--out-dir`` and prints their paths and a table per run.

    .venv/bin/python scripts/plot_runs.py outputs/bench_learning/grpo/troll/seed0 \\
        outputs/bench_learning/grpo/clip/seed0 --labels TROLL clip --out-dir outputs/plots
    .venv/bin/python scripts/plot_runs.py TROLL=run1/trainer.log clip=tensorboard_log/proj/clip --metrics reward kl
"""

from __future__ import annotations

import argparse
import os
import sys

from troll_verl.tools.metrics_io import LogFormatError, ReaderUnavailableError, load_run
from troll_verl.tools.plotting import PANELS, run_table, write_plots


def _split_label(arg: str) -> tuple[str | None, str]:
    """``LABEL=PATH`` → (label, path); an argument that exists as a path is a path even if it contains ``=``."""
    if os.path.exists(arg) or "=" not in arg:
        return None, arg
    label, path = arg.split("=", 1)
    return label or None, path


def _default_labels(paths: list[str]) -> list[str]:
    """The shortest trailing path parts that tell the runs apart (``troll/seed0`` vs ``clip/seed0``)."""
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    for k in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(i) for i in range(len(paths))]


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(
        prog="plot_runs.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directory, log file, or LABEL=PATH")
    parser.add_argument("--labels", nargs="+", help="one label per RUN (overrides LABEL= and the default)")
    parser.add_argument("--out-dir", default="outputs/plots", help="where the PNGs go (default outputs/plots)")
    parser.add_argument(
        "--smooth",
        type=int,
        default=5,
        metavar="N",
        help="trailing mean over N steps for training curves; 1 = raw (default 5)",
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=list(PANELS),
        metavar="PANEL",
        help=f"panels to draw (default: every panel with data): {', '.join(PANELS)}",
    )
    parser.add_argument("--title", default="", help="figure title")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, read every run, write the plots, print their paths and the run table."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error("--smooth must be >= 1")
    if args.labels is not None and len(args.labels) != len(args.runs):
        parser.error(f"--labels has {len(args.labels)} labels for {len(args.runs)} runs")

    specs = [_split_label(arg) for arg in args.runs]
    labels = _default_labels([path for _, path in specs])
    labels = [given or default for (given, _), default in zip(specs, labels, strict=True)]
    if args.labels is not None:
        labels = list(args.labels)
    if len(set(labels)) != len(labels):
        parser.error(f"run labels must differ, got {labels}; use --labels or LABEL=PATH")

    runs = []
    for (_, path), label in zip(specs, labels, strict=True):
        try:
            runs.append(load_run(path, label=label))
        except ReaderUnavailableError as exc:
            print(f"plot_runs.py: skipping {label}: {exc}", file=sys.stderr)
        except LogFormatError as exc:
            print(f"plot_runs.py: error: {exc}", file=sys.stderr)
            return 2
    if not runs:
        print("plot_runs.py: error: no run could be read", file=sys.stderr)
        return 2
    try:
        written = write_plots(runs, args.out_dir, metrics=args.metrics, smooth_window=args.smooth, title=args.title)
    except ValueError as exc:
        print(f"plot_runs.py: error: {exc}", file=sys.stderr)
        return 2
    for run in runs:
        print(f"{run.label}: {run.fmt} {run.source} ({len(run.rows)} logged steps)")
    print()
    print(run_table(runs))
    print()
    skipped = [name for name in (args.metrics or PANELS) if name not in written]
    if skipped:
        print(f"no data for panel(s): {', '.join(skipped)}")
    for name, path in written.items():
        print(f"wrote {path}" if name == "overview" else f"wrote {path}  ({name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

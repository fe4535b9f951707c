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
"""What the plugin's lazy registration saves: wall time of ``import verl`` in a fresh interpreter (TROLL's plugin runs
inside it and registers on each registry module's import), against ``import verl`` plus the registry modules an eager
registration would import (the policy-loss registry alone, and all four), interleaved per repeat; ratios against
``import verl`` measured in the same repeat.

    .venv/bin/python scripts/bench_import.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

REGISTRIES = (
    "verl.trainer.ppo.core_algos",
    "verl.trainer.ppo.v1",
    "verl.workers.engine",
    "verl.workers.rollout.replica",
)
ARMS = {
    "import verl (lazy registration)": ("verl",),
    "+ the policy-loss registry": ("verl", REGISTRIES[0]),
    "+ all four registries (eager registration)": ("verl", *REGISTRIES),
}


def _seconds(modules: tuple[str, ...]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], check=True, capture_output=True)
    return time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of each arm (median reported)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    times = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm, modules in ARMS.items():
            times[arm].append(_seconds(modules))
    base = times[next(iter(ARMS))]
    print(f"{args.repeats} repeats, interleaved; medians\n")
    print("| what is imported | seconds | / import verl | extra seconds per process |")
    print("|---|---|---|---|")
    for arm, values in times.items():
        ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
        extra = statistics.median(v - b for v, b in zip(values, base, strict=True))
        print(f"| {arm} | {statistics.median(values):.2f} | {ratio:.2f} | {extra:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
"""Rollout benchmark: the quickstart's TROLL run (verl's real trainer on CPU) per rollout backend, interleaved.

For each repetition and rollout backend it runs the quickstart's configuration (:func:`troll_verl.quickstart.
tiny_cpu_overrides`, same seed) and reports per backend, with ratios against the first backend listed:

- wall time of the whole run (Ray start to shutdown) and the time until step 1's metrics appear (start-up);
- median step time and median generation time per step (``timing_s/gen``);
- generation throughput: response tokens per second of ``timing_s/gen`` (verl's agent loop included).

    .venv/bin/python scripts/bench_rollout.py --steps 40 --repeats 2 --rollouts vllm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from troll_verl.quickstart import REWARD_KEY, read_metrics, run_trainer, tiny_cpu_overrides
from troll_verl.tiny import build_assets

# What selects each backend on top of the quickstart's overrides (which select vLLM). The retired transformers rollout
# was {"hf": ["actor_rollout_ref.rollout.name=hf"]} (see docs/benchmarks.md for the comparison made before it went).
ROLLOUTS = {"vllm": []}


def run_stats(rows: list[dict], wall_s: float, first_step_s: float | None, sequences: int) -> dict:
    train = [r for r in rows if REWARD_KEY in r][1:]  # step 1 carries one-off warm-up costs
    gen = [r["timing_s/gen"] for r in train]
    tokens = [r["response_length/mean"] * sequences for r in train]
    return {
        "wall_s": wall_s,
        "startup_s": first_step_s,
        "step_s": statistics.median(r["timing_s/step"] for r in train),
        "old_log_prob_s": statistics.median(r["timing_s/old_log_prob"] for r in train),
        "update_s": statistics.median(r["timing_s/update_actor"] for r in train),
        "gen_s": statistics.median(gen),
        "gen_tokens_per_s": sum(tokens) / sum(gen),
        "reward_start": statistics.mean(r[REWARD_KEY] for r in train[:5]),
        "reward_end": statistics.mean(r[REWARD_KEY] for r in train[-5:]),
    }


def report(results: dict[str, list[dict]]) -> str:
    names = list(results)
    base = {k: statistics.median(r[k] for r in results[names[0]]) for k in results[names[0]][0]}
    lines = [
        "| rollout | runs | wall time (s) | start-up to step 1 (s) | median step (s) | generation (s) "
        "| old-log-prob pass (s) | update (s) | generation throughput (tokens/s) | reward first 5 → last 5 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        runs = results[name]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}

        def cell(key, fmt=".1f", med=med, name=name):
            ratio = f" ({med[key] / base[key]:.2f}×)" if name != names[0] else ""
            return f"{med[key]:{fmt}}{ratio}"

        lines.append(
            f"| {name} | {len(runs)} | {cell('wall_s')} | {cell('startup_s')} | {cell('step_s', '.2f')} | "
            f"{cell('gen_s', '.2f')} | {cell('old_log_prob_s', '.2f')} | {cell('update_s', '.2f')} | "
            f"{cell('gen_tokens_per_s', '.0f')} | "
            f"{med['reward_start']:.3f} → {med['reward_end']:.3f} |"
        )
    lines.append("")
    lines.append(f"medians over runs (per-step figures: medians over steps 2 to the end); ratios against {names[0]}, "
                 "measured in the same invocation")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", nargs="+", default=list(ROLLOUTS), choices=list(ROLLOUTS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="outputs/bench_rollout")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)

    assets = build_assets(args.cache_dir)
    results_path = os.path.join(args.out_dir, "results.json")
    previous = json.load(open(results_path)) if os.path.exists(results_path) else {}
    results: dict[str, list[dict]] = {name: [] for name in args.rollouts}
    for rep in range(args.repeats):
        for name in args.rollouts:
            run_dir = os.path.join(args.out_dir, name, f"rep{rep}")
            done = previous.get(name, [])
            rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
            if rep < len(done) and sum(1 for r in rows if REWARD_KEY in r) >= args.steps:
                print(f"[rep {rep + 1}/{args.repeats}] {name}: reusing the finished run", flush=True)
                results[name].append(run_stats(rows, done[rep]["wall_s"], done[rep]["startup_s"], 16 * 8))
                continue
            print(f"[rep {rep + 1}/{args.repeats}] {name}: {args.steps} steps ...", flush=True)
            overrides = tiny_cpu_overrides(assets, steps=args.steps, seed=args.seed, run_dir=run_dir,
                                           experiment=f"bench_rollout_{name}") + ROLLOUTS[name]  # fmt: skip
            start = time.perf_counter()
            first: list[float] = []

            def on_step(row, first=first, start=start):
                if not first and REWARD_KEY in row:
                    first.append(time.perf_counter() - start)

            result = run_trainer(overrides, run_dir, on_step=on_step)
            if result.returncode != 0:
                print(f"  failed (exit {result.returncode}); see {result.log_path}", file=sys.stderr)
                return 1
            stats = run_stats(result.rows(), result.wall_seconds, first[0] if first else None, 16 * 8)
            results[name].append(stats)
            print("  " + json.dumps({k: round(v, 3) for k, v in stats.items()}), flush=True)
            os.makedirs(args.out_dir, exist_ok=True)
            with open(results_path, "w") as f:  # after every run, so an interrupted benchmark continues
                json.dump(results, f, indent=2)
    print()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
"""Learning benchmark on the built-in task: TROLL vs clip (GRPO and GSPO), several seeds, verl's real trainer on CPU.

For every (variant, loss, seed) it runs the quickstart's configuration (:func:`troll_verl.quickstart.
tiny_cpu_overrides`) and reports, per variant, TROLL against its clip baseline measured in the same invocation:

- steps to target: the first step whose trailing 5-step mean train reward reaches ``--target`` (a run that never
  gets there counts as ``steps + 1`` and is marked ``>``);
- final reward: mean train reward over the last 10 steps; gain: that minus the mean of the first 5 steps; the
  step-1 reward (sampled from the same initial model by both losses: the paired sampling noise); final greedy
  validation accuracy;
- entropy over the last 10 steps.

Variants: ``grpo`` (token ratio; clip = verl's ``vanilla`` with clip 0.2 and dual-clip 3; 2 optimizer steps per
batch, the quickstart's), ``grpo8`` (the same with 8 optimizer steps per batch, the paper's schedule) and ``gspo``
(sequence ratio, ``seq-mean-token-mean``; clip = verl's ``gspo`` with clip 0.2 both ways; TROLL with
``ratio_level=sequence``).
Runs are interleaved seed by seed so machine noise spreads over all configurations; finished runs are reused, so
an interrupted benchmark continues where it stopped.

    .venv/bin/python scripts/bench_learning.py --seeds 0 1 2 --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from troll_verl.plotting import smooth
from troll_verl.quickstart import REWARD_KEY, VAL_KEY, read_metrics, run_trainer, tiny_cpu_overrides
from troll_verl.tiny import build_assets

# 16 prompts per batch (tiny_cpu_overrides' default) in mini-batches of 2 prompts (16 sequences)
_EIGHT_UPDATES = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
]

VARIANTS = {
    "grpo": {
        "troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"],
        "clip": ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor_rollout_ref.actor.clip_ratio=0.2"],
    },
    # the paper's update schedule: 8 optimizer steps per batch (there: 256 prompts, mini-batch 32), so later
    # mini-batches are off-policy and the trust region / clip has work to do
    "grpo8": {
        "troll": ["actor_rollout_ref.actor.policy_loss.loss_mode=troll", *_EIGHT_UPDATES],
        "clip": ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor_rollout_ref.actor.clip_ratio=0.2",
                 *_EIGHT_UPDATES],  # fmt: skip
    },
    "gspo": {
        "troll": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=troll",
            "actor_rollout_ref.actor.policy_loss.ratio_level=sequence",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        ],
        "clip": [
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            "actor_rollout_ref.actor.clip_ratio_low=0.2",
            "actor_rollout_ref.actor.clip_ratio_high=0.2",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        ],
    },
}


def steps_to_target(rewards: list[float], target: float, window: int = 5) -> int | None:
    """The first step whose trailing ``window``-step mean reaches ``target`` (full windows only), else None."""
    means = smooth(rewards, window)
    return next((i + 1 for i in range(window - 1, len(means)) if means[i] >= target), None)


def run_stats(rows: list[dict], target: float) -> dict:
    train = [r for r in rows if REWARD_KEY in r]
    rewards = [r[REWARD_KEY] for r in train]
    val = [r[VAL_KEY] for r in rows if VAL_KEY in r]
    entropy = [r["actor/entropy"] for r in train if "actor/entropy" in r]
    return {
        "steps": len(train),
        "steps_to_target": steps_to_target(rewards, target),
        "reward_step1": rewards[0],  # both losses sample step 1 from the same model: the paired sampling noise
        "reward_start": statistics.mean(rewards[:5]),
        "reward_final": statistics.mean(rewards[-10:]),
        "gain": statistics.mean(rewards[-10:]) - statistics.mean(rewards[:5]),
        "val_final": val[-1] if val else None,
        "entropy_final": statistics.mean(entropy[-10:]) if entropy else None,
        "seconds_per_step": statistics.median(r["timing_s/step"] for r in train[1:]) if len(train) > 1 else None,
    }


def _fmt_steps(values: list[int | None], steps: int) -> str:
    return ", ".join(str(v) if v is not None else f">{steps}" for v in values)


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def report(results: dict, seeds: list[int], steps: int, target: float) -> str:
    lines = [
        f"target: trailing 5-step mean train reward >= {target}; seeds {seeds}; {steps} steps; "
        "unreached counts as steps+1",
        "",
        "| variant | loss | steps to target (per seed) | mean steps | step-1 reward (per seed) | gain | final reward "
        "| final val acc | final entropy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for variant in VARIANTS:
        means = {}
        for loss in ("troll", "clip"):
            runs = [results.get(f"{variant}/{loss}/seed{s}") for s in seeds]
            runs = [r for r in runs if r is not None]
            if not runs:
                continue
            reached = [r["steps_to_target"] for r in runs]
            means[loss] = statistics.mean(v if v is not None else steps + 1 for v in reached)
            vals = [r["val_final"] for r in runs if r["val_final"] is not None]
            step1 = ", ".join(f"{r['reward_step1']:.3f}" for r in runs)
            lines.append(
                f"| {variant} | {loss} | {_fmt_steps(reached, steps)} | {means[loss]:.1f} | "
                f"{step1} | {_mean_sd([r['gain'] for r in runs])} | {_mean_sd([r['reward_final'] for r in runs])} | "
                f"{_mean_sd(vals) if vals else 'n/a'} | {_mean_sd([r['entropy_final'] for r in runs])} |"
            )
        if len(means) == 2:
            ratios[variant] = means["troll"] / means["clip"]
    lines.append("")
    for variant, ratio in ratios.items():
        pairs = [(results.get(f"{variant}/troll/seed{s}"), results.get(f"{variant}/clip/seed{s}")) for s in seeds]
        time_ratios = [t["seconds_per_step"] / c["seconds_per_step"] for t, c in pairs
                       if t and c and t["seconds_per_step"] and c["seconds_per_step"]]  # fmt: skip
        lines.append(f"{variant}: TROLL / clip mean steps to target = {ratio:.2f}; median seconds per step, TROLL / "
                     f"clip per seed: {', '.join(f'{r:.2f}' for r in time_ratios)}")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out-dir", default="outputs/bench_learning")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)

    assets = build_assets(args.cache_dir)
    results_path = os.path.join(args.out_dir, "results.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    plan = [(v, loss, s) for s in args.seeds for v in args.variants for loss in ("troll", "clip")]
    for index, (variant, loss, seed) in enumerate(plan, 1):
        key = f"{variant}/{loss}/seed{seed}"
        run_dir = os.path.join(args.out_dir, variant, loss, f"seed{seed}")
        rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
        if sum(1 for r in rows if REWARD_KEY in r) >= args.steps and key in results:
            print(f"[{index}/{len(plan)}] {key}: reusing finished run", flush=True)
            results[key] = run_stats(rows, args.target)  # from its log, so new statistics apply to old runs
            continue
        print(f"[{index}/{len(plan)}] {key}: running {args.steps} steps ...", flush=True)
        start = time.perf_counter()
        overrides = tiny_cpu_overrides(assets, steps=args.steps, seed=seed, run_dir=run_dir,
                                       experiment=key.replace("/", "_")) + VARIANTS[variant][loss]  # fmt: skip
        result = run_trainer(overrides, run_dir)
        if result.returncode != 0:
            print(f"  failed (exit {result.returncode}); see {result.log_path}", file=sys.stderr)
            return 1
        results[key] = run_stats(result.rows(), args.target)
        os.makedirs(args.out_dir, exist_ok=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=2)
        r = results[key]
        print(f"  done in {time.perf_counter() - start:.0f} s: reward {r['reward_start']:.3f} -> "
              f"{r['reward_final']:.3f}, steps to target {r['steps_to_target']}", flush=True)  # fmt: skip
    os.makedirs(args.out_dir, exist_ok=True)
    with open(results_path, "w") as f:  # reused runs' statistics were recomputed from their logs
        json.dump(results, f, indent=2)
    print()
    print(report(results, args.seeds, args.steps, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
"""One run's outcomes from its per-step metrics: rewards, steps to target, entropy, the share constrained, timing,
staleness and the studies' collapse rules."""

from __future__ import annotations

import statistics

from troll_verl.tools.plotting import smooth
from troll_verl.tools.quickstart import REWARD_KEY, VAL_KEY, reward_window

from .raw import LENGTH_KEY, load_raw

__all__ = [
    "COLLAPSE_LENGTH",
    "steps_to_target",
    "run_stats",
    "below_half_peak",
    "finished",
    "recorded_stats",
    "collect",
]

# the stress map's collapse criterion on answers (tokens): a policy that answers in fewer has stopped answering
COLLAPSE_LENGTH = 4.0


def steps_to_target(rewards: list[float], target: float, window: int = 5) -> int | None:
    """The first step whose trailing ``window``-step mean reaches ``target`` (full windows only), else None."""
    means = smooth(rewards, window)
    return next((i + 1 for i in range(window - 1, len(means)) if means[i] >= target), None)


def _median_after_first(train: list[dict], key: str) -> float | None:
    values = [r[key] for r in train[1:] if key in r]  # step 1 carries one-off warm-up costs
    return statistics.median(values) if values else None


def _mean_of(train: list[dict], key: str) -> float | None:
    values = [r[key] for r in train if key in r]
    return statistics.mean(values) if values else None


def run_stats(rows: list[dict], target: float, val_key: str = VAL_KEY, peak_rss: int | None = None) -> dict:
    """One run's statistics from its metrics rows (the stress map's criteria: :func:`outcome`)."""
    train = [r for r in rows if REWARD_KEY in r]
    rewards = [r[REWARD_KEY] for r in train]
    val = [r[val_key] for r in rows if val_key in r]
    # the old-log-prob pass's entropy, or (bypass mode: no such pass) the update pass's
    entropy = [r.get("actor/entropy", r.get("actor/entropy_loss")) for r in train]
    entropy = [v for v in entropy if v is not None]
    lengths = [r[LENGTH_KEY] for r in train if LENGTH_KEY in r]
    # TROLL's projected share, or the share clip clipped (DPPO: the share its divergence mask dropped)
    constrained = [r.get("actor/troll/projected_frac", r.get("actor/pg_clipfrac")) for r in train]
    constrained = [v for v in constrained if v is not None]
    w_start, w_final = reward_window(len(train)), min(10, max(1, len(train) // 3))
    return {
        "constrained_frac": statistics.mean(constrained) if constrained else None,
        # how stale the data was: policy versions between sampling and training (verl's async trainers log it), and
        # verl's sampled-token estimate of KL(rollout policy || old policy), mean over steps
        "staleness": _mean_of(train, "training/off_policy/trajectory_staleness/mean"),
        "kl_rollout": _mean_of(train, "rollout_corr/kl"),
        # how far each update moved the policy from π_old before its optimizer step (verl's k1 estimate on the sampled
        # tokens, actor/ppo_kl, logged by both losses), mean over steps: more optimizer steps per batch raise it
        "kl_update": _mean_of(train, "actor/ppo_kl"),
        # bypass mode: the sparse KL between the rollout's and the actor's distributions before each step's first
        # update (the train-inference mismatch, plus staleness in the asynchronous trainers), and the share it projects
        "mismatch_kl_step1": train[0].get("actor/troll/mismatch_kl") if train else None,
        "mismatch_kl": _mean_of(train, "actor/troll/mismatch_kl"),
        "mismatch_projected": _mean_of(train, "actor/troll/mismatch_projected_frac"),
        "gen_s": _median_after_first(train, "timing_s/gen"),
        "old_log_prob_s": _median_after_first(train, "timing_s/old_log_prob"),
        "update_s": _median_after_first(train, "timing_s/update_actor"),
        "worker_peak_rss_gb": peak_rss / 2**30 if peak_rss else None,
        "steps": len(train),
        "steps_to_target": steps_to_target(rewards, target),
        "reward_step1": rewards[0],  # both losses sample step 1 from the same model: the paired sampling noise
        "reward_start": statistics.mean(rewards[:w_start]),
        "reward_final": statistics.mean(rewards[-w_final:]),
        "gain": statistics.mean(rewards[-w_final:]) - statistics.mean(rewards[:w_start]),
        "val_final": val[-1] if val else None,
        "entropy_final": statistics.mean(entropy[-w_final:]) if entropy else None,
        # mean answer length (tokens) over the last steps, verl's response_length/mean
        "length_final": statistics.mean(lengths[-w_final:]) if lengths else None,
        # the stress map's pre-stated criteria: collapsed when the final reward is below the step-1 reward or the
        # final answers are shorter than COLLAPSE_LENGTH tokens; learned when the final reward reaches the target
        "collapsed": bool(
            rewards
            and (
                statistics.mean(rewards[-w_final:]) < rewards[0]
                or (lengths and statistics.mean(lengths[-w_final:]) < COLLAPSE_LENGTH)
            )
        ),
        "learned": bool(rewards and statistics.mean(rewards[-w_final:]) >= target),
        # the powered study's primary outcome: mean train reward over every step of the run
        "reward_mean": statistics.mean(rewards) if rewards else None,
        # the powered study's added collapse rule: the trailing 5-step mean at the last step below half its peak
        "collapsed_peak": bool(rewards and below_half_peak(rewards)),
        "seconds_per_step": _median_after_first(train, "timing_s/step"),
    }


def below_half_peak(rewards: list[float], window: int = 5) -> bool:
    """Whether the trailing ``window``-step mean at the last step is below half of its largest value in the run."""
    means = smooth(rewards, window)[window - 1 :] or smooth(rewards, window)[-1:]
    return means[-1] < 0.5 * max(means)


def finished(rows: list[dict], steps: int) -> bool:
    """Whether a run's raw rows hold at least ``steps`` training steps (a shorter run is not a finished run)."""
    return sum(1 for r in rows if REWARD_KEY in r) >= steps


def recorded_stats(rows: list[dict], record: dict, target: float, val_key: str) -> dict:
    """:func:`run_stats` of a saved run, with the worker's peak memory its record names."""
    peak = record.get("worker_peak_rss_gb")
    return run_stats(rows, target, val_key, int(peak * 2**30) if peak else None)


def collect(results_dir: str, plan, target: float, val_key: str, steps: int) -> dict:
    """Statistics of every planned ``(variant, loss, seed)`` whose raw results hold at least ``steps`` steps."""
    results = {}
    for variant, loss, seed in plan:
        key = f"{variant}/{loss}/seed{seed}"
        rows, record = load_raw(results_dir, key)
        if finished(rows, steps):
            results[key] = recorded_stats(rows, record, target, val_key)
    return results

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
"""The late-decay study's plan as code (docs/benchmarks.md, "Late-decay study", fixed 2026-11-27 before its first run):
each run's outcomes, the two-look sequential test of the paired primary outcome, its power, and the reading rules.

Pure Python on a run's per-step metric rows (``troll_verl.tools.metrics_io``'s layout: one dict per step with
``step``); no verl. A look is computed only at the plan's looks (12 and 24 pairs): :func:`look` refuses any other n.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics

from troll_verl.tools.metrics_io import read_jsonl

from .stats import fisher_exact_p, sign_flip_p, t_interval

__all__ = [
    "SEEDS",
    "LOOKS",
    "T_BOUNDS",
    "PLANNING_SD",
    "EFFECT",
    "run_outcomes",
    "look",
    "sequential_power",
    "reading",
    "late_decay_counts",
]

REWARD_KEY = "critic/score/mean"
KL_KEY = "actor/ppo_kl"
ENTROPY_KEY = "actor/entropy"

SEEDS = tuple(range(200, 224))  # stage 1: 24 pairs, run in this order, TROLL first
LOOKS = (12, 24)  # the interim look (seeds 200-211) and the end
# O'Brien-Fleming's two-look bounds for two-sided alpha 0.05 (|z| >= 2.797, then 1.977) at the same nominal two-sided p
# on the paired t statistic with its own degrees of freedom
T_BOUNDS = {12: 3.474, 24: 2.089}
PLANNING_SD = 0.2
EFFECT = 0.1  # "no late-decay difference larger than 0.1"
LAST = (21, 30)  # the primary outcome's steps
PEAK_FROM = 5  # the peak's trailing 5-step means start at step 5
TARGET = 0.8  # steps to 0.8


def _trailing(rewards: dict[int, float], step: int, width: int = 5) -> float:
    return statistics.mean(rewards[s] for s in range(step - width + 1, step + 1))


def run_outcomes(rows: list[dict], val_key: str, steps: int = 30) -> dict:
    """One run's outcomes by the plan.

    Args:
        rows: the run's per-step metric rows (``step`` and the metrics; the training steps 1..``steps`` must all be
            there, validation rows may be separate or merged).
        val_key: the run's greedy validation accuracy metric.

    Returns:
        ``last10`` (mean train reward over steps 21-30), ``peak`` (largest trailing 5-step mean over steps 5-30),
        ``late_decay`` (last10 below half the peak), ``below_0_2``, ``held_out`` ({0, 10, 20, 30: accuracy or None};
        0: the untrained model),
        ``kl_mean`` and ``kl_max`` (of ``actor/ppo_kl`` over steps), ``entropy_last10``, ``steps_to_0_8`` (31: never).
    """
    rewards = {int(r["step"]): float(r[REWARD_KEY]) for r in rows if REWARD_KEY in r}
    missing = [s for s in range(1, steps + 1) if s not in rewards]
    if missing:
        raise ValueError(f"the run lacks the train reward of steps {missing}; the plan reads every step 1-{steps}")
    last10 = statistics.mean(rewards[s] for s in range(LAST[0], LAST[1] + 1))
    peak = max(_trailing(rewards, s) for s in range(PEAK_FROM, steps + 1))
    kls = [float(r[KL_KEY]) for r in rows if KL_KEY in r]
    entropy = [float(r[ENTROPY_KEY]) for r in rows if ENTROPY_KEY in r and LAST[0] <= int(r["step"]) <= LAST[1]]
    held_out = {s: None for s in (0, 10, 20, 30)}
    for r in rows:
        if val_key in r and int(r["step"]) in held_out:
            held_out[int(r["step"])] = float(r[val_key])
    reach = [s for s in range(PEAK_FROM, steps + 1) if _trailing(rewards, s) >= TARGET]
    return {
        "last10": last10,
        "peak": peak,
        "late_decay": last10 < peak / 2,
        "below_0_2": last10 < 0.2,
        "held_out": held_out,
        "kl_mean": statistics.mean(kls) if kls else None,
        "kl_max": max(kls) if kls else None,
        "entropy_last10": statistics.mean(entropy) if entropy else None,
        "steps_to_0_8": reach[0] if reach else steps + 1,
    }


def look(diffs: list[float]) -> dict:
    """The plan's look at ``n = len(diffs)`` pairs (TROLL − clip in last-10 reward, seeds in the plan's order).

    Returns:
        ``n``, ``mean``, ``lo``/``hi`` (95 % t interval), ``t``, ``bound``, ``crossed`` (|t| >= bound),
        ``sign_flip_p`` (exact, two-sided), ``sd``.

    Raises:
        ValueError: ``n`` is not one of :data:`LOOKS` (the plan allows no other look).
    """
    n = len(diffs)
    if n not in T_BOUNDS:
        raise ValueError(f"the plan looks at {LOOKS[0]} and {LOOKS[1]} pairs only, not at {n}: no unplanned look")
    mean, lo, hi = t_interval(diffs)
    sd = statistics.stdev(diffs)
    t = mean / (sd / math.sqrt(n)) if sd > 0 else math.copysign(math.inf, mean) if mean else 0.0
    return {"n": n, "mean": mean, "lo": lo, "hi": hi, "t": t, "bound": T_BOUNDS[n], "crossed": abs(t) >= T_BOUNDS[n],
            "sign_flip_p": sign_flip_p(diffs), "sd": sd}  # fmt: skip


def sequential_power(effect: float, sd: float, draws: int = 40_000, seed: int = 0) -> float:
    """Probability that the two-look design crosses a bound (either sign) when the paired differences are normal with
    mean ``effect`` and SD ``sd`` (Monte Carlo with a fixed generator, as the plan's power was computed).

    Each look's t is computed in float arithmetic (``math.fsum``), not ``statistics``' exact fractions (ten times
    slower): the same draws, and the same hits at the report's four settings (checked against the exact version)."""
    rng, hits = random.Random(seed), 0
    for _ in range(draws):
        sample = [rng.gauss(effect, sd) for _ in range(LOOKS[-1])]
        for n in LOOKS:
            part = sample[:n]
            mean = math.fsum(part) / n
            sample_sd = math.sqrt(math.fsum((x - mean) ** 2 for x in part) / (n - 1))
            if abs(mean / (sample_sd / math.sqrt(n))) >= T_BOUNDS[n]:
                hits += 1
                break
    return hits / draws


def reading(result: dict, final: bool, draws: int = 40_000) -> str:
    """The plan's reading rule for a look (``final``: the stage's last look, crossed or the end; ``draws``: the power
    simulation's, the plan's 40,000 unless a test asks for fewer)."""
    span = f"{result['mean']:+.3f} [{result['lo']:+.3f}, {result['hi']:+.3f}]"
    if not final:
        return f"the bound was not crossed at the look ({span}, |t| {abs(result['t']):.2f} < {result['bound']}): run on"
    if result["crossed"] and (result["lo"] > 0 or result["hi"] < 0):
        if result["lo"] > 0:
            return f"clip decayed late where TROLL held: {span} over the last 10 steps"
        return f"TROLL decayed late where clip held: {span} over the last 10 steps"
    if -EFFECT < result["lo"] and result["hi"] < EFFECT:
        return f"no late-decay difference larger than {EFFECT} ({span})"
    return (f"inconclusive ({span}; power for +0.10 at the planning SD {PLANNING_SD}: "
            f"{sequential_power(0.1, PLANNING_SD, draws):.0%}, at the observed SD {result['sd']:.3f}: "
            f"{sequential_power(0.1, result['sd'], draws):.0%})")  # fmt: skip


def late_decay_counts(troll: list[dict], clip: list[dict]) -> dict:
    """The secondary late-decay comparison: counts per arm and the two-sided Fisher exact p."""
    a, b = sum(r["late_decay"] for r in troll), sum(r["late_decay"] for r in clip)
    return {"troll": a, "clip": b, "n_troll": len(troll), "n_clip": len(clip),
            "fisher_p": fisher_exact_p(a, len(troll), b, len(clip))}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# the report (scripts/bench_learning.py --study late_decay): only what the plan allows at the pairs finished so far

VARIANT = "late8"


def collect(results_dir: str) -> dict[str, dict[int, dict]]:
    """Each finished stage-1 run's outcomes, ``{loss: {seed: run_outcomes(...)}}``, from the committed raw files
    ``<results_dir>/late8/<loss>/seed<N>.jsonl`` (and the ``.json`` record naming its validation metric)."""
    runs: dict[str, dict[int, dict]] = {"troll": {}, "clip": {}}
    for loss, by_seed in runs.items():
        for seed in SEEDS:
            path = os.path.join(results_dir, VARIANT, loss, f"seed{seed}")
            if os.path.isfile(path + ".jsonl") and os.path.isfile(path + ".json"):
                with open(path + ".json") as f:
                    record = json.load(f)
                by_seed[seed] = run_outcomes(read_jsonl(path + ".jsonl"), record["val_key"], record["steps"])
    return runs


def _pairs(runs: dict[str, dict[int, dict]]) -> list[int]:
    """The seeds, in the plan's order, up to the first one whose pair has not finished."""
    done = []
    for seed in SEEDS:
        if seed not in runs["troll"] or seed not in runs["clip"]:
            break
        done.append(seed)
    return done


def _failed_attempts(results_dir: str) -> int:
    path = os.path.join(results_dir, "failed_attempts.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def report(results_dir: str, draws: int = 40_000) -> str:
    """Stage 1's report by the plan: before the 12th pair only the progress (no outcome, no statistic); at a look its
    paired statistic and reading; at the stage's last look also the secondary outcomes and the achieved power
    (``draws``: the power simulation's, the plan's 40,000 unless a test asks for fewer)."""
    runs = collect(results_dir)
    pairs = _pairs(runs)
    n = len(pairs)
    lines = [
        f"**Stage 1 (late8, seeds {SEEDS[0]}-{SEEDS[-1]}):** {n} of {len(SEEDS)} pairs finished "
        f"({len(runs['troll'])} TROLL and {len(runs['clip'])} clip runs; {_failed_attempts(results_dir)} failed or "
        "stopped attempts recorded in failed_attempts.jsonl).",
        "",
    ]
    if n < LOOKS[0]:
        lines.append(f"No outcome is shown before the interim look at {LOOKS[0]} pairs (the plan: no unplanned look).")
        return "\n".join(lines) + "\n"
    diffs = [runs["troll"][s]["last10"] - runs["clip"][s]["last10"] for s in pairs]
    looks = [look(diffs[: LOOKS[0]])]
    if not looks[0]["crossed"] and n >= LOOKS[1]:
        looks.append(look(diffs[: LOOKS[1]]))
    final = looks[-1]["crossed"] or looks[-1]["n"] == LOOKS[1]
    lines += ["| look | pairs | TROLL − clip, last-10 reward [95 % CI] | t | bound | sign-flip p |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for result in looks:
        lines.append(f"| {'interim' if result['n'] == LOOKS[0] else 'end'} | {result['n']} | {result['mean']:+.3f} "
                     f"[{result['lo']:+.3f}, {result['hi']:+.3f}] | {result['t']:+.2f} | {result['bound']} | "
                     f"{result['sign_flip_p']:.4f} |")  # fmt: skip
    lines += ["", f"Reading: {reading(looks[-1], final, draws)}."]
    if not final:
        return "\n".join(lines) + "\n"
    used = pairs[: looks[-1]["n"]]
    troll, clip = [runs["troll"][s] for s in used], [runs["clip"][s] for s in used]
    counts = late_decay_counts(troll, clip)
    sd = looks[-1]["sd"]
    power = ", ".join(f"+{e:.2f}: {sequential_power(e, PLANNING_SD, draws):.0%} at SD {PLANNING_SD} and "
                      f"{sequential_power(e, sd, draws):.0%} at the observed {sd:.3f}"
                      for e in (0.10, 0.15))  # fmt: skip
    lines += ["", f"Achieved power ({power}).", "", "| secondary | TROLL | clip |", "|---|---|---|",
              f"| late decay (runs) | {counts['troll']}/{counts['n_troll']} | {counts['clip']}/{counts['n_clip']} "
              f"(Fisher p {counts['fisher_p']:.3f}) |",
              f"| ended below 0.2 (runs) | {sum(r['below_0_2'] for r in troll)} | "
              f"{sum(r['below_0_2'] for r in clip)} |"]  # fmt: skip
    for key, label in (("kl_mean", "update KL, mean"), ("kl_max", "update KL, largest step"),
                       ("entropy_last10", "entropy, steps 21-30"), ("steps_to_0_8", "steps to 0.8")):  # fmt: skip
        a, b = ([r[key] for r in arm if r[key] is not None] for arm in (troll, clip))
        lines.append(f"| {label} (mean) | {statistics.mean(a):.4g} | {statistics.mean(b):.4g} |" if a and b else
                     f"| {label} | n/a | n/a |")  # fmt: skip
    entropy = [t["entropy_last10"] - c["entropy_last10"] for t, c in zip(troll, clip, strict=True)
               if t["entropy_last10"] is not None and c["entropy_last10"] is not None]  # fmt: skip
    if entropy:
        lines.append(f"| entropy, steps 21-30, paired median TROLL − clip (a few failed runs pull the means) | "
                     f"{statistics.median(entropy):+.4f} (TROLL lower in {sum(e < 0 for e in entropy)}/"
                     f"{len(entropy)}) | |")  # fmt: skip
    for step in (10, 20, 30):
        d = [t["held_out"][step] - c["held_out"][step] for t, c in zip(troll, clip, strict=True)
             if t["held_out"][step] is not None and c["held_out"][step] is not None]  # fmt: skip
        if len(d) >= 2:
            mean, lo, hi = t_interval(d)
            lines.append(f"| held-out accuracy at step {step}, TROLL − clip | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] | |")
    return "\n".join(lines) + "\n"

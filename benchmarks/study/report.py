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
"""The learning benchmark's tables: per variant TROLL against its clip baseline (steps to target, rewards, cost
ratios, staleness, the bypass mismatch) and the stress map's outcomes and paired differences."""

from __future__ import annotations

import statistics

from troll_verl.tools.quickstart import reward_window

from .arms import BASELINE, STRESS_REGIMES, VARIANTS, clip_variant
from .stats import bootstrap_interval, t_interval

__all__ = ["report", "stress_report"]


def _fmt_steps(values: list[int | None], steps: int) -> str:
    return ", ".join(str(v) if v is not None else f">{steps}" for v in values)


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _ratio_cell(pairs, key) -> str:
    ratios = [t[key] / c[key] for t, c in pairs if t and c and t.get(key) and c.get(key)]
    return ", ".join(f"{r:.2f}" for r in ratios) if ratios else "n/a"


def report(results: dict, seeds: list[int], steps: int, target: float, variants=None) -> str:
    """The learning table: per variant and loss the steps to target, rewards, held-out accuracy and entropy; per
    variant the cost ratios TROLL / clip, the share constrained, staleness and KL; the bypass arms' mismatch."""
    variants = variants or list(VARIANTS)
    w_start, w_final = reward_window(steps), min(10, max(1, steps // 3))
    lines = [
        f"target: trailing 5-step mean train reward >= {target}; seeds {seeds}; {steps} steps; "
        f"unreached counts as steps+1; gain: mean of the last {w_final} steps minus the first {w_start}",
        "",
        "| variant | loss | steps to target (per seed) | mean steps | step-1 reward (per seed) | gain | final reward "
        "| final val acc | final entropy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for variant in variants:
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
    lines += [
        "",
        "Cost, TROLL / clip per seed (median seconds over steps 2+; the trainer worker's peak resident "
        "memory); share of tokens projected (TROLL) or clipped (clip), mean over steps:",
        "",
        "| variant | generation | old-log-prob pass | update | step | worker peak memory | projected (TROLL) "
        "| clipped (clip) | staleness (steps) | KL(rollout ‖ old), TROLL / clip | KL(old ‖ current) in the "
        "update, TROLL / clip |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        pairs = [
            (results.get(f"{variant}/troll/seed{s}"), results.get(f"{clip_variant(variant)}/clip/seed{s}"))
            for s in seeds
        ]
        if not any(t and c for t, c in pairs):
            continue
        troll_c = [t["constrained_frac"] for t, _ in pairs if t and t.get("constrained_frac") is not None]
        clip_c = [c["constrained_frac"] for _, c in pairs if c and c.get("constrained_frac") is not None]
        stale = [r["staleness"] for pair in pairs for r in pair if r and r.get("staleness") is not None]
        kl_cell, kl_update_cell = (_pair_mean_cell(pairs, key) for key in ("kl_rollout", "kl_update"))
        lines.append(
            f"| {variant} | {_ratio_cell(pairs, 'gen_s')} | {_ratio_cell(pairs, 'old_log_prob_s')} | "
            f"{_ratio_cell(pairs, 'update_s')} | {_ratio_cell(pairs, 'seconds_per_step')} | "
            f"{_ratio_cell(pairs, 'worker_peak_rss_gb')} | {_mean_sd(troll_c) if troll_c else 'n/a'} | "
            f"{_mean_sd(clip_c) if clip_c else 'n/a'} | {f'{statistics.mean(stale):.2f}' if stale else 'n/a'} | "
            f"{kl_cell} | {kl_update_cell} |"
        )
    mismatch = [(v, [results.get(f"{v}/troll/seed{s}") for s in seeds]) for v in variants]
    mismatch = [(v, [r for r in runs if r and r.get("mismatch_kl") is not None]) for v, runs in mismatch]
    if any(runs for _, runs in mismatch):
        lines += [
            "",
            "Train-inference mismatch in bypass mode (TROLL's sparse KL between the rollout's and the "
            "actor's distributions on each step's first micro-batch, before any update; per seed):",
            "",
            "| variant | step 1 | mean over steps | projected by the mismatch alone |",
            "|---|---|---|---|",
        ]
        for variant, runs in mismatch:
            if runs:
                step1 = ", ".join(f"{r['mismatch_kl_step1']:.2e}" for r in runs)
                mean = ", ".join(f"{r['mismatch_kl']:.2e}" for r in runs)
                lines.append(f"| {variant} | {step1} | {mean} | {_mean_sd([r['mismatch_projected'] for r in runs])} |")
    lines.append("")
    for variant, ratio in ratios.items():
        lines.append(f"{variant}: TROLL / clip mean steps to target = {ratio:.2f}")
    return "\n".join(lines)


def _pair_mean_cell(pairs, key) -> str:
    """``key``'s mean over seeds, TROLL / clip, from (troll, clip) run-statistics pairs."""
    values = [[p[i][key] for p in pairs if p[i] and p[i].get(key) is not None] for i in (0, 1)]
    return " / ".join(f"{statistics.mean(v):.2e}" if v else "n/a" for v in values)


def _paired(results: dict, troll_key: str, clip_key: str, seeds: list[int], key: str = "reward_final"):
    """``(seeds, differences)`` of ``key``, TROLL arm minus clip arm, over the seeds both finished."""
    both = [s for s in seeds if f"{troll_key}/seed{s}" in results and f"{clip_key}/seed{s}" in results]
    return both, [results[f"{troll_key}/seed{s}"][key] - results[f"{clip_key}/seed{s}"][key] for s in both]


def _diff_row(label: str, seeds: list[int], diffs: list[float]) -> str:
    per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
    if len(diffs) < 2:
        return f"| {label} | {len(diffs)} | {per_seed} | n/a | n/a | n/a |"
    mean, lo, hi = t_interval(diffs)
    b_lo, b_hi = bootstrap_interval(diffs)
    verdict = "yes" if lo > 0 or hi < 0 else "no"
    return (
        f"| {label} | {len(diffs)} | {per_seed} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | "
        f"[{b_lo:+.3f}, {b_hi:+.3f}] | {verdict} |"
    )


def _best_setting(results: dict, regime: str, loss: str, seeds: list[int]) -> str | None:
    """The regime setting (``regime``, ``_tight`` or ``_loose``) with ``loss``'s highest mean final reward over the
    seeds every measured setting finished."""
    settings = [v for v in (regime, f"{regime}_tight", f"{regime}_loose") if v in VARIANTS]
    measured = [v for v in settings if all(f"{v}/{loss}/seed{s}" in results for s in seeds)]
    if len(measured) < 2:
        return None
    return max(measured, key=lambda v: statistics.mean(results[f"{v}/{loss}/seed{s}"]["reward_final"] for s in seeds))


def stress_report(results: dict, seeds: list[int], steps: int, variants: list[str]) -> str:
    """The stress map's tables: per arm the pre-stated outcomes, and the paired differences TROLL − clip in final
    reward with their intervals (docs/benchmarks.md, "Stress map")."""
    lines = [
        "| variant | loss | seeds | final reward per seed | final reward | collapsed | learned | steps to target "
        "| held-out acc | entropy | answer length (tokens) | projected / clipped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        for loss in VARIANTS[variant]:
            runs = [results[f"{variant}/{loss}/seed{s}"] for s in seeds if f"{variant}/{loss}/seed{s}" in results]
            if not runs:
                continue
            reached = [r["steps_to_target"] if r["steps_to_target"] is not None else steps + 1 for r in runs]
            cells = []
            for k in ("val_final", "entropy_final", "length_final", "constrained_frac"):
                values = [r[k] for r in runs if r.get(k) is not None]
                cells.append(_mean_sd(values) if values else "n/a")
            per_seed = ", ".join(f"{r['reward_final']:.3f}" for r in runs)
            lines.append(
                f"| {variant} | {loss} | {len(runs)} | {per_seed} | "
                f"{_mean_sd([r['reward_final'] for r in runs])} | {sum(r['collapsed'] for r in runs)}/{len(runs)} | "
                f"{sum(r['learned'] for r in runs)}/{len(runs)} | {statistics.mean(reached):.1f} | "
                + " | ".join(cells)
                + " |"
            )
    lines += [
        "",
        "Paired differences in final reward (TROLL − clip unless named; same seed = same data order and "
        "first samples); 95 % intervals over seeds; separated = the t interval excludes 0:",
        "",
        "| comparison | seeds | per seed | mean | 95 % t interval | 95 % bootstrap | separated |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        if "clip" in VARIANTS[variant] and "troll" in VARIANTS[variant]:
            lines.append(_diff_row(variant, *_paired(results, f"{variant}/troll", f"{variant}/clip", seeds)))
        elif variant in BASELINE and VARIANTS[variant].keys() == {"troll"}:
            base = BASELINE[variant]
            lines.append(
                _diff_row(f"{variant} − {base}'s clip", *_paired(results, f"{variant}/troll", f"{base}/clip", seeds))
            )
            if "troll" in VARIANTS[base]:
                lines.append(
                    _diff_row(
                        f"{variant} − {base}'s TROLL (floor)",
                        *_paired(results, f"{variant}/troll", f"{base}/troll", seeds),
                    )
                )
    for regime in [v for v in variants if v in STRESS_REGIMES]:
        best = {loss: _best_setting(results, regime, loss, seeds) for loss in ("troll", "clip")}
        if all(best.values()):
            label = f"best of each in {regime}: TROLL {best['troll']} − clip {best['clip']} (chosen on these seeds)"
            lines.append(_diff_row(label, *_paired(results, f"{best['troll']}/troll", f"{best['clip']}/clip", seeds)))
    return "\n".join(lines)

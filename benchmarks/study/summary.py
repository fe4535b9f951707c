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
"""The README's results: one line of headline and one table row per pre-registered comparison, each computed from the
committed raw results by its own plan's code (:mod:`.powered`, :mod:`.late_decay`), never typed in.

``scripts/bench_learning.py --study summary --results-dir benchmarks/results --docs README.md`` rewrites the README's
block; tests/benchmarks/study/test_summary_on_cpu.py checks that the committed block is what it prints today.
"""

from __future__ import annotations

import os
import statistics

from . import late_decay as ld
from . import powered
from .arms import UPDATES_PER_BATCH
from .stats import fisher_exact_p, sign_flip_p, t_interval, t_power

__all__ = ["POWERED_DIR", "LATE_DECAY_DIR", "report"]

# the studies' raw results under --results-dir (benchmarks/results in the checkout)
POWERED_DIR = "powered_study"
LATE_DECAY_DIR = "late_decay"


def _span(mean: float, lo: float, hi: float) -> str:
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]".replace("-", "−")


def _below_untrained(runs: list[tuple[list[dict], dict]]) -> int:
    """How many of ``runs`` (``(rows, record)`` each) ended below their own step-0 (untrained) greedy held-out
    accuracy."""
    count = 0
    for rows, record in runs:
        val = [r[record["val_key"]] for r in rows if record["val_key"] in r]
        count += len(val) >= 2 and val[-1] < val[0]
    return count


def _powered_rows(results_dir: str) -> tuple[list[str], dict]:
    """The powered study's rows, and stage 1's figure for the headline."""
    from .raw import load_raw

    results = powered.collect_study(results_dir)
    rows, headline = [], {}
    for stage in powered.STUDY:
        if not powered.stage_complete(stage, results):
            continue
        updates = UPDATES_PER_BATCH.get(stage.variant, 2)
        regime = {
            "1": f"the paper's schedule ({updates} optimizer steps per batch), operands below 30, {stage.steps} steps",
            "2": "stage 1's regime and seeds 0-7, against verl's DPPO-Binary-KL (threshold 0.05)",
            "3": f"GSPO as the paper ran it (sequence ratio clipped at 0.2), {updates} optimizer steps per batch",
            "4": f"lr 1e-4 (5× the model's), {updates} optimizer steps per batch, {stage.steps} steps",
        }[stage.name]
        for a, b in stage.comparisons:
            if "troll" not in (a, b):
                continue  # DPPO − clip: in docs/benchmarks.md
            seeds = [s for s in stage.seeds if stage.key(a, s) in results and stage.key(b, s) in results]
            ra, rb = [results[stage.key(a, s)] for s in seeds], [results[stage.key(b, s)] for s in seeds]
            diffs = [x["reward_mean"] - y["reward_mean"] for x, y in zip(ra, rb, strict=True)]
            mean, lo, hi = t_interval(diffs)
            power = t_power(len(diffs), statistics.stdev(diffs), powered.EFFECT)
            reading = powered.reading(lo, hi, mean, a, b, power, stage.setting).split(" (")[0]
            corrected = 0.05 / len(stage.comparisons)
            p_value = sign_flip_p(diffs)
            if (lo > 0 or hi < 0) and p_value >= corrected:
                reading += (
                    f" (sign-flip p {p_value:.3f}, not below the {corrected:g} a correction for the stage's "
                    f"{len(stage.comparisons)} comparisons asks: a hint, not a finding)"
                )
            outcome = f"whole-run mean reward, TROLL − {powered.STUDY_LABEL[b]}: {_span(mean, lo, hi)}"
            if stage.primary == "collapses":
                ca = sum(x["collapsed"] or x["collapsed_peak"] for x in ra)
                cb = sum(y["collapsed"] or y["collapsed_peak"] for y in rb)
                p = fisher_exact_p(ca, len(ra), cb, len(rb))
                outcome = f"collapses {ca}/{len(ra)} against {cb}/{len(rb)} (Fisher p {p:.2f}); " + outcome
            if reading.startswith("inconclusive"):
                reading += f" (power {power:.0%} for ±{powered.EFFECT})"
            if stage.confirms:
                held = [x["val_final"] - y["val_final"] for x, y in zip(ra, rb, strict=True)]
                below = [_below_untrained([load_raw(results_dir, stage.key(x, s)) for s in seeds]) for x in (a, b)]
                outcome += (
                    f"; held-out accuracy {_span(*t_interval(held))}, yet below the untrained model's in "
                    f"{below[0]}/{len(seeds)} TROLL and {below[1]}/{len(seeds)} clip runs"
                )
            if stage.name == "1":
                headline = {"span": _span(mean, lo, hi), "n": len(diffs)}
            rows.append(f"| powered, stage {stage.name} | {regime} | {len(diffs)} | {outcome} | {reading} |")
    return rows, headline


def _late_decay_row(results_dir: str) -> tuple[list[str], dict]:
    """The late-decay study's row at its last look (none before its interim look), and its figure."""
    runs = ld.collect(results_dir)
    pairs = ld._pairs(runs)
    if len(pairs) < ld.LOOKS[0]:
        return [], {}
    diffs = [runs["troll"][s]["last10"] - runs["clip"][s]["last10"] for s in pairs]
    result = ld.look(diffs[: ld.LOOKS[0]])
    if not result["crossed"] and len(pairs) >= ld.LOOKS[1]:
        result = ld.look(diffs[: ld.LOOKS[1]])
    final = result["crossed"] or result["n"] == ld.LOOKS[-1]
    if not final:
        return [], {}
    used = pairs[: result["n"]]
    held = [runs["troll"][s]["held_out"][30] - runs["clip"][s]["held_out"][30] for s in used]
    untrained = {}
    for loss in ("troll", "clip"):
        untrained[loss] = sum(runs[loss][s]["held_out"][30] < runs[loss][s]["held_out"][0] for s in used)
    reading = ld.reading(result, final, draws=2_000).split(":")[0]
    span = _span(result["mean"], result["lo"], result["hi"])
    outcome = (
        f"reward over steps 21-30, TROLL − clip: **{span}**; held-out accuracy at step 30 "
        f"{_span(*t_interval(held))}, below the untrained model's in {untrained['troll']}/{len(used)} TROLL and "
        f"{untrained['clip']}/{len(used)} clip runs"
    )
    regime = (
        f"a task the model masters (one-digit sums), {UPDATES_PER_BATCH[ld.VARIANT]} optimizer steps per batch, "
        "30 steps"
    )
    return [f"| late decay | {regime} | {len(used)} | {outcome} | {reading} |"], {"span": span, "n": len(used)}


def report(results_dir: str) -> str:
    """The README's results block from ``results_dir`` (``benchmarks/results``): the headline, then the table."""
    rows, stage1 = _powered_rows(os.path.join(results_dir, POWERED_DIR))
    late_rows, late = _late_decay_row(os.path.join(results_dir, LATE_DECAY_DIR))
    lines = []
    if stage1 and late:
        lines += [
            "**At this scale TROLL did not learn better than clip.** Under the paper's update schedule the two were "
            f"within ±0.1 (whole-run mean reward {stage1['span']}, {stage1['n']} pairs); on a task the model masters, "
            f"TROLL ended lower ({late['span']} over the last 10 steps, {late['n']} pairs).",
            "",
        ]
    lines += [
        "| study | regime | pairs | outcome [95 % CI] | reading, by the plan fixed before its runs |",
        "|---|---|---|---|---|",
        *late_rows,
        *rows,
    ]
    return "\n".join(lines) + "\n"

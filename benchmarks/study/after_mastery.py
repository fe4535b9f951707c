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
"""The after-mastery probes' tables (docs/benchmarks.md, "After mastery", planned before their first runs): P1's
step-1 attribution, P2's mastered-phase signature and candidates, and P2's rule that picks the candidate a
confirmatory study tests, applied as the plan states it.

Pure Python on the committed raw files (``<results_dir>/p1``, ``<results_dir>/p2``); exploratory seeds only.
"""

from __future__ import annotations

import json
import os
import statistics

from troll_verl.tools.metrics_io import read_jsonl

from .late_decay import run_outcomes

__all__ = ["P1_ARMS", "P2_ARMS", "SEEDS", "mastered_signature", "choose_candidate", "report"]

SEEDS = (300, 301)
# (variant, loss) in the plans' order
P1_ARMS = (("late8", "troll"), ("late8", "clip"), ("probe_a0", "troll"), ("probe_upper", "troll"),
           ("probe_noproj", "troll"))  # fmt: skip
P2_ARMS = (("probe_diag", "troll"), ("late8", "clip"), ("cand_adv", "troll"), ("cand_upper", "troll"),
           ("cand_a0", "troll"))  # fmt: skip
CONTROL = ("probe_diag", "troll")
CANDIDATES = ("cand_adv", "cand_upper", "cand_a0")
UPDATES = 8  # optimizer steps per training step (late8's schedule)
MASTERED = (11, 30)  # the steps P2 reads the control's signature on
EFFECT = 0.1
_A = "actor/troll/"


def _load(results_dir: str, variant: str, loss: str, seed: int) -> tuple[list[dict], dict] | None:
    path = os.path.join(results_dir, variant, loss, f"seed{seed}")
    if not (os.path.isfile(path + ".jsonl") and os.path.isfile(path + ".json")):
        return None
    with open(path + ".json") as f:
        return read_jsonl(path + ".jsonl"), json.load(f)


def _step(rows: list[dict], step: int) -> dict:
    merged: dict = {}
    for row in rows:
        if int(row["step"]) == step:
            merged.update(row)
    return merged


def _p1_table(results_dir: str) -> list[str]:
    lines = [
        "| arm | seed | grad norm | update KL (`ppo_kl`) | projected / clipped | KL before | regression loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in SEEDS:
        for variant, loss in P1_ARMS:
            run = _load(results_dir, variant, loss, seed)
            if run is None:
                continue
            row = _step(run[0], 1)
            share = row.get(f"{_A}projected_frac", row.get("actor/pg_clipfrac"))
            klb, reg = row.get(f"{_A}kl_before"), row.get(f"{_A}regression_loss")
            lines.append(
                f"| {variant}/{loss} | {seed} | {row['actor/grad_norm']:.3f} | {row['actor/ppo_kl']:.4f} | "
                f"{share:.3f} | {'–' if klb is None else f'{klb:.4f}'} | {'–' if reg is None else f'{reg:.4f}'} |"
            )
    return lines


def mastered_signature(rows: list[dict]) -> dict | None:
    """The control's signature over :data:`MASTERED` (steps with the diagnostics' metrics): the share of optimizer steps
    whose mini-batch has no advantage, their mean gradient norm, the other optimizer steps' mean gradient norm, and the
    mean gradient norms of the two parts. None where a step lacks the diagnostics."""
    zero = zero_norm = other = other_norm = 0.0
    pg, reg = [], []
    for step in range(MASTERED[0], MASTERED[1] + 1):
        row = _step(rows, step)
        if f"{_A}zero_adv_frac" not in row:
            return None
        n_zero = round(row[f"{_A}zero_adv_frac"] * UPDATES)
        total = row["actor/grad_norm"] * UPDATES
        zero_sum = n_zero * row.get(f"{_A}zero_adv_grad_norm", 0.0)
        zero, zero_norm = zero + n_zero, zero_norm + zero_sum
        other, other_norm = other + UPDATES - n_zero, other_norm + total - zero_sum
        pg.append(row[f"{_A}grad_norm_pg"])
        reg.append(row[f"{_A}grad_norm_regression"])
    return {
        "zero_share": zero / (zero + other),
        "zero_grad_norm": zero_norm / zero if zero else 0.0,
        "other_grad_norm": other_norm / other if other else 0.0,
        "pg_grad_norm": statistics.mean(pg),
        "regression_grad_norm": statistics.mean(reg),
    }


def _h1_supported(signature: dict) -> bool:
    return signature["zero_share"] >= 0.25 and signature["zero_grad_norm"] >= 0.5 * signature["other_grad_norm"]


def choose_candidate(signatures: dict[int, dict], last10: dict[tuple[str, int], float]) -> tuple[str | None, str]:
    """P2's rule (docs/benchmarks.md, fixed before P2's first run): the candidate a confirmatory study tests, and why.

    Args:
        signatures: the control's :func:`mastered_signature` per seed.
        last10: last-10 reward per ``(variant, seed)``, the control's (``probe_diag``) and each candidate's.

    Returns:
        ``(variant or None, the reasoning)``.
    """
    h1 = all(_h1_supported(signatures[seed]) for seed in SEEDS)
    control = statistics.mean(last10[(CONTROL[0], seed)] for seed in SEEDS)
    if h1:
        harmed = all(last10[("cand_adv", seed)] < last10[(CONTROL[0], seed)] - EFFECT for seed in SEEDS)
        if not harmed:
            return "cand_adv", "H1 supported on both seeds, and cand_adv not more than 0.1 below the control on both"
    means = {c: statistics.mean(last10[(c, seed)] for seed in SEEDS) for c in CANDIDATES}
    best = max(means, key=means.get)
    why = "H1 supported, but cand_adv more than 0.1 below the control on both seeds; " if h1 else "H1 not supported; "
    if means[best] >= control + EFFECT:
        return best, why + f"{best} has the highest mean last-10 reward ({means[best]:.3f}), ≥ the control's + 0.1"
    return None, why + (
        f"no candidate's mean last-10 reward is ≥ the control's ({control:.3f}) + 0.1 (best: {best}, "
        f"{means[best]:.3f}): no confirmatory study"
    )


def _p2_tables(results_dir: str) -> list[str]:
    lines = [
        "| arm | seed | last-10 reward | held-out 0 / 10 / 20 / 30 | zero-advantage share, steps 11-30 | their grad "
        "norm | other grad norm | pg part | regression part | floor-only share, steps 1-4 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    signatures, last10, complete = {}, {}, True
    for seed in SEEDS:
        for variant, loss in P2_ARMS:
            run = _load(results_dir, variant, loss, seed)
            if run is None:
                complete = False
                continue
            rows, record = run
            out = run_outcomes(rows, record["val_key"], record["steps"])
            last10[(variant, seed)] = out["last10"]
            held = " / ".join(
                "–" if out["held_out"][s] is None else f"{out['held_out'][s]:.2f}" for s in (0, 10, 20, 30)
            )
            sig = mastered_signature(rows)
            if (variant, loss) == CONTROL and sig is not None:
                signatures[seed] = sig
            floor = [_step(rows, s).get(f"{_A}floor_only_frac") for s in range(1, 5)]
            cells = (
                ["–"] * 5
                if sig is None
                else [f"{sig['zero_share']:.2f}", f"{sig['zero_grad_norm']:.3f}", f"{sig['other_grad_norm']:.3f}",
                      f"{sig['pg_grad_norm']:.3f}", f"{sig['regression_grad_norm']:.3f}"]
            )  # fmt: skip
            floor_cell = "–" if None in floor else f"{statistics.mean(floor):.3f}"
            lines.append(
                f"| {variant}/{loss} | {seed} | {out['last10']:.3f} | {held} | {' | '.join(cells)} | {floor_cell} |"
            )
    if complete and len(signatures) == len(SEEDS):
        candidate, why = choose_candidate(signatures, last10)
        lines += ["", f"P2's rule: {'candidate ' + candidate if candidate else 'no candidate'} ({why})."]
    else:
        lines += ["", "P2's rule is applied once every planned run has finished."]
    return lines


def report(results_dir: str) -> str:
    """The probes' tables from ``results_dir`` (``benchmarks/results/after_mastery``)."""
    lines = ["**P1, step 1 on shared samples** (exploratory seeds):", "", *_p1_table(os.path.join(results_dir, "p1"))]
    lines += ["", "**P2, 30 steps: the mastered phase and the candidates** (exploratory seeds):", ""]
    lines += _p2_tables(os.path.join(results_dir, "p2"))
    return "\n".join(lines) + "\n"

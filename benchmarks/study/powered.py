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
"""The powered study's plan as code (docs/benchmarks.md, "Powered study"): its stages, the reading rules and the
tables that apply them to the committed raw results."""

from __future__ import annotations

import statistics

from troll_verl.tools.quickstart import MODELS

from .outcomes import finished, recorded_stats
from .raw import load_raw
from .stats import adjusted_difference, fisher_exact_p, sign_flip_p, t_interval, t_power

__all__ = [
    "EFFECT",
    "PAPER_SCHEDULE",
    "Stage",
    "STUDY",
    "STUDY_LABEL",
    "reading",
    "collect_study",
    "stage_complete",
    "study_report",
    "study_panels",
]

# docs/benchmarks.md, "Powered study": the plan (arms, seeds, n, outcomes, statistics, reading rules) was committed
# before the first run; these definitions apply it.
EFFECT = 0.1  # the difference the study is powered for, and the half-width of "no difference larger than"
PAPER_SCHEDULE = "under the paper's schedule"  # where stages 1-3 read an arm as learning faster


class Stage:
    """One stage of the powered study: its variant, losses, seeds, steps and paired comparisons (a, b: a − b).
    ``setting`` says where a reading has an arm learn faster; ``confirms`` names the earlier signal that an interval in
    TROLL's favour confirms and any other result withdraws (stage 4)."""

    def __init__(
        self,
        name,
        title,
        variant,
        losses,
        seeds,
        steps,
        comparisons,
        primary,
        test_freq,
        setting=PAPER_SCHEDULE,
        confirms=None,
    ):
        self.name, self.title, self.variant, self.losses = name, title, variant, losses
        self.seeds, self.steps, self.comparisons, self.primary = list(seeds), steps, comparisons, primary
        self.test_freq, self.setting, self.confirms = test_freq, setting, confirms

    def key(self, loss: str, seed: int) -> str:
        """The run of ``loss`` on ``seed`` in this stage, as the raw results name it (``<variant>/<loss>/seed<k>``)."""
        return f"{self.variant}/{loss}/seed{seed}"


STUDY = [
    Stage(
        "1",
        "TROLL vs clip, the paper's schedule",
        "paper8",
        ("troll", "clip"),
        range(15),
        30,
        [("troll", "clip")],
        "reward_mean",
        10,
    ),
    Stage(
        "2",
        "verl's DPPO-Binary-KL, paired with stage 1 on seeds 0-7",
        "paper8",
        ("troll", "clip", "dppo"),
        range(8),
        30,
        [("troll", "dppo"), ("dppo", "clip")],
        "reward_mean",
        10,
    ),
    Stage(
        "3",
        "GSPO as the paper ran it (sequence ratio clipped at 0.2)",
        "paper8_gspo",
        ("troll", "clip"),
        range(5),
        30,
        [("troll", "clip")],
        "collapses",
        10,
    ),
    Stage(
        "4",
        "the stress map's lr1e-4, fresh seeds",
        "lr1e-4",
        ("troll", "clip"),
        range(5, 19),
        10,
        [("troll", "clip")],
        "reward_mean",
        4,
        setting="at lr 1e-4",
        confirms="the stress map's lr 1e-4 signal (TROLL ahead in whole-run mean reward)",
    ),
]
STUDY_LABEL = {"troll": "TROLL", "clip": "clip", "dppo": "DPPO-KL"}


def reading(lo: float, hi: float, mean: float, a: str, b: str, power: float, setting: str = PAPER_SCHEDULE) -> str:
    """The plan's reading rule for a paired interval of ``a`` − ``b``."""
    if lo > 0 or hi < 0:
        winner = a if lo > 0 else b
        return f"{STUDY_LABEL[winner]} learned faster {setting} ({mean:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    if -EFFECT < lo and hi < EFFECT:
        return f"no difference larger than {EFFECT} at this scale ({mean:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    return f"inconclusive at this scale ({mean:+.3f} [{lo:+.3f}, {hi:+.3f}]; power {power:.0%} to detect ±{EFFECT})"


def collect_study(results_dir: str, target: float = 0.5) -> dict:
    """Run statistics of every finished run of every stage (``{stage.key(loss, seed): stats}``)."""
    results = {}
    for stage in STUDY:
        for loss in stage.losses:
            for seed in stage.seeds:
                key = stage.key(loss, seed)
                if key in results:  # stage 2 reuses stage 1's TROLL and clip runs
                    continue
                rows, record = load_raw(results_dir, key)
                if finished(rows, stage.steps):
                    val_key = record.get("val_key", MODELS["smollm2"].val_key)
                    results[key] = recorded_stats(rows, record, target, val_key)
    return results


def _cell(values: list[float], spec: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def stage_complete(stage: Stage, results: dict) -> bool:
    """Whether every planned run of ``stage`` is in ``results`` (``collect_study``'s): the plan fixes n and allows no
    interim look, so neither the tables nor the plot show a stage before then."""
    return all(stage.key(loss, seed) in results for loss in stage.losses for seed in stage.seeds)


def study_report(results: dict) -> str:
    """The powered study's tables (docs/benchmarks.md, "Powered study"): per stage and arm the per-seed primary
    outcome and the secondary ones, then the paired comparisons with the reading the plan's rules give."""
    lines = []
    for stage in STUDY:
        done = {loss: [s for s in stage.seeds if stage.key(loss, s) in results] for loss in stage.losses}
        finished = ", ".join(f"{STUDY_LABEL[loss]} {len(done[loss])}/{len(stage.seeds)}" for loss in stage.losses)
        lines += [
            f"**Stage {stage.name}: {stage.title}** ({stage.variant}, seeds {stage.seeds[0]}-{stage.seeds[-1]}, "
            f"{stage.steps} steps; runs finished: {finished})",
            "",
        ]
        if not stage_complete(stage, results):
            lines += [
                "Not summarised until every planned run of the stage has finished (the plan: fixed n, no "
                "interim look).",
                "",
            ]
            continue
        lines += [
            "| arm | whole-run mean reward per seed | whole-run mean | final reward | held-out acc | "
            "entropy | collapsed | KL(old ‖ new) per update | projected / clipped / masked | step s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for loss in stage.losses:
            runs = [results[stage.key(loss, s)] for s in done[loss]]
            if not runs:
                continue
            collapsed = sum(r["collapsed"] or r["collapsed_peak"] for r in runs)
            lines.append(
                f"| {STUDY_LABEL[loss]} | " + ", ".join(f"{r['reward_mean']:.3f}" for r in runs) + " | "
                f"{_cell([r['reward_mean'] for r in runs])} | {_cell([r['reward_final'] for r in runs])} | "
                f"{_cell([r['val_final'] for r in runs])} | {_cell([r['entropy_final'] for r in runs])} | "
                f"{collapsed}/{len(runs)} | {_cell([r['kl_update'] for r in runs], '.2e')} | "
                f"{_cell([r['constrained_frac'] for r in runs])} | "
                f"{_cell([r['seconds_per_step'] for r in runs], '.1f')} |"
            )
        lines += [
            "",
            "| comparison | pairs | primary: whole-run mean, per seed | mean | 95 % t interval | sign-flip p "
            "| SD | power for ±0.1 | final reward | entropy | entropy at equal final reward | step-1 reward "
            "equal | reading |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for a, b in stage.comparisons:
            seeds = [s for s in stage.seeds if stage.key(a, s) in results and stage.key(b, s) in results]
            ra, rb = [results[stage.key(a, s)] for s in seeds], [results[stage.key(b, s)] for s in seeds]
            diffs = [x["reward_mean"] - y["reward_mean"] for x, y in zip(ra, rb, strict=True)]
            mean, lo, hi = t_interval(diffs)
            sd = statistics.stdev(diffs)
            power = t_power(len(diffs), sd, EFFECT)
            final = [x["reward_final"] - y["reward_final"] for x, y in zip(ra, rb, strict=True)]
            f_mean, f_lo, f_hi = t_interval(final)
            entropy = [x["entropy_final"] - y["entropy_final"] for x, y in zip(ra, rb, strict=True)]
            e_mean, e_lo, e_hi = t_interval(entropy)
            adj, adj_lo, adj_hi = adjusted_difference(entropy, final)
            same_step1 = sum(abs(x["reward_step1"] - y["reward_step1"]) < 1e-9 for x, y in zip(ra, rb, strict=True))
            lines.append(
                f"| {STUDY_LABEL[a]} − {STUDY_LABEL[b]} | {len(diffs)} | "
                + ", ".join(f"{d:+.3f}" for d in diffs)
                + f" | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {sign_flip_p(diffs):.4f} | {sd:.3f} | {power:.0%} | "
                f"{f_mean:+.3f} [{f_lo:+.3f}, {f_hi:+.3f}] | {e_mean:+.3f} [{e_lo:+.3f}, {e_hi:+.3f}] | "
                f"{adj:+.3f} [{adj_lo:+.3f}, {adj_hi:+.3f}] | {same_step1}/{len(diffs)} | "
                f"{reading(lo, hi, mean, a, b, power, stage.setting)} |"
            )
            if stage.confirms:
                verdict = "confirmed" if a == "troll" and lo > 0 else "withdrawn"
                lines += [
                    "",
                    f"Primary outcome of this stage: {stage.confirms} {verdict} ({STUDY_LABEL[a]} − "
                    f"{STUDY_LABEL[b]} {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]; the plan: an interval that excludes "
                    "0 in TROLL's favour confirms it, any other result withdraws it).",
                ]
            if stage.primary == "collapses":
                ca = sum(x["collapsed"] or x["collapsed_peak"] for x in ra)
                cb = sum(y["collapsed"] or y["collapsed_peak"] for y in rb)
                p = fisher_exact_p(ca, len(ra), cb, len(rb))
                verdict = (
                    f"{STUDY_LABEL[a] if ca < cb else STUDY_LABEL[b]} collapsed less"
                    if p < 0.05
                    else "no difference in collapses detected"
                )
                lines += [
                    "",
                    f"Primary outcome of this stage, collapses: {STUDY_LABEL[a]} {ca}/{len(ra)}, "
                    f"{STUDY_LABEL[b]} {cb}/{len(rb)}, Fisher exact p = {p:.3f}: {verdict}.",
                ]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def study_panels(results: dict) -> list[list[tuple[Stage, str]]]:
    """The study plot's grid: a row per variant, a panel per arm, each arm in the first stage that has it (stage 2
    reuses stage 1's TROLL and clip) and only once that stage is complete (``stage_complete``)."""
    rows: dict[str, list[tuple[Stage, str]]] = {}
    seen = set()
    for stage in STUDY:
        for loss in stage.losses:
            if (stage.variant, loss) not in seen and stage_complete(stage, results):
                rows.setdefault(stage.variant, []).append((stage, loss))
            seen.add((stage.variant, loss))
    return list(rows.values())

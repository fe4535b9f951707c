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
"""The learning benchmark's plots: reward curves per variant, and per arm of the powered study."""

from __future__ import annotations

import statistics

from troll_verl.tools.plotting import smooth
from troll_verl.tools.quickstart import REWARD_KEY

from .arms import VARIANTS, clip_variant
from .powered import STUDY_LABEL, study_panels
from .raw import load_raw

__all__ = ["plot_curves", "plot_study"]


def plot_curves(results_dir: str, variants: list[str], seeds: list[int], path: str, title: str) -> str:
    """Train reward (trailing 3-step mean) against step, from the raw results: per variant one panel, a thin line per
    seed and the mean over seeds thick, TROLL and clip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(variants), 4)
    rows_of_panels = -(-len(variants) // columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(5 * columns, 3.6 * rows_of_panels), squeeze=False)
    for ax in axes.flat[len(variants) :]:
        ax.set_visible(False)
    colors = {"troll": "tab:blue", "clip": "tab:orange"}
    for ax, variant in zip(axes.flat, variants, strict=False):
        arms = [(variant, loss) for loss in VARIANTS[variant]]
        if "clip" not in VARIANTS[variant]:
            arms.append((clip_variant(variant), "clip"))
        for arm_variant, loss in arms:
            curves = []
            for seed in seeds:
                rows, _ = load_raw(results_dir, f"{arm_variant}/{loss}/seed{seed}")
                rewards = [r[REWARD_KEY] for r in rows if REWARD_KEY in r]
                if rewards:
                    curves.append(smooth(rewards, 3))
                    ax.plot(range(1, len(rewards) + 1), curves[-1], color=colors[loss], alpha=0.25, lw=1)
            if curves:
                n = min(len(c) for c in curves)
                mean = [statistics.mean(c[i] for c in curves) for i in range(n)]
                label = ("TROLL" if loss == "troll" else "clip") + (
                    "" if arm_variant == variant else f" ({arm_variant})"
                )
                ax.plot(range(1, n + 1), mean, color=colors[loss], lw=2.2, label=label)
        ax.set_title(variant)
        ax.set_xlabel("step")
        ax.set_ylabel("train reward (3-step mean)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_study(results_dir: str, results: dict, path: str) -> str:
    """Train reward against step, a panel per arm of the powered study (a row per variant, `study_panels`): a faint
    line per seed, the mean bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = study_panels(results)
    if not grid:
        return "no stage complete yet: nothing drawn"
    columns = max(len(row) for row in grid)
    fig, axes = plt.subplots(len(grid), columns, figsize=(4.2 * columns, 3.2 * len(grid)), squeeze=False, sharey=True)
    panels = []
    for row, ax_row in zip(grid, axes, strict=True):
        panels += zip(ax_row, row, strict=False)
        for ax in ax_row[len(row) :]:
            ax.set_visible(False)
    colors = {"troll": "tab:blue", "clip": "tab:orange", "dppo": "tab:green"}
    for ax, (stage, loss) in panels:
        curves = []
        for seed in stage.seeds:
            rows, _ = load_raw(results_dir, stage.key(loss, seed))
            rewards = [r[REWARD_KEY] for r in rows if REWARD_KEY in r]
            if rewards:
                curves.append(rewards)
                ax.plot(range(1, len(rewards) + 1), rewards, color=colors[loss], alpha=0.2, lw=0.8)
        if curves:
            n = min(len(c) for c in curves)
            ax.plot(
                range(1, n + 1), [statistics.mean(c[i] for c in curves) for i in range(n)], color=colors[loss], lw=2.4
            )
        ax.set_title(f"stage {stage.name}: {stage.variant}, {STUDY_LABEL[loss]} ({len(curves)} seeds)", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("train reward")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

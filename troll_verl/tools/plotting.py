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
"""Plot the metrics of verl runs (TROLL against the clip baseline): panels, smoothing, PNGs and a table.

The rows come from :mod:`troll_verl.tools.metrics_io` (any of verl's log formats, :func:`~.metrics_io.load_run`).
:func:`write_plots` draws the panels (:data:`PANELS`) of several runs, one PNG each plus an overview;
:func:`plot_runs` draws only the overview (what the quickstart writes as ``curves.png``); :func:`run_table` prints
each run's steps and rewards. ``scripts/plot_runs.py`` is the command line over both modules. Nothing here imports
verl; matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .metrics_io import REWARD_KEY, Run

__all__ = [
    "PANELS",
    "Panel",
    "val_keys",
    "smooth",
    "plot_runs",
    "write_plots",
    "run_table",
]


# ---------------------------------------------------------------------------------------------------------- panels

_VAL_CORE = re.compile(r"val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)")


def val_keys(rows: list[dict]) -> list[str]:
    """The validation keys logged: ``val-core/<data_source>/acc/mean@N`` (or ``.../reward/mean@N``), sorted.

    verl files the mean@N of ``acc`` (when the reward function returns one, else of ``reward``) for the largest N
    under ``val-core``; one key per data source.
    """
    return sorted({key for row in rows for key in row if _VAL_CORE.fullmatch(key)})


def _has(rows: list[dict], key: str) -> bool:
    return any(key in row for row in rows)


def _is_troll(rows: list[dict]) -> bool:
    return _has(rows, "actor/troll/kl_after")


@dataclass(frozen=True)
class _Series:
    key: str
    name: str  # legend suffix after the run's label ("" for the run's label alone)
    style: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Panel:
    """One plot: which series a run contributes (``series(rows)``), titles, and whether train smoothing applies."""

    name: str
    title: str
    ylabel: str
    series: Callable[[list[dict]], list[_Series]]
    smoothed: bool = True
    ylim: tuple[float, float] | None = None


def _val_series(rows: list[dict]) -> list[_Series]:
    keys = val_keys(rows)
    out = []
    for key in keys:
        match = _VAL_CORE.fullmatch(key)
        name = f"{match['source']} ({match['var']}@{match['n']})" if len(keys) > 1 else f"{match['var']}@{match['n']}"
        out.append(_Series(key, name, {"marker": "o", "linestyle": "--"}))
    return out


def _kl_series(rows: list[dict]) -> list[_Series]:
    if _is_troll(rows):
        return [
            _Series(
                "actor/troll/kl_before",
                r"before projection KL($\tilde\pi\|\pi_{old}$)",
                {"alpha": 0.55, "linestyle": ":"},
            ),
            _Series("actor/troll/kl_after", r"after projection KL($\pi\|\pi_{old}$)"),
        ]
    return [_Series("actor/ppo_kl", "actor/ppo_kl (k1 estimate)")] if _has(rows, "actor/ppo_kl") else []


def _constrained_series(rows: list[dict]) -> list[_Series]:
    if _is_troll(rows):
        return [_Series("actor/troll/projected_frac", "projected (TROLL)")]
    return [_Series("actor/pg_clipfrac", "clipped (pg_clipfrac)")] if _has(rows, "actor/pg_clipfrac") else []


def _simple(key: str) -> Callable[[list[dict]], list[_Series]]:
    return lambda rows: [_Series(key, "")] if _has(rows, key) else []


PANELS: dict[str, Panel] = {
    p.name: p
    for p in (
        Panel("reward", "train reward", f"{REWARD_KEY}", _simple(REWARD_KEY)),
        Panel("val", "validation (val-core mean@N)", "accuracy (or reward)", _val_series, smoothed=False),
        Panel("entropy", "policy entropy", "actor/entropy (nats/token)", _simple("actor/entropy")),
        Panel("kl", "KL to the old policy", "per-token KL (nats)", _kl_series),
        Panel("eta", "TROLL's η", "actor/troll/eta_mean", _simple("actor/troll/eta_mean")),
        Panel("constrained", "tokens projected / clipped", "fraction of tokens", _constrained_series),
    )
}


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` points, ignoring NaN (NaN where the whole window is NaN)."""
    if window <= 1:
        return list(values)
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def _points(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(row["step"], row[key]) for row in rows if key in row]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _draw(ax, panel: Panel, runs: list[Run], colors: dict[str, str], window: int) -> bool:
    """Draw one panel's series of every run on ``ax``; False when no run has any of them."""
    drawn = False
    for run in runs:
        for series in panel.series(run.rows):
            steps, values = _points(run.rows, series.key)
            if not steps:
                continue
            label = f"{run.label}: {series.name}" if series.name else run.label
            style = {"color": colors[run.label], "linewidth": 1.5, **series.style}
            if panel.smoothed and window > 1:
                ax.plot(steps, values, color=colors[run.label], alpha=0.18, linewidth=1.0)
                ax.plot(steps, smooth(values, window), label=label, **style)
            else:
                ax.plot(steps, values, label=label, **style)
            drawn = True
    title = panel.title + (f" ({window}-step mean)" if panel.smoothed and window > 1 else "")
    ax.set(title=title, xlabel="step", ylabel=panel.ylabel)
    if panel.ylim:
        ax.set_ylim(*panel.ylim)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    return drawn


def _panel_names(runs: list[Run], metrics: list[str] | None) -> list[str]:
    """The chosen panels (default all) that some run has data for; raises if none has, or a name is unknown."""
    names = list(PANELS) if metrics is None else list(metrics)
    unknown = [n for n in names if n not in PANELS]
    if unknown:
        raise ValueError(f"unknown panel(s) {unknown}; choose from {list(PANELS)}")
    with_data = [n for n in names if any(PANELS[n].series(run.rows) for run in runs)]
    if not with_data:
        raise ValueError(f"no run has data for any of the panels {metrics or list(PANELS)}")
    return with_data


def _as_runs(runs: dict[str, list[dict]] | list[Run]) -> list[Run]:
    if isinstance(runs, dict):
        return [Run(label=label, path="", fmt="rows", rows=rows) for label, rows in runs.items()]
    return list(runs)


def _colors(runs: list[Run]) -> dict[str, str]:
    return {run.label: f"C{i % 10}" for i, run in enumerate(runs)}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _overview(runs: list[Run], names: list[str], path: str, title: str, window: int) -> str:
    plt = _pyplot()
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    colors = _colors(runs)
    for ax, name in zip(axes.flat, names, strict=False):
        _draw(ax, PANELS[name], runs, colors, window)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_runs(
    runs: dict[str, list[dict]] | list[Run],
    path: str,
    title: str = "",
    *,
    metrics: list[str] | None = None,
    smooth_window: int = 5,
) -> str:
    """All panels that have data (or ``metrics``) of one or more runs in one PNG at ``path``; returns ``path``.

    Args:
        runs: label → rows (as the readers return them), or :class:`Run` objects.
        path: the PNG to write.
        title: figure title.
        metrics: panel names (keys of :data:`PANELS`); default all.
        smooth_window: trailing mean over this many steps for the training curves (1: raw).

    Raises:
        ValueError: an unknown panel name, or no run has data for any chosen panel.
    """
    run_list = _as_runs(runs)
    names = _panel_names(run_list, metrics)
    return _overview(run_list, names, path, title, smooth_window)


def write_plots(
    runs: dict[str, list[dict]] | list[Run],
    out_dir: str,
    *,
    metrics: list[str] | None = None,
    smooth_window: int = 5,
    title: str = "",
) -> dict[str, str]:
    """One PNG per panel (``<out_dir>/<panel>.png``) plus ``<out_dir>/overview.png``.

    Panels no run has data for are left out. Returns panel name → path, ``"overview"`` last.

    Raises:
        ValueError: an unknown panel name, or no run has data for any chosen panel.
    """
    run_list = _as_runs(runs)
    names = _panel_names(run_list, metrics)
    os.makedirs(out_dir, exist_ok=True)
    plt = _pyplot()
    colors = _colors(run_list)
    written = {}
    for name in names:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        _draw(ax, PANELS[name], run_list, colors, smooth_window)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        written[name] = os.path.join(out_dir, f"{name}.png")
        fig.savefig(written[name], dpi=110)
        plt.close(fig)
    written["overview"] = _overview(run_list, names, os.path.join(out_dir, "overview.png"), title, smooth_window)
    return written


def run_table(runs: list[Run]) -> str:
    """A plain-text table per run: format, training steps, first/last train reward, first/last validation."""

    def fmt(value: float | None, spec: str = ".3f") -> str:
        return "n/a" if value is None else format(value, spec)

    header = ("run", "format", "steps", "reward first", "reward last", "val first", "val last")
    lines = []
    for run in runs:
        _, rewards = _points(run.rows, REWARD_KEY)
        keys = val_keys(run.rows)
        _, vals = _points(run.rows, keys[0]) if keys else ([], [])
        lines.append((run.label, run.fmt, str(len(rewards)), fmt(rewards[0] if rewards else None),
                      fmt(rewards[-1] if rewards else None), fmt(vals[0] if vals else None),
                      fmt(vals[-1] if vals else None)))  # fmt: skip
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    out = []
    for row in [header, *lines]:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    if any(len(val_keys(run.rows)) > 1 for run in runs):
        out.append("(val: the first val-core key of each run)")
    return "\n".join(out)

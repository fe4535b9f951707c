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
"""Read the metrics of verl runs from any of verl's loggers and plot TROLL against the clip baseline.

Three log formats give the same rows, ``[{"step": int, "<metric>": float, ...}]`` sorted by step (a step logged
twice, as after a resume, is merged with the later value winning; every value is a float, NaN included):

- ``jsonl``: verl's file logger (``trainer.logger=[...,file]``; one ``{"step": N, "data": {...}}`` per line, path
  from ``VERL_FILE_LOGGER_PATH``), read by :func:`read_jsonl`;
- ``console``: verl's console logger (``step:N - key:value - ...`` lines, values printed with ``pprint`` such as
  ``np.float64(0.25)``), read from a captured stdout by :func:`read_console`; Ray's ``(TaskRunnerV1 pid=123)``
  prefixes, ANSI colours and lines that Ray's log monitor split in two are handled;
- ``tensorboard``: verl's tensorboard logger (``events.out.tfevents.*`` under ``$TENSORBOARD_DIR``), read by
  :func:`read_tensorboard` with the ``tensorboard`` package's event reader. Tensorboard stores scalars as float32,
  so its values are the other formats' values rounded to float32.

:func:`load_run` detects the format of a file or a run directory. :func:`write_plots` draws the panels
(:data:`PANELS`) of several runs, one PNG each plus an overview; :func:`plot_runs` draws only the overview (what
the quickstart writes as ``curves.png``). ``scripts/plot_runs.py`` is the command line over this module.
:func:`read_metrics` is the quickstart's tolerant JSONL reader for a file still being written. Nothing here
imports verl.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "REWARD_KEY",
    "FORMATS",
    "PANELS",
    "Panel",
    "LogFormatError",
    "ReaderUnavailableError",
    "Run",
    "read_metrics",
    "read_jsonl",
    "read_console",
    "read_tensorboard",
    "detect_format",
    "load_run",
    "val_keys",
    "smooth",
    "plot_runs",
    "write_plots",
    "run_table",
]

REWARD_KEY = "critic/score/mean"
FORMATS = ("jsonl", "console", "tensorboard")

_TB_PREFIX = "events.out.tfevents"
_FORMAT_HELP = (
    "expected verl's file-logger JSONL ({\"step\": N, \"data\": {...}} per line), verl's console output "
    "(lines 'step:N - key:value - ...') or a tensorboard event file (events.out.tfevents.*)"
)


class LogFormatError(ValueError):
    """A path that is missing, of an unknown format, or malformed; the message names the path (and line)."""


class ReaderUnavailableError(LogFormatError):
    """The reader for this format needs a package that is not installed (tensorboard)."""


@dataclass
class Run:
    """One run's metrics as read from ``path``.

    Args:
        label: the name in legends and the table.
        path: the file or directory given.
        fmt: ``jsonl``, ``console`` or ``tensorboard``.
        rows: ``[{"step": int, "<metric>": float, ...}]`` sorted by step.
        source: the file (or event-file directory) actually read.
    """

    label: str
    path: str
    fmt: str
    rows: list[dict] = field(default_factory=list)
    source: str = ""


def _merge(records: Iterable[tuple[int, dict]]) -> list[dict]:
    """Rows sorted by step; records of the same step are merged, later values winning."""
    by_step: dict[int, dict] = {}
    for step, data in records:
        by_step.setdefault(step, {}).update(data)
    return [{"step": step, **by_step[step]} for step in sorted(by_step)]


def _as_float(value) -> float | None:
    """A logged value as float: numbers and bools as such, JSON null (orjson's NaN) as NaN, anything else None."""
    if value is None:
        return math.nan
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None


# ----------------------------------------------------------------------------------------------- JSONL (file logger)


def read_jsonl(path: str, *, strict: bool = True) -> list[dict]:
    """Rows of verl's file-logger JSONL (``{"step": N, "data": {...}}`` per line).

    Non-numeric values are dropped (verl's console logger drops them too); JSON ``null`` (how orjson writes NaN)
    becomes NaN. A partially written last line is ignored.

    Args:
        path: the ``.jsonl`` file.
        strict: raise on a malformed line other than the last; with False such lines are skipped.

    Raises:
        LogFormatError: the file is missing or (strict) a line is not a file-logger record.
    """
    if not os.path.isfile(path):
        raise LogFormatError(f"{path}: no such file")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(n, line.strip()) for n, line in enumerate(f, 1)]
    lines = [(n, line) for n, line in lines if line]
    records = []
    for index, (lineno, line) in enumerate(lines):
        try:
            record = json.loads(line)
            if not (isinstance(record, dict) and isinstance(record.get("data"), dict)):
                raise ValueError("not an object with 'step' and 'data'")
            step = record["step"]
            if not isinstance(step, int) or isinstance(step, bool):
                raise ValueError(f"'step' is {step!r}, not an int")
        except (json.JSONDecodeError, ValueError, KeyError) as exc:
            if not strict or index == len(lines) - 1:  # a run still writing (or killed) leaves half a line
                continue
            raise LogFormatError(
                f"{path}:{lineno}: not a verl file-logger line ({exc}); expected {{\"step\": N, \"data\": {{...}}}}"
            ) from None
        data = {}
        for key, value in record["data"].items():
            number = _as_float(value)
            if number is not None:
                data[key] = number
        records.append((step, data))
    return _merge(records)


def read_metrics(path: str) -> list[dict]:
    """verl's file-logger JSONL as ``[{"step": int, **metrics}]``, tolerant of a file still being written.

    Returns ``[]`` while the file does not exist and skips lines that do not parse (what a polling reader needs);
    :func:`read_jsonl` and :func:`load_run` are the strict readers.
    """
    if not os.path.exists(path):
        return []
    return read_jsonl(path, strict=False)


# ------------------------------------------------------------------------------------------ console (stdout capture)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Ray's driver prints worker output as "(ActorName pid=123, ip=10.0.0.1) <line>" (ip only for remote nodes)
_RAY_PREFIX = re.compile(r"\((?P<who>[^()]*\bpid=[^()]*)\) ?")
_RAY_REPEATED = re.compile(r" \[repeated \d+x across cluster\].*$")
# the items may end in a partial " - " when Ray split the line right there
_STEP_LINE = re.compile(r"step:(?P<step>\d+)(?P<items>(?: - .*| -| )?)")
_NUMPY_SCALAR = re.compile(r"(?:np|numpy)\.[A-Za-z_]\w*\((?P<inner>.*)\)")
_LOOKAHEAD_LINES = 200  # how far to look for the rest of a step line split by Ray's log monitor
_MAX_FRAGMENTS = 8


def _console_value(text: str) -> float:
    """A value as verl's console logger prints it (``pprint.pformat``): ``0.25``, ``nan``, ``np.float64(0.25)``."""
    match = _NUMPY_SCALAR.fullmatch(text)
    if match:
        text = match["inner"]
    if text in ("True", "False"):
        return float(text == "True")
    if not text or text != text.strip():
        raise ValueError(text)
    return float(text)


def _parse_items(items: str) -> tuple[dict, str | None]:
    """``" - k:v - k:v"`` → (metrics, first unparseable item or None)."""
    metrics: dict[str, float] = {}
    if not items:
        return metrics, None
    if not items.startswith(" - "):
        return metrics, items
    for item in items[3:].split(" - "):
        key, sep, value = item.rpartition(":")
        if not sep or not key:
            return metrics, item
        try:
            metrics[key] = _console_value(value)
        except ValueError:
            return metrics, item
    return metrics, None


def _could_continue(content: str) -> bool:
    """Whether a line could be the rest of a split ``key:value - key:value`` list (no other whitespace)."""
    if not content or content.startswith("step:"):
        return False
    core = content.replace(" - ", "\0")
    core = re.sub(r"^(?: -|- | )", "", core)  # the split fell inside a " - " separator
    core = re.sub(r"(?: -| )$", "", core)
    return not any(ch.isspace() for ch in core)


def _console_lines(path: str) -> list[tuple[int, str, str]]:
    """(line number, Ray process or "", text) per line, ANSI colours and Ray's prefix removed."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read()
    out = []
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = _ANSI.sub("", raw)
        match = _RAY_PREFIX.match(line)
        who = ""
        if match:
            who, line = match["who"], line[match.end() :]
        segments = [s for s in line.split("\r") if s]  # tqdm's carriage returns: one line per redraw
        for segment in segments or [""]:
            out.append((lineno, who, _RAY_REPEATED.sub("", segment)))
    return out


def read_console(path: str) -> list[dict]:
    """Rows from captured console output of a verl run (``trainer.log``, a ``tee`` of stdout, Ray job logs).

    Recognises verl's console-logger lines ``step:N - key:value - key:value ...`` (``verl.utils.logger.
    aggregate_logger.concat_dict_to_str``), optionally behind Ray's ``(Actor pid=123)`` prefix and ANSI colours; every
    other line is ignored. Values may be plain (``0.25``, ``nan``, ``2``) or numpy reprs (``np.float64(0.25)``,
    ``np.int32(2)``). A long line that Ray's log monitor split is joined with its continuation(s) from the same
    Ray process (the longest join that parses). An unparseable value is an error, except on the last metric line
    of the file (a killed run).

    Raises:
        LogFormatError: the file is missing, a metric line has a value that is not a number, or no metric line.
    """
    if not os.path.isfile(path):
        raise LogFormatError(f"{path}: no such file")
    lines = _console_lines(path)
    step_lines = [i for i, (_, _, text) in enumerate(lines) if _STEP_LINE.fullmatch(text.lstrip())]
    consumed: set[int] = set()
    records = []
    for position, i in enumerate(step_lines):
        if i in consumed:
            continue
        lineno, who, text = lines[i]
        match = _STEP_LINE.fullmatch(text.lstrip())
        step, items = int(match["step"]), match["items"]
        # Candidates for the rest of a line Ray's log monitor split: the next lines of the same Ray process that
        # look like a fragment (output without Ray's prefix is not split).
        fragments: list[int] = []
        for j in range(i + 1, min(len(lines), i + 1 + _LOOKAHEAD_LINES) if who else i + 1):
            if lines[j][1] != who:
                continue
            if len(fragments) == _MAX_FRAGMENTS or not _could_continue(lines[j][2]):
                break
            fragments.append(j)
        metrics, bad = _parse_items(items)
        for k in range(len(fragments), 0, -1):  # the longest join that parses completely
            joined = items + "".join(lines[j][2] for j in fragments[:k])
            joined_metrics, joined_bad = _parse_items(joined)
            if joined_bad is None:
                metrics, bad = joined_metrics, None
                consumed.update(fragments[:k])
                break
        if bad is not None and position != len(step_lines) - 1:
            raise LogFormatError(
                f"{path}:{lineno}: cannot parse {bad[:80]!r} in verl's console line for step {step}; expected "
                "'key:value' with a number such as 0.25, nan or np.float64(0.25)"
            )
        records.append((step, metrics))
    if not records:
        raise LogFormatError(f"{path}: no verl metric lines ('step:N - key:value - ...') found; {_FORMAT_HELP}")
    return _merge(records)


# ----------------------------------------------------------------------------------------------------- tensorboard


def _event_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return sorted(
        os.path.join(path, name) for name in os.listdir(path) if name.startswith(_TB_PREFIX)
    )


def read_tensorboard(path: str) -> list[dict]:
    """Rows from verl's tensorboard logger: one event file, or every ``events.out.tfevents.*`` file in a directory.

    Reads scalar summaries (``add_scalar``'s ``simple_value`` and scalar tensors) with the ``tensorboard`` package's
    event-file loader; other summaries are ignored. Files are read in name (= creation time) order.

    Raises:
        ReaderUnavailableError: the ``tensorboard`` package is not installed.
        LogFormatError: the path is missing, holds no event file, or an event file cannot be read.
    """
    if not os.path.exists(path):
        raise LogFormatError(f"{path}: no such file or directory")
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise ReaderUnavailableError(
            f"{path}: reading tensorboard event files needs the 'tensorboard' package ({exc}); "
            "install it, or log with trainer.logger=[console,file] and plot the JSONL"
        ) from None
    files = _event_files(path)
    if not files:
        raise LogFormatError(f"{path}: no tensorboard event file ({_TB_PREFIX}.*) in this directory")
    records = []
    for file in files:
        try:
            for event in EventFileLoader(file).Load():
                if not event.HasField("summary"):
                    continue
                data = {}
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        data[value.tag] = float(value.simple_value)
                    elif value.HasField("tensor"):
                        array = tensor_util.make_ndarray(value.tensor)
                        if array.size == 1 and array.dtype.kind in "biuf":
                            data[value.tag] = float(array.reshape(()))
                if data:
                    records.append((int(event.step), data))
        except Exception as exc:  # the loader raises assorted errors on files that are not event files
            reason = f"{type(exc).__name__}: {exc}"
            raise LogFormatError(f"{file}: not a readable tensorboard event file ({reason})") from None
    if not records:
        raise LogFormatError(f"{path}: no scalar in the tensorboard event file(s) (empty, or not an event file)")
    return _merge(records)


# -------------------------------------------------------------------------------------------------- format detection


def _sniff_file(path: str) -> str | None:
    """The format of one file from its name and first lines, or None."""
    if os.path.basename(path).startswith(_TB_PREFIX):
        return "tensorboard"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 20)
    except OSError as exc:
        raise LogFormatError(f"{path}: cannot read ({exc})") from None
    first = next((line.strip() for line in head.splitlines() if line.strip()), "")
    if first.startswith("{"):
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            return "jsonl" if path.endswith(".jsonl") else None
        return "jsonl" if isinstance(record, dict) and "step" in record and "data" in record else None
    if any(_STEP_LINE.fullmatch(text.lstrip()) for _, _, text in _console_lines(path)):
        return "console"
    return None


def detect_format(path: str) -> tuple[str, str]:
    """``(format, file or directory to read)`` for a file or a run directory.

    A directory is searched in this order: ``metrics.jsonl`` (or its only ``*.jsonl``), tensorboard event files
    (in it, or in its only subdirectory that has any), ``trainer.log`` (or its only ``*.log``/``*.txt``/``*.out``
    with verl metric lines).

    Raises:
        LogFormatError: the path does not exist, or holds no (or more than one candidate) verl log.
    """
    if not os.path.exists(path):
        raise LogFormatError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        fmt = _sniff_file(path)
        if fmt is None:
            raise LogFormatError(f"{path}: not a verl metrics log; {_FORMAT_HELP}")
        return fmt, path
    names = sorted(os.listdir(path))
    if "metrics.jsonl" in names:
        return "jsonl", os.path.join(path, "metrics.jsonl")
    jsonl = [n for n in names if n.endswith(".jsonl")]
    if len(jsonl) == 1:
        return "jsonl", os.path.join(path, jsonl[0])
    if len(jsonl) > 1:
        raise LogFormatError(f"{path}: several JSONL files ({', '.join(jsonl)}); pass one of them")
    if any(n.startswith(_TB_PREFIX) for n in names):
        return "tensorboard", path
    tb_dirs = sorted({root for root, _, files in os.walk(path) if any(f.startswith(_TB_PREFIX) for f in files)})
    if len(tb_dirs) == 1:
        return "tensorboard", tb_dirs[0]
    if len(tb_dirs) > 1:
        listed = ", ".join(os.path.relpath(d, path) for d in tb_dirs[:5])
        raise LogFormatError(f"{path}: tensorboard event files of several runs ({listed}); pass one directory")
    if "trainer.log" in names:
        return "console", os.path.join(path, "trainer.log")
    logs = [n for n in names if n.endswith((".log", ".txt", ".out")) and os.path.isfile(os.path.join(path, n))]
    logs = [n for n in logs if _sniff_file(os.path.join(path, n)) == "console"]
    if len(logs) == 1:
        return "console", os.path.join(path, logs[0])
    if len(logs) > 1:
        raise LogFormatError(f"{path}: several console logs with verl metrics ({', '.join(logs)}); pass one of them")
    raise LogFormatError(
        f"{path}: no verl metrics in this directory (looked for metrics.jsonl / *.jsonl from verl's file logger, "
        f"{_TB_PREFIX}.* from its tensorboard logger, trainer.log / *.log with its console output)"
    )


_READERS: dict[str, Callable[[str], list[dict]]] = {
    "jsonl": read_jsonl,
    "console": read_console,
    "tensorboard": read_tensorboard,
}


def load_run(path: str, label: str | None = None, fmt: str | None = None) -> Run:
    """Read one run from a file or run directory, detecting the format unless ``fmt`` is given.

    Raises:
        LogFormatError: see :func:`detect_format` and the readers; also when the log holds no metric at all.
    """
    if fmt is None:
        fmt, source = detect_format(path)
    elif fmt not in _READERS:
        raise LogFormatError(f"{path}: unknown format {fmt!r}; one of {list(_READERS)}")
    else:
        source = path
    rows = _READERS[fmt](source)
    if not rows:
        raise LogFormatError(f"{source}: no metrics in this {fmt} log")
    return Run(label=label or os.path.basename(os.path.normpath(path)), path=path, fmt=fmt, rows=rows, source=source)


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
            _Series("actor/troll/kl_before", r"before projection KL($\tilde\pi\|\pi_{old}$)", {"alpha": 0.55,
                                                                                         "linestyle": ":"}),
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

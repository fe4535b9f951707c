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
"""Read the metrics of verl runs from any of verl's loggers: three log formats, one row layout.

Each format gives the same rows, ``[{"step": int, "<metric>": float, ...}]`` sorted by step (a step logged twice, as
after a resume, is merged with the later value winning; every value is a float, NaN included):

- ``jsonl``: verl's file logger (``trainer.logger=[...,file]``; one ``{"step": N, "data": {...}}`` per line, path
  from ``VERL_FILE_LOGGER_PATH``), read by :func:`read_jsonl`;
- ``console``: verl's console logger (``step:N - key:value - ...`` lines, values printed with ``pprint`` such as
  ``np.float64(0.25)``), read from a captured stdout by :func:`read_console`; Ray's ``(TaskRunnerV1 pid=123)``
  prefixes, ANSI colours and lines that Ray's log monitor split in two are handled;
- ``tensorboard``: verl's tensorboard logger (``events.out.tfevents.*`` under ``$TENSORBOARD_DIR``), read by
  :func:`read_tensorboard` with the ``tensorboard`` package's event reader. Tensorboard stores scalars as float32,
  so its values are the other formats' values rounded to float32.

:func:`load_run` detects the format of a file or a run directory (:func:`detect_format`) and returns a :class:`Run`.
:func:`read_metrics` is the quickstart's tolerant JSONL reader for a file still being written. The drawing is
:mod:`troll_verl.tools.plotting`. Nothing here imports verl.
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
    "LogFormatError",
    "ReaderUnavailableError",
    "Run",
    "read_metrics",
    "read_jsonl",
    "read_console",
    "read_tensorboard",
    "detect_format",
    "load_run",
]

# verl's mean training reward (the quickstart's summary and the overview's first panel)
REWARD_KEY = "critic/score/mean"

_TB_PREFIX = "events.out.tfevents"
_FORMAT_HELP = (
    'expected verl\'s file-logger JSONL ({"step": N, "data": {...}} per line), verl\'s console output '
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
                f'{path}:{lineno}: not a verl file-logger line ({exc}); expected {{"step": N, "data": {{...}}}}'
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
    return sorted(os.path.join(path, name) for name in os.listdir(path) if name.startswith(_TB_PREFIX))


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

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
"""What the dataset mappers and the ``examples/data_preprocess`` CLIs share.

Reading records (local json / jsonl / parquet files, or ``datasets.load_dataset`` when no file is given), the
record-to-row loop with its counts (:func:`map_records`, :class:`SplitReport`), writing ``train.parquet`` and
``val.parquet`` and checking them (:func:`write_splits`), and the CLIs' common arguments (:func:`base_parser`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .schema import check_rl_parquet

__all__ = [
    "RecordError",
    "SplitReport",
    "SPLITS",
    "base_parser",
    "convert_and_write",
    "input_files",
    "last_user_content",
    "load_records",
    "map_records",
    "read_records",
    "text_field",
    "write_splits",
]

SPLITS = ("train", "val")
_MAX_REASONS = 5


class RecordError(ValueError):
    """A source record that cannot become a verl row; the mappers raise it and the CLIs skip and count the record."""


@dataclass
class SplitReport:
    """What happened to one split's records.

    Attributes:
        split: ``"train"`` or ``"val"``.
        read: Records examined (reading stops once ``max_samples`` rows are kept).
        written: Rows kept.
        skipped: Malformed records (:class:`RecordError`), not written.
        not_selected: Records left out on purpose (e.g. the other Eurus-2 subset).
        duplicates: Records whose problem text repeats an earlier one, not written.
        conflicting_duplicates: Of ``duplicates``, those whose ground truth differs from the kept record's.
        notes: Dataset-specific counts, by description.
        reasons: The first few skip reasons.
    """

    split: str
    read: int = 0
    written: int = 0
    skipped: int = 0
    not_selected: int = 0
    duplicates: int = 0
    conflicting_duplicates: int = 0
    notes: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def note(self, description: str) -> None:
        """Count one occurrence of a dataset-specific event."""
        self.notes[description] = self.notes.get(description, 0) + 1

    def summary(self) -> str:
        """One line for the CLI's output, e.g. ``train: read 6 records, kept 3 rows, skipped 1 malformed``."""
        parts = [f"{self.split}: read {self.read} records, kept {self.written} rows"]
        if self.not_selected:
            parts.append(f"{self.not_selected} not in the selected subset")
        if self.skipped:
            parts.append(f"skipped {self.skipped} malformed")
        if self.duplicates:
            parts.append(
                f"removed {self.duplicates} duplicate problems ({self.conflicting_duplicates} with a different "
                "ground truth; the first record's answer is kept)"
            )
        parts.extend(f"{count} {description}" for description, count in sorted(self.notes.items()))
        lines = [", ".join(parts)]
        lines.extend(f"  skipped {reason}" for reason in self.reasons)
        if self.skipped > len(self.reasons):
            lines.append(f"  ... and {self.skipped - len(self.reasons)} more skipped")
        return "\n".join(lines)


def text_field(record: Mapping[str, Any], *path: str) -> str:
    """The non-empty str at ``record[path[0]][path[1]]...``; numbers are converted to str.

    Raises:
        RecordError: Naming the field, if it is missing, empty or of another type.
    """
    name = ".".join(path)
    value: Any = record
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            raise RecordError(f"field '{name}' is missing")
        value = value[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise RecordError(f"field '{name}' must be a non-empty str, got {value!r:.60}")
    return value.strip()


def last_user_content(record: Mapping[str, Any], key: str = "prompt") -> str:
    """The content of the last ``"user"`` message of a chat-list field (DAPO and Eurus-2 records).

    Raises:
        RecordError: If the field is not a list of messages or has no non-empty user message.
    """
    messages = record.get(key)
    if hasattr(messages, "tolist") and not isinstance(messages, (str, bytes)):
        messages = messages.tolist()
    if not isinstance(messages, (list, tuple)):
        raise RecordError(f"field '{key}' must be a list of chat messages, got {type(messages).__name__}")
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                return content
            raise RecordError(f"field '{key}': the last user message has no text content")
    raise RecordError(f"field '{key}' has no 'user' message")


def map_records(
    records: Iterable[Mapping[str, Any]],
    to_row: Callable[[Mapping[str, Any], str, int], dict],
    report: SplitReport,
    *,
    max_samples: int | None = None,
    select: Callable[[Mapping[str, Any]], bool] | None = None,
    dedup_key: Callable[[dict], str] | None = None,
) -> list[dict]:
    """Map records to verl rows, skipping malformed ones and, with ``dedup_key``, repeated problems.

    Args:
        records: Source records, in order.
        to_row: ``(record, split, index) -> row``; raises :class:`RecordError` for a malformed record. ``index`` is
            the row's position among the kept rows.
        report: Filled in with the counts (its ``split`` names the split).
        max_samples: Stop once this many rows are kept; ``None`` reads everything.
        select: Keep only records for which this is true (the others count as ``not_selected``).
        dedup_key: Keep only the first row per key (the others count as ``duplicates``).

    Returns:
        The kept rows.
    """
    rows: list[dict] = []
    first_answer: dict[str, str] = {}
    for record in records:
        if max_samples is not None and len(rows) >= max_samples:
            break
        report.read += 1
        if select is not None and not select(record):
            report.not_selected += 1
            continue
        try:
            row = to_row(record, report.split, len(rows))
        except RecordError as error:
            report.skipped += 1
            if len(report.reasons) < _MAX_REASONS:
                report.reasons.append(f"record {report.read - 1}: {error}")
            continue
        if dedup_key is not None:
            key = dedup_key(row)
            answer = row["reward_model"]["ground_truth"]
            if key in first_answer:
                report.duplicates += 1
                report.conflicting_duplicates += int(first_answer[key] != answer)
                continue
            first_answer[key] = answer
        rows.append(row)
    report.written = len(rows)
    return rows


def read_records(path: str | os.PathLike) -> list[dict]:
    """The records of a local ``.jsonl``, ``.json`` (a JSON list, or JSON lines) or ``.parquet`` file.

    Raises:
        ValueError: For a missing file, an unsupported extension, or content that is not a list of JSON objects.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file; pass an existing .jsonl, .json or .parquet file")
    extension = os.path.splitext(path)[1].lower()
    if extension == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    elif extension in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        records = None
        if extension == ".json":
            try:
                records = json.loads(text)
            except json.JSONDecodeError:
                records = None  # a .json file of JSON lines, as the hub often stores them
            if records is not None and not isinstance(records, list):
                raise ValueError(f"{path}: expected a JSON list of records, got a JSON {type(records).__name__}")
        if records is None:
            records = []
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not a JSON object ({error.msg}); one record per line") from None
    else:
        raise ValueError(f"{path}: unsupported extension {extension!r}; use .jsonl, .json or .parquet")
    for number, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: record {number} is a {type(record).__name__}; each record must be an object")
    return records


def load_records(
    files: Sequence[str] | None, hf_path: str, hf_name: str | None, hf_split: str
) -> Iterator[Mapping[str, Any]]:
    """The records of local ``files`` in order or, when ``files`` is empty or None, of a Hugging Face dataset split.

    Args:
        files: Local files (see :func:`read_records`).
        hf_path: The hub dataset, downloaded with ``datasets.load_dataset`` only when no file is given.
        hf_name: Its configuration name (``None`` for the default).
        hf_split: Its split.

    Yields:
        One record (a dict) at a time.
    """
    if files:
        for path in files:
            yield from read_records(path)
        return
    import datasets

    yield from datasets.load_dataset(hf_path, hf_name, split=hf_split)


def write_splits(local_dir: str | os.PathLike, rows_by_split: Mapping[str, list[dict]]) -> dict[str, int]:
    """Write ``local_dir/train.parquet`` and ``local_dir/val.parquet`` and check both against verl's schema.

    Args:
        local_dir: The output directory (created if missing).
        rows_by_split: The rows of ``"train"`` and ``"val"``.

    Returns:
        The number of rows per split, read back from the files.

    Raises:
        ValueError: If a split has no rows or a written file fails
        :func:`~troll_verl.recipes.data.schema.check_rl_parquet`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in SPLITS:
        if not rows_by_split.get(split):
            raise ValueError(
                f"no {split} rows to write; check the inputs (see the skip reasons above) or raise --max-samples"
            )
    local_dir = os.path.expanduser(os.fspath(local_dir))
    os.makedirs(local_dir, exist_ok=True)
    counts = {}
    for split in SPLITS:
        path = os.path.join(local_dir, f"{split}.parquet")
        partial = path + ".partial"
        pq.write_table(pa.Table.from_pylist(rows_by_split[split]), partial)
        os.replace(partial, path)
        counts[split] = check_rl_parquet(path)
        print(f"wrote {path}: {counts[split]} rows, verl RL schema check passed")
    return counts


def convert_and_write(local_dir: str | os.PathLike, convert: Callable[[str], tuple[list[dict], SplitReport]]) -> int:
    """The body of every ``examples/data_preprocess`` CLI: convert each split, print its report, write both files.

    Args:
        local_dir: The output directory (see :func:`write_splits`).
        convert: ``split -> (rows, report)`` for ``"train"`` and ``"val"``.

    Returns:
        The process exit status: 0, or 1 after printing the ``ValueError`` that stopped it (no rows, a bad file).
    """
    try:
        rows = {}
        for split in SPLITS:
            rows[split], report = convert(split)
            print(report.summary())
        write_splits(local_dir, rows)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def base_parser(description: str, default_local_dir: str) -> argparse.ArgumentParser:
    """The arguments every ``examples/data_preprocess`` CLI takes.

    ``--local-dir``, ``--train-file``/``--val-file`` (repeatable; give both to work from local files, neither to
    download) and ``--max-samples``.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--local-dir",
        default=default_local_dir,
        help=f"output directory; writes exactly DIR/train.parquet and DIR/val.parquet (default: {default_local_dir})",
    )
    for split in SPLITS:
        parser.add_argument(
            f"--{split}-file",
            action="append",
            metavar="PATH",
            help=f"a local .jsonl/.json/.parquet file of {split} records in the hub dataset's schema; repeatable. "
            "Give both --train-file and --val-file to skip the download.",
        )
    parser.add_argument(
        "--max-samples", type=int, default=None, metavar="N", help="keep at most N rows per split (default: all)"
    )
    return parser


def input_files(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, list[str] | None]:
    """The local files per split, or ``None`` per split to download; exits on a half-given pair or a bad N."""
    if args.max_samples is not None and args.max_samples < 1:
        parser.error(f"--max-samples must be >= 1, got {args.max_samples}")
    if bool(args.train_file) != bool(args.val_file):
        parser.error("give both --train-file and --val-file to use local files, or neither to download the dataset")
    return {"train": args.train_file, "val": args.val_file}

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
"""DAPO-Math-17k (train) and its AIME-2024 set (validation) records to verl rows.

Both hub datasets (``BytedTsinghua-SIA/DAPO-Math-17k`` and ``BytedTsinghua-SIA/AIME-2024``, one ``train`` split
each) are already verl rows: ``prompt`` is one user message wrapping the problem in DAPO's instruction to end with
an ``Answer:`` line, ``reward_model`` is ``{"ground_truth": str, "style": "rule-lighteval/MATH_v2"}`` and
``extra_info`` is ``{"index": ...}``. The mapping recovers the bare problem (:func:`~troll_verl.recipes.data.prompts.
dapo_problem`), re-prompts it with :func:`~troll_verl.recipes.data.prompts.math_prompt` and keeps the ground truth.

data_source is ``"math_dapo"`` for DAPO-Math-17k and ``"aime2024"`` for AIME-2024; ability is ``"math"``.
``extra_info`` holds ``split``, ``index``, the bare ``problem`` and the record's own index as ``source_index``.

DAPO-Math-17k repeats each of its ~17k problems many times (its 1.79M rows); :func:`build_dapo_split` keeps the
first record per problem text (whitespace-normalised). The AIME-2024 set repeats its 30 problems the same way for
avg@k, which verl's ``val_kwargs.n`` does instead, so it is deduplicated too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .common import SplitReport, last_user_content, map_records, text_field
from .prompts import dapo_problem, math_prompt

__all__ = [
    "TRAIN_DATA_SOURCE",
    "VAL_DATA_SOURCE",
    "HF_TRAIN_PATH",
    "HF_VAL_PATH",
    "HF_SPLIT",
    "NO_WRAPPER_NOTE",
    "dapo_row",
    "problem_key",
    "build_dapo_split",
]

TRAIN_DATA_SOURCE = "math_dapo"
VAL_DATA_SOURCE = "aime2024"
HF_TRAIN_PATH = "BytedTsinghua-SIA/DAPO-Math-17k"
HF_VAL_PATH = "BytedTsinghua-SIA/AIME-2024"
HF_SPLIT = "train"
NO_WRAPPER_NOTE = "records without DAPO's 'Answer:' wrapper (problem text kept as is)"


def dapo_row(record: Mapping[str, Any], split: str, index: int, data_source: str = TRAIN_DATA_SOURCE) -> dict:
    """One verl row for a DAPO-Math-17k or AIME-2024 record.

    Args:
        record: The hub record: ``prompt`` (chat list), ``reward_model.ground_truth``, ``extra_info.index``.
        split: ``"train"`` or ``"val"``, stored in ``extra_info``.
        index: The row's position in its split, stored in ``extra_info``.
        data_source: ``"math_dapo"`` (DAPO-Math-17k) or ``"aime2024"`` (AIME-2024).

    Returns:
        The row.

    Raises:
        RecordError: For a prompt without a user message or a missing ground truth.
    """
    problem, _ = dapo_problem(last_user_content(record))
    extra = record.get("extra_info")
    source_index = extra.get("index") if isinstance(extra, Mapping) else None
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": math_prompt(problem)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": text_field(record, "reward_model", "ground_truth")},
        "extra_info": {
            "split": split,
            "index": index,
            "problem": problem,
            "source_index": "" if source_index is None else str(source_index),
        },
    }


def problem_key(row: Mapping[str, Any]) -> str:
    """The deduplication key of a row: its bare problem with whitespace runs collapsed."""
    return " ".join(row["extra_info"]["problem"].split())


def build_dapo_split(
    records: Iterable[Mapping[str, Any]],
    split: str,
    data_source: str,
    max_samples: int | None = None,
    dedup: bool = True,
) -> tuple[list[dict], SplitReport]:
    """Map one split's records: skip malformed ones and, with ``dedup``, keep the first record per problem.

    Args:
        records: DAPO-Math-17k or AIME-2024 records.
        split: ``"train"`` or ``"val"``.
        data_source: ``"math_dapo"`` or ``"aime2024"``.
        max_samples: Keep at most this many (unique) rows.
        dedup: Drop records whose problem text repeats an earlier one's.

    Returns:
        The rows and the split's report (duplicates, and records read without DAPO's wrapper, counted).
    """
    report = SplitReport(split)

    def to_row(record: Mapping[str, Any], split: str, index: int) -> dict:
        row = dapo_row(record, split, index, data_source)
        if not dapo_problem(last_user_content(record))[1]:
            report.note(NO_WRAPPER_NOTE)
        return row

    rows = map_records(records, to_row, report, max_samples=max_samples, dedup_key=problem_key if dedup else None)
    return rows, report

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
"""GSM8K (``openai/gsm8k``, config ``main``) records to verl rows.

A record is ``{"question": str, "answer": str}``, the answer a worked solution whose last line is ``#### N``.
The row: data_source ``"openai/gsm8k"``, ability ``"math"``, the prompt of
:func:`~troll_verl.recipes.data.prompts.gsm8k_prompt`, and ground truth ``N`` with its thousands commas removed. The
hub's ``train`` split becomes ``train`` and its ``test`` split ``val``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .common import RecordError, SplitReport, map_records, text_field
from .prompts import gsm8k_prompt

__all__ = ["DATA_SOURCE", "HF_PATH", "HF_NAME", "HF_SPLITS", "gsm8k_ground_truth", "gsm8k_row", "build_gsm8k_split"]

DATA_SOURCE = "openai/gsm8k"
HF_PATH = "openai/gsm8k"
HF_NAME = "main"
HF_SPLITS = {"train": "train", "val": "test"}

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def gsm8k_ground_truth(answer: str) -> str:
    """The final number of a GSM8K ``answer``: the text after the last ``####``, commas removed.

    Args:
        answer: The record's ``answer`` field.

    Returns:
        The number as text, e.g. ``"1200"`` for ``"... #### 1,200"``.

    Raises:
        RecordError: If there is no ``####`` or what follows it is not a number.
    """
    if not isinstance(answer, str) or "####" not in answer:
        raise RecordError("field 'answer' has no final '#### <number>' line")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not _NUMBER.fullmatch(final):
        raise RecordError(f"field 'answer': {final!r:.40} after '####' is not a number")
    return final


def gsm8k_row(record: Mapping[str, Any], split: str, index: int) -> dict:
    """One verl row for a GSM8K record.

    Args:
        record: ``{"question": str, "answer": str}`` as the hub dataset yields it.
        split: ``"train"`` or ``"val"``, stored in ``extra_info``.
        index: The row's position in its split, stored in ``extra_info``.

    Returns:
        The row; ``extra_info`` also keeps the raw ``question`` and ``answer``.

    Raises:
        RecordError: For a missing question or an answer without a final number.
    """
    question = text_field(record, "question")
    answer = record.get("answer")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": gsm8k_prompt(question)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gsm8k_ground_truth(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def build_gsm8k_split(
    records: Iterable[Mapping[str, Any]], split: str, max_samples: int | None = None
) -> tuple[list[dict], SplitReport]:
    """Map one split's records, skipping malformed ones.

    Args:
        records: GSM8K records.
        split: ``"train"`` or ``"val"``.
        max_samples: Keep at most this many rows.

    Returns:
        The rows and the split's report.
    """
    report = SplitReport(split)
    rows = map_records(records, gsm8k_row, report, max_samples=max_samples)
    return rows, report

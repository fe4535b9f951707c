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
"""verl's RL parquet schema, checked row by row.

verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``) and its reward loop read five columns:

``data_source`` (str)
    Selects the reward function (``reward.reward_fn_key`` defaults to this column).
``prompt`` (list of ``{"role": str, "content": str}``)
    The chat fed to the tokenizer's chat template; non-empty, and the last message is the ``"user"`` turn the
    policy answers.
``ability`` (str)
    A free-form task label (``"math"``, ``"code"``).
``reward_model`` (``{"style": "rule", "ground_truth": str}``)
    The rule-based reward's reference answer.
``extra_info`` (dict with at least ``split`` (str) and ``index`` (int))
    Passed to the reward function; verl takes ``extra_info["index"]`` as the row's index.

:func:`check_rl_rows` checks Python rows (as written, or as read back); :func:`check_rl_parquet` reads a file and
checks every row. Both raise ``ValueError`` naming the row index, the column and the fix.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REQUIRED_COLUMNS", "CHAT_ROLES", "REWARD_STYLE", "check_rl_row", "check_rl_rows", "check_rl_parquet"]

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
CHAT_ROLES = ("system", "user", "assistant", "tool")
REWARD_STYLE = "rule"
_BATCH_ROWS = 1024  # check_rl_parquet reads this many rows at a time, so large code splits need not fit in memory


def _type_name(value: Any) -> str:
    return type(value).__name__


def _as_list(value: Any) -> list | None:
    """A chat list as a Python list: lists and tuples, or numpy arrays as pandas reads them; else None."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        converted = value.tolist()
        return converted if isinstance(converted, list) else None
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_prompt(prompt: Any) -> str | None:
    messages = _as_list(prompt)
    if messages is None:
        return (
            f"column 'prompt' must be a list of {{'role', 'content'}} messages, got {_type_name(prompt)}; "
            "wrap the text as [{'role': 'user', 'content': text}]"
        )
    if not messages:
        return "column 'prompt' is an empty list; give at least one {'role': 'user', 'content': ...} message"
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            got = _type_name(message)
            return f"column 'prompt': message {position} must be a dict with 'role' and 'content', got {got}"
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            return f"column 'prompt': message {position} has role {role!r}; use one of {', '.join(CHAT_ROLES)}"
        if not isinstance(content, str) or not content.strip():
            return f"column 'prompt': message {position} ({role}) needs a non-empty str 'content', got {content!r:.60}"
    last_role = messages[-1].get("role")
    if last_role != "user":
        return f"column 'prompt': the last message is from {last_role!r}; it must be the 'user' turn the policy answers"
    return None


def _check_reward_model(reward_model: Any) -> str | None:
    if not isinstance(reward_model, Mapping):
        return (
            f"column 'reward_model' must be a dict {{'style': 'rule', 'ground_truth': str}}, got "
            f"{_type_name(reward_model)}"
        )
    style = reward_model.get("style")
    if style != REWARD_STYLE:
        return f"column 'reward_model': style is {style!r}; set reward_model['style'] = {REWARD_STYLE!r}"
    ground_truth = reward_model.get("ground_truth")
    if not isinstance(ground_truth, str):
        return (
            f"column 'reward_model': ground_truth must be a str, got {_type_name(ground_truth)}; "
            "store the reference answer as text (JSON-encode structured answers)"
        )
    if not ground_truth.strip():
        return "column 'reward_model': ground_truth is empty; drop the row or give its reference answer"
    return None


def _check_extra_info(extra_info: Any) -> str | None:
    if not isinstance(extra_info, Mapping):
        return f"column 'extra_info' must be a dict with 'split' and 'index', got {_type_name(extra_info)}"
    split, index = extra_info.get("split"), extra_info.get("index")
    if not isinstance(split, str) or not split:
        return f"column 'extra_info': 'split' must be a non-empty str such as 'train' or 'val', got {split!r}"
    if not _is_int(index) or index < 0:
        return f"column 'extra_info': 'index' must be an int >= 0 (the row's position in its split), got {index!r}"
    return None


def check_rl_row(row: Any) -> str | None:
    """The first problem with one row, as a message naming the column and the fix; ``None`` if the row is valid.

    Args:
        row: One row as a mapping from column name to value.

    Returns:
        ``None`` for a valid row, else a one-line description of its first problem.
    """
    if not isinstance(row, Mapping):
        return f"a row must be a dict of columns, got {_type_name(row)}"
    missing = [column for column in REQUIRED_COLUMNS if column not in row]
    if missing:
        return f"missing column(s) {', '.join(missing)}; verl's RL rows need {', '.join(REQUIRED_COLUMNS)}"
    data_source = row["data_source"]
    if not isinstance(data_source, str) or not data_source.strip():
        return f"column 'data_source' must be a non-empty str naming the reward function's source, got {data_source!r}"
    ability = row["ability"]
    if not isinstance(ability, str) or not ability.strip():
        return f"column 'ability' must be a non-empty str such as 'math' or 'code', got {ability!r}"
    checks = {"prompt": _check_prompt, "reward_model": _check_reward_model, "extra_info": _check_extra_info}
    for column, check in checks.items():
        problem = check(row[column])
        if problem is not None:
            return problem
    return None


def check_rl_rows(rows: Sequence[Mapping[str, Any]]) -> None:
    """Check rows against verl's RL parquet schema (see the module docstring).

    Args:
        rows: The rows, each a mapping from column name to value. An empty sequence passes.

    Raises:
        ValueError: On the first invalid row, naming its index, the column and the fix.
    """
    for index, row in enumerate(rows):
        problem = check_rl_row(row)
        if problem is not None:
            raise ValueError(f"row {index}: {problem}")


def check_rl_parquet(path: str | os.PathLike) -> int:
    """Read a parquet file and check every row against verl's RL schema.

    Args:
        path: The parquet file.

    Returns:
        The number of rows (at least 1).

    Raises:
        ValueError: If the file is missing, has no rows, lacks a column, or holds an invalid row (named by index).
    """
    import pyarrow.parquet as pq

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such parquet file; write it first (e.g. with examples/data_preprocess/*.py)")
    parquet = pq.ParquetFile(path)
    missing = [column for column in REQUIRED_COLUMNS if column not in parquet.schema_arrow.names]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {', '.join(missing)}; verl's RL rows need {', '.join(REQUIRED_COLUMNS)}"
        )
    num_rows = parquet.metadata.num_rows
    if num_rows == 0:
        raise ValueError(f"{path}: has no rows; verl cannot train or validate on an empty split")
    offset = 0
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=list(REQUIRED_COLUMNS)):
        for position, row in enumerate(batch.to_pylist()):
            problem = check_rl_row(row)
            if problem is not None:
                raise ValueError(f"{path}: row {offset + position}: {problem}")
        offset += batch.num_rows
    return num_rows

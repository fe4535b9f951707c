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
"""Eurus-2-RL-Data (``PRIME-RL/Eurus-2-RL-Data``, splits ``train`` and ``validation``) records to verl rows.

Each record is already verl-shaped: ``data_source`` (the origin, e.g. ``numina_olympiads``, ``taco``, ``apps``),
``prompt`` (PRIME's action-centric system message, then the user message), ``ability`` (``"math"`` or ``"code"``),
``reward_model`` ``{"ground_truth": str, "style": "rule"}`` and ``extra_info``. The mapping keeps the user message's
bare problem (without Eurus-2's own answer instructions, see :mod:`troll_verl.recipes.data.prompts`), drops the system
message, and re-prompts:

math rows
    data_source ``"eurus2_math"``, the prompt of :func:`~troll_verl.recipes.data.prompts.math_prompt`, the LaTeX ground
    truth as is.
code rows
    data_source ``"eurus2_code"``, the prompt of :func:`~troll_verl.recipes.data.prompts.code_prompt`, and the test
    cases normalised by :func:`normalize_code_tests` into what verl's local scorer
    (``verl.utils.reward_score.prime_code.compute_score``) reads. Rows whose tests cannot be normalised are skipped.

``extra_info`` holds ``split``, ``index``, the origin as ``source`` and the record's own index as ``source_index``.
The hub's ``validation`` split becomes ``val``.

The code ground truth is a JSON string of ``{"inputs": [str, ...], "outputs": [str, ...]}`` (equal lengths, at
least one case), plus ``"fn_name": str`` for call-based problems:

standard input (no ``fn_name``)
    ``inputs[i]`` is the whole stdin text and ``outputs[i]`` the expected stdout; the scorer compares them
    line by line. Sources that give a case as a list of lines are joined with ``"\\n"``.
call-based (``fn_name``)
    The scorer calls ``fn_name(*args)`` (on ``Solution()`` when the code defines ``class Solution``) with
    ``args = [json.loads(line) for line in inputs[i].split("\\n")]`` and compares the result with
    ``json.loads(outputs[i])`` (or its first element). Sources in the APPS/TACO layout give ``inputs[i]`` as the
    argument list and ``outputs[i]`` as a JSON value; both are JSON-encoded here, one argument per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .common import RecordError, SplitReport, last_user_content, map_records, text_field
from .prompts import code_prompt, eurus2_code_problem, eurus2_math_problem, math_prompt

__all__ = [
    "MATH_DATA_SOURCE",
    "CODE_DATA_SOURCE",
    "HF_PATH",
    "HF_SPLITS",
    "SUBSETS",
    "normalize_code_tests",
    "eurus2_math_row",
    "eurus2_code_row",
    "eurus2_row",
    "build_eurus2_split",
]

MATH_DATA_SOURCE = "eurus2_math"
CODE_DATA_SOURCE = "eurus2_code"
HF_PATH = "PRIME-RL/Eurus-2-RL-Data"
HF_SPLITS = {"train": "train", "val": "validation"}
SUBSETS = ("math", "code")


def _stdin_text(value: Any, name: str, position: int) -> str:
    """A standard-input case as text: a str as is, a list of str lines joined with newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise RecordError(f"code tests: {name}[{position}] must be a str or a list of str lines, got {value!r:.60}")


def _json_lines(value: str, position: int) -> None:
    """Check that every line of an encoded call-based input decodes as JSON (one argument per line)."""
    for line in value.split("\n"):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            raise RecordError(
                f"code tests: inputs[{position}] line {line!r:.40} is not JSON; encoded call-based inputs hold one "
                "JSON argument per line"
            ) from None


def normalize_code_tests(ground_truth: str | Mapping[str, Any]) -> str:
    """Normalise a code record's test cases into the JSON string verl's ``prime_code`` scorer reads.

    See the module docstring for the format. Call-based cases are accepted in two layouts, decided per record:
    every input a list of arguments (APPS/TACO; each argument and output is JSON-encoded), or every input already
    an encoded str (each line, and each output, must decode as JSON).

    Args:
        ground_truth: The record's ``reward_model.ground_truth``: a JSON str or a dict.

    Returns:
        ``json.dumps({"inputs": [...], "outputs": [...]})``, with ``"fn_name"`` added for call-based tests.

    Raises:
        RecordError: Naming the problem, for tests that are not JSON, lack ``inputs``/``outputs``, are empty, of
            unequal lengths, or hold values of the wrong type.
    """
    if isinstance(ground_truth, str):
        try:
            tests = json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise RecordError(f"code tests: ground_truth is not JSON ({error.msg})") from None
    else:
        tests = ground_truth
    if not isinstance(tests, Mapping):
        raise RecordError(f"code tests: ground_truth must be a JSON object, got {type(tests).__name__}")
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise RecordError("code tests: ground_truth needs 'inputs' and 'outputs' lists")
    if not inputs:
        raise RecordError("code tests: 'inputs' is empty; a problem needs at least one test case")
    if len(inputs) != len(outputs):
        raise RecordError(f"code tests: {len(inputs)} inputs but {len(outputs)} outputs; they must pair up")
    fn_name = tests.get("fn_name")
    if fn_name is None:
        normalized = {
            "inputs": [_stdin_text(value, "inputs", i) for i, value in enumerate(inputs)],
            "outputs": [_stdin_text(value, "outputs", i) for i, value in enumerate(outputs)],
        }
        return json.dumps(normalized)
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise RecordError(f"code tests: fn_name must be a Python identifier, got {fn_name!r:.60}")
    if all(isinstance(value, list) for value in inputs):  # APPS/TACO: argument lists and plain result values
        try:
            encoded_inputs = ["\n".join(json.dumps(argument) for argument in args) for args in inputs]
            encoded_outputs = [json.dumps(value) for value in outputs]
        except (TypeError, ValueError) as error:
            raise RecordError(f"code tests: a call-based case is not JSON-serialisable ({error})") from None
        if any(args == [] for args in inputs):
            raise RecordError("code tests: a call-based case has an empty argument list, which the scorer cannot pass")
    elif all(isinstance(value, str) for value in inputs):  # already encoded: one JSON argument per line
        if not all(isinstance(value, str) for value in outputs):
            raise RecordError("code tests: encoded call-based inputs need JSON-encoded str outputs")
        for i, value in enumerate(inputs):
            _json_lines(value, i)
        for i, value in enumerate(outputs):
            try:
                json.loads(value)
            except json.JSONDecodeError:
                raise RecordError(f"code tests: outputs[{i}] {value!r:.40} is not one JSON value") from None
        encoded_inputs, encoded_outputs = list(inputs), list(outputs)
    else:
        raise RecordError("code tests: call-based inputs must all be argument lists or all be encoded str")
    return json.dumps({"inputs": encoded_inputs, "outputs": encoded_outputs, "fn_name": fn_name})


def _extra_info(record: Mapping[str, Any], split: str, index: int) -> dict:
    extra = record.get("extra_info")
    source_index = extra.get("index") if isinstance(extra, Mapping) else None
    source = record.get("data_source")
    return {
        "split": split,
        "index": index,
        "source": source if isinstance(source, str) else "",
        "source_index": "" if source_index is None else str(source_index),
    }


def eurus2_math_row(record: Mapping[str, Any], split: str, index: int) -> dict:
    """One verl row for a Eurus-2 math record (data_source ``"eurus2_math"``).

    Raises:
        RecordError: For a prompt without a user message or a missing ground truth.
    """
    problem = eurus2_math_problem(last_user_content(record))
    return {
        "data_source": MATH_DATA_SOURCE,
        "prompt": [{"role": "user", "content": math_prompt(problem)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": text_field(record, "reward_model", "ground_truth")},
        "extra_info": _extra_info(record, split, index),
    }


def eurus2_code_row(record: Mapping[str, Any], split: str, index: int) -> dict:
    """One verl row for a Eurus-2 code record (data_source ``"eurus2_code"``), its tests normalised.

    Raises:
        RecordError: For a prompt without a user message, or tests :func:`normalize_code_tests` rejects.
    """
    problem = eurus2_code_problem(last_user_content(record))
    reward_model = record.get("reward_model")
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise RecordError("field 'reward_model.ground_truth' is missing")
    ground_truth = normalize_code_tests(reward_model["ground_truth"])
    fn_name = json.loads(ground_truth).get("fn_name")
    return {
        "data_source": CODE_DATA_SOURCE,
        "prompt": [{"role": "user", "content": code_prompt(problem, fn_name)}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": _extra_info(record, split, index),
    }


def eurus2_row(record: Mapping[str, Any], split: str, index: int) -> dict:
    """One verl row for a Eurus-2 record, by its ``ability`` (``"math"`` or ``"code"``).

    Raises:
        RecordError: For another ability, or a record the math/code mapper rejects.
    """
    ability = record.get("ability")
    if ability == "math":
        return eurus2_math_row(record, split, index)
    if ability == "code":
        return eurus2_code_row(record, split, index)
    raise RecordError(f"field 'ability' is {ability!r}; Eurus-2 records are 'math' or 'code'")


def build_eurus2_split(
    records: Iterable[Mapping[str, Any]], split: str, subset: str, max_samples: int | None = None
) -> tuple[list[dict], SplitReport]:
    """Map the ``subset`` (``"math"`` or ``"code"``) records of one split, skipping malformed ones.

    Args:
        records: Eurus-2-RL-Data records.
        split: ``"train"`` or ``"val"``.
        subset: ``"math"`` or ``"code"``: records of the other ability count as not selected.
        max_samples: Keep at most this many rows.

    Returns:
        The rows and the split's report.
    """
    if subset not in SUBSETS:
        raise ValueError(f"subset must be one of {', '.join(SUBSETS)}, got {subset!r}")
    report = SplitReport(split)
    rows = map_records(
        records,
        eurus2_row,
        report,
        max_samples=max_samples,
        select=lambda record: record.get("ability") == subset,
    )
    return rows, report

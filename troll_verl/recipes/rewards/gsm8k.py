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
"""GSM8K reward: the number after the last ``####`` (else in the last ``\\boxed{}``), compared exactly.

The prompt asks the model to ``output the final answer after "####"``. The answer is the number that starts the
text after the *last* ``####`` marker carrying one (``$`` and markdown ``**`` before it are skipped); a response
without one falls back to the content of the last ``\\boxed{...}``, which must then be a number as a whole
(``\\boxed{18}``, ``\\boxed{\\$1,080}``, ``\\boxed{\\frac{3}{4}}``). Numbers compare exactly as fractions after
dropping ``$``, thousands commas, spaces, a trailing ``.`` and a trailing ``%``: ``1,080`` = ``1080`` = ``1080.00``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from . import Reason, make_result
from .math import last_boxed

__all__ = ["compute_score", "extract_answer", "parse_number"]

_MARKER = re.compile(r"####[ \t]*([^\n]*)")
_LEADING_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)")
_FULL_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_FRAC = re.compile(r"([-+]?)\\[dt]?frac\{([-+]?\d+)\}\{(\d+)\}")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{[^{}]*\}")


def _strip_money(text: str) -> str:
    return text.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "")


def extract_answer(solution_str: str) -> str | None:
    """Extracts the final answer of a GSM8K response as written (e.g. ``"1,080"``), or None.

    Args:
        solution_str: The decoded response.

    Returns:
        The number after the last ``####`` that is followed by one, else the content of the last ``\\boxed{}``,
        else None.
    """
    for tail in reversed(_MARKER.findall(solution_str)):
        match = _LEADING_NUMBER.match(_strip_money(tail).lstrip(" \t*"))
        if match is not None:
            return match.group(0)
    boxed = last_boxed(solution_str)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    return None


def parse_number(text: str) -> Fraction | None:
    """Parses a GSM8K-style number exactly, or returns None.

    Accepts ``$``/``\\$``, thousands commas, spaces, ``\\text{...}`` units, a trailing ``.`` or ``%``, and
    ``\\frac{a}{b}``; anything else (an expression, words) is not a number.

    Args:
        text: The extracted answer (or a ground truth).

    Returns:
        The value as a :class:`fractions.Fraction`, or None.
    """
    s = _TEXT.sub("", _strip_money(str(text)))
    s = s.replace(",", "").replace(" ", "").replace("\\%", "").rstrip("%").rstrip(".")
    frac = _FRAC.fullmatch(s)
    if frac is not None:
        sign, num, den = frac.groups()
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign == "-" else value
    if _FULL_NUMBER.fullmatch(s) is None:
        return None
    try:
        return Fraction(Decimal(s))
    except (InvalidOperation, ValueError):
        return None


def compute_score(solution_str: str, ground_truth: Any) -> dict[str, float | int]:
    """Scores a GSM8K response.

    Args:
        solution_str: The decoded response.
        ground_truth: The reference answer (a number, possibly with commas; a full GSM8K solution ending in
            ``#### <number>`` also works).

    Returns:
        The :func:`troll_verl.recipes.rewards.make_result` dict.
    """
    gt_text = str(ground_truth)
    gold = parse_number(extract_answer(gt_text) or gt_text) if "####" in gt_text else parse_number(gt_text)
    answer = extract_answer(solution_str)
    if gold is None:
        return make_result(reason=Reason.BAD_GROUND_TRUTH, has_answer=answer is not None)
    if answer is None:
        return make_result(reason=Reason.NO_ANSWER, has_answer=False)
    value = parse_number(answer)
    reason = Reason.CORRECT if value is not None and value == gold else Reason.WRONG_ANSWER
    return make_result(reason=reason, has_answer=True)

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
"""The built-in task: two-operand addition with a verifiable reward, in verl's parquet schema.

A prompt is the chat message ``"12+7="``; the right response is ``"19"`` then ``<|im_end|>``. The reward
(:func:`compute_score`, verl's ``custom_reward_function`` signature) is 1 when the response, stripped, is exactly
the decimal sum, else 0. Every ordered pair ``(a, b)`` with ``0 <= a, b < num_operands`` is one problem; a seeded
split holds some pairs out for validation, so validation reward measures generalisation, not recall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..common import addition_rows, addition_split

__all__ = ["DATA_SOURCE", "AdditionTask", "compute_score", "prompt_text", "answer_text"]

DATA_SOURCE = "troll_tiny/addition"
_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")


def prompt_text(a: int, b: int) -> str:
    """The bare prompt ``a+b=`` of the built-in task."""
    return f"{a}+{b}="


def answer_text(a: int, b: int) -> str:
    """The answer the built-in task rewards for ``a + b``."""
    return str(a + b)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> dict:
    """verl reward function: ``{"score": 1.0 | 0.0, "acc": bool}`` for the decoded response ``solution_str``.

    The response counts only if it is a bare integer (whitespace and ChatML end tokens aside); anything else,
    including an empty or over-long answer, scores 0.
    """
    if data_source != DATA_SOURCE:
        raise ValueError(f"troll_verl.assets.tiny.task.compute_score scores {DATA_SOURCE!r} only, got {data_source!r}")
    text = solution_str.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    match = _ANSWER.match(text)
    correct = match is not None and match.group(1) == str(ground_truth).strip()
    return {"score": 1.0 if correct else 0.0, "acc": bool(correct)}


@dataclass(frozen=True)
class AdditionTask:
    """All ordered pairs from ``range(num_operands)``, split into train and validation pairs by ``seed``."""

    num_operands: int = 10
    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self):
        if self.num_operands < 2:
            raise ValueError(f"num_operands must be >= 2, got {self.num_operands}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")

    def split(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(train, validation)`` pairs: every ordered pair of operands, shuffled by ``seed``."""
        return addition_split(range(self.num_operands), self.val_fraction, self.seed)

    @staticmethod
    def rows(pairs: list[tuple[int, int]], split: str) -> list[dict]:
        """verl's RL parquet rows (:func:`troll_verl.assets.common.addition_rows`)."""
        return addition_rows(pairs, split, DATA_SOURCE, prompt_text)

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
"""The real model's task: addition asked in plain words, scored by the exact number in the answer.

A prompt is one user turn, ``"What is 3+4? Answer with the number only."``, in the model's own chat format (verl's
agent loop applies the tokenizer's chat template). The reward (:func:`compute_score`, verl's
``custom_reward_function`` signature) is 1 when the **last integer** in the decoded answer equals the sum, else 0:
an instruct model answers ``"3 + 4 = 7."`` as often as ``"7"``, and both are right.

Operands are drawn from ``[lo, hi)``; every ordered pair is one problem and a seeded split holds some out for
(greedy) validation. SmolLM2-135M-Instruct sampled at T=1 gets about 1 in 8 one-digit sums right
(``docs/benchmarks.md``), so there is room to learn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..common import addition_rows, addition_split

__all__ = ["DATA_SOURCE", "ArithmeticTask", "compute_score", "prompt_text", "last_integer"]

DATA_SOURCE = "troll_smollm2/addition"
_INTEGER = re.compile(r"-?\d+")


def prompt_text(a: int, b: int) -> str:
    """The user turn asking for ``a + b`` (the chat template is applied by verl's agent loop)."""
    return f"What is {a}+{b}? Answer with the number only."


def last_integer(text: str) -> str | None:
    """The last integer written in ``text`` (thousands separators are not numbers here), or None."""
    found = _INTEGER.findall(text)
    return found[-1] if found else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> dict:
    """verl reward function: ``{"score": 1.0 | 0.0, "acc": bool, "has_answer": bool}`` for a decoded answer."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"{__name__}.compute_score scores {DATA_SOURCE!r} only, got {data_source!r}")
    answer = last_integer(solution_str)
    correct = answer is not None and int(answer) == int(str(ground_truth).strip())
    return {"score": 1.0 if correct else 0.0, "acc": bool(correct), "has_answer": answer is not None}


@dataclass(frozen=True)
class ArithmeticTask:
    """All ordered pairs ``(a, b)`` with ``lo <= a, b < hi``, split into train and validation by ``seed``."""

    lo: int = 0
    hi: int = 10
    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self):
        if not 0 <= self.lo < self.hi - 1:
            raise ValueError(f"need 0 <= lo < hi - 1 (at least two operands), got lo={self.lo}, hi={self.hi}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")

    def split(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(train, validation)`` pairs: every ordered pair of operands, shuffled by ``seed``."""
        return addition_split(range(self.lo, self.hi), self.val_fraction, self.seed)

    @staticmethod
    def rows(pairs: list[tuple[int, int]], split: str) -> list[dict]:
        """verl's RL parquet rows (:func:`troll_verl.assets.common.addition_rows`)."""
        return addition_rows(pairs, split, DATA_SOURCE, prompt_text)

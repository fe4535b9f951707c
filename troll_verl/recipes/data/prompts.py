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
"""The prompt formats troll-verl's data preparation emits; the reward functions rely on them.

Every row's ``prompt`` is one user message (no system message). Its content, with ``problem`` stripped of
surrounding whitespace:

GSM8K (:func:`gsm8k_prompt`)
    ``problem + "\\n" + GSM8K_INSTRUCTION``, i.e. ``...\\nLet's think step by step and output the final answer
    after "####".`` The reward reads the number after the last ``####``.
Math: DAPO-Math-17k, its AIME-2024 validation set, Eurus-2 math (:func:`math_prompt`)
    ``problem + "\\n" + MATH_INSTRUCTION``, i.e. ``...\\nLet's think step by step and output the final answer
    within \\boxed{}.`` The reward reads the last ``\\boxed{...}``.
Code: Eurus-2 code (:func:`code_prompt`)
    ``problem + "\\n\\n" + instruction``: :data:`CODE_STDIN_INSTRUCTION` for standard-input problems, or
    :data:`CODE_CALL_INSTRUCTION` (formatted with the function name) for call-based ones. Both ask for the final
    code in a single fenced ``python`` block at the end, since verl's ``prime_code`` scorer runs the text after the
    last fence opening.

The source datasets carry their own instructions; the ``*_problem`` helpers recover the bare problem first so that
no instruction is doubled: :func:`dapo_problem` (DAPO's "Answer:" wrapper), :func:`eurus2_math_problem` (Eurus-2's
"Present the answer in LaTex format" suffix) and :func:`eurus2_code_problem` (Eurus-2's "Write Python code to
solve ..." prefix and suffix).
"""

from __future__ import annotations

import re

__all__ = [
    "GSM8K_INSTRUCTION",
    "MATH_INSTRUCTION",
    "CODE_STDIN_INSTRUCTION",
    "CODE_CALL_INSTRUCTION",
    "gsm8k_prompt",
    "math_prompt",
    "code_prompt",
    "dapo_problem",
    "eurus2_math_problem",
    "eurus2_code_problem",
]

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
CODE_STDIN_INSTRUCTION = (
    "Write a complete Python 3 program that reads the input from standard input and writes the answer to standard "
    "output. Give the final program in a single ```python code block at the end of your response."
)
CODE_CALL_INSTRUCTION = (
    "Write a Python 3 function `{fn_name}` that takes the arguments described in the problem and returns the "
    "answer; it must not read input or print. If the problem gives a `class Solution`, write `{fn_name}` as its "
    "method. Give the final code in a single ```python code block at the end of your response."
)

# DAPO-Math-17k (and its AIME-2024 set) wrap every problem as PREFIX + "\n\n" + problem + "\n\n" + SUFFIX.
_DAPO_PREFIX = re.compile(
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*"
)
_DAPO_SUFFIX = re.compile(r'\s*Remember to put your answer on its own line after "Answer:"\.?\s*$')
# Eurus-2-RL-Data math: problem + "\n\nPresent the answer in LaTex format: \boxed{Your answer}".
_EURUS2_MATH_SUFFIX = re.compile(r"\s*Present the answer in LaTe[Xx] format:\s*\\boxed\{Your answer\}\.?\s*$")
# Eurus-2-RL-Data code: "Write Python code to solve the task.\n" + problem
# + "\n\nWrite Python code to solve the problem. Present the code in \n```python\nYour code\n```\nat the end."
_EURUS2_CODE_PREFIX = re.compile(r"^\s*Write Python code to solve the task\.\s*")
_EURUS2_CODE_SUFFIX = re.compile(
    r"\s*Write Python code to solve the problem\. Present the code in\s*```python\s*Your code\s*```\s*at the end\.?\s*$"
)


def _text(problem: str, name: str) -> str:
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"{name}: the problem must be a non-empty str, got {problem!r:.60}")
    return problem.strip()


def gsm8k_prompt(question: str) -> str:
    """The GSM8K user message: ``question + "\\n" + GSM8K_INSTRUCTION``.

    Args:
        question: The GSM8K ``question`` field.

    Returns:
        The prompt text.
    """
    return _text(question, "gsm8k_prompt") + "\n" + GSM8K_INSTRUCTION


def math_prompt(problem: str) -> str:
    """The math user message (DAPO-Math-17k, AIME-2024, Eurus-2 math): ``problem + "\\n" + MATH_INSTRUCTION``.

    Args:
        problem: The bare problem statement, without the source dataset's own answer instruction.

    Returns:
        The prompt text.
    """
    return _text(problem, "math_prompt") + "\n" + MATH_INSTRUCTION


def code_prompt(problem: str, fn_name: str | None = None) -> str:
    """The code user message: ``problem + "\\n\\n" + instruction``.

    Args:
        problem: The bare problem statement, without the source dataset's own code instruction.
        fn_name: The function the tests call, for call-based problems; ``None`` for standard-input problems.

    Returns:
        The prompt text.
    """
    instruction = CODE_STDIN_INSTRUCTION if fn_name is None else CODE_CALL_INSTRUCTION.format(fn_name=fn_name)
    return _text(problem, "code_prompt") + "\n\n" + instruction


def dapo_problem(text: str) -> tuple[str, bool]:
    """The bare problem inside a DAPO-Math-17k / AIME-2024 prompt.

    DAPO wraps each problem in an instruction asking for a final ``Answer:`` line. Each part of that wrapper that is
    present (the leading instruction, the trailing reminder) is removed; text without it is kept as is.

    Args:
        text: The content of the dataset's user message.

    Returns:
        ``(problem, found)``: the stripped problem, and whether any part of the wrapper was found and removed.
    """
    problem = _text(text, "dapo_problem")
    unwrapped = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", problem, count=1), count=1).strip()
    if not unwrapped:  # the text was nothing but the wrapper: keep it rather than emit an empty problem
        return problem, False
    return unwrapped, unwrapped != problem


def eurus2_math_problem(text: str) -> str:
    """The bare problem of a Eurus-2-RL-Data math prompt, without its trailing ``\\boxed{Your answer}`` request."""
    problem = _text(text, "eurus2_math_problem")
    return _EURUS2_MATH_SUFFIX.sub("", problem, count=1).strip() or problem


def eurus2_code_problem(text: str) -> str:
    """The bare problem of a Eurus-2-RL-Data code prompt, without its "Write Python code to solve ..." parts."""
    problem = _text(text, "eurus2_code_problem")
    return _EURUS2_CODE_SUFFIX.sub("", _EURUS2_CODE_PREFIX.sub("", problem, count=1), count=1).strip() or problem

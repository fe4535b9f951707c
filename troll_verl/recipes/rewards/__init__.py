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
"""Verifiable rewards for the math and code recipes, as one verl custom reward function.

Use it with::

    reward.custom_reward_function.path=pkg://troll_verl.recipes.rewards
    reward.custom_reward_function.name=compute_score

:func:`compute_score` dispatches on ``data_source`` (the names our data preprocessors emit):

======================================================  ==========================================================
data_source                                             scorer
======================================================  ==========================================================
``openai/gsm8k``                                        :mod:`troll_verl.recipes.rewards.gsm8k`: last ``#### <number>``
                                                        (else last ``\\boxed{}``), compared as exact numbers
``math_dapo``, ``eurus2_math``, ``aime*``, ``amc*``     :mod:`troll_verl.recipes.rewards.math`: last ``\\boxed{}`` (else
                                                        last ``Answer:`` line), checked with math-verify
``eurus2_code``, ``codecontests``, ``apps``, ``taco``,  :mod:`troll_verl.recipes.rewards.code`: last Python code block,
``codeforces``                                          run on the test cases (locally or in Sandbox Fusion)
======================================================  ==========================================================

Any other ``data_source`` raises :class:`ValueError`: that is a configuration error, not a model error. Everything
the model can do wrong (no answer, a wrong one, code that hangs, crashes or eats memory) scores 0 with a
:class:`Reason` and never raises.

**The returned dict.** verl's reward managers (``verl/experimental/reward_loop/reward_manager/naive.py``) take
``result["score"]`` as the reward and put *every* key of the dict into ``reward_extra_info``; the reward loop then
builds one ``np.array`` per key from the keys of the *first* sample of the batch (``info[key]`` for every sample),
so every sample must return the same keys whatever its data source, and validation averages every non-string
key per data source (``val-core/<data_source>/acc/mean@N`` is the headline metric). Hence all values are numbers
and the keys are always these:

* ``score`` (float): the reward. 1.0 or 0.0; for code with ``continuous=True`` the pass fraction.
* ``acc`` (float): 1.0 iff the answer is fully correct (every test passes), else 0.0.
* ``pass_rate`` (float): the fraction of test cases passed (code); equal to ``acc`` for gsm8k and math.
* ``has_answer`` (float): 1.0 iff an answer / a code block could be extracted (the format rate).
* ``reason`` (int): a :class:`Reason` code, 0 when correct. The code's name is logged at DEBUG level
  (logger ``troll_verl.recipes.rewards``), failures of our own machinery at WARNING.

**Options** (keyword arguments, e.g. ``+reward.custom_reward_function.reward_kwargs.continuous=true``; verl merges
``reward_kwargs`` into every call): see :func:`compute_score`.

**Sandbox Fusion.** verl 0.9.1 binds ``reward.sandbox_fusion.url`` / ``memory_limit_mb`` / ``max_concurrent`` to its
*default* reward function only (``verl/trainer/ppo/reward.py::load_reward_manager``); a custom function never
sees them. Configure ours with the same keyword names verl's default function takes, through ``reward_kwargs``::

    +reward.custom_reward_function.reward_kwargs.sandbox_fusion_url=http://host:8080/run_code
    +reward.custom_reward_function.reward_kwargs.memory_limit_mb=1024        # optional
    +reward.custom_reward_function.reward_kwargs.sandbox_fusion_max_concurrent=64   # optional, per reward worker

or with the environment variable ``TROLL_SANDBOX_FUSION_URL`` (it must reach the Ray reward workers: export it
before a local ``ray.init``, or set ``+ray_kwargs.ray_init.runtime_env.env_vars.TROLL_SANDBOX_FUSION_URL=...``).
The keyword wins over the variable. Without either, code runs locally (see :mod:`troll_verl.recipes.rewards.code`).
"""

from __future__ import annotations

import enum
import logging
from typing import Any

logger = logging.getLogger(__name__)

GSM8K_SOURCES: frozenset[str] = frozenset({"openai/gsm8k"})
MATH_SOURCES: frozenset[str] = frozenset({"math_dapo", "eurus2_math"})
MATH_PREFIXES: tuple[str, ...] = ("aime", "amc")
CODE_SOURCES: frozenset[str] = frozenset({"eurus2_code", "codecontests", "apps", "taco", "codeforces"})

#: Keys of every dict :func:`compute_score` returns.
RESULT_KEYS: tuple[str, ...] = ("score", "acc", "pass_rate", "has_answer", "reason")


class Reason(enum.IntEnum):
    """Why a response got the score it got (the ``reason`` key; numbers so verl can aggregate them)."""

    CORRECT = 0
    #: An answer was extracted but it is wrong (code: some test printed/returned the wrong output).
    WRONG_ANSWER = 1
    #: No answer to extract: no ``####`` number / ``\\boxed{}`` / ``Answer:`` line, or no closed code block.
    NO_ANSWER = 2
    #: The ground truth itself could not be read (not a number, bad test-case JSON): a data problem, logged.
    BAD_GROUND_TRUTH = 3
    #: math-verify ran past its time limit (its worker process was killed).
    VERIFY_TIMEOUT = 4
    #: math-verify failed (raised, or its worker died).
    VERIFY_ERROR = 5
    #: The program does not compile (or fails while defining its functions).
    COMPILE_ERROR = 6
    #: The program raised, exited non-zero or crashed on a test.
    RUNTIME_ERROR = 7
    #: The program ran past the per-test or the overall time limit.
    TIMEOUT = 8
    #: The program ran out of the memory limit.
    MEMORY_LIMIT = 9
    #: Sandbox Fusion could not be reached or failed internally (the response was not judged).
    SANDBOX_ERROR = 10
    #: An unexpected error in troll-verl's scoring code itself (logged with its traceback).
    INTERNAL_ERROR = 11


def make_result(
    *,
    reason: Reason,
    has_answer: bool,
    pass_rate: float | None = None,
    continuous: bool = False,
) -> dict[str, float | int]:
    """Builds the result dict with the fixed :data:`RESULT_KEYS`.

    Args:
        reason: The outcome; ``Reason.CORRECT`` means fully correct.
        has_answer: Whether an answer (or a code block) was extracted.
        pass_rate: Fraction of test cases passed; defaults to 1.0 if correct else 0.0.
        continuous: Score with ``pass_rate`` instead of all-or-nothing ``acc``.

    Returns:
        ``{"score", "acc", "pass_rate", "has_answer", "reason"}`` with float values and an int ``reason``.
    """
    acc = 1.0 if reason == Reason.CORRECT else 0.0
    rate = acc if pass_rate is None else float(pass_rate)
    return {
        "score": rate if continuous else acc,
        "acc": acc,
        "pass_rate": rate,
        "has_answer": 1.0 if has_answer else 0.0,
        "reason": int(reason),
    }


def supported_data_sources() -> list[str]:
    """Returns the supported ``data_source`` names (``aime*``/``amc*`` stand for any name with that prefix)."""
    return sorted(GSM8K_SOURCES | MATH_SOURCES | CODE_SOURCES) + [f"{p}*" for p in MATH_PREFIXES]


def _family(data_source: str) -> str:
    if data_source in GSM8K_SOURCES:
        return "gsm8k"
    if data_source in MATH_SOURCES or data_source.startswith(MATH_PREFIXES):
        return "math"
    if data_source in CODE_SOURCES:
        return "code"
    raise ValueError(
        f"troll_verl.recipes.rewards.compute_score: unsupported data_source {data_source!r}; "
        f"supported: {', '.join(supported_data_sources())}"
    )


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    continuous: bool = False,
    math_timeout_s: float = 10.0,
    code_timeout_s: float = 5.0,
    code_total_timeout_s: float = 60.0,
    code_max_tests: int | None = None,
    memory_limit_mb: int | None = None,
    sandbox_fusion_url: str | None = None,
    sandbox_fusion_max_concurrent: int = 64,
    concurrent_semaphore: Any = None,
    **kwargs: Any,
) -> dict[str, float | int]:
    """verl custom reward function: scores one decoded response.

    Args:
        data_source: Dataset name (see the module docstring); selects the scorer.
        solution_str: The decoded response.
        ground_truth: ``reward_model.ground_truth`` of the sample: the answer (gsm8k, math) or the test cases
            (code: a JSON string or dict ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``).
        extra_info: The sample's ``extra_info`` (unused).
        continuous: Code only: score with the pass fraction instead of 1/0.
        math_timeout_s: Time limit of one math-verify check (its worker process is killed past it).
        code_timeout_s: Per-test time limit of a program (whole seconds: verl's harness uses ``signal.alarm``).
        code_total_timeout_s: Wall-clock limit of one program over all its tests.
        code_max_tests: Run at most this many test cases (the first ones); ``None`` runs all.
        memory_limit_mb: Memory limit of a program (address space locally; Sandbox Fusion's limit remotely).
            Defaults to 1024.
        sandbox_fusion_url: Sandbox Fusion ``run_code`` endpoint; when set (or ``TROLL_SANDBOX_FUSION_URL`` is),
            code is judged there instead of locally.
        sandbox_fusion_max_concurrent: Concurrent Sandbox Fusion requests per reward worker process, used when
            verl passes no ``concurrent_semaphore``.
        concurrent_semaphore: A semaphore bounding Sandbox Fusion requests (verl's default-function keyword).
        **kwargs: Anything else verl passes (e.g. ``reward_router_address``); ignored.

    Returns:
        The dict described in the module docstring.

    Raises:
        ValueError: If ``data_source`` is not supported.
    """
    del extra_info, kwargs
    family = _family(str(data_source))
    solution_str = "" if solution_str is None else str(solution_str)
    try:
        if family == "gsm8k":
            from . import gsm8k

            result = gsm8k.compute_score(solution_str, ground_truth)
        elif family == "math":
            from . import math as math_reward

            result = math_reward.compute_score(solution_str, ground_truth, timeout_s=math_timeout_s)
        else:
            from . import code

            result = code.compute_score(
                solution_str,
                ground_truth,
                continuous=continuous,
                timeout_s=code_timeout_s,
                total_timeout_s=code_total_timeout_s,
                max_tests=code_max_tests,
                memory_limit_mb=memory_limit_mb,
                sandbox_fusion_url=sandbox_fusion_url,
                sandbox_fusion_max_concurrent=sandbox_fusion_max_concurrent,
                concurrent_semaphore=concurrent_semaphore,
            )
    except Exception:
        logger.exception("troll_verl.recipes.rewards: scoring a %s sample failed; scoring it 0", data_source)
        result = make_result(reason=Reason.INTERNAL_ERROR, has_answer=False)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: %s %s", data_source, Reason(result["reason"]).name, result)
    return result


__all__ = ["RESULT_KEYS", "Reason", "compute_score", "make_result", "supported_data_sources"]

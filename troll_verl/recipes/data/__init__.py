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
"""Data preparation for the recipes: hub datasets to verl's RL parquet files.

:mod:`troll_verl.recipes.data.schema` checks verl's RL parquet schema; :mod:`troll_verl.recipes.data.prompts` defines
the prompt formats the rows carry (and the reward functions rely on). One module per dataset maps a hub record to a
verl row, without downloading anything: :mod:`~troll_verl.recipes.data.gsm8k` (``openai/gsm8k``),
:mod:`~troll_verl.recipes.data.dapo_math` (``BytedTsinghua-SIA/DAPO-Math-17k`` with ``BytedTsinghua-SIA/AIME-2024``)
and :mod:`~troll_verl.recipes.data.eurus2` (``PRIME-RL/Eurus-2-RL-Data``). The CLIs in ``examples/data_preprocess/``
write ``train.parquet`` and ``val.parquet`` with them and the shared helpers of :mod:`~troll_verl.recipes.data.common`
(reading records, counting skips, writing and checking the files).

data_source per dataset (the reward dispatch key): ``"openai/gsm8k"``, ``"math_dapo"`` (DAPO-Math-17k),
``"aime2024"`` (AIME-2024), ``"eurus2_math"`` and ``"eurus2_code"`` (Eurus-2-RL-Data).

Importing this package is cheap: pure Python, with pyarrow and ``datasets`` imported only when a file is read,
written or downloaded.
"""

from .prompts import (
    CODE_CALL_INSTRUCTION,
    CODE_STDIN_INSTRUCTION,
    GSM8K_INSTRUCTION,
    MATH_INSTRUCTION,
    code_prompt,
    gsm8k_prompt,
    math_prompt,
)
from .schema import REQUIRED_COLUMNS, check_rl_parquet, check_rl_rows

__all__ = [
    "REQUIRED_COLUMNS",
    "check_rl_rows",
    "check_rl_parquet",
    "GSM8K_INSTRUCTION",
    "MATH_INSTRUCTION",
    "CODE_STDIN_INSTRUCTION",
    "CODE_CALL_INSTRUCTION",
    "gsm8k_prompt",
    "math_prompt",
    "code_prompt",
]

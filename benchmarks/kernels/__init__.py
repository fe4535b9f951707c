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
"""Tooling around the Triton kernels of ``troll_verl.kernels``, outside the installed package:

- :mod:`.clip`: the fused log-probs of the sampled tokens, the clip objective's GPU baseline of the loss-step
  benchmark (``scripts/bench_kernels.py``);
- :mod:`.aot`: every kernel specialisation the launchers make, compiled ahead of time for a GPU this machine need not
  have, with its register use and spills (``python -m benchmarks.kernels.aot``).
"""

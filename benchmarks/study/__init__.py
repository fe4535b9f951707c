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
"""The learning studies' harness (``scripts/bench_learning.py``, docs/benchmarks.md), one job a module:

- :mod:`.arms`: the arm catalogue (each variant's TROLL, clip and DPPO overrides, schedule, learning rate);
- :mod:`.run`: the command line, the plan and the runner (each finished run saved at once);
- :mod:`.raw`: the raw results (filtered per-step metrics and run records; failed attempts);
- :mod:`.outcomes`: one run's outcomes from its metrics;
- :mod:`.stats`: the paired statistics;
- :mod:`.report`: the learning and stress-map tables; :mod:`.powered` and :mod:`.late_decay`: the two studies' plans
  as code and their tables;
- :mod:`.summary`: the README's headline and results table, from every study's plan code;
- :mod:`.after_mastery`: the after-mastery probes' tables and the rule that picks a confirmatory candidate;
- :mod:`.plots`: the reward curves; :mod:`.docs_block`: the tables' blocks in the docs.

Pure Python on the committed raw files for everything but :mod:`.run`, which starts verl's trainer.
"""

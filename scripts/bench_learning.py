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
"""Learning benchmark: TROLL vs clip (GRPO, GSPO), several seeds, verl's real trainer and vLLM rollout on CPU; the
powered and late-decay studies' tables. The command line of :mod:`benchmarks.study.run` (``--help``: its options, arms
and examples), kept here so that the commands in docs/benchmarks.md and the studies' plans run from a checkout.
"""

import os
import sys

# benchmarks/ lives beside scripts/ in the checkout, not in the installed package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.study.run import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())

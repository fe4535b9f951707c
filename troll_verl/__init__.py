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
"""troll-verl: TROLL for verl, from "Trust Regions improve Reinforcement Learning for Large Language Models"
(Becker et al., arXiv:2510.03817, ICLR 2026); TROLL stands for Trust Region Optimization for Large Language Models.

The numerical core is verl-free and cheap to import: :mod:`troll_verl.core.projection` (the exact per-token KL
projection) and :mod:`troll_verl.core.sparse` (sparse top-K supports computed lean from logits).
:mod:`troll_verl.core.losses` holds the policy loss on top of verl's ``agg_loss``.
"""

__version__ = "0.1.0.dev0"

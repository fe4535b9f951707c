# Copyright 2026 Bytedance Ltd. and/or its affiliates
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
"""TROLL: Trust Region Optimization for Large Language Models (Becker et al., arXiv:2510.03817).

TROLL replaces PPO's ratio clipping with a differentiable per-token KL trust-region projection of the new token
distribution onto a KL ball around the old one, computed on sparse top-K token distributions. Select it with
``actor_rollout_ref.actor.policy_loss.loss_mode=troll``; its settings are ``policy_loss.troll``
(:class:`verl.workers.config.TrollConfig`). See ``docs/algo/troll.md``.

- ``projection.py``: the exact projection, a custom autograd Function with the implicit-function gradient.
- ``sparse.py``: the sparse supports (top-K, mass rule, union, tail bucket), computed lean from the logits.
- ``terms.py``, ``losses.py``: the per-token terms, the loss and its hooks on the logits.
- ``layout.py``, ``fsdp/``: where the per-token data sits in a micro-batch, and the FSDP engine's hooks.
- ``fast_paths.py``, ``variants.py``: where an extension registers faster implementations (fused kernels) and other
  variants than the paper's (solver, tail, old-side estimate); both empty here.

The loss is registered in :mod:`verl.trainer.ppo.core_algos`, which imports these modules on first use.
"""

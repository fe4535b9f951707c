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
"""The CPU platform's engine overrides (troll_verl/platform/cpu.py) on verl's real FSDP2 engine."""

from verl.utils import torch_functional as verl_F

from troll_verl.testing.verl_engine import compose_config, make_actor_worker, tiny_model_dir


def test_the_engine_overrides_leave_nothing_to_torch_compile(tmp_path):
    """verl has two switches: the actor's ``use_torch_compile`` (its legacy worker) and its FSDP engine's own
    ``fsdp_config.use_torch_compile``, which otherwise wraps the entropy in ``torch.compile``: an inductor C++ build in
    every actor process on CPU, and compiled rather than eager fp32 numerics."""
    config = compose_config(tiny_model_dir(str(tmp_path), vocab=64))
    for role in ("actor", "ref"):
        section = config.actor_rollout_ref[role]
        assert section.use_torch_compile is False and section.fsdp_config.use_torch_compile is False, role
    worker = make_actor_worker(config)
    assert worker.actor.engine.compute_entropy_from_logits is verl_F.entropy_from_logits

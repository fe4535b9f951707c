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
"""The tiny model's build (troll_verl/assets/tiny): what the fast tests and the tiny launches train."""

from __future__ import annotations

import torch

from troll_verl.assets.tiny import TinySpec, build_assets
from troll_verl.assets.tiny import model as tiny_model


def test_the_build_computes_on_one_thread_and_gives_the_count_back(tmp_path, monkeypatch):
    """The warm-up runs on one thread whatever the process has (two threads on a busy machine wait for each other at
    every op of a 0.1 M-parameter model), and the process gets its thread count back."""
    seen = []

    def recording(name):
        function = getattr(tiny_model, name)

        def recorded(*args, **kwargs):
            seen.append((name, torch.get_num_threads()))
            return function(*args, **kwargs)

        monkeypatch.setattr(tiny_model, name, recorded)

    recording("warm_up")
    recording("generate")  # the accuracy checks after the warm-up
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assets = build_assets(str(tmp_path), TinySpec(warmup_steps=2), log=None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [("warm_up", 1)] + [("generate", 1)] * 3
    assert assets.model_dir.startswith(str(tmp_path))

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
"""The kernel choice (troll_verl.kernels): the config's value (configure) decides unless TROLL_KERNELS overrides it,
both are checked, and the start-up line says which path a process takes and why. No kernel runs here."""

import pytest
import torch

from troll_verl import kernels


@pytest.fixture
def choice(monkeypatch):
    """The module's configured choice and the environment restored after the test."""
    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    saved = kernels.kernel_choice()
    yield monkeypatch
    kernels.configure(saved)


def test_the_config_decides_unless_the_environment_overrides(choice):
    z = torch.zeros(2, 300, dtype=torch.bfloat16)
    choice.setenv("TRITON_INTERPRET", "1")  # CPU tensors count as the kernels' where the choice is triton
    kernels.configure("triton")
    assert kernels.kernel_choice() == "triton" and kernels.use_kernels(z)
    kernels.configure("torch")
    assert kernels.kernel_choice() == "torch" and not kernels.use_kernels(z)
    choice.setenv(kernels.KERNELS_ENV, "triton")  # the environment wins over the config
    assert kernels.kernel_choice() == "triton" and kernels.use_kernels(z)
    kernels.configure("triton")
    choice.setenv(kernels.KERNELS_ENV, "torch")
    assert not kernels.use_kernels(z)
    choice.setenv(kernels.KERNELS_ENV, " ")  # blank: the config's
    assert kernels.kernel_choice() == "triton"


def test_bad_choices_are_refused_naming_where_they_came_from(choice):
    with pytest.raises(ValueError, match="auto"):
        kernels.configure("cuda")
    choice.setenv(kernels.KERNELS_ENV, "cuda")
    with pytest.raises(ValueError, match=kernels.KERNELS_ENV):
        kernels.kernel_choice()


def test_the_start_up_line_names_the_path_and_its_source(choice):
    kernels.configure("torch")
    assert kernels.describe_choice() == "TROLL kernels: torch (config): the torch path on every device."
    kernels.configure("auto")
    line = kernels.describe_choice()
    if torch.cuda.is_available():
        assert "Triton kernels" in line or "triton does not import" in line
    else:
        assert line == "TROLL kernels: auto (config): no CUDA device here, so the torch path."
    choice.setenv(kernels.KERNELS_ENV, "torch")
    assert "(TROLL_KERNELS=torch)" in kernels.describe_choice()

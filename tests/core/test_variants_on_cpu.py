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
"""Tests of troll_verl.core.variants: the table an extension fills with other solvers, tails and old-side
estimates, and the core's entry points asking it."""

import pytest
import torch

import troll_verl.core.variants as variants
from troll_verl.core.projection import project
from troll_verl.core.variants import CORE_VARIANTS, register_variant, variant, variant_names


@pytest.fixture
def table(monkeypatch):
    """The variants table, restored after the test."""
    saved = {switch: dict(names) for switch, names in variants._TABLE.items()}
    yield variants._TABLE
    for switch, names in saved.items():
        variants._TABLE[switch].clear()
        variants._TABLE[switch].update(names)


def _echo(*args):
    return args


def test_the_core_answers_its_own_names_and_registered_ones_by_their_function(table):
    assert all(variant(switch, name) is None for switch, name in CORE_VARIANTS.items())
    register_variant("tail", "echo", _echo)
    register_variant("tail", "echo", _echo)  # the same function again: a no-op
    assert variant("tail", "echo") is _echo
    assert variant_names("tail")[0] == "bucket" and variant_names("tail")[-1] == "echo"


@pytest.mark.parametrize(
    "switch, name, match",
    [("kernel", "x", "is not one of"), ("solver", "newton", "the core's own"), ("tail", "held", "already registered")],
)
def test_registering_an_unknown_switch_the_cores_name_or_a_held_name_is_refused(table, switch, name, match):
    register_variant("tail", "held", _echo)
    with pytest.raises(ValueError, match=match):
        register_variant(switch, name, lambda *a: a)


def test_an_unregistered_name_is_refused_naming_the_choices(table):
    with pytest.raises(ValueError, match=r"solver must be one of \('newton'.*got 'brent'.*register_variant"):
        variant("solver", "brent")


def test_project_hands_a_registered_solver_the_rows_and_uses_its_answer(table):
    """The solver's u = log w is what the projection applies: a solver that answers w = 1/2 for every row gives
    log π = (log π̃ + log π_old) / 2 renormalised on the projected rows, and its iteration count is reported."""
    calls = []

    def halfway(moments, kl_before, target, w_min, max_iter, tol, active, host):
        calls.append((kl_before.shape, bool(active.all()), max_iter))
        return torch.full_like(kl_before, -torch.log(torch.tensor(2.0, dtype=kl_before.dtype))), torch.tensor(7)

    register_variant("solver", "halfway", halfway)
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(5, 9, generator=g, dtype=torch.float64), -1)
    new = torch.log_softmax(old + 3 * torch.randn(5, 9, generator=g, dtype=torch.float64), -1)
    res = project(new, old, 1e-3, solver="halfway", max_iter=11)
    assert calls == [(torch.Size([5]), True, 11)]
    expected = torch.log_softmax(0.5 * (new + old), -1)
    torch.testing.assert_close(res.logprobs, expected, atol=1e-12, rtol=0)
    assert int(res.num_iters) == 7 and bool(res.projected.all())

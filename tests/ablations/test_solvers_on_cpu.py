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
"""Tests of troll_verl.ablations.solvers: the bisection solver, through the core's projection."""

import subprocess
import sys

import pytest
import torch

from troll_verl import ablations  # noqa: F401  (registers the variants)
from troll_verl.core.projection import project
from troll_verl.testing.reference import dense_project_row, logprob_pair

EPS = 0.05


@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0, 3.0, 30.0, 1e3])
def test_bisection_matches_brute_force_float64(scale):
    new, old = logprob_pair(24, 17, scale, seed=1)
    res = project(new, old, EPS, solver="bisection", max_iter=200)
    for i in range(new.shape[0]):
        ref, eta = dense_project_row(new[i], old[i], EPS)
        torch.testing.assert_close(res.logprobs[i], ref, atol=1e-7, rtol=0)
        assert abs(res.eta[i].item() - eta) <= 1e-5 * eta + 1e-9
        assert bool(res.projected[i]) == (eta > 0)


def test_the_solvers_agree_and_newton_uses_fewer_passes():
    new, old = logprob_pair(2000, 64, 3.0, seed=12, dtype=torch.float32)
    a = project(new, old, EPS, solver="newton")
    b = project(new, old, EPS, solver="bisection", max_iter=40)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-4, rtol=0)
    assert a.num_iters <= 8 < b.num_iters == 40


def test_bisection_reports_no_pass_where_no_row_is_projected():
    new, old = logprob_pair(6, 9, 1e-4, seed=3)
    res = project(new, old, EPS, solver="bisection", max_iter=40)
    assert not bool(res.projected.any()) and int(res.num_iters) == 0
    torch.testing.assert_close(res.logprobs, new, atol=0, rtol=0)


def test_the_core_alone_refuses_the_ablations_and_names_the_fix():
    """Without troll_verl.ablations imported the core knows only its own choices (what goes upstream); troll-verl's
    settings import the ablations, so there every value is accepted."""
    code = (
        "from troll_verl.core.config import TrollConfig\n"
        "try:\n    TrollConfig(solver='bisection')\nexcept ValueError as e:\n    print('refused:', e)\n"
        "from troll_verl.config import TrollPolicyLossConfig\n"
        "print('accepted:', TrollPolicyLossConfig(solver='bisection', tail='renormalize', old_estimate='upper').solver)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "refused: actor_rollout_ref.actor.policy_loss.troll.solver must be one of ['newton']" in out
    assert "register_variant" in out and "accepted: bisection" in out

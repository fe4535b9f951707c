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
"""TROLL's diagnostics (``policy_loss.diagnostics``) on verl's real FSDP2 engine: a tiny Qwen2 (fp32, CPU), the worker
route's recorded case (8 sequences, two mini-batches of two micro-batches each), verl's actor worker in this process.

Each part is checked against an update that has only that part: the regression part's norm against the gradient norm
of an update whose advantages are all zero (its loss is α·L_reg alone), the policy-gradient part's against an update
with α = 0 (its loss is L_pg alone); both on the first mini-batch, from the same weights.
"""

import os
import runpy

import pytest
import torch
from verl.utils import tensordict_utils as tu

from troll_verl.integration.seam import seam_available
from troll_verl.testing.verl_engine import (
    compose_config,
    make_actor_worker,
    make_batch,
    old_pass,
    tiny_model_dir,
    update_batch,
)

pytestmark = pytest.mark.skipif(seam_available(), reason="on a verl with the seam verl's own worker runs TROLL")

_FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "worker_route", "record_reference.py")
CASE = runpy.run_path(_FIXTURE, run_name="worker_route_case")
VOCAB, TEMPERATURE, SEED = CASE["VOCAB"], CASE["TEMPERATURE"], CASE["SEED"]
PROMPTS, RESPONSES = CASE["PROMPTS"], CASE["RESPONSES"]
DIAGNOSTICS = "actor_rollout_ref.actor.policy_loss.diagnostics=true"
# the steps with diagnostics on against those without (the same computation, the extra pass before each)
REL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny_qwen2")), vocab=VOCAB)


def _run(model_dir, *overrides, advantages=None, count=None):
    """One update of the recorded case; its metrics. ``count``: a dict that receives the engine's passes with a
    gradient (``forward_backward_batch(forward_only=False)``) and the autograd backward calls."""
    torch.manual_seed(SEED)
    worker = make_actor_worker(compose_config(model_dir, *CASE["OVERRIDES"], *overrides))
    batch = make_batch(VOCAB, PROMPTS, RESPONSES, seed=SEED)
    old = old_pass(worker, batch, TEMPERATURE)
    advantages = CASE["case_advantages"]() if advantages is None else advantages
    data = update_batch(batch, old, advantages, TEMPERATURE, mini_batch_size=4)
    if count is None:
        return tu.get(worker.update_actor(data), "metrics")
    engine = worker.actor.engine
    original_pass, original_backward = engine.forward_backward_batch, torch.autograd.backward
    count.update(passes=0, backwards=0)

    def counted_pass(*args, **kwargs):
        count["passes"] += not kwargs.get("forward_only", False)
        return original_pass(*args, **kwargs)

    def counted_backward(*args, **kwargs):
        count["backwards"] += 1
        return original_backward(*args, **kwargs)

    engine.forward_backward_batch = counted_pass
    torch.autograd.backward = counted_backward
    try:
        return tu.get(worker.update_actor(data), "metrics")
    finally:
        torch.autograd.backward = original_backward


def _floats(metrics, key):
    return [float(v) for v in metrics[key]]


def _unadvantaged_second_step() -> torch.Tensor:
    """The case's advantages with the second mini-batch's (sequences 4-7) all zero."""
    advantages = CASE["case_advantages"]()
    advantages[4:] = 0.0
    return advantages


@pytest.fixture(scope="module")
def runs(model_dir):
    """The case with diagnostics off and on (counting passes), with α = 0, and with the second optimizer step's
    advantages all zero (diagnostics on).

    The first step projects nothing (the old top-K is the current policy's), so its regression term and that term's
    gradient are exactly zero: every run here takes the same first step, and their second steps start from the same
    weights. There, α = 0 leaves L_pg alone and zero advantages leave α·L_reg alone."""
    off_count, on_count = {}, {}
    out = {
        "off": _run(model_dir, count=off_count),
        "on": _run(model_dir, DIAGNOSTICS, count=on_count),
        "alpha0": _run(model_dir, "actor_rollout_ref.actor.policy_loss.alpha=0.0"),
        "unadvantaged": _run(model_dir, DIAGNOSTICS, advantages=_unadvantaged_second_step()),
    }
    return out, off_count, on_count


def test_off_costs_nothing_and_on_one_extra_backward_per_optimizer_step(runs):
    """Off: one pass with a gradient per optimizer step (2) and one backward per micro-batch (4), as verl's own update;
    on: exactly one more of each per optimizer step (the regression part), and no diagnostic metric when off."""
    metrics, off, on = runs
    assert off == {"passes": 2, "backwards": 4}, off
    assert on == {"passes": 4, "backwards": 8}, on
    assert not [key for key in metrics["off"] if key.startswith(("troll/grad_norm_", "troll/zero_adv", "troll/floor"))]


def test_the_extra_pass_leaves_the_update_as_it_was(runs):
    """The optimizer steps with diagnostics on are those without: the same loss, gradient norm and projection."""
    metrics, _, _ = runs
    for key in ("actor/pg_loss", "grad_norm", "troll/projected_frac", "troll/kl_before"):
        off, on = _floats(metrics["off"], key), _floats(metrics["on"], key)
        assert off == pytest.approx(on, rel=REL, abs=1e-9), (key, off, on)


def test_the_parts_are_the_regression_and_the_policy_gradient(runs):
    """Second optimizer step (the projection acts): the regression part's norm is the gradient norm of the step with no
    advantage (α·L_reg alone), the policy-gradient part's that of the step with α = 0 (L_pg alone). They differ by a
    factor of about 18, so reporting one as the other fails. First step: no regression, the whole norm is the pg's."""
    metrics, _, _ = runs
    on = metrics["on"]
    regression, pg, total = (
        _floats(on, key) for key in ("troll/grad_norm_regression", "troll/grad_norm_pg", "grad_norm")
    )
    assert regression[1] == pytest.approx(_floats(metrics["unadvantaged"], "grad_norm")[1], rel=1e-4)
    assert pg[1] == pytest.approx(_floats(metrics["alpha0"], "grad_norm")[1], rel=1e-4)
    assert regression[1] > 0 and pg[1] > 2 * regression[1]
    assert regression[0] == 0.0 and pg[0] == pytest.approx(total[0], rel=1e-6)
    assert total[1] <= regression[1] + pg[1] + 1e-6 * total[1]


def test_the_zero_advantage_share_and_its_gradient_norm(runs):
    """The second mini-batch's advantages all zero: the step's share is 1/2, that mini-batch's gradient norm (TROLL's
    regression alone) is its zero-advantage gradient norm, and its policy-gradient part is zero."""
    metrics, _, _ = runs
    unadvantaged = metrics["unadvantaged"]
    grad_norm = _floats(unadvantaged, "grad_norm")
    assert _floats(unadvantaged, "troll/zero_adv_frac") == [0.0, 1.0]
    assert _floats(unadvantaged, "troll/zero_adv_grad_norm") == [grad_norm[1]] and grad_norm[1] > 0
    assert _floats(unadvantaged, "troll/grad_norm_pg")[1] == pytest.approx(0.0, abs=1e-6 * grad_norm[1])
    assert _floats(metrics["on"], "troll/zero_adv_frac") == [0.0, 0.0]
    assert "troll/zero_adv_grad_norm" not in metrics["on"]


def test_the_floor_only_share_is_what_the_upper_estimate_does_not_project(model_dir):
    """With K = 4 (the current policy's top tokens often outside the old top-K) the second step projects 5 of 14 tokens
    under the floor and 2 under the upper estimate, whose projected tokens the floor projects too: floor_only_frac is
    the difference, 3 of 14. The first step projects nothing under either, so both second steps start from the same
    weights."""
    topk = "actor_rollout_ref.actor.policy_loss.topk=4"
    on = _run(model_dir, DIAGNOSTICS, topk)
    upper = _run(model_dir, topk, "actor_rollout_ref.actor.policy_loss.old_estimate=upper")
    floor_only, projected = _floats(on, "troll/floor_only_frac"), _floats(on, "troll/projected_frac")
    projected_upper = _floats(upper, "troll/projected_frac")
    assert projected[0] == projected_upper[0] == floor_only[0] == 0.0
    assert floor_only[1] == pytest.approx(projected[1] - projected_upper[1], abs=1e-6)
    assert 0.0 < floor_only[1] < projected[1]


def test_the_diagnostics_refuse_the_megatron_strategy(model_dir):
    """The actor-level rule, as troll_verl.main and the worker run it: Megatron's engine is refused, naming the key."""
    from troll_verl.integration.checks import check_actor

    config = compose_config(model_dir, DIAGNOSTICS).actor_rollout_ref
    assert check_actor(config.actor, config.model).diagnostics is True
    config.actor.strategy = "megatron"
    with pytest.raises(ValueError, match="policy_loss.diagnostics=false"):
        check_actor(config.actor, config.model)

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
"""troll_verl.bypass.rollout_topk: the engine's top-K turned into the old pass's stored top-K, and aligned with verl's
responses (misaligned, truncated, empty and padding samples)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from troll_verl.bypass.rollout_topk import (
    RolloutTopKError,
    align_rollout_topk,
    old_topk_from_rollout,
    point_mass_rows,
    topk_arrays_from_logprobs,
)
from troll_verl.core.sparse import old_topk_from_logits
from troll_verl.testing.vllm_topk import flat_logprobs


def _engine_topk(logits: torch.Tensor, k: int, shuffle: bool = False):
    """What an engine returns: the top-k of log_softmax in fp32 (optionally in a scrambled column order)."""
    lp = torch.log_softmax(logits.double(), dim=-1).float()
    vals, ids = torch.topk(lp, k, dim=-1)
    if shuffle:
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(0))
        vals, ids = vals[:, perm], ids[:, perm]
    return ids.int(), vals


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("scale", "mass_delta"), [(1.0, 1e-5), (4.0, 1e-5), (8.0, 1e-3)])
def test_equals_the_actor_pass_from_the_same_logits(scale, mass_delta, shuffle):
    """Ids, log-probs and tail mass as old_topk_from_logits computes them from the full logits, to 1e-5; peaked
    logits (scale 8) trigger the mass rule, flat ones keep all K."""
    torch.manual_seed(0)
    V, K = 50, 16
    logits = torch.randn(40, V, dtype=torch.float64) * scale
    ref = old_topk_from_logits(logits, topk=K, mass_delta=mass_delta, floor=1e-12)
    ids, lps = _engine_topk(logits, K, shuffle)
    got = old_topk_from_rollout(ids, lps, topk=K, mass_delta=mass_delta, floor=1e-12)
    assert got.ids.dtype == torch.int32 and got.tail_logprob.dtype == torch.float32
    assert torch.equal(got.ids, ref.ids)
    kept = ref.ids >= 0
    assert torch.allclose(got.logprobs[kept].double(), ref.logprobs[kept].double(), atol=1e-5)
    assert (got.logprobs[~kept] == math.log(1e-12)).all()
    assert torch.allclose(got.tail_logprob.double().exp(), ref.tail_logprob.double().exp(), atol=1e-5)
    if scale == 8.0:
        assert (~kept).any()  # the mass rule dropped entries somewhere


def test_tail_is_clamped_to_the_floor_when_rounding_leaves_no_mass():
    ids = torch.tensor([[3, 1]], dtype=torch.int32)
    lps = torch.tensor([[0.0, -1e-3]])  # sums above 1 by rounding: 1 − Σ < 0
    got = old_topk_from_rollout(ids, lps, topk=2, mass_delta=1e-5, floor=1e-9)
    assert got.ids.tolist() == [[3, -1]]  # the first entry already holds all the mass
    assert math.isclose(float(got.tail_logprob[0]), math.log(1e-9), rel_tol=1e-6)


def test_topk_caps_the_engine_width_and_bad_shapes_are_refused():
    logits = torch.randn(5, 30)
    ids, lps = _engine_topk(logits, 10)
    got = old_topk_from_rollout(ids, lps, topk=4, mass_delta=1e-5)
    assert got.ids.shape == (5, 4) and torch.equal(got.ids, ids[:, :4])
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        old_topk_from_rollout(ids[:, :3], lps, topk=4)
    with pytest.raises(ValueError, match="integer"):
        old_topk_from_rollout(lps, lps, topk=4)
    with pytest.raises(ValueError, match="topk"):
        old_topk_from_rollout(ids, lps, topk=0)


def test_a_rounding_swap_at_rank_k_projects_its_token_under_the_floor_only():
    """The engine and the actor compute the same policy, but rounding orders two near-equal tokens at ranks K and
    K + 1 differently. The token only the actor ranks inside its top-K is not in the rollout's stored top-K: the
    paper's floor (TROLL §5) makes its old probability 1e-12, so ``π̃_a log(π̃_a / floor)`` (hundredths at a T = 1 tail)
    projects that token at a tight bound, from rounding alone. ``old_estimate=upper`` (at most the stored K-th
    probability) leaves it at rounding. Rows without a swap stay at rounding either way."""
    from troll_verl import ablations  # noqa: F401  (registers old_estimate=upper)
    from troll_verl.core.projection import project
    from troll_verl.core.sparse import troll_sparse_from_logits

    V, K, bound = 4000, 64, 0.002
    actor = torch.randn(6, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2.5
    order = actor[0].argsort(descending=True)
    kth, next_one = order[K - 1], order[K]
    actor[0, next_one] = actor[0, kth] - 1e-5  # a near tie at ranks K and K + 1 (fp32 still tells them apart)
    engine = actor.clone()
    engine[0, next_one] += 2e-5  # the engine's rounding puts the other one inside
    ids, lps = _engine_topk(engine, K)
    old = old_topk_from_rollout(ids, lps, topk=K, mass_delta=1e-5, value_dtype=torch.float64)
    assert bool((old.ids >= 0).all()), "the tail is long: K binds, not the mass rule"
    sampled = order.new_zeros(6) + order[0]  # row 0's most likely token, inside both top-Ks
    sampled_old = torch.log_softmax(engine, -1).gather(1, sampled[:, None]).squeeze(1)
    kl = {}
    for estimate in ("floor", "upper"):
        sup = troll_sparse_from_logits(actor, sampled, old, sampled_old, topk=K, old_estimate=estimate)
        kl[estimate] = project(sup.new_logprobs, sup.old_logprobs, bound, mask=sup.mask).kl_before
    assert 0.01 < float(kl["floor"][0]) < 0.1, kl  # the swapped row: about p_K log(p_K / 1e-12)
    assert float(kl["upper"][0]) < 1e-6, kl
    assert float(kl["floor"][1:].abs().max()) < 1e-6 and float(kl["upper"][1:].abs().max()) < 1e-6, kl


# ---------------------------------------------------------------------------------------------------------------------
# parsing vLLM's sample log-probs (its two containers, filled by hand here; the real engine in test_bypass_on_cpu.py)


def test_flat_logprobs_drop_the_sampled_entry_and_keep_rank_order():
    # position 0 sampled token 7 (outside the top 2), position 1 sampled 4 (also rank 1: duplicated, not collapsed)
    flat = flat_logprobs([[(7, -3.0), (4, -0.5), (5, -1.2)], [(4, -0.1), (4, -0.1), (9, -2.5)]])
    ids, lps = topk_arrays_from_logprobs(flat, 2)
    assert ids.tolist() == [[4, 5], [4, 9]] and ids.dtype == np.int32
    assert np.allclose(lps, [[-0.5, -1.2], [-0.1, -2.5]]) and lps.dtype == np.float32
    with pytest.raises(RolloutTopKError, match="expected 4"):
        topk_arrays_from_logprobs(flat, 3)


def test_dict_logprobs_are_read_by_rank():
    Lp = lambda lp, rank: SimpleNamespace(logprob=lp, rank=rank)  # noqa: E731
    rows = [{7: Lp(-3.0, 9), 4: Lp(-0.5, 1), 5: Lp(-1.2, 2)}, {9: Lp(-2.5, 2), 4: Lp(-0.1, 1)}]
    ids, lps = topk_arrays_from_logprobs(rows, 2)
    assert ids.tolist() == [[4, 5], [4, 9]] and np.allclose(lps, [[-0.5, -1.2], [-0.1, -2.5]])
    with pytest.raises(RolloutTopKError, match="position 0 carries 2"):
        topk_arrays_from_logprobs(rows, 3)


def test_no_tokens_give_empty_arrays():
    for empty in (None, []):
        ids, lps = topk_arrays_from_logprobs(empty, 4)
        assert ids.shape == (0, 4) and lps.shape == (0, 4)


# ---------------------------------------------------------------------------------------------------------------------
# alignment with verl's responses


def _arrays(t: int, k: int = 3):
    return np.arange(t * k, dtype=np.int32).reshape(t, k), -np.ones((t, k), dtype=np.float32)


def test_aligned_and_truncated_responses_keep_their_first_rows():
    ids, lps = _arrays(5)
    got_ids, got_lps = align_rollout_topk(ids, lps, torch.arange(5), k=3, max_response_length=8)
    assert got_ids.tolist() == ids.tolist() and got_lps.dtype == torch.float32
    # generated 5 tokens, verl cut the response at response_length=4
    got_ids, _ = align_rollout_topk(ids, lps, torch.arange(4), k=3, max_response_length=4)
    assert got_ids.tolist() == ids[:4].tolist()


def test_empty_response_gives_empty_rows():
    for ids, lps in ((None, None), _arrays(0)):
        got_ids, got_lps = align_rollout_topk(ids, lps, torch.zeros(0, dtype=torch.long), k=3, max_response_length=4)
        assert got_ids.shape == (0, 3) and got_lps.shape == (0, 3)


@pytest.mark.parametrize(
    ("t", "r", "match"),
    [
        (3, 5, "multi-turn or tool agent loop"),
        (6, 5, "was not cut at rollout.response_length=8"),
        (None, 2, "returned no top-K"),
    ],
)
def test_misaligned_rows_are_refused_with_the_fix(t, r, match):
    ids, lps = (None, None) if t is None else _arrays(t)
    with pytest.raises(RolloutTopKError, match=match) as info:
        align_rollout_topk(ids, lps, torch.arange(r), k=3, max_response_length=8)
    assert "bypass_mode=false" in str(info.value)


def test_wrong_width_is_refused():
    ids, lps = _arrays(4, k=2)
    with pytest.raises(RolloutTopKError, match=r"expected \(T, 3\)"):
        align_rollout_topk(ids, lps, torch.arange(4), k=3, max_response_length=8)


def test_padding_samples_get_a_point_mass_on_their_token():
    """verl's synthetic padding sample copies the first real sample's fields (top-K of another length) but has a
    one-token response with rollout log-prob 0: its rows must be a distribution consistent with that."""
    ids, lps = _arrays(7)
    got_ids, got_lps = align_rollout_topk(ids, lps, torch.tensor([2]), k=3, max_response_length=8, is_padding=True)
    assert got_ids.tolist() == [[2, -1, -1]]
    old = old_topk_from_rollout(got_ids, got_lps, topk=3, floor=1e-12)
    assert old.ids.tolist() == [[2, -1, -1]] and float(old.logprobs[0, 0]) == 0.0
    assert math.isclose(float(old.tail_logprob[0]), math.log(1e-12), rel_tol=1e-6)
    assert torch.equal(point_mass_rows(torch.tensor([5, 6]), 2, 1e-12)[0], torch.tensor([[5, -1], [6, -1]]).int())

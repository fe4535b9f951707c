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
"""Tests of troll_verl.core.sparse: support rule, union, tail bucket, gradients and the memory contract."""

import math

import pytest
import torch

from troll_verl.core.host import SYNC_FREE_ENV
from troll_verl.core.projection import project
from troll_verl.core.sparse import (
    OldTopK,
    mass_rule_mask,
    old_topk_from_logits,
    troll_sparse_from_logits,
)
from troll_verl.testing.reference import brute_support

LOG_FLOOR = math.log(1e-12)


def _setup(N=10, V=60, K=8, delta=1e-3, scale=3.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z_old = torch.randn(N, V, generator=g, dtype=torch.float64) * scale
    z = z_old + torch.randn(N, V, generator=g, dtype=torch.float64)
    sampled = torch.multinomial(torch.softmax(z_old, -1), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z_old.to(dtype), topk=K, mass_delta=delta, value_dtype=dtype)
    old_sampled = torch.log_softmax(z_old, -1).gather(1, sampled[:, None]).squeeze(1).to(dtype)
    return z.to(dtype), z_old.to(dtype), sampled, old, old_sampled


def test_mass_rule_mask():
    lp = torch.log(torch.tensor([[0.6, 0.3, 0.09, 0.01], [0.999999, 5e-7, 3e-7, 2e-7]]))
    torch.testing.assert_close(
        mass_rule_mask(lp, 0.05), torch.tensor([[True, True, True, False]] + [[True] + [False] * 3])
    )
    assert mass_rule_mask(lp, 1e-9).all()


def test_old_topk_matches_brute_force():
    z, z_old, sampled, old, _ = _setup(N=12, K=10, delta=1e-2)
    lsm = torch.log_softmax(z_old, -1)
    for i in range(z_old.shape[0]):
        kept = brute_support(lsm[i], 10, 1e-2)
        ids = old.ids[i][old.ids[i] >= 0].tolist()
        assert ids == kept
        torch.testing.assert_close(old.logprobs[i, : len(ids)], lsm[i, ids])
        tail = math.log(1 - lsm[i, ids].exp().sum().item())
        assert math.isclose(old.tail_logprob[i].item(), max(tail, LOG_FLOOR), rel_tol=1e-9)
    assert old.ids.dtype == torch.int32


def test_union_values_and_tail_match_brute_force():
    K, delta = 8, 1e-3
    z, z_old, sampled, old, old_sampled = _setup(N=16, K=K, delta=delta)
    sup = troll_sparse_from_logits(z, sampled, old, old_sampled, topk=K, mass_delta=delta)
    lsm, lsm_old = torch.log_softmax(z, -1), torch.log_softmax(z_old, -1)
    for i in range(z.shape[0]):
        old_ids = [j for j in old.ids[i].tolist() if j >= 0]
        new_ids = brute_support(lsm[i], K, delta)
        union = sorted(set(old_ids) | set(new_ids) | {int(sampled[i])})
        n = len(union)
        assert sup.ids[i, :n].tolist() == union and (sup.ids[i, n:] == -1).all()
        assert sup.mask[i, :n].all() and not sup.mask[i, n:-1].any() and sup.mask[i, -1]
        torch.testing.assert_close(sup.new_logprobs[i, :n], lsm[i, union])
        tail = math.log(1 - lsm[i, union].exp().sum().item())
        assert math.isclose(sup.new_logprobs[i, -1].item(), max(tail, LOG_FLOOR), rel_tol=1e-9)
        for pos, j in enumerate(union):
            expected = lsm_old[i, j].item() if (j in old_ids or j == int(sampled[i])) else LOG_FLOOR
            assert math.isclose(sup.old_logprobs[i, pos].item(), expected, rel_tol=1e-12), (i, j)
        assert union[sup.sampled_index[i]] == int(sampled[i])
        # old distribution on S + tail sums to one (tail corrected for the tokens the union added)
        total = sup.old_logprobs[i, :n].exp().sum() + sup.old_logprobs[i, -1].exp()
        assert math.isclose(total.item(), 1.0, abs_tol=1e-9)


def test_sampled_token_outside_old_support_moves_out_of_old_tail():
    z, z_old, _, old, _ = _setup(N=4, K=2, delta=1e-9)
    lsm_old = torch.log_softmax(z_old, -1)
    sampled = torch.argsort(lsm_old, dim=-1, descending=True)[:, 5]  # never in the stored top-2
    old_sampled = lsm_old.gather(1, sampled[:, None]).squeeze(1)
    sup = troll_sparse_from_logits(z, sampled, old, old_sampled, topk=2, mass_delta=1e-9)
    got = sup.old_logprobs.gather(1, sup.sampled_index[:, None]).squeeze(1)
    torch.testing.assert_close(got, old_sampled)
    n = sup.mask[:, :-1].sum(-1)
    for i in range(4):
        total = sup.old_logprobs[i, : n[i]].exp().sum() + sup.old_logprobs[i, -1].exp()
        assert math.isclose(total.item(), 1.0, abs_tol=1e-9)


@pytest.mark.parametrize("chunk_size", [1, 3, None])
def test_gradcheck_logits_path(chunk_size):
    z, _, sampled, old, old_sampled = _setup(N=7, V=30, K=5, delta=1e-2)
    z.requires_grad_(True)

    def fn(x):
        sup = troll_sparse_from_logits(x, sampled, old, old_sampled, topk=5, mass_delta=1e-2, chunk_size=chunk_size)
        return sup.new_logprobs.masked_fill(~sup.mask, 0.0)

    assert torch.autograd.gradcheck(fn, (z,))


def test_results_do_not_depend_on_chunk_size():
    z, _, sampled, old, old_sampled = _setup(N=33, V=200, K=16, delta=1e-5, dtype=torch.float32)
    outs = [troll_sparse_from_logits(z, sampled, old, old_sampled, topk=16, chunk_size=c) for c in (1, 5, 64)]
    for o in outs[1:]:
        for a, b in zip(outs[0], o, strict=True):
            assert torch.equal(a, b)


def test_sparse_path_equals_dense_path_when_topk_covers_vocab():
    """With K = V every token is in the support; the projection must match the dense full-vocab one."""
    N, V = 12, 40
    z, z_old, sampled, old, old_sampled = _setup(N=N, V=V, K=V, delta=1e-14, scale=1.0, seed=3)
    z.requires_grad_(True)
    sup = troll_sparse_from_logits(z, sampled, old, old_sampled, topk=V, mass_delta=1e-14)
    # ids sorted, padding last: the first V entries are the vocabulary; the rest is padding (trimmed where the core
    # reads values back, the fixed width K_old + K + 1 where it is sync-free), then the tail
    assert sup.mask[:, :V].all() and not sup.mask[:, V:-1].any()
    assert (sup.ids[:, :V] == torch.arange(V)).all()
    eps = 0.02
    sparse = project(sup.new_logprobs, sup.old_logprobs, eps, mask=sup.mask)
    dense = project(torch.log_softmax(z, -1), torch.log_softmax(z_old, -1), eps)
    assert dense.projected.any()
    torch.testing.assert_close(sparse.logprobs[:, :V], dense.logprobs, atol=1e-9, rtol=0)
    torch.testing.assert_close(sparse.eta, dense.eta, atol=1e-9, rtol=1e-6)
    v = torch.randn(N, V, dtype=torch.float64)
    (g_sparse,) = torch.autograd.grad((sparse.logprobs[:, :V] * v).sum(), z)
    (g_dense,) = torch.autograd.grad((dense.logprobs * v).sum(), z)
    torch.testing.assert_close(g_sparse, g_dense, atol=1e-9, rtol=0)


@pytest.mark.host_only
def test_saves_no_extra_vocab_sized_buffer():
    """Memory contract: backward keeps only the caller's logits (no copy) plus O(N·S) tensors."""
    N, V, K = 64, 4000, 16
    z, _, sampled, old, old_sampled = _setup(N=N, V=V, K=K, delta=1e-5, dtype=torch.float32)
    z.requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        sup = troll_sparse_from_logits(z, sampled, old, old_sampled, topk=K)
    big = [t for t in saved if t.numel() >= N * V // 8]
    assert len(big) == 1 and big[0].data_ptr() == z.data_ptr()
    assert sum(t.numel() for t in saved if t.data_ptr() != z.data_ptr()) <= 8 * N * (2 * K + 2)
    sup.new_logprobs.sum().backward()
    assert z.grad.shape == z.shape


def test_low_precision_logits_and_old_values():
    z, z_old, sampled, old64, old_sampled = _setup(N=20, V=300, K=16, delta=1e-5, dtype=torch.float32)
    old_bf16 = old_topk_from_logits(z_old, topk=16, value_dtype=torch.bfloat16)
    assert old_bf16.logprobs.dtype == torch.bfloat16 and old_bf16.tail_logprob.dtype == torch.float32
    zb = z.to(torch.bfloat16).requires_grad_(True)
    sup = troll_sparse_from_logits(zb, sampled, old_bf16, old_sampled, topk=16)
    assert sup.new_logprobs.dtype == torch.float32
    sup.new_logprobs.sum().backward()
    assert zb.grad.dtype == torch.bfloat16 and torch.isfinite(zb.grad.float()).all()


def test_empty_batch():
    z = torch.zeros(0, 10, requires_grad=True)
    empty = OldTopK(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, 4), torch.zeros(0))
    sup = troll_sparse_from_logits(z, torch.zeros(0, dtype=torch.long), empty, torch.zeros(0), topk=4)
    assert sup.new_logprobs.shape[0] == 0
    sup.new_logprobs.sum().backward()


@pytest.mark.parametrize(
    "kwargs, match",
    [({"topk": 0}, "topk"), ({"mass_delta": 0.0}, "mass_delta"), ({"mass_delta": 1.0}, "mass_delta"),
     ({"floor": 0.0}, "floor"), ({"chunk_size": 0}, "chunk_size")],
)  # fmt: skip
def test_invalid_arguments(kwargs, match):
    z, _, sampled, old, old_sampled = _setup(N=3, V=20, K=4)
    with pytest.raises(ValueError, match=match):
        troll_sparse_from_logits(z, sampled, old, old_sampled, **kwargs)
    if "chunk_size" not in kwargs:
        with pytest.raises(ValueError, match=match):
            old_topk_from_logits(z, **kwargs)


def test_invalid_shapes():
    z, _, sampled, old, old_sampled = _setup(N=3, V=20, K=4)
    with pytest.raises(ValueError, match="sampled_ids"):
        troll_sparse_from_logits(z, sampled[:2], old, old_sampled, topk=4)
    with pytest.raises(ValueError, match="old top-K"):
        troll_sparse_from_logits(z, sampled, OldTopK(old.ids[:2], old.logprobs[:2], old.tail_logprob), old_sampled)
    with pytest.raises(ValueError, match=r"\(N, V\)"):
        troll_sparse_from_logits(z[None], sampled, old, old_sampled)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_row_subset_equals_sliced_logits(dtype):
    """``rows=`` processes a subset of the logits in place: same result as slicing, zero gradient elsewhere."""
    z, z_old, sampled, old, old_sampled = _setup(N=12, V=40, K=5, delta=1e-3)
    rows = torch.tensor([1, 2, 5, 6, 7, 11])
    full = z.to(dtype).requires_grad_(True)
    sliced = full.detach()[rows].clone().requires_grad_(True)
    sub_old = OldTopK(*(t[rows] for t in old))
    kw = dict(topk=5, mass_delta=1e-3, chunk_size=4)
    a = troll_sparse_from_logits(full, sampled[rows], sub_old, old_sampled[rows], rows=rows, **kw)
    b = troll_sparse_from_logits(sliced, sampled[rows], sub_old, old_sampled[rows], **kw)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    v = torch.randn_like(a.new_logprobs)
    (ga,) = torch.autograd.grad((a.new_logprobs * v).sum(), full)
    (gb,) = torch.autograd.grad((b.new_logprobs * v).sum(), sliced)
    others = torch.ones(12, dtype=torch.bool)
    others[rows] = False
    assert torch.equal(ga[rows], gb) and (ga[others] == 0).all()
    ref = old_topk_from_logits(z_old[rows], topk=5, mass_delta=1e-3)
    got = old_topk_from_logits(z_old, topk=5, mass_delta=1e-3, rows=rows)
    for x, y in zip(got, ref, strict=True):
        assert torch.equal(x, y)


@pytest.mark.host_only
def test_rows_outside_the_logits_are_refused_where_the_core_reads_values(monkeypatch):
    """On the CPU the range of ``rows`` is checked (a read back); sync-free, indexing's own error or device assert."""
    monkeypatch.delenv(SYNC_FREE_ENV, raising=False)
    z_old = torch.randn(12, 30, dtype=torch.float64)
    with pytest.raises(ValueError, match="rows"):
        old_topk_from_logits(z_old, rows=torch.tensor([0, 99]))


def test_old_estimate_is_validated():
    g = torch.Generator().manual_seed(0)
    z_old = torch.randn(2, 50, generator=g, dtype=torch.float64)
    z_new = z_old + torch.randn(2, 50, generator=g, dtype=torch.float64)
    old = old_topk_from_logits(z_old, topk=4)
    old_lp = torch.log_softmax(z_old, -1)[:, 0]
    with pytest.raises(ValueError, match="old_estimate must be one of"):
        troll_sparse_from_logits(z_new, torch.zeros(2, dtype=torch.long), old, old_lp, topk=4, old_estimate="exact")

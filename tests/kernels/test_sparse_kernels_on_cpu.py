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
"""The statistics, top-K, union, tail and backward kernels against the torch path (troll_verl.core.sparse), on fresh
random inputs at tiny sizes: fp32 logits without ties, where the ids must match, and bf16, where only tie-invariant
quantities are compared. Outputs are allocated poisoned (NaN, sentinels), so every element must be written."""

from __future__ import annotations

import math
import os

import pytest
import torch

from troll_verl.core.sparse import OldTopK, old_topk_from_logits, troll_sparse_from_logits

LOG_FLOOR = math.log(1e-12)
DEVICE = os.environ.get("TROLL_TEST_DEVICE", "cpu")  # conftest.py: the kernels run there


def _dev(*tensors):
    """The tensors on the kernels' device (a tuple, even of one)."""
    return tuple(t.to(DEVICE) for t in tensors)


def _cpu(t):
    return t.detach().cpu()


def _logits(N, V, seed, kind="llm", dtype=torch.float32):
    """``(N, V)`` logits with distinct fp32 values. ``llm``: a few peaks above a Gaussian bulk (the mass rule keeps a
    handful); ``flat``: nearly uniform (the top-K cap binds); ``peaked``: one token holds all but e^-60 of the mass
    (a tail below the floor); ``distinct``: 20 peaks without ties in bf16; anything else: the Gaussian bulk alone."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N, V, generator=g, dtype=torch.float64)
    if kind == "llm":
        peaks = torch.randint(V, (N, 5), generator=g)
        heights = 12.0 - 2.0 * torch.arange(5, dtype=torch.float64).expand(N, 5) + torch.rand(N, 5, generator=g)
        z.scatter_(1, peaks, heights)
    elif kind == "flat":
        z = 1e-3 * z
    elif kind == "peaked":
        z[:, int(torch.randint(V, (1,), generator=g))] = 80.0
    elif kind == "distinct":  # 20 peaks 14, 13.5, ..., 4.5 (exact in bf16): the top-16 has no ties in any dtype
        peaks = torch.stack([torch.randperm(V, generator=g)[:20] for _ in range(N)])
        z.scatter_(1, peaks, (14.0 - 0.5 * torch.arange(20, dtype=torch.float64)).expand(N, 20))
    return z.to(dtype)


def _old_side(z_old, K, delta, sampled=None, seed=0):
    """The torch path's old top-K, the sampled token (drawn from the old policy unless given) and its old log-prob."""
    g = torch.Generator().manual_seed(seed + 1)
    lsm = torch.log_softmax(z_old.double(), -1)
    if sampled is None:
        sampled = torch.multinomial(lsm.exp(), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z_old, topk=K, mass_delta=delta)
    return old, sampled, lsm.gather(1, sampled[:, None]).squeeze(1).float()


# ------------------------------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_statistics_pass(kernels, poisoned, dtype):
    N, V = 5, 4500  # 36 chunks (the last one partial), three loop steps
    z = _logits(N, V, seed=0, dtype=dtype)
    rows = torch.tensor([0, 2, 4])
    target = torch.tensor([7, V - 1, 1000])
    lse, cmax, csum, target_lp = kernels.stats.row_stats(*_dev(z, rows), chunk_stats=True, target=_dev(target)[0])
    zs = z[rows].double()
    torch.testing.assert_close(_cpu(lse).double(), torch.logsumexp(zs, -1), rtol=0, atol=2e-6)
    pad = torch.full((3, 36 * 128 - V), -math.inf, dtype=torch.float64)
    chunks = torch.cat([zs, pad], 1).view(3, 36, 128)
    torch.testing.assert_close(_cpu(cmax).double(), chunks.amax(-1), rtol=0, atol=0)  # exactly a logit
    csum_ref = (chunks - chunks.amax(-1, keepdim=True)).exp().sum(-1)
    torch.testing.assert_close(_cpu(csum).double(), csum_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(_cpu(target_lp).double(), torch.log_softmax(zs, -1).gather(1, target[:, None])[:, 0],
                               rtol=0, atol=2e-6)  # fmt: skip


# ------------------------------------------------------------------------------------------------- old pass
@pytest.mark.parametrize(
    "N, V, K, delta, kind",
    [(4, 3000, 16, 1e-3, "llm"), (3, 2000, 8, 1e-5, "flat"), (2, 1500, 8, 1e-5, "peaked"), (1, 8300, 64, 1e-5, "llm"),
     (2, 100, 64, 1e-5, "llm")],
)  # fmt: skip
def test_old_topk_matches_the_torch_path(kernels, poisoned, N, V, K, delta, kind):
    """fp32, no ties: the same ids, log-probs and tail; ``flat`` keeps all K (the cap), ``peaked`` one token and a tail
    below the floor; V = 8300 with K = 64 runs the 64-chunk prefilter over 65 chunks; V = 100 is one partial chunk."""
    z = _logits(N, V, seed=N * V + K, kind=kind)
    ref = old_topk_from_logits(z, topk=K, mass_delta=delta)
    got = kernels.sparse.triton_old_topk_from_logits(*_dev(z), topk=K, mass_delta=delta)
    assert torch.equal(_cpu(got.ids), ref.ids)
    torch.testing.assert_close(_cpu(got.logprobs), ref.logprobs, rtol=0, atol=2e-6)
    torch.testing.assert_close(_cpu(got.tail_logprob), ref.tail_logprob, rtol=0, atol=5e-6)
    kept = (ref.ids >= 0).sum(-1)
    if kind == "flat":
        assert (kept == K).all()
    if kind == "peaked":
        assert (kept == 1).all() and (ref.tail_logprob == LOG_FLOOR).all()


def test_old_topk_rows_and_low_precision_values(kernels, poisoned):
    z = _logits(6, 2500, seed=3)
    rows = torch.tensor([1, 3, 5])
    ref = old_topk_from_logits(z[rows], topk=8, mass_delta=1e-4, value_dtype=torch.bfloat16)
    got = kernels.sparse.triton_old_topk_from_logits(*_dev(z), topk=8, mass_delta=1e-4, value_dtype=torch.bfloat16,
                                               rows=_dev(rows)[0])  # fmt: skip
    assert got.logprobs.dtype == torch.bfloat16 and got.tail_logprob.dtype == torch.float32
    assert torch.equal(_cpu(got.ids), ref.ids)
    torch.testing.assert_close(_cpu(got.logprobs).float(), ref.logprobs.float(), rtol=1e-2, atol=0)
    torch.testing.assert_close(_cpu(got.tail_logprob), ref.tail_logprob, rtol=0, atol=5e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_old_topk_tie_invariants_in_low_precision(kernels, poisoned, dtype):
    """bf16 and fp16 logits tie a lot: the kept values (as a multiset), their number and the tail must agree."""
    z = _logits(4, 3000, seed=5, dtype=dtype)
    ref = old_topk_from_logits(z, topk=16, mass_delta=1e-3)
    got = kernels.sparse.triton_old_topk_from_logits(*_dev(z), topk=16, mass_delta=1e-3)
    assert torch.equal((_cpu(got.ids) >= 0).sum(-1), (ref.ids >= 0).sum(-1))
    torch.testing.assert_close(_cpu(got.logprobs).sort(-1).values, ref.logprobs.sort(-1).values, rtol=0, atol=2e-6)
    torch.testing.assert_close(_cpu(got.tail_logprob), ref.tail_logprob, rtol=0, atol=5e-6)
    kept = _cpu(got.ids) >= 0
    values = torch.where(kept, z.float().gather(1, _cpu(got.ids).clamp_min(0).long()), 0)
    ref_values = torch.where(ref.ids >= 0, z.float().gather(1, ref.ids.clamp_min(0).long()), 0)
    torch.testing.assert_close(values.sort(-1).values, ref_values.sort(-1).values, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------- update pass
def _support_case(case):
    """Inputs of one update-pass case: ``(z, rows, old, sampled, old_sampled_lp, K, delta)``."""
    N, V, K, delta = 6, 2600, 16, 1e-4
    z_old = _logits(N, V, seed=11)
    z = z_old + 0.5 * _logits(N, V, seed=12, kind="gauss")
    sampled = None
    if case == "drift":  # the old ids fall off the new top-K
        z = _logits(N, V, seed=13)
    elif case == "sampled_outside":  # the sampled token is in neither support
        sampled = torch.argsort(z_old, -1)[:, V // 2]
    elif case == "flat":
        z_old, z = _logits(N, V, seed=14, kind="flat"), _logits(N, V, seed=15, kind="flat")
    elif case == "peaked":  # one token on both sides: a tail below the floor
        z_old = _logits(N, V, seed=16, kind="peaked")
        z = z_old.clone()
        z[:, 0] += 1.0
    elif case == "k64":
        K, z_old, z = 64, _logits(2, 8300, seed=17), _logits(2, 8300, seed=18)
    elif case == "n1":
        z_old, z = z_old[:1], z[:1]
    elif case == "padded":  # δ = 5 %: the mass rule stops after a few peaks on both sides
        delta = 5e-2
    old, sampled, old_lp = _old_side(z_old, K, delta, sampled)
    return z, old, sampled, old_lp, K, delta


CASES = ["base", "drift", "sampled_outside", "padded", "flat", "peaked", "k64", "n1"]


def _check_support(got, ref, sampled):
    """Kernel support (fixed width) against the torch path's (trimmed width): the same union, values and tail."""
    n = ref.ids.shape[1]
    assert torch.equal(_cpu(got.ids[:, :n]), ref.ids) and (_cpu(got.ids[:, n:]) == -1).all()
    mask, ref_mask = _cpu(got.mask), ref.mask
    assert torch.equal(mask[:, :n], ref_mask[:, :n]) and not mask[:, n:-1].any() and mask[:, -1].all()
    on = ref_mask[:, :n]
    torch.testing.assert_close(_cpu(got.new_logprobs[:, :n])[on], ref.new_logprobs[:, :n][on], rtol=0, atol=2e-6)
    torch.testing.assert_close(_cpu(got.old_logprobs[:, :n])[on], ref.old_logprobs[:, :n][on], rtol=0, atol=0)
    torch.testing.assert_close(_cpu(got.new_logprobs[:, -1]), ref.new_logprobs[:, -1], rtol=0, atol=5e-6)
    torch.testing.assert_close(_cpu(got.old_logprobs[:, -1]), ref.old_logprobs[:, -1], rtol=1e-6, atol=0)
    assert torch.equal(_cpu(got.ids).gather(1, _cpu(got.sampled_index)[:, None])[:, 0], sampled)


@pytest.mark.parametrize("case", CASES)
def test_support_matches_the_torch_path(kernels, poisoned, case):
    z, old, sampled, old_lp, K, delta = _support_case(case)
    ref = troll_sparse_from_logits(z, sampled, old, old_lp, topk=K, mass_delta=delta)
    got = kernels.sparse.triton_sparse_from_logits(*_dev(z, sampled), OldTopK(*_dev(*old)), *_dev(old_lp), topk=K,
                                                   mass_delta=delta)  # fmt: skip
    assert got.ids.shape[1] == old.ids.shape[1] + K + 1  # the fixed width
    valid_bytes = _cpu(got.mask).view(torch.uint8)
    assert (valid_bytes <= 1).all()
    _check_support(got, ref, sampled)
    if case == "padded":  # old ids past the mass rule are -1
        assert (old.ids < 0).any() and ((old.ids >= 0).sum(-1) > 1).any()
    if case == "base":  # the raw outputs, padding included, are all written
        ids, old_u, valid, new, tail, lse = kernels.topk.support_forward(
            *_dev(z), None, *_dev(old.ids, old.logprobs, sampled, old_lp), K, delta, LOG_FLOOR
        )
        ids, valid = _cpu(ids), _cpu(valid).view(torch.uint8)
        assert ((ids >= -1) & (ids < z.shape[1])).all() and (valid <= 1).all() and torch.equal(ids >= 0, valid == 1)
        assert not any(_cpu(t).isnan().any() for t in (old_u, new, tail, lse))
        assert (_cpu(old_u)[valid == 0] == LOG_FLOOR).all() and (_cpu(new)[valid == 0] == 0).all()
    if case == "sampled_outside":
        in_old = (old.ids.long() == sampled[:, None]).any(-1)
        in_new = (torch.topk(z, K).indices == sampled[:, None]).any(-1)
        assert not (in_old | in_new).any()
    if case == "drift":
        new_top = torch.topk(z, 4).indices
        assert not (old.ids[:, :, None].long() == new_top[:, None, :]).any(1).all()
    if case == "peaked":
        assert (ref.new_logprobs[:, -1] == LOG_FLOOR).all()
    if case == "flat":
        assert (ref.mask[:, :-1].sum(-1) > K).all()


def assert_same_union(got, ref):
    n = ref.ids.shape[1]
    assert torch.equal(_cpu(got.ids[:, :n]), ref.ids) and (_cpu(got.ids[:, n:]) == -1).all()


def _loss(sup, v, w):
    """A scalar reaching every support entry and the tail, with fixed random weights."""
    n = v.shape[1]
    return (torch.where(sup.mask[:, :n], sup.new_logprobs[:, :n], 0) * v).sum() + (sup.new_logprobs[:, -1] * w).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_matches_the_torch_path_with_row_selection(kernels, poisoned, dtype):
    """``rows=`` every other row: the selected rows' gradient is the torch path's, the others are exactly zero. bf16
    logits without ties in the supports (``distinct``), so both paths pick the same support."""
    kind = "llm" if dtype == torch.float32 else "distinct"
    z_full = _logits(8, 2300, seed=21, kind=kind, dtype=dtype)
    rows = torch.arange(0, 8, 2)
    old, sampled, old_lp = _old_side(_logits(8, 2300, seed=22, kind=kind)[rows], 16, 1e-4)
    za = z_full.clone().requires_grad_(True)
    ref = troll_sparse_from_logits(za, sampled, old, old_lp, topk=16, mass_delta=1e-4, rows=rows)
    zb = _dev(z_full)[0].requires_grad_(True)
    got = kernels.sparse.triton_sparse_from_logits(zb, *_dev(sampled), OldTopK(*_dev(*old)), *_dev(old_lp), topk=16,
                                                   mass_delta=1e-4, rows=_dev(rows)[0])  # fmt: skip
    n = ref.ids.shape[1]
    if dtype == torch.float32:
        _check_support(got, ref, sampled)
    else:
        assert_same_union(got, ref)
    g = torch.Generator().manual_seed(0)
    v, w = torch.randn(4, n, generator=g), torch.randn(4, generator=g)
    (ga,) = torch.autograd.grad(_loss(ref, v, w), za)
    (gb,) = torch.autograd.grad(_loss(got, *_dev(v, w)), zb)
    gb = _cpu(gb)
    assert gb.dtype == dtype
    others = torch.ones(8, dtype=torch.bool)
    others[rows] = False
    assert (gb[others] == 0).all()
    # where the tail is small, g_t/π_t is large and cancels on the support: the torch path loses ~eps·|g_t/π_t| there
    scale = float(ga.abs().max())
    if dtype == torch.float32:
        torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6 * scale)
    else:  # the torch path rounds π and π·coef separately; the kernel rounds exp(z − LSE)·coef once
        torch.testing.assert_close(gb.float(), ga.float(), rtol=2e-2, atol=1e-4 * scale)


def test_backward_overwrites_the_support_entries_with_their_exact_values(kernels, poisoned):
    """At a sampled token of probability near 1, ``∂ log π_o / ∂z_o = 1 − π_o`` is small: the support entry holds that
    value (computed in fp32, rounded once), not the dense term ``−π_o`` every column gets first."""
    z = _logits(2, 1200, seed=23, kind="gauss")
    sampled = torch.tensor([3, 700])
    z[torch.arange(2), sampled] = 14.0
    z = z.to(torch.bfloat16)
    old, _, old_lp = _old_side(z.float(), 8, 1e-5, sampled)
    zb = _dev(z)[0].requires_grad_(True)
    sup = kernels.sparse.triton_sparse_from_logits(zb, *_dev(sampled), OldTopK(*_dev(*old)), *_dev(old_lp), topk=8)
    (g,) = torch.autograd.grad(sup.new_logprobs.gather(1, sup.sampled_index[:, None]).sum(), zb)
    exact = -torch.expm1(torch.log_softmax(z.double(), -1).gather(1, sampled[:, None]))[:, 0]  # 1 − π_o, ~2e-3
    torch.testing.assert_close(_cpu(g).double().gather(1, sampled[:, None])[:, 0], exact, rtol=2e-2, atol=0)


def test_empty_batch(kernels, poisoned):
    z = _dev(torch.zeros(0, 300))[0].requires_grad_(True)
    empty = OldTopK(*_dev(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, 4), torch.zeros(0)))
    sampled, old_lp = _dev(torch.zeros(0, dtype=torch.long), torch.zeros(0))
    sup = kernels.sparse.triton_sparse_from_logits(z, sampled, empty, old_lp, topk=4)
    assert sup.new_logprobs.shape == (0, 4 + 4 + 1 + 1)
    sup.new_logprobs.sum().backward()
    assert z.grad.shape == (0, 300)


# ------------------------------------------------------------------------------------------------- clip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_token_logprobs(kernels, poisoned, dtype):
    z = _logits(6, 2100, seed=31, dtype=dtype)
    rows = torch.tensor([0, 3, 4])
    labels = torch.tensor([5, 2099, 77])
    za = z.clone().requires_grad_(True)
    ref = torch.log_softmax(za[rows].float(), -1).gather(1, labels[:, None])[:, 0]
    zb = _dev(z)[0].requires_grad_(True)
    got = kernels.clip.token_logprobs(zb, *_dev(labels, rows))
    torch.testing.assert_close(_cpu(got), ref.detach(), rtol=0, atol=2e-6)
    w = torch.randn(3, generator=torch.Generator().manual_seed(1))
    (ga,) = torch.autograd.grad((ref * w).sum(), za)
    (gb,) = torch.autograd.grad((got * _dev(w)[0]).sum(), zb)
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-5)
    torch.testing.assert_close(_cpu(gb).float(), ga.float(), **tol)
    assert (_cpu(gb)[[1, 2, 5]] == 0).all()


# ------------------------------------------------------------------------------------------------- dispatch
def test_use_kernels_chooses_them_only_where_they_apply(kernels, monkeypatch):
    from troll_verl.kernels import KERNELS_ENV, MAX_TOPK, use_kernels

    monkeypatch.delenv(KERNELS_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    z = torch.zeros(2, 300, dtype=torch.bfloat16)
    assert not use_kernels(z)  # a CPU tensor, no interpreter
    monkeypatch.setenv(KERNELS_ENV, "triton")
    assert not use_kernels(z)  # still no interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_kernels(z) and use_kernels(z.float(), topk=MAX_TOPK, old_topk=MAX_TOPK)
    assert not use_kernels(z.double())  # float64 stays on the torch path (reference tests, gradchecks)
    assert not use_kernels(z, topk=MAX_TOPK + 1) and not use_kernels(z, old_topk=MAX_TOPK + 1)
    monkeypatch.setenv(KERNELS_ENV, "torch")
    assert not use_kernels(z)
    monkeypatch.setenv(KERNELS_ENV, "cuda")
    with pytest.raises(ValueError, match=KERNELS_ENV):
        use_kernels(z)


def test_the_core_dispatches_to_the_kernels_where_they_apply(kernels, monkeypatch):
    """The public torch functions hand the logits to the kernels where ``use_kernels`` says so (here: the interpreter
    with TROLL_KERNELS=triton), with every argument, and keep them otherwise."""
    pytest.importorskip("verl", reason="TrollConfig is a verl BaseConfig (the GPU check's bare machine has no verl)")
    from troll_verl.core import sparse, terms
    from troll_verl.core.config import TrollConfig
    from troll_verl.kernels import KERNELS_ENV

    calls = []
    for module, name in (
        (kernels.sparse, "triton_old_topk_from_logits"),
        (kernels.sparse, "triton_sparse_from_logits"),
        (kernels.terms, "triton_token_terms"),
    ):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    z_old, z = _dev(_logits(4, 700, seed=11), _logits(4, 700, seed=12))
    sampled = _dev(torch.tensor([3, 50, 699, 0]))[0]
    old_lp = torch.log_softmax(z_old.float(), -1).gather(1, sampled[:, None]).squeeze(1)
    cfg = TrollConfig(topk=8, mass_delta=1e-4)

    def step():
        old = sparse.old_topk_from_logits(z_old, topk=8, mass_delta=1e-4)
        support = sparse.troll_sparse_from_logits(z, sampled, old, old_lp, topk=8, mass_delta=1e-4)
        return support, terms.troll_token_terms(support, cfg)

    torch_support, (torch_terms, _) = step()  # the fixture keeps TROLL_KERNELS=torch
    assert calls == []
    monkeypatch.setenv(KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel_support, (kernel_terms, _) = step()
    assert calls == ["triton_old_topk_from_logits", "triton_sparse_from_logits", "triton_token_terms"]
    assert kernel_support.new_logprobs.shape[-1] == 8 + 8 + 1 + 1  # the kernels' fixed union width, plus the tail
    torch.testing.assert_close(_cpu(kernel_terms.proj_log_prob), _cpu(torch_terms.proj_log_prob), rtol=1e-5,
                               atol=1e-6)  # fmt: skip

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
"""Tests of troll_verl.core.megatron.losses: the vocab-parallel primitives on 2 ranks (gloo, plain torch.distributed
groups) equal 1 rank."""

import numpy as np
import pytest
import torch

from troll_verl.testing.dist import FileFunction, run_distributed

V, N, K, DELTA = 96, 11, 6, 1e-3


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    z_old = torch.randn(N, V, generator=g, dtype=torch.float64) * 3
    z = z_old + torch.randn(N, V, generator=g, dtype=torch.float64)
    sampled = torch.multinomial(torch.softmax(z_old, -1), 1, generator=g).squeeze(1)
    old_sampled = torch.log_softmax(z_old, -1).gather(1, sampled[:, None]).squeeze(1)
    rows = torch.tensor([0, 2, 3, 5, 6, 7, 10])
    probe = torch.randn(len(rows), 2 * K + 2, generator=g, dtype=torch.float64)
    return z_old, z, sampled, old_sampled, rows, probe


def _single_rank():
    from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits

    z_old, z, sampled, old_sampled, rows, probe = _inputs()
    old = old_topk_from_logits(z_old, topk=K, mass_delta=DELTA, value_dtype=torch.float64)
    z = z.clone().requires_grad_(True)
    sub_old = type(old)(*(t[rows] for t in old))
    sup = troll_sparse_from_logits(z, sampled[rows], sub_old, old_sampled[rows], topk=K, mass_delta=DELTA, rows=rows)
    width = sup.new_logprobs.shape[1]
    (sup.new_logprobs.masked_fill(~sup.mask, 0) * probe[:, :width]).sum().backward()
    return old, sup, z.grad


def _tp_rank(rank, world):
    import torch.distributed as dist

    from troll_verl.core.megatron.losses import VocabParallelStatistics
    from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits

    stats = VocabParallelStatistics(dist.new_group(list(range(world))))
    z_old, z, sampled, old_sampled, rows, probe = _inputs()
    vp = V // world
    shard = slice(rank * vp, (rank + 1) * vp)
    old = old_topk_from_logits(z_old[:, shard], topk=K, mass_delta=DELTA, value_dtype=torch.float64, statistics=stats)
    z_local = z[:, shard].clone().requires_grad_(True)
    sub_old = type(old)(*(t[rows] for t in old))
    sup = troll_sparse_from_logits(
        z_local, sampled[rows], sub_old, old_sampled[rows], topk=K, mass_delta=DELTA, rows=rows, statistics=stats
    )
    width = sup.new_logprobs.shape[1]
    (sup.new_logprobs.masked_fill(~sup.mask, 0) * probe[:, :width]).sum().backward()
    to_np = lambda t: t.detach().numpy().copy()  # noqa: E731
    return [to_np(t) for t in old], [to_np(t) for t in sup], to_np(z_local.grad)


@pytest.mark.slow
def test_vocab_parallel_primitives_tp2_equal_single_rank():
    ref_old, ref_sup, ref_grad = _single_rank()
    results = run_distributed(FileFunction(__file__, "_tp_rank"), 2)
    vp = V // 2
    for rank, (old, sup, grad) in enumerate(results):
        for got, want in zip(old, ref_old, strict=True):
            np.testing.assert_allclose(got, want.numpy(), atol=1e-12, rtol=1e-10)
        for got, want in zip(sup, ref_sup, strict=True):
            np.testing.assert_allclose(got, want.detach().numpy(), atol=1e-12, rtol=1e-10)
        # each rank's gradient is its vocabulary slice of the single-rank gradient
        np.testing.assert_allclose(grad, ref_grad[:, rank * vp : (rank + 1) * vp].numpy(), atol=1e-12, rtol=1e-10)

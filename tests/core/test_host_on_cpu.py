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
"""The core's accelerator path (troll_verl.core.host) on the CPU: TROLL_SYNC_FREE=1 gives the CPU the accelerator's
behaviour. There the sparse support, the projection and the loss, forward and backward, read nothing back to the
host but the loss's metrics in one transfer; and they compute what the CPU path computes (fixed union width and all
rows through the solver against trimmed widths and early exits)."""

import pytest
import torch
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.host import SYNC_FREE_ENV, host_reads
from troll_verl.core.losses import compute_policy_loss_troll
from troll_verl.core.projection import project
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits

# each test chooses its path itself
pytestmark = pytest.mark.own_host_mode
B, T, V, K = 3, 5, 300, 16
# what reads a tensor's value back to the host from Python
_HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero")


class _Reads:
    """Counts the host reads made through torch.Tensor's Python methods while active."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name in _HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                self.calls.append(_name)
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z_old = torch.randn(B * T, V, generator=g, dtype=dtype) * 3
    z = (z_old + 1.5 * torch.randn(B * T, V, generator=g, dtype=dtype)).requires_grad_(True)
    sampled = torch.multinomial(torch.softmax(z_old.double(), -1), 1, generator=g).squeeze(1)
    old = old_topk_from_logits(z_old, topk=K, mass_delta=1e-4)
    old_lp = torch.log_softmax(z_old, -1).gather(1, sampled[:, None]).squeeze(1)
    mask = torch.arange(T)[None, :] < torch.tensor([T, 2, 4])[:, None]
    adv = torch.randn(B, generator=g)[:, None].expand(B, T).clone()
    return z, sampled, old, old_lp, mask, adv


def _loss_step(z, sampled, old, old_lp, mask, adv):
    """The loss on the sparse support and its gradient: ``(loss, metrics, dL/dz)``."""
    config = FSDPActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                             policy_loss=TrollPolicyLossConfig(kl_bound=0.05, topk=K, mass_delta=1e-4))  # fmt: skip
    support = troll_sparse_from_logits(z, sampled, old, old_lp, topk=K, mass_delta=1e-4).reshape(B, T)
    loss, metrics = compute_policy_loss_troll(old_lp.view(B, T), None, adv, mask, "token-mean", config,
                                              support=support)  # fmt: skip
    (grad,) = torch.autograd.grad(loss, z)
    return loss, metrics, grad


def test_host_reads_on_the_cpu_unless_asked_not_to(monkeypatch):
    cpu = torch.zeros(1)
    assert host_reads(cpu)
    monkeypatch.setenv(SYNC_FREE_ENV, "1")
    assert not host_reads(cpu)
    assert not host_reads(torch.zeros(1, device="meta"))  # any accelerator (no CUDA here: the meta device)


def test_the_accelerator_path_reads_back_only_the_metrics_once(monkeypatch):
    inputs = _inputs()
    monkeypatch.setenv(SYNC_FREE_ENV, "1")
    reads = _Reads(monkeypatch)
    loss, metrics, grad = _loss_step(*inputs)
    assert reads.calls == ["tolist"]  # the loss's metrics, in one transfer
    assert torch.isfinite(grad).all() and metrics["troll/projected_frac"] > 0


def test_the_cpu_path_reads_back_where_it_saves_work(monkeypatch):
    """The same counter on the CPU path finds its reads (trimmed width, early exit): the counter can fail."""
    inputs = _inputs()
    reads = _Reads(monkeypatch)
    _loss_step(*inputs)
    assert "item" in reads.calls and len(reads.calls) > 3


@pytest.mark.parametrize("seed", [0, 1])
def test_the_accelerator_path_computes_what_the_cpu_path_computes(monkeypatch, seed):
    loss_cpu, metrics_cpu, grad_cpu = _loss_step(*_inputs(seed))
    monkeypatch.setenv(SYNC_FREE_ENV, "1")
    loss_acc, metrics_acc, grad_acc = _loss_step(*_inputs(seed))
    # fp32: the fixed width sums longer (masked) rows, a few ulps apart from the trimmed ones
    assert torch.allclose(loss_acc, loss_cpu, rtol=1e-5, atol=1e-7)
    assert torch.allclose(grad_acc, grad_cpu, rtol=1e-4, atol=1e-6)
    for key in metrics_cpu:
        a, c = (float(m.aggregate()) if hasattr(m, "aggregate") else m for m in (metrics_acc[key], metrics_cpu[key]))
        assert a == pytest.approx(c, rel=1e-5, abs=1e-7), key


def test_the_projection_without_host_reads_keeps_every_row_and_the_bound(monkeypatch):
    g = torch.Generator().manual_seed(3)
    new = torch.log_softmax(torch.randn(40, 12, generator=g, dtype=torch.float64) * 2, -1).requires_grad_(True)
    old = torch.log_softmax(torch.randn(40, 12, generator=g, dtype=torch.float64) * 2, -1)
    old[::7] = new.detach()[::7]  # rows inside the ball
    new_nan = new.detach().clone()
    new_nan[5, 3] = float("nan")  # a non-finite row stays NaN
    reference = project(new, old, 0.05)
    monkeypatch.setenv(SYNC_FREE_ENV, "1")
    result = project(new, old, 0.05)
    assert torch.equal(result.projected, reference.projected) and int(result.num_iters) == int(reference.num_iters)
    assert torch.allclose(result.logprobs, reference.logprobs, rtol=0, atol=1e-12)
    assert (result.kl_after <= 0.05).all() and torch.equal(result.logprobs[::7], new.detach()[::7])
    (g_acc,) = torch.autograd.grad(result.logprobs.sum(), new)
    (g_ref,) = torch.autograd.grad(reference.logprobs.sum(), new)
    assert torch.allclose(g_acc, g_ref, rtol=0, atol=1e-12)
    broken = project(new_nan, old, 0.05)
    assert torch.isnan(broken.logprobs[5]).all() and torch.isnan(broken.kl_after[5])
    assert torch.isfinite(broken.logprobs[torch.arange(40) != 5]).all()

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
"""The kernels' GPU check (``bash scripts/bench_kernels.sh``): TROLL's loss step on the Triton kernels against the torch
path and against two clip baselines, on one CUDA GPU with nothing but torch and triton (no verl, no wheels).

Stages, each in its own process under its own time limit, in this order; the results go to ``bench_kernels.json`` and
``bench_kernels.md`` in ``--out`` as each stage finishes (a stage cut off by its limit still leaves what it measured):

- ``env``: the machine (GPU, driver, torch, triton, CUDA).
- ``floor``: the card's measured copy rate (read + write) and bf16 / fp32 matmul rates at the LM head's shapes; the
  loss step's floor is computed from these (the head's three matmuls plus three passes over the logits), not from
  datasheets.
- ``correctness``: every kernel compiled and checked against the torch path on fresh inputs at the real vocabulary
  (statistics, old top-K, support, tail, backward, fused clip, projection, token terms), bf16 and fp32.
- ``loss``: the loss step (LM head, loss, backward to the hidden states and the head) side by side in one run:
  ``torch_clip`` (``log_softmax`` + verl's vanilla clip objective), ``fused_clip`` (the fused log-probs of
  :mod:`benchmarks.kernels.clip`: what verl runs on a GPU with flash-attn's Triton cross-entropy), ``troll_torch``
  (today's torch path) and ``troll_kernels``; bf16 at N ∈ {2048, 8192, 16384} × H ∈ {2560, 4096} at V 151936,
  V ∈ {32768, 65536} at N 8192, fp32 at N 8192; paired, interleaved repeats; peak memory; TROLL's results checked
  against the torch path first (a failing variant is reported and not timed). Then the loss alone with the logits
  given, and the old pass.
- ``kernels``: each kernel's time, as GB/s against the measured copy rate.
- ``profile``: kernel launches and host syncs per step (``torch.profiler``).
- ``tests``: the core's tests and the kernels' tests with the core on CUDA (``TROLL_TEST_DEVICE=cuda``).

A short table is printed last. ``--smoke`` runs every stage but ``tests`` on the CPU under Triton's interpreter at a
tiny size (the suite's check of this script, ``tests/scripts/test_bench_kernels_on_cpu.py``); its numbers mean nothing.

    bash scripts/bench_kernels.sh                       # on the GPU machine: ~3 minutes on an H100
    python scripts/bench_kernels.py --smoke --out /tmp/bench_kernels_smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# benchmarks/ (the fused clip baseline) lives beside scripts/ in the checkout, not in the installed package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--smoke" in sys.argv:  # Triton decides at import whether its functions are interpreted
    os.environ["TRITON_INTERPRET"] = "1"
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

STAGES = ("env", "floor", "correctness", "loss", "kernels", "profile", "tests")
# seconds per stage on the GPU (the whole run stays within --budget-s, 450 by default: 7.5 minutes)
STAGE_LIMIT_S = {"env": 30, "floor": 40, "correctness": 100, "loss": 170, "kernels": 45, "profile": 45, "tests": 120}
SMOKE_LIMIT_S = 600
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
KL_BOUND = 0.05
CFG = SimpleNamespace(
    kl_bound=KL_BOUND, alpha=1.0, tail="bucket", solver="newton", solver_max_iter=30, solver_tol=None, eta_max=1e6
)
VARIANTS = ("torch_clip", "fused_clip", "troll_torch", "troll_kernels")
# (N, H, V, dtype), the Qwen3-4B and Qwen3-8B shapes first
LOSS_CASES = [
    (8192, 2560, 151936, "bf16"),
    (8192, 4096, 151936, "bf16"),
    (8192, 2560, 151936, "fp32"),
    (2048, 2560, 151936, "bf16"),
    (2048, 4096, 151936, "bf16"),
    (16384, 2560, 151936, "bf16"),
    (16384, 4096, 151936, "bf16"),
    (8192, 2560, 32768, "bf16"),
    (8192, 2560, 65536, "bf16"),
]
SMOKE_CASES = [(4, 16, 1500, "bf16")]


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------------------- helpers
class Context:
    """What a stage needs: the device, the sizes (``smoke``), where to leave its (partial) result."""

    def __init__(self, args, stage: str):
        self.smoke = args.smoke
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.topk = 8 if args.smoke else args.topk
        self.repeats = 1 if args.smoke else args.repeats
        self.partial_path = os.path.join(args.work, f"{stage}.partial.json")
        self.result: dict = {}

    def save(self, **items) -> None:
        """Record results so far (a stage cut off by its time limit still reports them)."""
        self.result.update(items)
        with open(self.partial_path, "w") as f:
            json.dump(self.result, f, indent=1, default=str)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def kernels():
    """The kernel modules (imported once the device and the interpreter switch are settled)."""
    from benchmarks.kernels import clip
    from troll_verl.kernels import grad, projection, sparse, stats, terms, topk

    return SimpleNamespace(
        clip=clip, grad=grad, projection=projection, stats=stats, sparse=sparse, terms=terms, topk=topk
    )


def torch_path():
    """The torch path's modules. Their public functions hand CUDA logits to the kernels (registered when
    :func:`kernels` imports them) unless TROLL_KERNELS=torch, which :func:`main` sets for this script (the kernels
    are called directly)."""
    from troll_verl.core import projection, sparse, terms

    return SimpleNamespace(sparse=sparse, projection=projection, terms=terms)


def time_fn(ctx: Context, fn, iters: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``iters`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        ctx.sync()
        start = time.perf_counter()
        fn()
        ctx.sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 (0 when both are 0)."""
    a, b = a.detach().double(), b.detach().double()
    den = float(b.norm())
    return float((a - b).norm()) / den if den > 0 else float((a - b).norm())


def make_inputs(n, h, v, dtype, device, topk, drift=0.5, seed=0):
    """LM-like peaked logits through a real matmul (as ``scripts/bench_loss.py``): each hidden state points at 1-6
    rows of the head with logits ~28, 25, 22, ... above a Gaussian bulk; the old policy differs by N(0, drift²)
    logit noise. The old top-K comes from the torch path."""
    tp = torch_path()
    g = torch.Generator(device=device).manual_seed(seed)
    to = dict(device=device)
    weight = torch.randn(v, h, generator=g, **to) / math.sqrt(h)
    hidden = 2.0 * torch.randn(n, h, generator=g, **to)
    n_peaks = torch.randint(1, 7, (n,), generator=g, **to)
    peak = torch.arange(6, **to)[None, :] < n_peaks[:, None]
    ids = torch.randint(v, (n, 6), generator=g, **to)
    heights = 28.0 - 3.0 * torch.arange(6, **to) + torch.randn(n, 6, generator=g, **to)
    rows = weight[ids]
    hidden += (heights[..., None] * rows / rows.pow(2).sum(-1, keepdim=True) * peak[..., None]).sum(1)
    del rows
    with torch.no_grad():
        logits_old = hidden.to(dtype) @ weight.to(dtype).t()
        logits_old += (drift * torch.randn(n, v, generator=g, **to)).to(dtype)
        sampled = torch.multinomial(torch.softmax(logits_old.float(), -1), 1, generator=g).squeeze(1)
        old_lp = torch.log_softmax(logits_old.float(), -1).gather(1, sampled[:, None]).squeeze(1)
        old = tp.sparse.old_topk_from_logits(logits_old, topk=topk, mass_delta=1e-5)
    del logits_old
    adv = torch.randn(n, generator=g, **to).sign()
    return dict(
        hidden=hidden.to(dtype).requires_grad_(True),
        weight=weight.to(dtype).requires_grad_(True),
        sampled=sampled,
        old_lp=old_lp,
        old=old,
        adv=adv,
        topk=topk,
    )


# --------------------------------------------------------------------------------------------------------- the losses
def clip_objective(lp, old_lp, adv, clip=0.2, clip_c=10.0):
    """verl's ``compute_policy_loss_vanilla`` (ratio clip, dual clip), token mean."""
    ratio = torch.exp((lp - old_lp).clamp(-20.0, 20.0))
    loss1, loss2 = -adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip)
    clipped = torch.maximum(loss1, loss2)
    dual = torch.minimum(-adv * clip_c, clipped)
    return torch.where(adv < 0, dual, clipped).mean()


def troll_objective(terms, old_lp, adv, alpha=1.0):
    """TROLL §4 at token level, token mean (``core/losses.py`` with verl's token-mean aggregation), and the metrics
    moved to the host in one transfer (as ``core/losses.py`` does)."""
    ratio = torch.exp((terms.proj_log_prob - old_lp).clamp(-20.0, 20.0))
    loss = (-adv * ratio).mean() + alpha * terms.regression.mean()
    with torch.no_grad():
        metrics = torch.stack(
            [terms.kl_before.mean(), terms.kl_after.max(), terms.projected.mean(), terms.support_size.mean()]
        ).tolist()
    return loss, metrics


def step_logits(x):
    return x["hidden"] @ x["weight"].t()


def loss_torch_clip(x, logits):
    lp = torch.log_softmax(logits, dim=-1).gather(-1, x["sampled"][:, None]).squeeze(-1).float()
    return clip_objective(lp, x["old_lp"], x["adv"])


def loss_fused_clip(x, logits):
    return clip_objective(kernels().clip.token_logprobs(logits, x["sampled"]), x["old_lp"], x["adv"])


def loss_clip_reference(x, logits):
    """The clip objective on fp32 log-probs of the same logits: the fused clip's reference (torch's bf16
    ``log_softmax`` rounds its output to bf16, ~2 % in the gradient)."""
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, x["sampled"][:, None]).squeeze(-1)
    return clip_objective(lp, x["old_lp"], x["adv"])


def loss_troll(x, logits, on_kernels: bool):
    if on_kernels:
        k = kernels()
        sparse_fn, terms_fn = k.sparse.triton_sparse_from_logits, k.terms.triton_token_terms
    else:
        tp = torch_path()
        sparse_fn, terms_fn = tp.sparse.troll_sparse_from_logits, tp.terms.troll_token_terms
    sup = sparse_fn(logits, x["sampled"], x["old"], x["old_lp"], topk=x["topk"], mass_delta=1e-5)
    terms, _ = terms_fn(sup, CFG)
    loss, metrics = troll_objective(terms, x["old_lp"], x["adv"])
    loss_troll.last = (terms, metrics)
    return loss


LOSSES = {
    "clip_reference": loss_clip_reference,
    "torch_clip": loss_torch_clip,
    "fused_clip": loss_fused_clip,
    "troll_torch": lambda x, z: loss_troll(x, z, False),
    "troll_kernels": lambda x, z: loss_troll(x, z, True),
}


def run_step(x, variant: str, logits=None):
    """One step: the head (unless ``logits`` is given), the loss, backward. Returns the loss."""
    for key in ("hidden", "weight"):
        x[key].grad = None
    if logits is not None:
        logits.grad = None
    z = step_logits(x) if logits is None else logits
    loss = LOSSES[variant](x, z)
    del z
    loss.backward()
    return loss.detach()


# --------------------------------------------------------------------------------------------------------- stages
def stage_env(ctx: Context) -> dict:
    import triton

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "device": str(ctx.device),
    }
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
        )
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = None
    return info


def stage_floor(ctx: Context) -> dict:
    """Copy rate (read + write) and matmul rates at the LM head's shapes: the loss step's floor."""
    dev = ctx.device
    copy_gbs = _copy_rate(ctx, 2**20 if ctx.smoke else 2**31)
    ctx.save(copy_gb_s=copy_gbs)
    rates = {}
    shapes = [(8, 16, 2100)] if ctx.smoke else [(8192, 2560, 151936), (8192, 4096, 151936)]
    for n, h, v in shapes:
        for name, dtype in DTYPES.items():
            a = torch.randn(n, h, device=dev, dtype=dtype)
            b = torch.randn(v, h, device=dev, dtype=dtype)
            t = time_fn(ctx, lambda a=a, b=b: a @ b.t(), 2 if ctx.smoke else 5, warmup=1)
            rates[f"{name} {n}x{h}x{v}"] = 2 * n * h * v / t / 1e12
            del a, b
            ctx.save(copy_gb_s=copy_gbs, matmul_tflops=rates)
    return {"copy_gb_s": copy_gbs, "matmul_tflops": rates}


def _copy_rate(ctx: Context, nbytes: int) -> float:
    """GB/s of ``dst.copy_(src)`` over ``nbytes`` (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=ctx.device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / time_fn(ctx, lambda: dst.copy_(src), 3 if ctx.smoke else 10, warmup=2) / 1e9


def floor_ms(floor: dict, n: int, h: int, v: int, dtype: str) -> float | None:
    """The loss step's floor from the measured rates: three head matmuls and three passes over the logits."""
    if not floor:
        return None
    rates = floor["matmul_tflops"]
    key = f"{dtype} {n}x{h}x{v}"
    rate = rates.get(key) or statistics.median(r for k, r in rates.items() if k.startswith(dtype))
    nbytes = n * v * DTYPES[dtype].itemsize
    return 1e3 * (3 * 2 * n * h * v / (rate * 1e12) + 3 * nbytes / (floor["copy_gb_s"] * 1e9))


def _check(name, ok, **values) -> dict:
    return {
        "check": name,
        "ok": bool(ok),
        **{k: (float(v) if isinstance(v, torch.Tensor | float) else v) for k, v in values.items()},
    }


MASS_DELTA = 1e-5


def mass_rule_window(z: torch.Tensor, topk: int, mass_delta: float) -> dict:
    """Where the mass rule's cut may fall in fp32, per row of ``z`` ``(N, V)``: the rule keeps sorted entry j while the
    mass before it is below ``1 − δ``, and the log-probs that decide it carry the rounding of ``lse`` (one ulp of
    ``|lse|``, ~2e-6 at logits near 30) plus the cumulative sum's (K half-ulps of 1). Each path's cut is right if it
    lies between the cuts of the fp64 mass moved by ∓ that tolerance: ``lo`` and ``hi`` kept entries. Also the fp64
    top-K ids in order, ``(N, K)``."""
    top = torch.log_softmax(z.double(), -1).topk(topk, -1)
    lse = torch.logsumexp(z.float(), -1).abs()
    tol = (2 * (torch.nextafter(lse, lse + 1) - lse).double() + topk * 2.0**-24)[:, None]
    # the torch path's own rule on the fp64 log-probs, its δ moved by the tolerance per row (δ broadcasts)
    mass_rule_mask = torch_path().sparse.mass_rule_mask
    lo = mass_rule_mask(top.values, mass_delta + tol).sum(-1)
    hi = mass_rule_mask(top.values, mass_delta - tol).sum(-1)
    return {"lo": lo, "hi": hi, "ids": top.indices, "tol_max": float(tol.max())}


def old_topk_agreement(got, ref, window: dict) -> dict:
    """The kernels' old top-K ``got`` against the torch path's ``ref``: each kept count inside the rounding window of
    :func:`mass_rule_window`; the log-probs of the entries both keep (sorted by value, so position j is rank j up to
    ties, whose values are equal); the tail where both kept as many."""
    ck, ct = (got.ids >= 0).sum(-1), (ref.ids >= 0).sum(-1)
    inside = lambda c: (c >= window["lo"]) & (c <= window["hi"])  # noqa: E731
    common = torch.arange(got.ids.shape[1], device=ck.device)[None, :] < torch.minimum(ck, ct)[:, None]
    lp_err = torch.where(common, (got.logprobs.float() - ref.logprobs.float()).abs(), 0.0).max()
    same = ck == ct
    tail_err = torch.where(same, (got.tail_logprob - ref.tail_logprob).abs(), 0.0).max()
    ok = bool(inside(ck).all()) and bool(inside(ct).all()) and lp_err < 1e-4 and tail_err < 1e-3
    return dict(
        ok=ok,
        logprob_err=lp_err,
        tail_err=tail_err,
        rows_cut_elsewhere=int((~same).sum()),
        kernel_rows_outside_window=int((~inside(ck)).sum()),
        torch_rows_outside_window=int((~inside(ct)).sum()),
        rows_with_equal_ids=(got.ids == ref.ids).all(-1).float().mean(),
        window_tol=window["tol_max"],
    )


def support_agreement(got, ref, window: dict) -> dict:
    """The kernels' union support against the torch path's: rows whose unions differ may differ only by current-side
    tokens inside the mass rule's rounding window (:func:`mass_rule_window`); on the rows with equal unions, the
    log-probs of both policies and the tail agree."""
    width = ref.ids.shape[1]
    gi, ri = got.ids[:, :width], ref.ids
    equal = (gi == ri).all(-1) & (got.ids[:, width:] < 0).all(-1)
    outside = 0
    for r in (~equal).nonzero().flatten().tolist():
        a, b = set(gi[r][gi[r] >= 0].tolist()), set(ri[r][ri[r] >= 0].tolist())
        lo, hi = int(window["lo"][r]), int(window["hi"][r])
        outside += int(not (a ^ b) <= set(window["ids"][r, lo:hi].tolist()))
    both = equal[:, None] & ref.mask[:, :width]
    new_err = torch.where(both, (got.new_logprobs[:, :width] - ref.new_logprobs[:, :width]).abs(), 0.0).max()
    old_err = torch.where(both, (got.old_logprobs[:, :width] - ref.old_logprobs[:, :width]).abs(), 0.0).max()
    tail_err = torch.where(equal, (got.new_logprobs[:, -1] - ref.new_logprobs[:, -1]).abs(), 0.0).max()
    ok = outside == 0 and new_err < 1e-4 and old_err < 1e-6 and tail_err < 1e-3
    return dict(
        ok=ok,
        rows_with_equal_union=equal.float().mean(),
        rows_differing_outside_window=outside,
        new_logprob_err=new_err,
        old_logprob_err=old_err,
        tail_err=tail_err,
    )


def stage_correctness(ctx: Context) -> dict:
    """Every kernel against the torch path on fresh inputs at the real vocabulary (small N)."""
    k, tp = kernels(), torch_path()
    dev = ctx.device
    n, v, topk = (4, 2100, ctx.topk) if ctx.smoke else (256, 151936, ctx.topk)
    checks = []
    for name, dtype in DTYPES.items():
        x = make_inputs(n, 16 if ctx.smoke else 512, v, dtype, dev, topk, seed=7)
        with torch.no_grad():
            z = step_logits(x)
        rows = torch.arange(0, n, 2, device=dev)
        try:
            lse, cmax, _, _ = k.stats.row_stats(z, rows, chunk_stats=True)
            zr = z[rows].float()
            ref_lse = torch.logsumexp(zr, -1)
            pad = torch.full((zr.shape[0], cmax.shape[1] * 128 - v), -math.inf, device=dev)
            ref_cmax = torch.cat([zr, pad], 1).view(zr.shape[0], -1, 128).amax(-1)
            checks.append(
                _check(
                    f"stats {name}",
                    (lse - ref_lse).abs().max() < 1e-4 and torch.equal(cmax, ref_cmax),
                    lse_err=(lse - ref_lse).abs().max(),
                )
            )
            old_k = k.sparse.triton_old_topk_from_logits(z, topk=topk, mass_delta=MASS_DELTA)
            old_t = tp.sparse.old_topk_from_logits(z, topk=topk, mass_delta=MASS_DELTA)
            window = mass_rule_window(z, topk, MASS_DELTA)
            checks.append(_check(f"old top-K {name}", **old_topk_agreement(old_k, old_t, window)))
            zk = z.detach().clone().requires_grad_(True)
            zt = z.detach().clone().requires_grad_(True)
            sup_k = k.sparse.triton_sparse_from_logits(
                zk, x["sampled"], x["old"], x["old_lp"], topk=topk, mass_delta=MASS_DELTA
            )
            sup_t = tp.sparse.troll_sparse_from_logits(
                zt, x["sampled"], x["old"], x["old_lp"], topk=topk, mass_delta=MASS_DELTA
            )
            checks.append(_check(f"support {name}", **support_agreement(sup_k, sup_t, window)))
            tk, it_k = k.terms.triton_token_terms(sup_k, CFG)
            tt, it_t = tp.terms.troll_token_terms(sup_t, CFG)
            bound = float(torch.where(tk.projected > 0, tk.kl_after, 0.0).max())
            plp_err = (tk.proj_log_prob - tt.proj_log_prob).abs().max()
            checks.append(
                _check(
                    f"projection and terms {name}",
                    bound <= KL_BOUND and plp_err < 1e-2,
                    kl_after_max=bound,
                    proj_log_prob_err=plp_err,
                    iters_kernels=int(it_k),
                    iters_torch=int(it_t),
                    projected=tk.projected.mean(),
                )
            )
            lk, _ = troll_objective(tk, x["old_lp"], x["adv"])
            lt, _ = troll_objective(tt, x["old_lp"], x["adv"])
            (gk,) = torch.autograd.grad(lk, zk)
            (gt,) = torch.autograd.grad(lt, zt)
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
            checks.append(
                _check(
                    f"TROLL loss and gradient {name}",
                    rel_err(lk, lt) < tol and rel_err(gk, gt) < tol,
                    loss_rel_err=rel_err(lk, lt),
                    grad_rel_err=rel_err(gk, gt),
                )
            )
            zc = z.detach().clone().requires_grad_(True)
            lp_k = k.clip.token_logprobs(zc, x["sampled"])
            (gck,) = torch.autograd.grad(lp_k.sum(), zc)
            zf = z.detach().float().requires_grad_(True)
            lp_t = torch.log_softmax(zf, -1).gather(1, x["sampled"][:, None])[:, 0]
            (gct,) = torch.autograd.grad(lp_t.sum(), zf)
            checks.append(
                _check(
                    f"fused clip {name}",
                    (lp_k - lp_t).abs().max() < 1e-3 and rel_err(gck, gct) < tol,
                    logprob_err=(lp_k - lp_t).abs().max(),
                    grad_rel_err=rel_err(gck, gct),
                )
            )
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a finding; the other dtype still runs
            checks.append({"check": f"{name}: {type(exc).__name__}", "ok": False, "error": str(exc)[-1500:]})
        ctx.save(checks=checks)
        del x
    return {"checks": checks, "all_ok": all(c["ok"] for c in checks)}


class PeakMemory:
    def __init__(self, ctx: Context):
        self.cuda = ctx.device.type == "cuda"

    def reset(self) -> int:
        if not self.cuda:
            return 0
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() if self.cuda else 0


def _paired(a: list[float], b: list[float]) -> float | None:
    ratios = [x / y for x, y in zip(a, b, strict=True) if y > 0]
    return statistics.median(ratios) if ratios else None


def measure(ctx: Context, x: dict, variants: list[str], repeats: int, logits=None) -> dict:
    """Interleaved repeats (one step of every variant per repeat); per variant: seconds and peak bytes."""
    mem = PeakMemory(ctx)
    times = {v: [] for v in variants}
    peaks = {v: [] for v in variants}
    for v in variants:
        run_step(x, v, logits)  # warm-up (allocator, compiles)
    for _ in range(repeats):
        for v in variants:
            base = mem.reset()
            ctx.sync()
            start = time.perf_counter()
            run_step(x, v, logits)
            ctx.sync()
            times[v].append(time.perf_counter() - start)
            peaks[v].append(mem.peak() - base)
    out = {}
    for v in variants:
        out[v] = {"ms": 1e3 * statistics.median(times[v]), "peak_mib": statistics.median(peaks[v]) / 2**20}
        for base in ("torch_clip", "fused_clip"):
            if base in times and v != base:
                out[v][f"time_vs_{base}"] = _paired(times[v], times[base])
                out[v][f"mem_vs_{base}"] = _paired(peaks[v], peaks[base]) if mem.cuda else None
    return out


def _correct_variants(ctx: Context, x: dict, dtype) -> tuple[list[str], dict]:
    """The variants whose loss and gradients match their reference (fused clip: the fp32 clip reference; TROLL
    kernels: TROLL torch), and the TROLL metrics."""
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
    results, report = {}, {}
    for v in ("clip_reference", *VARIANTS):
        try:
            loss = run_step(x, v)
            results[v] = (loss, x["hidden"].grad.detach().clone(), x["weight"].grad.detach().clone())
            if v.startswith("troll"):
                terms, metrics = loss_troll.last
                report[v] = {
                    "kl_before": metrics[0],
                    "kl_after_max": metrics[1],
                    "projected": metrics[2],
                    "support": metrics[3],
                    "bound_held": metrics[1] <= KL_BOUND,
                }
        except Exception as exc:  # noqa: BLE001 - reported, not timed
            report[v] = {"error": f"{type(exc).__name__}: {str(exc)[-800:]}"}
    ok = [v for v in ("torch_clip", "troll_torch") if v in results]
    for v, ref in (
        ("torch_clip", "clip_reference"),
        ("fused_clip", "clip_reference"),
        ("troll_kernels", "troll_torch"),
    ):
        if v in results and ref in results:
            errs = [rel_err(a, b) for a, b in zip(results[v], results[ref], strict=True)]
            report.setdefault(v, {})["rel_err_loss_grads"] = errs
            bound = report[v].get("bound_held", True)
            if v == "torch_clip":
                continue  # the baseline itself: its deviation is reported, it is timed regardless
            if max(errs) < tol and bound:
                ok.append(v)
            else:
                report[v]["failed"] = True
    return [v for v in VARIANTS if v in ok], report


def stage_loss(ctx: Context) -> dict:
    """The loss-step ratios, then the loss alone with the logits given, then the old pass."""
    floor = _read_floor(ctx)
    cases = SMOKE_CASES if ctx.smoke else LOSS_CASES
    out = []
    for n, h, v, name in cases:
        dtype = DTYPES[name]
        case = {"N": n, "H": h, "V": v, "dtype": name}
        try:
            x = make_inputs(n, h, v, dtype, ctx.device, ctx.topk)
            variants, report = _correct_variants(ctx, x, dtype)
            case["checks"] = report
            repeats = ctx.repeats if n <= 8192 else max(2, ctx.repeats - 2)
            case["results"] = measure(ctx, x, variants, repeats)
            case["floor_ms"] = floor_ms(floor, n, h, v, name) if not ctx.smoke else None
            del x
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory at one shape: the others still run
            case["error"] = f"{type(exc).__name__}: {str(exc)[-800:]}"
        out.append(case)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        ctx.save(cases=out)
        log(f"[loss] {n}x{h}x{v} {name}: " + json.dumps(case.get("results", case.get("error")))[:400])
    # the loss alone (logits given, no head) and the old pass, at the Qwen3 vocabulary
    n, v = (4, 1500) if ctx.smoke else (8192, 151936)
    try:
        x = make_inputs(n, 16 if ctx.smoke else 2560, v, torch.bfloat16, ctx.device, ctx.topk)
        with torch.no_grad():
            logits = step_logits(x)
        logits.requires_grad_(True)
        variants, _ = _correct_variants(ctx, x, torch.bfloat16)
        alone = measure(ctx, x, variants, ctx.repeats, logits=logits)
        ctx.save(cases=out, loss_alone={"N": n, "V": v, "dtype": "bf16", "results": alone})
        k, tp = kernels(), torch_path()
        z = logits.detach()
        old = {
            "torch": time_fn(ctx, lambda: tp.sparse.old_topk_from_logits(z, topk=ctx.topk), ctx.repeats),
            "kernels": time_fn(ctx, lambda: k.sparse.triton_old_topk_from_logits(z, topk=ctx.topk), ctx.repeats),
            "log_softmax": time_fn(ctx, lambda: torch.log_softmax(z, -1), ctx.repeats),
        }
        old_pass = {
            "N": n,
            "V": v,
            "dtype": "bf16",
            **{f"{key}_ms": 1e3 * t for key, t in old.items()},
            "kernels_vs_torch": old["kernels"] / old["torch"],
        }
        ctx.save(cases=out, loss_alone={"N": n, "V": v, "dtype": "bf16", "results": alone}, old_pass=old_pass)
    except Exception as exc:  # noqa: BLE001
        ctx.save(cases=out, loss_alone_error=f"{type(exc).__name__}: {str(exc)[-800:]}")
    return ctx.result


def _read_floor(ctx: Context) -> dict:
    path = os.path.join(os.path.dirname(ctx.partial_path), "floor.result.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def stage_kernels(ctx: Context) -> dict:
    """Each kernel's time at N = 8192, V = 151936 (bf16), as GB/s of the bytes it must move against the copy rate."""
    k = kernels()
    floor = _read_floor(ctx)
    copy = floor.get("copy_gb_s")
    n, v = (6, 2100) if ctx.smoke else (8192, 151936)
    iters = 1 if ctx.smoke else 10
    out = []
    for name, dtype in DTYPES.items() if not ctx.smoke else [("bf16", torch.bfloat16)]:
        for label, (fn, nbytes) in _kernel_calls(ctx, k, n, v, dtype).items():
            try:
                t = time_fn(ctx, fn, iters)
                gbs = nbytes / t / 1e9
                out.append(
                    {
                        "kernel": label,
                        "dtype": name,
                        "ms": 1e3 * t,
                        "gb_s": gbs,
                        "of_copy_rate": gbs / copy if copy else None,
                    }
                )
            except Exception as exc:  # noqa: BLE001
                out.append({"kernel": label, "dtype": name, "error": f"{type(exc).__name__}: {str(exc)[-500:]}"})
            ctx.save(kernels=out, N=n, V=v)
    return {"kernels": out, "N": n, "V": v}


def _kernel_calls(ctx: Context, k, n: int, v: int, dtype) -> dict:
    """``{label: (call, bytes it must move)}`` on fresh random logits of ``dtype``."""
    dev, log_floor = ctx.device, math.log(1e-12)
    z = (3.0 * torch.randn(n, v, device=dev)).to(dtype)
    nb = n * v * dtype.itemsize
    sampled = torch.randint(v, (n,), device=dev)
    old = k.sparse.triton_old_topk_from_logits(z, topk=ctx.topk)
    old_lp = torch.log_softmax(z.float(), -1).gather(1, sampled[:, None])[:, 0]
    lse, _, _, lp = k.stats.row_stats(z, target=sampled)
    ids, old_u, valid, new, tail, lse2 = k.topk.support_forward(
        z, None, old.ids, old.logprobs, sampled, old_lp, ctx.topk, 1e-5, log_floor
    )
    g_new, g_tail = torch.randn_like(new), torch.randn_like(tail)
    one = torch.ones(n, 1, dtype=torch.bool, device=dev)
    calls = {
        "statistics pass (LSE + chunk stats)": (lambda: k.stats.row_stats(z, chunk_stats=True), nb),
        "statistics pass + old top-K": (lambda: k.sparse.triton_old_topk_from_logits(z, topk=ctx.topk), nb),
        "statistics pass + support": (
            lambda: k.topk.support_forward(z, None, old.ids, old.logprobs, sampled, old_lp, ctx.topk, 1e-5, log_floor),
            nb,
        ),
        "backward (read + write)": (
            lambda: k.grad.logits_grad(z, None, lse2, ids, valid, g_new, new, g_tail, tail, log_floor),
            2 * nb,
        ),
        "clip forward (LSE + target)": (lambda: k.stats.row_stats(z, target=sampled), nb),
        "clip backward (read + write)": (
            lambda: k.grad.logits_grad(z, None, lse, sampled[:, None], one, g_tail[:, None], lp[:, None]),
            2 * nb,
        ),
        "torch copy (read + write)": (lambda: z.clone(), 2 * nb),
        "torch log_softmax": (lambda: torch.log_softmax(z, -1), 2 * nb),
        "torch topk (K over V)": (lambda: torch.topk(z, ctx.topk, -1), nb),
    }
    if dtype == torch.bfloat16:  # the projection and terms read fp32 supports whatever the logits' dtype
        new_lp, old_lp2 = torch.cat([new, tail[:, None]], 1), torch.cat([old_u, tail[:, None] - 1.0], 1)
        mask = torch.cat([valid, one], 1)
        index = (ids == sampled[:, None]).long().argmax(-1)
        calls["projection + terms forward"] = (
            lambda: k.terms.TokenTerms.apply(new_lp, old_lp2, mask, index, KL_BOUND, 30, None, 1e6),
            new_lp.numel() * 9,
        )
    return calls


_LAUNCH = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
)
_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def stage_profile(ctx: Context) -> dict:
    """Kernel launches and host syncs per step (``torch.profiler``), one step per variant after a warm-up."""
    from torch.profiler import ProfilerActivity, profile

    n, h, v = (4, 16, 1500) if ctx.smoke else (2048, 2560, 151936)
    x = make_inputs(n, h, v, torch.bfloat16, ctx.device, ctx.topk)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    out = {}
    for variant in VARIANTS:
        try:
            run_step(x, variant)
            ctx.sync()
            with profile(activities=activities) as prof:
                run_step(x, variant)
                ctx.sync()
            events = prof.events()
            names = [e.name for e in events]
            on_gpu = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
            out[variant] = {
                "launches": sum(name in _LAUNCH for name in names),
                "syncs": sum(name in _SYNC for name in names),
                "device_to_host_copies": sum(name == "cudaMemcpyAsync" for name in names),
                "gpu_events": on_gpu,
            }
        except Exception as exc:  # noqa: BLE001
            out[variant] = {"error": f"{type(exc).__name__}: {str(exc)[-500:]}"}
        ctx.save(N=n, H=h, V=v, variants=out)
    # the step profiled includes the one sync this script adds after it
    return {"N": n, "H": h, "V": v, "variants": out}


def stage_tests(ctx: Context) -> dict:
    """The core's tests and the kernels' tests with the core on CUDA; pass/fail counts and the failing tests."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skip_reason": "pytest is not installed on this machine"}
    files = [
        "tests/core/test_projection_on_cpu.py",
        "tests/core/test_sparse_on_cpu.py",
        "tests/kernels/test_sparse_kernels_on_cpu.py",
        "tests/kernels/test_projection_kernels_on_cpu.py",
    ]
    # the core's own tests on the torch path (on CUDA: its sync-free code); the kernels' tests against it
    env = {**os.environ, "TROLL_TEST_DEVICE": "cuda", "PYTHONPATH": ROOT, "TROLL_KERNELS": "torch"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--import-mode=importlib",
        "-m",
        "not slow",
        *files,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=STAGE_LIMIT_S["tests"] - 10)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    lines = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1] if lines else ""):
        counts["errors" if word.startswith("error") else word] = int(count)
    return {
        **counts,
        "returncode": proc.returncode,
        "failed_tests": re.findall(r"^FAILED (\S+)", proc.stdout, re.M),
        "log_tail": (proc.stdout + proc.stderr)[-3000:],
    }


STAGE_FNS = {
    "env": stage_env,
    "floor": stage_floor,
    "correctness": stage_correctness,
    "loss": stage_loss,
    "kernels": stage_kernels,
    "profile": stage_profile,
    "tests": stage_tests,
}


# --------------------------------------------------------------------------------------------------------- report
def _num(value, fmt=".3f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def render_markdown(report: dict) -> str:
    """The run's tables, from whatever stages finished."""
    env = (report.get("env") or {}).get("result") or {}
    lines = [
        f"Kernels' GPU check, {report.get('date', '?')}: {env.get('gpu', env.get('device', '?'))}, "
        f"driver {env.get('driver', '?')}, torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), "
        f"triton {env.get('triton', '?')}"
        + (" — SMOKE RUN (interpreter, CPU): numbers mean nothing" if report.get("smoke") else ""),
        "",
        "| stage | status | seconds |",
        "|---|---|---|",
    ]
    for name in STAGES:
        stage = report.get(name)
        lines.append(f"| {name} | {stage['status']} | {stage['seconds']:.0f} |" if stage else f"| {name} | not run | |")
    floor = (report.get("floor") or {}).get("result") or {}
    if floor:
        lines += [
            "",
            f"Measured copy rate (read + write): {_num(floor.get('copy_gb_s'), '.0f')} GB/s; matmul rates: "
            + ", ".join(f"{k}: {_num(r, '.1f')} TFLOP/s" for k, r in floor.get("matmul_tflops", {}).items()),
        ]
    checks = ((report.get("correctness") or {}).get("result") or {}).get("checks") or []
    if checks:
        lines += ["", "| correctness check | ok | values |", "|---|---|---|"]
        for c in checks:
            vals = ", ".join(
                f"{k} {_num(v, '.3g') if isinstance(v, float) else v}" for k, v in c.items() if k not in ("check", "ok")
            )
            lines.append(f"| {c['check']} | {'yes' if c['ok'] else 'NO'} | {vals[:300]} |")
    loss = (report.get("loss") or {}).get("result") or {}
    if loss.get("cases"):
        lines += ["", "Loss step (head + loss + backward), medians of paired ratios:", "", _loss_table(loss["cases"])]
    if loss.get("loss_alone"):
        la = loss["loss_alone"]
        lines += [
            "",
            f"The loss alone, logits given (N {la['N']}, V {la['V']}, bf16):",
            "",
            "| variant | ms | / torch clip | / fused clip | peak MiB |",
            "|---|---|---|---|---|",
        ]
        for v, r in la["results"].items():
            lines.append(
                f"| {v} | {_num(r['ms'], '.2f')} | {_num(r.get('time_vs_torch_clip'))} | "
                f"{_num(r.get('time_vs_fused_clip'))} | {_num(r['peak_mib'], '.0f')} |"
            )
    if loss.get("old_pass"):
        op = loss["old_pass"]
        lines += [
            "",
            f"Old pass (N {op['N']}, V {op['V']}, bf16): torch {_num(op['torch_ms'], '.2f')} ms, kernels "
            f"{_num(op['kernels_ms'], '.2f')} ms ({_num(op['kernels_vs_torch'])}x), log_softmax alone "
            f"{_num(op['log_softmax_ms'], '.2f')} ms",
        ]
    kern = (report.get("kernels") or {}).get("result") or {}
    if kern.get("kernels"):
        lines += [
            "",
            f"Kernels at N {kern['N']}, V {kern['V']}:",
            "",
            "| kernel | dtype | ms | GB/s | of copy rate |",
            "|---|---|---|---|---|",
        ]
        for r in kern["kernels"]:
            lines.append(
                f"| {r['kernel']} | {r['dtype']} | {_num(r.get('ms'), '.3f')} | {_num(r.get('gb_s'), '.0f')} "
                f"| {_num(r.get('of_copy_rate'), '.2f')} |"
                if "error" not in r
                else f"| {r['kernel']} | {r['dtype']} | error: {r['error'][:120]} | | |"
            )
    prof = (report.get("profile") or {}).get("result") or {}
    if prof.get("variants"):
        lines += [
            "",
            f"Launches and host syncs per step (N {prof['N']}, H {prof['H']}, V {prof['V']}, bf16; the "
            "timing sync included):",
            "",
            "| variant | launches | syncs | memcpy calls | GPU events |",
            "|---|---|---|---|---|",
        ]
        for v, r in prof["variants"].items():
            lines.append(
                f"| {v} | {r.get('launches', 'n/a')} | {r.get('syncs', 'n/a')} | "
                f"{r.get('device_to_host_copies', 'n/a')} | {r.get('gpu_events', 'n/a')} |"
            )
    tests = (report.get("tests") or {}).get("result") or {}
    if tests:
        lines += [
            "",
            "Tests with the core on CUDA: "
            + (
                tests.get("skip_reason")
                or f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped, "
                f"{tests['errors']} errors "
                + " ".join(tests.get("failed_tests", [])[:8])
            ),
        ]
    return "\n".join(lines) + "\n"


def _loss_table(cases: list[dict]) -> str:
    lines = [
        "| N | H | V | dtype | TROLL kernels / torch clip | TROLL kernels / fused clip | TROLL torch / torch clip "
        "| fused clip / torch clip | memory TROLL kernels / torch clip | floor / torch clip | torch clip ms "
        "| TROLL kernels ms | failed or not run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        r = c.get("results") or {}
        tk, tc = r.get("troll_kernels", {}), r.get("torch_clip", {})
        floor = c.get("floor_ms") / tc["ms"] if c.get("floor_ms") and tc.get("ms") else None
        missing = [v for v in VARIANTS if v not in r] or ([c["error"][:80]] if "error" in c else [])
        tt = r.get("troll_torch", {})
        lines.append(
            f"| {c['N']} | {c['H']} | {c['V']} | {c['dtype']} | {_num(tk.get('time_vs_torch_clip'))} | "
            f"{_num(tk.get('time_vs_fused_clip'))} | {_num(tt.get('time_vs_torch_clip'))}"
            f" | {_num(r.get('fused_clip', {}).get('time_vs_torch_clip'))} | "
            f"{_num(tk.get('mem_vs_torch_clip'))} | {_num(floor)} | {_num(tc.get('ms'), '.1f')} | "
            f"{_num(tk.get('ms'), '.1f')} | {', '.join(missing)} |"
        )
    return "\n".join(lines)


def short_table(report: dict) -> str:
    """The last lines printed: the headline ratios."""
    loss = (report.get("loss") or {}).get("result") or {}
    lines = ["", "== bench_kernels: TROLL kernels / clip (time), medians of paired ratios =="]
    for c in loss.get("cases", []):
        tk = (c.get("results") or {}).get("troll_kernels", {})
        lines.append(
            f"{c['N']:>6} x {c['H']:>4} x {c['V']:>6} {c['dtype']}: vs torch clip "
            f"{_num(tk.get('time_vs_torch_clip'))}, vs fused clip {_num(tk.get('time_vs_fused_clip'))}, "
            f"memory vs torch clip {_num(tk.get('mem_vs_torch_clip'))}"
        )
    prof = ((report.get("profile") or {}).get("result") or {}).get("variants", {})
    if prof:
        lines.append(
            "launches / syncs per step: "
            + ", ".join(f"{v} {r.get('launches')}/{r.get('syncs')}" for v, r in prof.items())
        )
    lines.append("stages: " + ", ".join(f"{n} {report[n]['status']}" for n in STAGES if n in report))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------- main
def run_stage(name: str, args, limit: float) -> dict:
    """``name`` in a child process under ``limit`` seconds; its result, or what it saved before failing."""
    start = time.perf_counter()
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--stage",
        name,
        "--work",
        args.work,
        "--topk",
        str(args.topk),
        "--repeats",
        str(args.repeats),
    ] + (["--smoke"] if args.smoke else [])
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        output, status = proc.stdout + proc.stderr, "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        output += f"\ntimed out after {limit:.0f} s"
        status = "timed out"
    with open(os.path.join(args.out, "bench_kernels.log"), "a") as f:
        f.write(f"\n===== {name} =====\n{output}")
    stage = {"status": status, "seconds": time.perf_counter() - start}
    for suffix in ("result", "partial"):
        path = os.path.join(args.work, f"{name}.{suffix}.json")
        if os.path.exists(path):
            with open(path) as f:
                stage["result"] = json.load(f)
            break
    if status != "ok":
        stage["error"] = output[-3000:]
    if name == "correctness" and status == "ok" and not stage["result"].get("all_ok"):
        stage["status"] = "failed"
    if name == "tests" and status == "ok" and (stage["result"].get("failed") or stage["result"].get("errors")):
        stage["status"] = "failed"
    log(f"[bench_kernels] {name}: {stage['status']} in {stage['seconds']:.0f} s")
    return stage


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="outputs/bench_kernels", help="bench_kernels.json, .md and .log go here")
    p.add_argument("--work", default=None, help="intermediate files (default: a new temporary folder)")
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    p.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="the whole run's time limit (stages are skipped or cut short to keep it)",
    )
    p.add_argument("--topk", type=int, default=64, help="K, old and current side (the paper's 64)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per variant (interleaved)")
    p.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter, tiny sizes (a check of the code)")
    p.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)  # internal: run one stage here
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ["TROLL_KERNELS"] = "torch"  # "TROLL torch" is the torch path; the kernels are called directly
    own_work = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="troll-bench-kernels-")
    if args.stage:
        ctx = Context(args, args.stage)
        result = STAGE_FNS[args.stage](ctx)
        with open(os.path.join(args.work, f"{args.stage}.result.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
        return 0
    stages = [s for s in args.stages if not (args.smoke and s == "tests")]
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "bench_kernels.log"), "w").close()
    deadline = time.perf_counter() + args.budget_s
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "smoke": args.smoke, "budget_s": args.budget_s}
    try:
        for name in stages:
            left = deadline - time.perf_counter()
            limit = min(SMOKE_LIMIT_S if args.smoke else STAGE_LIMIT_S[name], left)
            if limit < 10:
                report[name] = {"status": "skipped (time budget)", "seconds": 0.0}
            else:
                report[name] = run_stage(name, args, limit)
            with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
                json.dump(report, f, indent=1, default=str)
            with open(os.path.join(args.out, "bench_kernels.md"), "w") as f:
                f.write(render_markdown(report))
    finally:
        if own_work:  # the temporary folder made above: the stages' results are in the report now
            shutil.rmtree(args.work, ignore_errors=True)
    log(render_markdown(report))
    log(short_table(report))
    return 0 if all(report[n]["status"] == "ok" for n in stages) else 1


if __name__ == "__main__":
    sys.exit(main())

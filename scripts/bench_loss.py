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
"""TROLL loss vs the clip objective: time and peak memory of one loss step, plus solver vs bisection.

One process, one run, identical inputs. A step is: LM head (``hidden @ W.T``), the loss, and backward to
``hidden`` and ``W``. Variants:

- ``clip``: ``log_softmax(logits).gather(o_t)`` + verl's vanilla clip loss (ratio clip 0.2, dual clip 10): the
  baseline the ratios are taken against.
- ``clip-verl``: the same loss with verl's own ``logprobs_from_logits`` (what verl runs on this device).
- ``troll``: :func:`troll_sparse_from_logits` + :func:`compute_policy_loss_troll` (paper defaults).

Correctness is checked before anything is timed. Every ratio is TROLL over clip measured in this run.
The last line of output is a JSON object (``time_ratio_fp32`` ... ``solver_time_ratio``).

    .venv/bin/python scripts/bench_loss.py                 # CPU, N=512 H=896 V=151936, fp32 and bf16
    .venv/bin/python scripts/bench_loss.py --shapes 512x576x49152 4096x576x49152 512x576x151936 4096x576x151936
    .venv/bin/python scripts/bench_loss.py --device cuda --shapes 8192x2560x151936 8192x4096x151936 --dtypes bf16
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.utils.metric import Metric
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.config import FSDPActorConfig

from troll_verl.config import TrollPolicyLossConfig
from troll_verl.core.losses import compute_policy_loss_troll
from troll_verl.core.projection import project
from troll_verl.core.sparse import old_topk_from_logits, troll_sparse_from_logits

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------------
# peak memory: CUDA allocator stats, or the process's peak RSS (VmHWM, reset through /proc/self/clear_refs)
# ---------------------------------------------------------------------------------------------------------
class PeakMemory:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def _rss(self, key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"{key} not in /proc/self/status")

    def reset(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return self._rss("VmRSS:")

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return self._rss("VmHWM:")


# ---------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------
def make_inputs(n, h, v, dtype, device, drift, seed=0):
    """Hidden states, head weight and an old policy that differs from the current one by ``drift``.

    LM-like peaked distributions through a real matmul: each hidden state points at 1-6 token rows of W with
    logits ~28, 25, 22, ... above a Gaussian bulk, so the mass rule keeps a handful of tokens (as in TROLL §5).
    Generated on ``device`` (the GPU's shapes are too large to build on a CPU), in fp32, then cast.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    to = dict(device=device)
    weight = torch.randn(v, h, generator=g, **to) / math.sqrt(h)
    hidden = 2.0 * torch.randn(n, h, generator=g, **to)
    n_peaks = torch.randint(1, 7, (n,), generator=g, **to)
    peak = torch.arange(6, **to)[None, :] < n_peaks[:, None]  # (n, 6): which of a row's 6 peak slots are used
    ids = torch.randint(v, (n, 6), generator=g, **to)
    heights = 28.0 - 3.0 * torch.arange(6, **to) + torch.randn(n, 6, generator=g, **to)
    rows = weight[ids]  # (n, 6, h)
    push = heights[..., None] * rows / rows.pow(2).sum(-1, keepdim=True)
    hidden += (push * peak[..., None]).sum(1)
    del rows, push
    with torch.no_grad():
        logits_old = hidden @ weight.t()
        logits_old += drift * torch.randn(n, v, generator=g, **to)
        sampled = torch.multinomial(torch.softmax(logits_old, -1), 1, generator=g).squeeze(1)
        old_lp = torch.log_softmax(logits_old, -1).gather(1, sampled[:, None]).squeeze(1)
        old = old_topk_from_logits(logits_old, topk=64, mass_delta=1e-5)
    del logits_old
    adv = torch.randn(n, generator=g, **to).sign()[None, :]
    return dict(
        hidden=hidden.to(dtype=dtype).requires_grad_(True),
        weight=weight.to(dtype=dtype).requires_grad_(True),
        sampled=sampled,
        old_lp=old_lp,
        old=old,
        adv=adv,
        mask=torch.ones(1, n, dtype=torch.bool, device=device),
    )


def actor_config(policy_loss, clip_ratio=0.2, clip_ratio_c=10.0):
    return FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio,
        clip_ratio_high=clip_ratio,
        clip_ratio_c=clip_ratio_c,
        policy_loss=policy_loss,
    )


# ---------------------------------------------------------------------------------------------------------
# the step variants (each returns the loss; the caller runs backward)
# ---------------------------------------------------------------------------------------------------------
def step_clip(x, cfg, logprob_fn):
    logits = x["hidden"] @ x["weight"].t()
    lp = logprob_fn(logits, x["sampled"]).float()[None, :]
    del logits
    loss, _ = compute_policy_loss_vanilla(x["old_lp"][None, :], lp, x["adv"], x["mask"], "token-mean", cfg)
    return loss


def naive_logprobs(logits, labels):
    return F.log_softmax(logits, dim=-1).gather(-1, labels[:, None]).squeeze(-1)


def step_troll(x, cfg):
    logits = x["hidden"] @ x["weight"].t()
    sup = troll_sparse_from_logits(logits, x["sampled"], x["old"], x["old_lp"])
    del logits
    loss, metrics = compute_policy_loss_troll(
        x["old_lp"][None, :], None, x["adv"], x["mask"], "token-mean", cfg, support=sup.reshape(1, -1)
    )
    # the metrics that combine other than by a mean across micro-batches come as verl Metric objects
    step_troll.metrics = {k: float(v.aggregate()) if isinstance(v, Metric) else v for k, v in metrics.items()}
    return loss


def run_step(fn, x, *args):
    x["hidden"].grad = None
    x["weight"].grad = None
    loss = fn(x, *args)
    loss.backward()
    return loss.detach()


def grads(x):
    return x["hidden"].grad.detach().float().clone(), x["weight"].grad.detach().float().clone()


# ---------------------------------------------------------------------------------------------------------
# correctness before timing
# ---------------------------------------------------------------------------------------------------------
def check_correctness(x, dtype):
    """TROLL with an unbounded trust region is the unclipped ratio objective: it must equal clip with no clipping;
    the trust region must hold."""
    free_troll = actor_config(TrollPolicyLossConfig(kl_bound=1e9))
    free_clip = actor_config(TrollPolicyLossConfig(loss_mode="vanilla"), clip_ratio=1e9, clip_ratio_c=1e10)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=5e-2)
    l_troll = run_step(step_troll, x, free_troll)
    g_troll = grads(x)
    l_clip = run_step(step_clip, x, free_clip, naive_logprobs)
    g_clip = grads(x)
    torch.testing.assert_close(l_troll, l_clip, **tol)
    for a, b in zip(g_troll, g_clip, strict=True):
        torch.testing.assert_close(a, b, **tol)
    cfg = actor_config(TrollPolicyLossConfig())
    l1 = run_step(step_troll, x, cfg)
    g1 = grads(x)
    metrics = step_troll.metrics
    assert math.isfinite(l1.item()) and all(torch.isfinite(g).all() for g in g1)
    assert metrics["troll/bound_violation_max"] == 0.0, metrics
    return metrics


# ---------------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------------
def measure(variants, x, device, repeats):
    """Interleaved repeats (one step of every variant per repeat, so slow drifts of a shared machine hit all
    of them alike). Returns per-variant lists of seconds and of peak bytes above the step's starting point."""
    mem = PeakMemory(device)
    times = {name: [] for name in variants}
    peaks = {name: [] for name in variants}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _name, (fn, args) in variants.items():  # warm-up
        run_step(fn, x, *args)
    for r in range(repeats):
        for name, (fn, args) in variants.items():
            x["hidden"].grad = None
            x["weight"].grad = None
            base = mem.reset()
            sync()
            t0 = time.perf_counter()
            run_step(fn, x, *args)
            sync()
            times[name].append(time.perf_counter() - t0)
            peaks[name].append(mem.peak() - base)
        log(f"  repeat {r + 1}/{repeats}: " + ", ".join(f"{n} {times[n][-1]:.3f}s" for n in variants))
    return times, peaks


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over repeats of num[r] / den[r] (pairs measured back to back)."""
    return statistics.median(a / b if b > 0 else math.nan for a, b in zip(num, den, strict=True))


def bench_loss(args, dtype_name, device):
    dtype = DTYPES[dtype_name]
    log(f"\n== loss step, {dtype_name}: N={args.tokens} H={args.hidden} V={args.vocab} on {device} ==")
    x = make_inputs(args.tokens, args.hidden, args.vocab, dtype, device, args.drift)
    metrics = check_correctness(x, dtype)
    log(
        f"  correctness ok: support {metrics['troll/support_size']:.1f} tokens, projected "
        f"{100 * metrics['troll/projected_frac']:.0f}%, KL before {metrics['troll/kl_before']:.3f} after "
        f"{metrics['troll/kl_after']:.3f}, solver iters {metrics['troll/solver_iters']:.0f}"
    )
    clip_cfg = actor_config(TrollPolicyLossConfig(loss_mode="vanilla"))
    troll_cfg = actor_config(TrollPolicyLossConfig())
    variants = {
        "clip": (step_clip, (clip_cfg, naive_logprobs)),
        "clip-verl": (step_clip, (clip_cfg, logprobs_from_logits)),
        "troll": (step_troll, (troll_cfg,)),
    }
    if args.skip_verl_baseline:
        variants.pop("clip-verl")
    times, peaks = measure(variants, x, device, args.repeats)
    res = {}
    log(f"\n  {'variant':<12} {'time [s]':>9} {'time/clip':>10} {'peak [MiB]':>11} {'mem/clip':>9}   (medians)")
    for name in variants:
        t_ratio = paired_ratio(times[name], times["clip"])
        m_ratio = paired_ratio(peaks[name], peaks["clip"])
        res[name] = dict(
            time=statistics.median(times[name]),
            mem=statistics.median(peaks[name]),
            time_ratio=t_ratio,
            mem_ratio=m_ratio,
        )
        log(
            f"  {name:<12} {res[name]['time']:>9.3f} {t_ratio:>10.3f} {res[name]['mem'] / 2**20:>11.0f} {m_ratio:>9.3f}"
        )
    if "clip-verl" in res:
        res["troll"]["time_ratio_vs_verl"] = paired_ratio(times["troll"], times["clip-verl"])
        res["troll"]["mem_ratio_vs_verl"] = paired_ratio(peaks["troll"], peaks["clip-verl"])
    del x
    return res, metrics


def bench_solver(args, device):
    """Newton vs plain 24-step log-space bisection on rows x support, fp32; accuracy checked in float64."""
    R, S = args.solver_rows, args.solver_support
    log(f"\n== solver: {R} rows x {S} support, fp32 on {device} ==")
    g = torch.Generator().manual_seed(1)
    a = torch.randn(R, S, generator=g, dtype=torch.float64) * 3.0
    b = a + torch.randn(R, S, generator=g, dtype=torch.float64) * 0.4
    new = torch.log_softmax(b, -1).float().to(device)
    old = torch.log_softmax(a, -1).float().to(device)
    eps = 0.05
    out = {}
    for solver, iters in (("newton", None), ("bisection", 24)):
        res = project(new, old, eps, solver=solver, max_iter=iters)
        lp, lo = res.logprobs.double(), old.double()
        kl = (lp.exp() * (lp - lo)).sum(-1)
        p = res.projected
        rel = ((kl[p] - eps) / eps).abs().max().item()
        viol = (kl - eps).clamp_min(0).max().item()
        out[solver] = dict(rel_err=rel, violation=viol, iters=int(res.num_iters), frac=p.float().mean().item())
    # both land just inside the ball (the solver's target margin): Newton must keep the bound and be as tight as
    # bisection's 24 halvings, to rounding (within 1e-5 relative of epsilon)
    if out["newton"]["violation"] > 0 or out["newton"]["rel_err"] > out["bisection"]["rel_err"] + 1e-5:
        raise SystemExit(f"solver accuracy check failed: {out}")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {"newton": [], "bisection": []}
    for _ in range(2):
        project(new, old, eps)
        project(new, old, eps, solver="bisection", max_iter=24)
    for _ in range(args.solver_repeats):
        for solver, iters in (("newton", None), ("bisection", 24)):
            sync()
            t0 = time.perf_counter()
            project(new, old, eps, solver=solver, max_iter=iters)
            sync()
            times[solver].append(time.perf_counter() - t0)
    for s in times:
        out[s]["time"] = statistics.median(times[s])
    out["time_ratio"] = paired_ratio(times["newton"], times["bisection"])
    log(f"  {'solver':<10} {'time [s]':>9} {'iters':>6} {'max |KL-eps|/eps':>17} {'max violation':>14}")
    for s in times:
        o = out[s]
        log(f"  {s:<10} {o['time']:>9.4f} {o['iters']:>6} {o['rel_err']:>17.2e} {o['violation']:>14.2e}")
    log(
        f"  newton/bisection time (median of paired ratios): {out['time_ratio']:.3f}; projected rows: "
        f"{100 * out['newton']['frac']:.0f}%"
    )
    return out


def parse_shape(text: str) -> tuple[int, int, int]:
    """``NxHxV`` (tokens x hidden x vocabulary) as three ints."""
    try:
        n, h, v = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxHxV such as 4096x576x49152, got {text!r}") from None
    if min(n, h, v) < 1:
        raise argparse.ArgumentTypeError(f"N, H and V must be positive, got {text!r}")
    return n, h, v


def markdown_table(cases: list[dict]) -> str:
    """One row per (shape, dtype): TROLL / clip time and peak memory (medians of paired ratios) and the seconds."""
    lines = [
        "| N | H | V | dtype | time TROLL / clip | peak memory TROLL / clip | clip step [ms] | TROLL step [ms] "
        "| clip peak [MiB] | TROLL peak [MiB] | support | projected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c['N']} | {c['H']} | {c['V']} | {c['dtype']} | {_num(c['time_ratio'])} | {_num(c['mem_ratio'])} | "
            f"{1e3 * c['time_clip_s']:.1f} | {1e3 * c['time_troll_s']:.1f} | {c['mem_clip_mib']:.0f} | "
            f"{c['mem_troll_mib']:.0f} | {c['support_size']:.1f} | {100 * c['projected_frac']:.0f} % |"
        )
    return "\n".join(lines)


def _num(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=None,
        metavar="NxHxV",
        help="several shapes in one run (overrides --tokens/--hidden/--vocab), e.g. 512x576x49152",
    )
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--drift", type=float, default=0.5, help="std of the old-vs-current logit difference")
    p.add_argument("--solver-rows", type=int, default=32768)
    p.add_argument("--solver-support", type=int, default=128)
    p.add_argument("--solver-repeats", type=int, default=9)
    p.add_argument("--skip-solver", action="store_true", help="skip the Newton vs bisection comparison")
    p.add_argument("--skip-verl-baseline", action="store_true", help="skip verl's logprobs_from_logits baseline")
    p.add_argument("--json", default=None, help="also write the summary here")
    p.add_argument("--markdown", default=None, help="also write the table here")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    log(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device}")

    shapes = args.shapes or [(args.tokens, args.hidden, args.vocab)]
    cases = []
    for n, h, v in shapes:
        for name in args.dtypes.split(","):
            args.tokens, args.hidden, args.vocab = n, h, v
            res, metrics = bench_loss(args, name, device)
            troll = res["troll"]
            case = {
                "N": n,
                "H": h,
                "V": v,
                "dtype": name,
                "time_ratio": round(troll["time_ratio"], 4),
                "mem_ratio": round(troll["mem_ratio"], 4),
                "time_clip_s": res["clip"]["time"],
                "time_troll_s": res["troll"]["time"],
                "mem_clip_mib": res["clip"]["mem"] / 2**20,
                "mem_troll_mib": res["troll"]["mem"] / 2**20,
                "support_size": round(metrics["troll/support_size"], 2),
                "projected_frac": round(metrics["troll/projected_frac"], 3),
            }
            if "clip-verl" in res:
                case["time_ratio_vs_verl"] = round(res["troll"]["time_ratio_vs_verl"], 4)
                case["mem_ratio_vs_verl"] = round(res["troll"]["mem_ratio_vs_verl"], 4)
            cases.append(case)
    summary = {"device": str(device), "device_name": _device_name(device), "torch": torch.__version__, "cases": cases}
    if not args.skip_solver:
        solver = bench_solver(args, device)
        summary["solver_time_ratio"] = round(solver["time_ratio"], 4)
        summary["solver_rel_err_newton"] = float(f"{solver['newton']['rel_err']:.3e}")
        summary["solver_rel_err_bisection"] = float(f"{solver['bisection']['rel_err']:.3e}")
    table = markdown_table(cases)
    log("\nTROLL / clip, medians of paired ratios measured in this run:\n" + table + "\n")
    summary = _finite(summary)  # a ratio with a zero baseline (memory below the RSS page granularity) is null
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, allow_nan=False)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    print(json.dumps(summary, allow_nan=False), flush=True)


def _finite(value):
    """``value`` with every NaN float replaced by None, recursively (strict JSON)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())

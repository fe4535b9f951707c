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
"""The per-token KL projection (TROLL §1–§3) as one kernel each way, with TROLL's per-token terms (§4) fused in
where asked (``TERMS``; :mod:`.terms` launches them).

Forward, one program per block of rows × the support padded to a power of two, all in registers: the renormalisation,
KL(π̃ ‖ π_old), the row's target (ε less the same relative and rounding margins), and for rows above it the
safeguarded Newton solve in ``u = log w`` with the same bracket, trust rule, convergence test and iteration cap as
:mod:`troll_verl.core.projection`; then the projected log-probs and ``kl_after`` recomputed from the returned values.
Backward: the closed-form implicit gradient (TROLL §3) from the saved ``w``, recomputing the rest.

NOTE: the torch solver iterates every projected row of the call until the slowest has converged; here a block of rows
iterates until its slowest has. Rows that converged keep taking (tiny) Newton steps in both, so the two agree to
rounding, and every row meets the same convergence test and margins. ``num_iters`` is the largest block's count, a
0-d tensor (reading it is a device sync).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from troll_verl.core.projection import DEFAULT_MAX_ITER, ProjectionResult, full_precision, solver_constants
from troll_verl.core.projection import project as torch_project

from .launch import Launch, unused

__all__ = [
    "KLProjection",
    "ProjectionForward",
    "forward_launch",
    "run_forward",
    "backward_launch",
    "run_backward",
    "triton_project",
    "SOLVER_CONSTANTS",
]

# the torch solver's constants for fp32 (troll_verl.core.projection.solver_constants): the kernels stop on its test
SOLVER_CONSTANTS = solver_constants(torch.float32)
_EPS = float(torch.finfo(torch.float32).eps)
_TINY = float(torch.finfo(torch.float32).tiny)
_BLOCK_ELEMS = 2048  # rows × padded support per program
_WARPS = 4


@triton.jit
def _prepare(new_ptr, old_ptr, mask_ptr, r, S, HAS_MASK: tl.constexpr, S_P2: tl.constexpr):
    """Rows ``r`` (BLOCK_R,): ``(ln raw, valid, lo − LSE(lo), s, kl0, row_ok)`` as in ``projection._prepare``."""
    c = tl.arange(0, S_P2)
    inb = (r[:, None] >= 0) & (c < S)[None, :]
    off = r.to(tl.int64)[:, None] * S + c[None, :]
    ln = tl.load(new_ptr + off, mask=inb, other=0.0).to(tl.float32)
    lo = tl.load(old_ptr + off, mask=inb, other=0.0).to(tl.float32)
    if HAS_MASK:
        valid = inb & (tl.load(mask_ptr + off, mask=inb, other=0) != 0)
    else:
        valid = inb
    ln_m = tl.where(valid, ln, float("-inf"))
    lo_m = tl.where(valid, lo, float("-inf"))
    m_n = tl.max(ln_m, axis=1)
    m_n = tl.where(m_n == float("-inf"), 0.0, m_n)
    e_n = tl.exp(ln_m - m_n[:, None])
    z_n = tl.sum(e_n, axis=1)
    m_o = tl.max(lo_m, axis=1)
    m_o = tl.where(m_o == float("-inf"), 0.0, m_o)
    lse_o = m_o + tl.log(tl.sum(tl.exp(lo_m - m_o[:, None]), axis=1))
    s = tl.where(valid, (ln - lo) - (m_n + tl.log(z_n) - lse_o)[:, None], 0.0)
    kl0 = tl.sum(e_n * s, axis=1) / z_n
    row_ok = (kl0 == kl0) & (tl.abs(kl0) < float("inf")) & (tl.sum(valid.to(tl.int32), axis=1) > 0)
    return ln, valid, lo - lse_o[:, None], s, kl0, row_ok


@triton.jit
def _moments(lo_n, sc, valid, w):
    """``(x, log Z, E_w[sc], Var_w(sc))`` of ``π_w ∝ π_old · exp(w · sc)`` per row (TROLL §2)."""
    x = tl.where(valid, lo_n + sc * w[:, None], float("-inf"))
    m = tl.max(x, axis=1)
    m = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m[:, None])
    z = tl.sum(e, axis=1)
    es = tl.sum(e * sc, axis=1) / z
    var = tl.maximum(tl.sum(e * sc * sc, axis=1) / z - es * es, 0.0)
    return x, m + tl.log(z), es, var


@triton.jit
def _project_rows(
    new_ptr, old_ptr, mask_ptr, r, S, target_base, ulps_eps, half_bound, u_min, max_iter, tol, trust_phi, phi_conv,
    tiny, HAS_MASK: tl.constexpr, S_P2: tl.constexpr,
):  # fmt: skip
    """Solve a block of rows: ``(ln, valid, lp, w, kl0, kl_after, projected, bad, iters)``."""
    ln, valid, lo_n, s, kl0, row_ok = _prepare(new_ptr, old_ptr, mask_ptr, r, S, HAS_MASK, S_P2)
    # the row's target (projection._row_target): the aim and the inside/outside test
    min_lo = tl.min(tl.where(valid & (tl.abs(lo_n) < float("inf")), lo_n, 0.0), axis=1)
    mag = -(min_lo + tl.minimum(tl.min(s, axis=1), 0.0))
    target = tl.maximum(target_base - ulps_eps * mag, half_bound)
    projected = row_ok & (kl0 > target)
    # safeguarded Newton on φ(u) = log KL(π_w ‖ π_old) − log target in u = log w (projection._solve_newton)
    sc = s - kl0[:, None]
    log_t = tl.log(target)
    kl0_safe = tl.where(projected, kl0, 1.0)
    u = tl.minimum(tl.maximum(0.5 * (log_t - tl.log(kl0_safe)), u_min), 0.0)
    lo_b = tl.zeros_like(u) + u_min
    hi_b = tl.zeros_like(u)
    it = tl.full([], 0, tl.int32)
    go = tl.sum(projected.to(tl.int32), axis=0) > 0
    while go:
        it += 1
        w = tl.exp(u)
        _, log_z, es, var = _moments(lo_n, sc, valid, w)
        kl = tl.maximum(w * es - log_z, tiny)
        phi = tl.log(kl) - log_t
        feas = phi <= 0
        lo_b = tl.where(feas, u, lo_b)
        hi_b = tl.where(feas, hi_b, u)
        u_new = u - phi * kl / tl.maximum(w * w * var, tiny)
        outside = ((u_new >= lo_b) & (u_new <= hi_b)) == 0  # also catches NaN
        u_new = tl.where(outside | (phi < trust_phi), 0.5 * (lo_b + hi_b), u_new)
        done = ((tl.abs(u_new - u) <= tol) & (tl.abs(phi) <= phi_conv)) | (hi_b - lo_b <= tol)
        u = tl.where(projected, u_new, u)
        go = (it < max_iter) & (tl.sum((projected & (done == 0)).to(tl.int32), axis=0) > 0)
    w = tl.where(projected, tl.exp(u), 1.0)
    x, log_z, es, _ = _moments(lo_n, sc, valid, w)
    lp = x - log_z[:, None]
    kl_after = tl.where(projected, w * es - log_z, kl0)
    if HAS_MASK:
        bad = (row_ok == 0) & (tl.sum(valid.to(tl.int32), axis=1) > 0)  # rows without support stay unchanged
    else:
        bad = row_ok == 0
    return ln, valid, lp, w, kl0, kl_after, projected, bad, it


@triton.jit
def _project_fwd_kernel(
    new_ptr,
    old_ptr,
    mask_ptr,
    idx_ptr,
    out_ptr,
    eta_ptr,
    klb_ptr,
    kla_ptr,
    proj_ptr,
    w_ptr,
    iters_ptr,
    plp_ptr,
    lp_ptr,
    reg_ptr,
    R,
    S,
    target_base,
    ulps_eps,
    half_bound,
    u_min,
    max_iter,
    tol,
    trust_phi,
    phi_conv,
    tiny,
    HAS_MASK: tl.constexpr,
    TERMS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    S_P2: tl.constexpr,
):
    """A block of rows: the projection's outputs (``TERMS``: the token terms instead of the log-probs).

    Parameters:
        new_ptr: ``(R, S)`` current log-probs on the support (fp32), contiguous.
        old_ptr: ``(R, S)`` old log-probs on the support (fp32), contiguous.
        mask_ptr: ``(R, S)`` uint8 valid entries (read with ``HAS_MASK`` only).
        idx_ptr: ``(R,)`` int32 column of the sampled token in each row (read with ``TERMS`` only).
        out_ptr: out ``(R, S)`` projected log-probs in new's dtype (written without ``TERMS`` only).
        eta_ptr: out ``(R,)`` fp32 ``η = 1/w − 1`` (with ``TERMS``: 0 where not projected).
        klb_ptr: out ``(R,)`` fp32 KL(π ‖ π_old) before the projection.
        kla_ptr: out ``(R,)`` fp32 KL(π̃ ‖ π_old) after it.
        proj_ptr: out ``(R,)`` uint8 rows projected.
        w_ptr: out ``(R,)`` fp32 the solution's weight ``w`` (1 where not projected), saved for the backward.
        iters_ptr: out ``(cdiv(R, BLOCK_R),)`` int32 Newton passes of each block.
        plp_ptr: out ``(R,)`` fp32 ``log π̃(o_t)`` (``TERMS`` only).
        lp_ptr: out ``(R,)`` fp32 ``log π(o_t)`` (``TERMS`` only).
        reg_ptr: out ``(R,)`` fp32 the regression ``KL(π̃ ‖ sg π)`` on projected rows (``TERMS`` only).
        R: rows.
        S: the support's width.
        target_base: ``ε (1 − target_margin)``, the target before the rounding margin.
        ulps_eps: ``margin_ulps · eps``; the target is lowered by it times the row's largest |log-prob|.
        half_bound: ``ε / 2``, the target's floor.
        u_min: ``log(1 / (1 + eta_max))``, the smallest ``u = log w``.
        max_iter: the Newton iteration cap.
        tol: the step tolerance in ``u``.
        trust_phi: below this ``log(KL / target)`` a Newton step is replaced by bisection.
        phi_conv: the ``|log(KL / target)|`` that counts as converged.
        tiny: fp32's smallest normal.
        HAS_MASK: rows have a mask (else every entry is valid).
        TERMS: the token terms of TROLL §4 instead of the projected log-probs.
        BLOCK_R: rows per program.
        S_P2: ``S`` padded to a power of 2.
    """
    pid = tl.program_id(0)
    rr = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rv = rr < R
    r = tl.where(rv, rr, -1)
    ln, valid, lp, w, kl0, kl_after, projected, bad, it = _project_rows(
        new_ptr, old_ptr, mask_ptr, r, S, target_base, ulps_eps, half_bound, u_min, max_iter, tol, trust_phi,
        phi_conv, tiny, HAS_MASK, S_P2,
    )  # fmt: skip
    out = tl.where(projected[:, None] & valid, lp, ln)  # rows inside the ball and masked entries pass through
    out = tl.where(bad[:, None], float("nan"), out)
    eta = tl.where(bad, float("nan"), 1.0 / w - 1.0)
    klb = tl.where(bad, float("nan"), kl0)
    kla = tl.where(bad, float("nan"), kl_after)
    c = tl.arange(0, S_P2)
    r64 = rr.to(tl.int64)
    if TERMS:
        # TROLL §4 (terms.troll_token_terms): log π(o_t), log π̃(o_t), KL(π̃ ‖ sg π) on projected rows
        idx = tl.load(idx_ptr + rr, mask=rv, other=0)
        at = c[None, :] == idx[:, None]
        tl.store(plp_ptr + rr, tl.sum(tl.where(at, out, 0.0), axis=1), mask=rv)
        tl.store(lp_ptr + rr, tl.sum(tl.where(at, ln, 0.0), axis=1), mask=rv)
        reg_on = valid & projected[:, None]
        reg = tl.sum(tl.where(reg_on, tl.exp(ln) * (ln - out), 0.0), axis=1)
        tl.store(reg_ptr + rr, reg, mask=rv)
        eta = tl.where(projected, eta, 0.0)
    else:
        tl.store(out_ptr + r64[:, None] * S + c[None, :], out, mask=rv[:, None] & (c < S)[None, :])
    tl.store(eta_ptr + rr, eta, mask=rv)
    tl.store(klb_ptr + rr, klb, mask=rv)
    tl.store(kla_ptr + rr, kla, mask=rv)
    tl.store(proj_ptr + rr, projected.to(tl.uint8), mask=rv)
    tl.store(w_ptr + rr, tl.where(bad, float("nan"), w), mask=rv)
    tl.store(iters_ptr + pid, it)


@triton.jit
def _project_bwd_kernel(
    new_ptr,
    old_ptr,
    mask_ptr,
    idx_ptr,
    w_ptr,
    proj_ptr,
    g_ptr,
    gplp_ptr,
    glp_ptr,
    greg_ptr,
    grad_ptr,
    R,
    S,
    tiny,
    HAS_MASK: tl.constexpr,
    TERMS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    S_P2: tl.constexpr,
):
    """∂L/∂log π̃ for a block of rows (TROLL §3); ``TERMS``: upstream gradients of the token terms per row.

    Parameters:
        new_ptr: ``(R, S)`` current log-probs on the support (fp32), contiguous.
        old_ptr: ``(R, S)`` old log-probs on the support (fp32), contiguous.
        mask_ptr: ``(R, S)`` uint8 valid entries (read with ``HAS_MASK`` only).
        idx_ptr: ``(R,)`` int32 column of the sampled token in each row (read with ``TERMS`` only).
        w_ptr: ``(R,)`` fp32 the forward's weights ``w``.
        proj_ptr: ``(R,)`` uint8 rows the forward projected.
        g_ptr: ``(R, S)`` upstream gradient of the projected log-probs (read without ``TERMS`` only).
        gplp_ptr: ``(R,)`` upstream gradient of ``log π̃(o_t)`` (``TERMS`` only).
        glp_ptr: ``(R,)`` upstream gradient of ``log π(o_t)`` (``TERMS`` only).
        greg_ptr: ``(R,)`` upstream gradient of the regression (``TERMS`` only).
        grad_ptr: out ``(R, S)`` fp32 gradient with respect to the current log-probs.
        R: rows.
        S: the support's width.
        tiny: fp32's smallest normal.
        HAS_MASK: rows have a mask (else every entry is valid).
        TERMS: the token terms of TROLL §4 instead of the projected log-probs.
        BLOCK_R: rows per program.
        S_P2: ``S`` padded to a power of 2.
    """
    pid = tl.program_id(0)
    rr = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rv = rr < R
    r = tl.where(rv, rr, -1)
    ln, valid, lo_n, s, kl0, row_ok = _prepare(new_ptr, old_ptr, mask_ptr, r, S, HAS_MASK, S_P2)
    c = tl.arange(0, S_P2)
    r64 = rr.to(tl.int64)
    inb = rv[:, None] & (c < S)[None, :]
    w = tl.load(w_ptr + rr, mask=rv, other=1.0)
    projected = tl.load(proj_ptr + rr, mask=rv, other=0) != 0
    if TERMS:
        idx = tl.load(idx_ptr + rr, mask=rv, other=0)
        at = c[None, :] == idx[:, None]
        g = tl.where(at, tl.load(gplp_ptr + rr, mask=rv, other=0.0)[:, None], 0.0)
    else:
        g = tl.load(g_ptr + r64[:, None] * S + c[None, :], mask=inb, other=0.0).to(tl.float32)
    # π_w at the solution (the uncentred s gives the same distribution), E[s], Var(s), c = Σ G (s − E[s])
    x = tl.where(valid, lo_n + s * w[:, None], float("-inf"))
    m = tl.max(x, axis=1)
    m = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m[:, None])
    p = e / tl.sum(e, axis=1)[:, None]
    es = tl.sum(p * s, axis=1)
    d = tl.where(valid, s - es[:, None], 0.0)
    var = tl.maximum(tl.sum(p * d * d, axis=1), tiny)
    g_v = tl.where(valid, g, 0.0)
    cc = tl.sum(g_v * d, axis=1)
    gs = w[:, None] * (g_v - p * tl.sum(g_v, axis=1)[:, None]) - (w * cc / var)[:, None] * p * d
    grad = tl.where(projected[:, None] & valid, gs, g)
    if HAS_MASK:
        bad = (row_ok == 0) & (tl.sum(valid.to(tl.int32), axis=1) > 0)
    else:
        bad = row_ok == 0
    if TERMS:
        # the regression's π̃_a (log π̃_a − log π_a + 1) on projected rows, and log π̃(o_t)'s own gradient
        lp_proj = x - (m + tl.log(tl.sum(e, axis=1)))[:, None]
        g_reg = tl.load(greg_ptr + rr, mask=rv, other=0.0)
        reg = tl.where(valid & projected[:, None], tl.exp(ln) * (ln - lp_proj + 1.0), 0.0) * g_reg[:, None]
        grad = grad + reg + tl.where(at, tl.load(glp_ptr + rr, mask=rv, other=0.0)[:, None], 0.0)
    grad = tl.where(bad[:, None], float("nan"), grad)
    tl.store(grad_ptr + r64[:, None] * S + c[None, :], grad, mask=inb)


# ------------------------------------------------------------------------------------------------------ launchers
def _config(S: int) -> tuple[int, int]:
    s_p2 = triton.next_power_of_2(max(S, 1))
    return s_p2, max(1, _BLOCK_ELEMS // s_p2)


# the forward kernel's solver parameters, in the order _solver_args gives them
_SOLVER_ARGS = ("target_base", "ulps_eps", "half_bound", "u_min", "max_iter", "tol", "trust_phi", "phi_conv", "tiny")


def _solver_args(kl_bound: float, max_iter: int, tol: float | None, eta_max: float) -> tuple:
    k = SOLVER_CONSTANTS
    return (kl_bound * (1.0 - k["target_margin"]), k["margin_ulps"] * _EPS, 0.5 * kl_bound,
            math.log(1.0 / (1.0 + eta_max)), max_iter, k["tol"] if tol is None else tol, k["trust_phi"],
            k["phi_converged"], _TINY)  # fmt: skip


class ProjectionForward(NamedTuple):
    """The forward kernel's outputs for ``R`` rows of width ``S``."""

    out: torch.Tensor | None  # (R, S) projected log-probs in new's dtype; None with the token terms
    eta: torch.Tensor  # (R,) fp32
    kl_before: torch.Tensor  # (R,) fp32
    kl_after: torch.Tensor  # (R,) fp32
    projected: torch.Tensor  # (R,) bool
    w: torch.Tensor  # (R,) fp32, saved for the backward
    iters: torch.Tensor  # 0-d int32: the slowest block's Newton passes
    proj_log_prob: torch.Tensor | None  # (R,) fp32, token terms only
    log_prob: torch.Tensor | None  # (R,) fp32, token terms only
    regression: torch.Tensor | None  # (R,) fp32, token terms only


def forward_launch(new, old, mask, idx, kl_bound, max_iter, tol, eta_max, terms: bool) -> tuple[Launch, tuple]:
    """The forward kernel's launch and its output buffers ``(out, eta, kl_before, kl_after, projected, w, iters,
    proj_log_prob, log_prob, regression)`` (arguments as :func:`run_forward`; ``out`` None with ``terms``, the last
    three None without). Nothing runs: on ``meta`` tensors it gives the launch's signature."""
    R, S = new.shape
    dev = new.device
    s_p2, block_r = _config(S)
    n_blocks = triton.cdiv(R, block_r)
    f32 = dict(dtype=torch.float32, device=dev)
    out = None if terms else torch.empty((R, S), dtype=new.dtype, device=dev)
    eta, klb, kla, w = (torch.empty(R, **f32) for _ in range(4))
    projected = torch.empty(R, dtype=torch.uint8, device=dev)
    iters = torch.empty(max(n_blocks, 1), dtype=torch.int32, device=dev)
    plp, lp, reg = (torch.empty(R, **f32) for _ in range(3)) if terms else (None, None, None)
    stand_in = unused(torch.float32, dev)
    solver = dict(zip(_SOLVER_ARGS, _solver_args(kl_bound, max_iter, tol, eta_max), strict=True))
    launch = Launch(
        _project_fwd_kernel,
        (n_blocks,),
        dict(
            new_ptr=new,
            old_ptr=old,
            mask_ptr=unused(torch.uint8, dev) if mask is None else mask.view(torch.uint8),
            idx_ptr=unused(torch.int32, dev) if idx is None else idx,
            out_ptr=unused(new.dtype, dev) if out is None else out,
            eta_ptr=eta,
            klb_ptr=klb,
            kla_ptr=kla,
            proj_ptr=projected,
            w_ptr=w,
            iters_ptr=iters,
            plp_ptr=stand_in if plp is None else plp,
            lp_ptr=stand_in if lp is None else lp,
            reg_ptr=stand_in if reg is None else reg,
            R=R,
            S=S,
            **solver,
        ),
        dict(HAS_MASK=mask is not None, TERMS=terms, BLOCK_R=block_r, S_P2=s_p2),
        _WARPS,
    )
    return launch, (out, eta, klb, kla, projected, w, iters, plp, lp, reg)


def run_forward(new, old, mask, idx, kl_bound, max_iter, tol, eta_max, terms: bool) -> ProjectionForward:
    """The forward kernel on ``(R, S)`` rows: ``new``, ``old`` fp32 log-probs, ``mask`` ``(R, S)`` bool or None,
    ``idx`` ``(R,)`` int32 sampled positions (read with ``terms``, else None), the solver's settings; ``terms``
    selects the token terms' outputs instead of the projected rows."""
    launch, (out, eta, klb, kla, projected, w, iters, plp, lp, reg) = forward_launch(
        new, old, mask, idx, kl_bound, max_iter, tol, eta_max, terms
    )
    if launch.grid[0] > 0:
        launch()
    else:
        iters.zero_()
    return ProjectionForward(out, eta, klb, kla, projected.view(torch.bool), w, iters.max(), plp, lp, reg)


def backward_launch(
    new, old, mask, idx, w, projected, g, g_plp, g_lp, g_reg, terms: bool
) -> tuple[Launch, torch.Tensor]:
    """The backward kernel's launch and the gradient buffer it writes (arguments as :func:`run_backward`). Nothing
    runs: on ``meta`` tensors it gives the launch's signature."""
    R, S = new.shape
    dev = new.device
    grad = torch.empty((R, S), dtype=torch.float32, device=dev)
    s_p2, block_r = _config(S)
    stand_in = unused(torch.float32, dev)
    launch = Launch(
        _project_bwd_kernel,
        (triton.cdiv(R, block_r),),
        dict(
            new_ptr=new,
            old_ptr=old,
            mask_ptr=unused(torch.uint8, dev) if mask is None else mask.view(torch.uint8),
            idx_ptr=unused(torch.int32, dev) if idx is None else idx,
            w_ptr=w,
            proj_ptr=projected.view(torch.uint8),
            g_ptr=stand_in if g is None else g.contiguous(),
            gplp_ptr=stand_in if g_plp is None else g_plp,
            glp_ptr=stand_in if g_lp is None else g_lp,
            greg_ptr=stand_in if g_reg is None else g_reg,
            grad_ptr=grad,
            R=R,
            S=S,
            tiny=_TINY,
        ),
        dict(HAS_MASK=mask is not None, TERMS=terms, BLOCK_R=block_r, S_P2=s_p2),
        _WARPS,
    )
    return launch, grad


def run_backward(new, old, mask, idx, w, projected, g, g_plp, g_lp, g_reg, terms: bool) -> torch.Tensor:
    """The backward kernel: ``(R, S)`` fp32 gradient w.r.t. ``new`` from the forward's inputs and saved ``w``,
    ``projected``; the upstream gradient is ``g`` ``(R, S)`` (the projection) or, with ``terms``, ``g_plp``,
    ``g_lp``, ``g_reg`` ``(R,)`` (the token terms)."""
    launch, grad = backward_launch(new, old, mask, idx, w, projected, g, g_plp, g_lp, g_reg, terms)
    if launch.grid[0] > 0:
        launch()
    return grad


class KLProjection(torch.autograd.Function):
    """The kernels' ``_KLProjection`` (:mod:`troll_verl.core.projection`) on ``(R, S)`` rows, Newton solver.

    Forward: ``(new (R, S), old (R, S), mask (R, S) bool or None, kl_bound, max_iter, tol, eta_max)`` →
    ``(logprobs (R, S) in new's dtype, eta, kl_before, kl_after (R,) fp32, projected (R,) bool, iters 0-d int32)``.
    """

    @staticmethod
    @full_precision
    def forward(ctx, new, old, mask, kl_bound, max_iter, tol, eta_max):
        """One launch (plus the iteration count's max)."""
        new_c, old_c = new.detach().contiguous(), old.detach().contiguous()
        mask_c = None if mask is None else mask.contiguous()
        f = run_forward(new_c, old_c, mask_c, None, kl_bound, max_iter, tol, eta_max, terms=False)
        ctx.save_for_backward(new_c, old_c, mask_c, f.w, f.projected)
        ctx.mark_non_differentiable(f.eta, f.kl_before, f.kl_after, f.projected, f.iters)
        return f.out, f.eta, f.kl_before, f.kl_after, f.projected, f.iters

    @staticmethod
    @once_differentiable
    @full_precision
    def backward(ctx, g_out, *_):
        """One launch: the implicit gradient (TROLL §3)."""
        new, old, mask, w, projected = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 7
        grad = run_backward(new, old, mask, None, w, projected, g_out.float(), None, None, None, terms=False)
        return grad.to(new.dtype), None, None, None, None, None, None


def triton_project(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    kl_bound: float,
    mask: torch.Tensor | None = None,
    *,
    solver: str = "newton",
    max_iter: int | None = None,
    tol: float | None = None,
    eta_max: float = 1e6,
) -> ProjectionResult:
    """:func:`troll_verl.core.projection.project` on the kernels (same arguments and outputs, ``num_iters`` a 0-d
    tensor). ``solver="bisection"`` and float64 inputs go to the torch function."""
    if solver != "newton" or new_logprobs.dtype == torch.float64:
        return torch_project(new_logprobs, old_logprobs, kl_bound, mask, solver=solver, max_iter=max_iter, tol=tol,
                             eta_max=eta_max)  # fmt: skip
    if new_logprobs.shape != old_logprobs.shape or (mask is not None and mask.shape != new_logprobs.shape):
        raise ValueError(f"new_logprobs, old_logprobs and mask must share one shape (..., S), got "
                         f"{tuple(new_logprobs.shape)}, {tuple(old_logprobs.shape)}.")  # fmt: skip
    S = new_logprobs.shape[-1]
    batch = new_logprobs.shape[:-1]
    out, eta, klb, kla, projected, iters = KLProjection.apply(
        new_logprobs.reshape(-1, S), old_logprobs.reshape(-1, S), None if mask is None else mask.reshape(-1, S),
        float(kl_bound), DEFAULT_MAX_ITER if max_iter is None else int(max_iter), tol, float(eta_max),
    )  # fmt: skip
    return ProjectionResult(out.reshape(new_logprobs.shape), eta.reshape(batch), klb.reshape(batch),
                            kla.reshape(batch), projected.reshape(batch), iters)  # fmt: skip

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
"""Exact per-token KL trust-region projection (TROLL, arXiv:2510.03817, §2-§3).

For every row (one token position) of categorical distributions over a support of size S this module
solves

    π* = argmin_π KL(π ‖ π̃)   subject to   KL(π ‖ π_old) ≤ ε                      # TROLL §1

whose solution is the geometric interpolation

    log π_η(a) = (log π̃(a) + η · log π_old(a)) / (1 + η) − log Z(η).

With ``w = 1 / (1 + η)`` and ``s = log π̃ − log π_old`` this is ``π_w ∝ π_old · exp(w · s)``; ``w = 1`` is the
unprojected distribution and ``w → 0`` the old one. Rows inside the ball are returned unchanged
(η = 0, identity Jacobian); every other row is made tight, ``KL(π_η* ‖ π_old) = ε`` up to a safety margin of a
few units of rounding (``_row_target``), which also decides inside from outside: the KL of the *returned*
log-probs, evaluated exactly, stays ≤ ε.

The module is pure torch (no verl import) so that it can move upstream unchanged. Public API:
:func:`project` and :class:`ProjectionResult`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from .host import host_reads
from .variants import variant

__all__ = ["ProjectionResult", "project", "compute_dtype", "full_precision", "solver_constants", "DEFAULT_MAX_ITER"]


# Safety margin on the bound: the solver aims at ε·(1 − margin) − _MARGIN_ULPS·M·eps(dtype) per row, M the
# largest |log-prob| on the row's support, so that the KL recomputed from the returned (rounded) log-probs
# stays ≤ ε. Rounding a log-prob of magnitude M moves the KL by up to ~M·eps(dtype) (absolute).
_TARGET_MARGIN = {torch.float32: 2e-5, torch.float64: 1e-10}
_MARGIN_ULPS = 4.0
# Step tolerance on u = log w at which Newton stops; the final step is still applied, so the achieved
# accuracy is quadratic in this number.
_DEFAULT_TOL = {torch.float32: 1e-4, torch.float64: 1e-8}
# Newton steps are trusted only while log(KL / target) is above this (below, KL is lost in rounding).
_NEWTON_TRUST_PHI = -math.log(1e4)
# |log(KL / target)| below which a small step counts as converged (guards against stalled steps).
_PHI_CONVERGED = 1e-2
# the solver's iteration cap when the caller sets none
DEFAULT_MAX_ITER = 30


def solver_constants(dtype: torch.dtype) -> dict[str, float]:
    """The Newton solver's constants in ``dtype`` (fp32 or fp64), for a solver elsewhere that must stop on the same
    test (a fast path): the relative target margin, the rounding margin in units of eps·max|log p|, the default step
    tolerance in log w, the trust threshold on log(KL / target) and the |log(KL / target)| that counts as converged."""
    return dict(
        target_margin=_TARGET_MARGIN[dtype],
        margin_ulps=_MARGIN_ULPS,
        tol=_DEFAULT_TOL[dtype],
        trust_phi=_NEWTON_TRUST_PHI,
        phi_converged=_PHI_CONVERGED,
    )


class ProjectionResult(NamedTuple):
    """What :func:`project` returns. All fields but ``logprobs`` are detached diagnostics.

    Attributes:
        logprobs: ``(..., S)`` projected log-probs in the input dtype. Masked entries hold the input value.
        eta: ``(...)`` Lagrange multiplier η* ≥ 0 (0 for rows inside the trust region), compute dtype.
        kl_before: ``(...)`` KL(π̃ ‖ π_old) over the (renormalised) support.
        kl_after: ``(...)`` KL(π ‖ π_old) of the returned distribution. Above ``kl_bound`` only where the
            solver hit ``eta_max`` (the residual violation is reported here, never hidden).
        projected: ``(...)`` bool, True where the row was projected (η > 0).
        num_iters: solver iterations used by the slowest row, a 0-d int64 tensor on the inputs' device (reading
            it is a device sync, left to the caller).
    """

    logprobs: torch.Tensor
    eta: torch.Tensor
    kl_before: torch.Tensor
    kl_after: torch.Tensor
    projected: torch.Tensor
    num_iters: torch.Tensor


def project(
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
    """Project ``new_logprobs`` onto the KL ball of radius ``kl_bound`` around ``old_logprobs``.

    Args:
        new_logprobs: ``(..., S)`` log-probs of the current policy π̃ over a support of size S (the full
            vocabulary or a sparse union). Differentiable. Normalisation is only required up to a per-row
            constant: the support is renormalised internally (a constant cancels, TROLL §1).
        old_logprobs: ``(..., S)`` log-probs of the old policy, same shape and dtype. Must not require grad
            (π_old is a constant of the update).
        kl_bound: ε > 0, the trust-region radius.
        mask: optional bool ``(..., S)``; False entries are not part of the support. Their values are ignored
            and passed through to the output unchanged (with identity gradient). Rows without any True entry
            are left unchanged.
        solver: ``"newton"`` (safeguarded Newton in log w with bisection fallback, the core's) or another solver
            registered under that name (:mod:`.variants`).
        max_iter: iteration cap; defaults to :data:`DEFAULT_MAX_ITER` (30).
        tol: stopping tolerance on the Newton step in log w; None picks a dtype default.
        eta_max: largest admissible η; rows that still violate the bound there report it in ``kl_after``.

    Returns:
        A :class:`ProjectionResult`. Non-finite values in unmasked entries make the whole row NaN (output,
        η and KLs); they are never turned into finite numbers.
    """
    _check_args(new_logprobs, old_logprobs, kl_bound, mask, max_iter, tol, eta_max)
    solve = variant("solver", solver)  # None: Newton, the core's
    if max_iter is None:
        max_iter = DEFAULT_MAX_ITER
    out, eta, kl_before, kl_after, projected, iters = _KLProjection.apply(
        new_logprobs, old_logprobs, mask, float(kl_bound), solve, int(max_iter), tol, float(eta_max)
    )
    return ProjectionResult(out, eta, kl_before, kl_after, projected, iters)


def _check_args(new, old, kl_bound, mask, max_iter, tol, eta_max) -> None:
    if not isinstance(new, torch.Tensor) or not isinstance(old, torch.Tensor):
        raise ValueError("new_logprobs and old_logprobs must be torch.Tensors of shape (..., S).")
    if new.shape != old.shape:
        raise ValueError(
            f"new_logprobs and old_logprobs must have the same shape, got {tuple(new.shape)} and "
            f"{tuple(old.shape)}; gather both on the same support first."
        )
    if new.dim() < 1 or new.shape[-1] < 1:
        raise ValueError(f"new_logprobs must have a non-empty last (support) dimension, got {tuple(new.shape)}.")
    if not new.is_floating_point() or new.dtype != old.dtype:
        raise ValueError(
            f"new_logprobs and old_logprobs must share one floating dtype, got {new.dtype} and {old.dtype}; "
            "cast old_logprobs with .to(new_logprobs.dtype)."
        )
    if old.requires_grad:
        raise ValueError("old_logprobs must not require grad (π_old is a constant); pass old_logprobs.detach().")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != new.shape:
            raise ValueError(
                f"mask must be a bool tensor of shape {tuple(new.shape)}, got "
                f"{getattr(mask, 'dtype', type(mask))} {tuple(getattr(mask, 'shape', ()))}; use mask.bool()."
            )
    if isinstance(kl_bound, torch.Tensor):
        if kl_bound.numel() != 1:
            raise ValueError("kl_bound must be a positive scalar; per-row bounds are not supported.")
        kl_bound = kl_bound.item()
    if not isinstance(kl_bound, int | float) or not math.isfinite(kl_bound) or kl_bound <= 0:
        raise ValueError(f"kl_bound must be a finite float > 0 (the paper uses 0.05), got {kl_bound!r}.")
    if max_iter is not None and (not isinstance(max_iter, int) or max_iter < 1):
        raise ValueError(f"max_iter must be an int >= 1, got {max_iter!r}.")
    if tol is not None and not (isinstance(tol, int | float) and tol > 0):
        raise ValueError(f"tol must be a float > 0, got {tol!r}.")
    if not (isinstance(eta_max, int | float) and math.isfinite(eta_max) and eta_max > 0):
        raise ValueError(f"eta_max must be a finite float > 0, got {eta_max!r}.")


def full_precision(fn):
    """Run ``fn`` with autocast switched off (TROLL's numerical core chooses its own dtypes).

    NOTE: verl runs the forward pass of a bf16-parameter actor under ``torch.autocast``, and CPU autocast lowers
    reductions such as ``torch.linalg.vecdot`` to bf16. Inside the solver that made KL(π_η ‖ π_old) too coarse to
    hold the bound (measured on verl's engine: KL 0.0106 against ε = 0.01). Every custom Function of the core and
    every entry point the engines call is wrapped in this.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            for device_type in _autocast_device_types():
                if torch.is_autocast_enabled(device_type):
                    stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
            return fn(*args, **kwargs)

    return wrapper


def _autocast_device_types() -> tuple[str, ...]:
    """The CPU and, where there is one, this machine's accelerator (CUDA, NPU, ...): where autocast may be on."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return ("cpu",) if accelerator is None else ("cpu", accelerator.type)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The internal compute dtype for an input dtype: fp64 stays fp64, everything else runs in fp32."""
    # NOTE: at least fp32 internally; bf16/fp16 inputs are upcast, fp64 stays fp64 (gradcheck).
    return torch.float64 if dtype == torch.float64 else torch.float32


def _prepare(new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor | None):
    """Flatten to rows, renormalise over the support and form s = log π̃ − log π_old.

    Returns ``(lo, s, kl0, valid, row_ok)`` with ``lo``: ``(R, S)`` normalised old log-probs (−inf at masked
    entries), ``s``: ``(R, S)`` normalised log-ratio (0 at masked entries), ``kl0``: ``(R,)`` KL(π̃ ‖ π_old),
    ``valid``: ``(R, S)`` bool or None, ``row_ok``: ``(R,)`` rows with a support and only finite values on it.
    A non-finite value on the support makes ``kl0`` non-finite (NaN propagates, ±inf yields inf or 0·inf),
    which is how such rows are detected without extra passes.
    """
    S = new.shape[-1]
    cdt = compute_dtype(new.dtype)
    ln = new.detach().reshape(-1, S).to(cdt)
    lo = old.detach().reshape(-1, S).to(cdt)
    valid = None
    if mask is not None:
        valid = mask.reshape(-1, S)
        ln = ln.masked_fill(~valid, -math.inf)
        lo = lo.masked_fill(~valid, -math.inf)
    # log-sum-exp of the new side by hand, so that exp(ln − m) also yields π̃ for KL(π̃ ‖ π_old) (one exp pass)
    m_n = ln.amax(dim=-1, keepdim=True)
    e_n = torch.sub(ln, m_n).exp_()
    z_n = e_n.sum(dim=-1, keepdim=True)
    lse_o = torch.logsumexp(lo, dim=-1, keepdim=True)
    s = torch.sub(ln, lo).sub_(m_n + torch.log(z_n) - lse_o)
    if valid is not None:
        s.masked_fill_(~valid, 0.0)  # −inf − (−inf) at masked entries; NaN on the support stays NaN
    kl0 = torch.linalg.vecdot(e_n, s) / z_n.squeeze(-1)
    row_ok = torch.isfinite(kl0)
    if valid is not None:
        row_ok &= valid.any(-1)
    return lo - lse_o, s, kl0, valid, row_ok


class _Moments:
    """KL(π_w ‖ π_old) and Var_{π_w}(s) for a fixed set of rows, with preallocated ``(P, S)`` buffers.

    TROLL §2: with x = log π_old + w·s, log Z = LSE(x), π_w = exp(x − log Z):
        KL(π_w ‖ π_old) = w · E_w[s] − log Z(w),        dKL/dw = w · Var_w(s).
    ``s`` is shifted per row by c = E_π̃[s] first; π_w and the KL are invariant to the shift, and it keeps
    w·E[s] and log Z small so their difference (the KL) loses little to cancellation, and makes
    Var = E[s²] − E[s]² well conditioned.
    """

    def __init__(self, s: torch.Tensor, lo: torch.Tensor, center: torch.Tensor):
        self.lo = lo
        self.s = s - center[:, None]
        self.s2 = self.s * self.s
        self.x = torch.empty_like(s)
        self.e = torch.empty_like(s)

    def _eval(self, w: torch.Tensor):
        x = torch.addcmul(self.lo, self.s, w[:, None], out=self.x)
        m = x.amax(dim=-1, keepdim=True)
        e = torch.sub(x, m, out=self.e).exp_()  # −inf (masked) → 0
        z = e.sum(dim=-1)
        es = torch.linalg.vecdot(e, self.s) / z
        log_z = m.squeeze(-1) + torch.log(z)
        return x, e, z, es, log_z

    def __call__(self, w: torch.Tensor, need_var: bool):
        _, e, z, es, log_z = self._eval(w)
        kl = w * es - log_z
        if not need_var:
            return kl, None
        var = torch.linalg.vecdot(e, self.s2) / z - es * es
        return kl, var.clamp_min(0.0)

    def logprobs(self, w: torch.Tensor):
        """``(log π_w (P, S), KL(π_w ‖ π_old) (P,))``; the log-probs live in this object's buffer."""
        x, _, _, es, log_z = self._eval(w)
        return x.sub_(log_z[:, None]), w * es - log_z


def _row_target(kl_bound: float, lo: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per-row target ``(R,)``: ε minus a relative margin and a rounding margin (see _MARGIN_ULPS).

    It is both the solver's aim and the inside/outside test: a row whose KL(π̃ ‖ π_old) reads just under ε in
    the compute dtype can exceed ε when evaluated exactly, so rows above the target (not above ε) are projected.
    The magnitude bound M ≥ max |log p| over both policies uses log π̃ = log π_old + s (log-probs are ≤ 0).
    """
    min_lo = torch.where(torch.isfinite(lo), lo, 0.0).amin(-1)
    mag = -(min_lo + s.amin(-1).clamp_max(0.0))
    rounding = _MARGIN_ULPS * torch.finfo(s.dtype).eps * mag
    # NOTE: beyond |log p| ~ 1e4 in fp32 the rounding margin would eat half the ball; we stop there and the
    # (then possible) excess shows in kl_after.
    return (kl_bound * (1.0 - _TARGET_MARGIN[s.dtype]) - rounding).clamp_min(0.5 * kl_bound)


def _solve_newton(moments, kl0, target, w_min, max_iter, tol, active, host):
    """Safeguarded Newton on φ(u) = log KL(π_w ‖ π_old) − log ε_t in u = log w ∈ [log w_min, 0], for the rows in
    ``active`` (the others' values are discarded by the caller).

    φ is increasing in u and close to linear (KL ≈ w² Var/2 near w = 0), so Newton converges in a handful of
    passes; a step that leaves the current bracket [lo, hi] is replaced by bisection of the bracket. Every row keeps
    stepping until all active rows have converged (then all stop). With ``host`` the loop ends there; without, it
    runs ``max_iter`` passes with the rows frozen from then on, so that no pass reads a value back to the host.
    dφ/du = w² Var_w(s) / KL. Returns ``(u, iterations as a 0-d int64 tensor)``.
    """
    log_t = torch.log(target)
    u_min = math.log(w_min)
    # Initial guess from KL(w) ≈ KL(1) · w² (exact for a quadratic dual).
    u = (0.5 * (log_t - torch.log(kl0))).clamp(u_min, 0.0)
    lo_b = torch.full_like(u, u_min)
    hi_b = torch.zeros_like(u)  # KL(1) = kl0 > target
    tiny = torch.finfo(kl0.dtype).tiny
    all_done = ~active.any()
    iters = torch.zeros((), dtype=torch.long, device=u.device)
    for _ in range(max_iter):
        if host and bool(all_done):
            break
        w = torch.exp(u)
        kl, var = moments(w, need_var=True)
        kl = kl.clamp_min(tiny)
        phi = torch.log(kl) - log_t
        feas = phi <= 0
        lo_b = torch.where(feas, u, lo_b)
        hi_b = torch.where(feas, hi_b, u)
        step = -phi * kl / (w * w * var).clamp_min(tiny)
        u_new = u + step
        # Closed bracket: a converged step lands on (or next to) a bracket end and must not trigger bisection.
        # A KL far below the target is dominated by cancellation noise (KL = w·E[s] − log Z), so its Newton
        # step is not trusted either.
        outside = ~((u_new >= lo_b) & (u_new <= hi_b)) | (phi < _NEWTON_TRUST_PHI)  # also catches NaN
        u_new = torch.where(outside, 0.5 * (lo_b + hi_b), u_new)
        done = (((u_new - u).abs() <= tol) & (phi.abs() <= _PHI_CONVERGED)) | (hi_b - lo_b <= tol)
        u = torch.where(all_done, u, u_new)  # the final step is applied; nothing moves once all rows are done
        iters += (~all_done).long()
        all_done = all_done | (done | ~active).all()
    return u, iters


def _projected_rows(lo_p, s_p, w_p):
    """log π_w for rows ``(R, S)`` at their ``w`` ``(R,)`` (−inf at masked entries)."""
    x = torch.addcmul(lo_p, s_p, w_p[:, None])
    return x - torch.logsumexp(x, dim=-1, keepdim=True)


class _KLProjection(torch.autograd.Function):
    """Forward solves the projection; backward is the closed-form implicit gradient.

    Derivation (TROLL §3). For a projected row let π = π_w* with w = 1/(1+η*), s = log π̃ − log π_old,
    E and Var under π, and G = ∂L/∂log π. From log π_a = log π_old,a + w s_a − log Z(w):

        d log π_a = w (ds_a − E[ds]) + (s_a − E[s]) dw.

    The active constraint F(w, s) = KL(π_w ‖ π_old) − ε = 0 has
        ∂F/∂w = w Var(s),      ∂F/∂s_a = w² π_a (s_a − E[s]),
    so by the implicit function theorem  ∂w/∂s_a = −w π_a (s_a − E[s]) / Var(s)
    (equivalently ∂η/∂s_a = (1+η) π_a (s_a − E[s]) / Var(s)). Contracting with G:

        ∂L/∂s_a = w (G_a − π_a ΣG) − w c π_a (s_a − E[s]) / Var(s),     c = Σ_b G_b (s_b − E[s]).

    ∂L/∂log π̃ = ∂L/∂s since π_old is constant. The expression sums to zero over the support, so it is also
    the gradient with respect to unnormalised inputs (the internal renormalisation has Jacobian I − 1πᵀ).
    Rows with η = 0 are returned unchanged: their Jacobian is the identity. Masked entries pass through.
    """

    @staticmethod
    @full_precision
    def forward(ctx, new, old, mask, kl_bound, solve, max_iter, tol, eta_max):
        """Solve η* per row and return the projected log-probs with the solver's diagnostics (class docstring)."""
        lo, s, kl_before, valid, row_ok = _prepare(new, old, mask)
        cdt = lo.dtype
        # NOTE: inside/outside is decided against the solver's own target (ε less its margins), so that "the bound
        # holds on every token" is true of the returned values, not only of their rounded KL.
        target = _row_target(kl_bound, lo, s)
        projected = row_ok & (kl_before > target)
        host = host_reads(kl_before)
        out = new.detach().reshape(lo.shape).clone()
        # every row goes through the solver (fixed shapes, no gather of the projected ones: no host read); the rows
        # inside the ball keep w = 1 and their input values
        if host and not bool(projected.any()):
            w = torch.ones_like(kl_before)
            kl_after = kl_before.clone()
            iters = torch.zeros((), dtype=torch.long, device=kl_before.device)
        else:
            moments = _Moments(s, lo, center=kl_before)
            w_min = 1.0 / (1.0 + eta_max)
            if solve is None:
                tol = tol or _DEFAULT_TOL[cdt]
                u, iters = _solve_newton(moments, kl_before, target, w_min, max_iter, tol, projected, host)
            else:
                u, iters = solve(moments, kl_before, target, w_min, max_iter, tol, projected, host)
            w = torch.where(projected, torch.exp(u), 1.0)
            lp, kl_w = moments.logprobs(w)
            kl_after = torch.where(projected, kl_w, kl_before)
            if valid is not None:
                lp = torch.where(valid, lp, out.to(cdt))
            out = torch.where(projected[:, None], lp.to(out.dtype), out)

        eta = 1.0 / w - 1.0
        bad = ~row_ok
        if valid is not None:
            bad = bad & valid.any(-1)  # rows without support are legitimately unchanged
        # a non-finite value on the support makes the whole row NaN (masked fills, no host read)
        out = out.masked_fill(bad[:, None], math.nan)
        eta, kl_before, kl_after = (t.masked_fill(bad, math.nan) for t in (eta, kl_before, kl_after))

        ctx.save_for_backward(new, old, mask, projected, w, bad)
        ctx.has_mask = mask is not None
        batch = new.shape[:-1]
        outs = (
            out.reshape(new.shape),
            eta.reshape(batch),
            kl_before.reshape(batch),
            kl_after.reshape(batch),
            projected.reshape(batch),
            iters,
        )
        ctx.mark_non_differentiable(*outs[1:])
        return outs

    @staticmethod
    @once_differentiable
    @full_precision
    def backward(ctx, grad_out, *_):
        """∂L/∂log π̃ by the implicit function theorem at η* (the derivation is in the class docstring)."""
        new, old, mask, projected, w, bad = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 8
        S = new.shape[-1]
        g = grad_out.reshape(-1, S)
        if host_reads(g) and not bool(projected.any()):
            grad = g.clone()
        else:
            # every row through the same formula (fixed shapes); the rows inside the ball keep their gradient
            lo, s, _, valid, _ = _prepare(new.reshape(-1, S), old.reshape(-1, S), mask.reshape(-1, S) if ctx.has_mask
                                          else None)  # fmt: skip
            cdt = lo.dtype
            gp = g.to(cdt)
            gp_v = gp.masked_fill(~valid, 0.0) if valid is not None else gp
            lp = _projected_rows(lo, s, w)
            p = torch.exp(lp)  # 0 at masked entries
            es = (p * s).sum(-1, keepdim=True)
            d = (s - es) if valid is None else (s - es).masked_fill(~valid, 0.0)
            var = (p * d * d).sum(-1, keepdim=True).clamp_min(torch.finfo(cdt).tiny)
            c = (gp_v * d).sum(-1, keepdim=True)
            w_col = w[:, None]
            gs = w_col * (gp_v - p * gp_v.sum(-1, keepdim=True)) - w_col * c * p * d / var
            if valid is not None:
                gs = torch.where(valid, gs, gp)
            grad = torch.where(projected[:, None], gs.to(g.dtype), g)
        grad = grad.masked_fill(bad[:, None], math.nan)
        return grad.reshape(new.shape), None, None, None, None, None, None, None

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
"""TROLL's per-token terms (§4) on the kernels: :func:`triton_token_terms` for
:func:`troll_verl.core.terms.troll_token_terms`.

The terms are fused into the projection's two kernels (:mod:`.projection`, ``TERMS=True``): forward also gathers
``log π(o_t)`` and ``log π̃(o_t)`` and sums the regression ``KL(π̃ ‖ sg π)``; backward chains their gradients through
the projection's (a one-hot upstream gradient at the sampled token) and adds the regression's
``π̃_a (log π̃_a − log π_a + 1)`` and the sampled log-prob's own.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from troll_verl.core.projection import full_precision
from troll_verl.core.support import TrollTokenTerms, projected_support, support_diagnostics

from .projection import run_backward, run_forward

__all__ = ["TokenTerms", "triton_token_terms"]


class TokenTerms(torch.autograd.Function):
    """The token terms of TROLL §4 on ``(R, S)`` rows in one kernel each way.

    Forward: ``(new (R, S), old (R, S), mask (R, S) bool or None, sampled_index (R,) int, kl_bound, max_iter, tol,
    eta_max)`` → ``proj_log_prob, log_prob, regression`` (differentiable w.r.t. ``new``) and ``kl_before, kl_after,
    eta (0 where not projected), projected (bool), iters (0-d)``, all ``(R,)`` fp32 but the last two.
    """

    @staticmethod
    @full_precision
    def forward(ctx, new, old, mask, sampled_index, kl_bound, max_iter, tol, eta_max):
        """One launch (plus the iteration count's max)."""
        new_c, old_c = new.detach().contiguous(), old.detach().contiguous()
        mask_c = None if mask is None else mask.contiguous()
        idx = sampled_index.to(torch.int32).contiguous()
        f = run_forward(new_c, old_c, mask_c, idx, kl_bound, max_iter, tol, eta_max, terms=True)
        ctx.save_for_backward(new_c, old_c, mask_c, idx, f.w, f.projected)
        ctx.mark_non_differentiable(f.kl_before, f.kl_after, f.eta, f.projected, f.iters)
        return f.proj_log_prob, f.log_prob, f.regression, f.kl_before, f.kl_after, f.eta, f.projected, f.iters

    @staticmethod
    @once_differentiable
    @full_precision
    def backward(ctx, g_plp, g_lp, g_reg, *_):
        """One launch: the terms' gradients chained through the implicit gradient of the projection."""
        new, old, mask, idx, w, projected = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 8
        zeros = torch.zeros_like(w)
        g_plp, g_lp, g_reg = (zeros if g is None else g.float().contiguous() for g in (g_plp, g_lp, g_reg))
        grad = run_backward(new, old, mask, idx, w, projected, None, g_plp, g_lp, g_reg, terms=True)
        return grad.to(new.dtype), None, None, None, None, None, None, None


@full_precision
def triton_token_terms(support, cfg, row_mask: torch.Tensor | None = None) -> tuple[TrollTokenTerms, torch.Tensor]:
    """:func:`troll_verl.core.terms.troll_token_terms` on the kernels: same arguments, the same
    :class:`~troll_verl.core.support.TrollTokenTerms`, and the solver's iteration count as a 0-d tensor.

    Args:
        support: :class:`~troll_verl.core.support.SparseSupport` with ``(..., S + 1)`` fields.
        cfg: TROLL's settings (``kl_bound``, ``tail``, ``solver_max_iter``, ``solver_tol``, ``eta_max``; the solver is
            Newton's).
        row_mask: optional bool ``(...)``: tokens outside it are not projected (identity, zero terms).
    """
    new_lp, sup_mask = projected_support(support, cfg, row_mask)
    width = new_lp.shape[-1]
    batch = new_lp.shape[:-1]
    plp, lp, reg, klb, kla, eta, projected, iters = TokenTerms.apply(
        new_lp.reshape(-1, width), support.old_logprobs.reshape(-1, width), sup_mask.reshape(-1, width),
        support.sampled_index.reshape(-1), float(cfg.kl_bound), int(cfg.solver_max_iter), cfg.solver_tol,
        float(cfg.eta_max),
    )  # fmt: skip
    support_size, covered = support_diagnostics(support, new_lp.dtype)
    terms = TrollTokenTerms(
        proj_log_prob=plp.reshape(batch),
        log_prob=lp.reshape(batch),
        regression=reg.reshape(batch),
        kl_before=klb.reshape(batch),
        kl_after=kla.reshape(batch),
        eta=eta.reshape(batch),
        projected=projected.reshape(batch).to(new_lp.dtype),
        support_size=support_size,
        covered_mass=covered,
    )
    return terms, iters

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
"""TROLL's per-token terms (arXiv:2510.03817 §1–4) from a sparse support, on any leading shape.

Shared by the loss (:mod:`.losses`) and the engine backends (``fsdp/losses.py``, ``megatron/losses.py``), which
compute them inside the forward pass, where the logits live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .fast_paths import fast_path
from .projection import full_precision, project
from .support import SparseSupport, TrollTokenTerms, projected_support, support_diagnostics

if TYPE_CHECKING:  # the settings class is verl's BaseConfig; the terms need only its values
    from .config import TrollConfig

__all__ = ["TrollTokenTerms", "troll_token_terms", "projected_support", "hook_outputs", "TROLL_LOGITS_OUTPUT_KEYS"]


# Per-row outputs of TROLL's update-pass hook that reach the policy loss: every TrollTokenTerms field but log_prob
# (the hook returns it as verl's "log_probs", in place of the engine's own), the solver's iteration count and the
# bytes of old-pass data each token carried (both constant over a micro-batch's rows).
TROLL_LOGITS_OUTPUT_KEYS = (
    *(f"troll_{name}" for name in TrollTokenTerms._fields if name != "log_prob"),
    "troll_solver_iters",
    "troll_old_bytes_per_token",
)


def hook_outputs(
    terms: TrollTokenTerms, iters: torch.Tensor, rows: torch.Tensor, n_rows: int, shape
) -> dict[str, torch.Tensor]:
    """The update-pass hook's per-row outputs: each term at ``rows`` of ``n_rows`` logits rows (0 elsewhere),
    reshaped to ``shape`` (the engine's per-row shape), and the solver's iteration count on every row.

    Args:
        terms: :class:`TrollTokenTerms` of shape ``(R,)``, one per response row of this shard.
        iters: the solver's passes (a 0-d tensor).
        rows: ``(R,)`` int64 indices into the shard's rows.
        n_rows: the shard's logits rows.
        shape: the engine's per-row shape the outputs take.
    """
    out = {}
    for name, value in zip(terms._fields, terms, strict=True):
        full = torch.zeros(n_rows, dtype=value.dtype, device=value.device).index_put((rows,), value)
        out["log_probs" if name == "log_prob" else f"troll_{name}"] = full.reshape(shape)
    out["troll_solver_iters"] = torch.as_tensor(iters, device=rows.device).to(torch.float32).expand(shape).clone()
    return out


@full_precision
def troll_token_terms(
    support: SparseSupport, cfg: TrollConfig, row_mask: torch.Tensor | None = None
) -> tuple[TrollTokenTerms, torch.Tensor]:
    """Project every token and form its TROLL terms (TROLL §1–4), on any leading shape.

    Args:
        support: :class:`SparseSupport` with ``(..., S + 1)`` fields.
        cfg: TROLL settings.
        row_mask: optional bool ``(...)``: tokens outside it are not projected (identity, zero terms).

    Returns:
        ``(terms, solver_iters)``: :class:`TrollTokenTerms` of shape ``(...)`` and the solver's iteration count (a
        0-d tensor on the support's device).
    """
    fast = fast_path("token_terms")
    if fast is not None:  # an extension's implementation (.fast_paths), where it serves this support
        result = fast(support, cfg, row_mask)
        if result is not None:
            return result
    new_lp, sup_mask = projected_support(support, cfg, row_mask)

    # TROLL §1-3: per-token projection onto KL(π ‖ π_old) ≤ ε, differentiable through η*.
    proj = project(
        new_lp,
        support.old_logprobs,
        cfg.kl_bound,
        mask=sup_mask,
        solver=cfg.solver,
        max_iter=cfg.solver_max_iter,
        tol=cfg.solver_tol,
        eta_max=cfg.eta_max,
    )
    idx = support.sampled_index[..., None]
    # TROLL §4: regression of the raw output onto its own projection, KL(π̃ ‖ sg π) on S + tail.
    # NOTE: computed on projected rows only. On a row inside the ball π = π̃ exactly (η = 0), so the term is zero
    # in value and in exact gradient; its floating-point gradient, π̃_a (1 − Σ_b π̃_b) w.r.t. log π̃_a, is rounding
    # noise (~1e-6 per row in fp32) that Adam normalises into a full-size step, moving a policy whose advantages
    # are all zero. Masking keeps the loss the same function with an exactly zero gradient there.
    reg_mask = sup_mask & proj.projected[..., None]
    reg = torch.where(reg_mask, torch.exp(new_lp) * (new_lp - proj.logprobs.detach()), 0.0).sum(-1)
    with torch.no_grad():
        projected = proj.projected.to(new_lp.dtype)
        eta = torch.where(proj.projected, proj.eta, 0.0)
    support_size, covered = support_diagnostics(support, new_lp.dtype)
    terms = TrollTokenTerms(
        proj_log_prob=proj.logprobs.gather(-1, idx).squeeze(-1),
        log_prob=new_lp.gather(-1, idx).squeeze(-1),
        regression=reg,
        kl_before=proj.kl_before,
        kl_after=proj.kl_after,
        eta=eta,
        projected=projected,
        support_size=support_size,
        covered_mass=covered,
    )
    return terms, proj.num_iters

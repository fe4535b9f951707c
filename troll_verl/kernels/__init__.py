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
"""Triton kernels for TROLL's loss step on a GPU: fast paths (:mod:`troll_verl.core.fast_paths`) under the core's
torch entry points, which stay the CPU path and the definition every kernel is tested against.

Importing this package registers the three fast paths (:func:`register`; troll-verl's plugin imports it at every
``import verl``) and imports neither triton nor a kernel: each registered function asks :func:`use_kernels` whether
the kernels serve the call's tensors and declines (returns ``None``) where they do not. The modules below import
triton when first imported:

- :mod:`.stats`: the statistics pass, one streaming read per selected row: log-sum-exp and each 128-column chunk's
  maximum and exp-sum (the chunks' exp-sums relative to their maxima).
- :mod:`.topk`: exact top-K by a chunk-max prefilter, the mass rule (TROLL §5), the union support and the exact tail;
  the old pass's top-K.
- :mod:`.grad`: the backward pass, one streaming read and write from the saved log-sum-exp.
- :mod:`.sparse`: the autograd Functions and the entry points with the signatures of the torch functions of
  :mod:`troll_verl.core.sparse` they replace (:func:`~.sparse.triton_sparse_from_logits`,
  :func:`~.sparse.triton_old_topk_from_logits`).
- :mod:`.projection`: the safeguarded Newton solve of :func:`troll_verl.core.projection.project` and its implicit
  backward (:func:`~.projection.triton_project`).
- :mod:`.terms`: TROLL's per-token terms fused into the projection's kernels (:func:`~.terms.triton_token_terms` for
  :func:`troll_verl.core.terms.troll_token_terms`).
- :mod:`.launch`: one launch as a value, which every launcher builds and runs (and the checkout's
  ``benchmarks/kernels/aot.py`` builds on ``meta`` tensors to compile every specialisation for a GPU this machine need
  not have).

Switch: the run's ``actor_rollout_ref.actor.policy_loss.kernels`` (TROLL's actor worker passes it to
:func:`configure`), overridden by ``TROLL_KERNELS`` in a process's environment: ``torch`` keeps the torch path
everywhere; ``triton`` also runs the kernels on CPU tensors where Triton's interpreter is on (``TRITON_INTERPRET=1``,
the tests); ``auto`` (the default), they serve CUDA tensors whenever triton imports.
"""

from __future__ import annotations

import functools
import os

import torch

from troll_verl.core.fast_paths import register_fast_path

__all__ = [
    "KERNELS_ENV",
    "KERNEL_DTYPES",
    "MAX_TOPK",
    "use_kernels",
    "triton_available",
    "interpreting",
    "KERNEL_CHOICES",
    "configure",
    "kernel_choice",
    "describe_choice",
    "old_topk_fast_path",
    "sparse_support_fast_path",
    "token_terms_fast_path",
    "register",
]

KERNELS_ENV = "TROLL_KERNELS"
# the logits' dtypes the kernels read (float64 stays on the torch path: the reference tests and gradchecks)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# the largest top-K (old and current side) the kernels' register tiles are compiled and checked for (the paper's K; its
# ablations use 16 and 256): a larger one stays on the torch path
MAX_TOPK = 64


# the kernel choices (the plugin's key policy_loss.kernels; TROLL_KERNELS overrides it)
KERNEL_CHOICES = ("auto", "torch", "triton")
_configured = "auto"


def configure(choice: str) -> None:
    """Set this process's kernel choice from the run's config (``policy_loss.kernels``; TROLL's actor worker calls
    it). ``TROLL_KERNELS`` in the environment still overrides it (:func:`kernel_choice`).

    Raises:
        ValueError: for a choice not in :data:`KERNEL_CHOICES`.
    """
    global _configured
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"the kernel choice must be one of {list(KERNEL_CHOICES)}, got {choice!r}.")
    _configured = choice


def kernel_choice() -> str:
    """This process's kernel choice: ``TROLL_KERNELS`` where set, else the configured one (:func:`configure`,
    ``auto`` by default).

    Raises:
        ValueError: for a ``TROLL_KERNELS`` value not in :data:`KERNEL_CHOICES`, naming the variable.
    """
    choice = _env_choice() or _configured
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_ENV} must be auto, torch or triton, got {choice!r}; unset it for the config's.")
    return choice


def _env_choice() -> str:
    """``TROLL_KERNELS`` as a choice (stripped, lower case); ``""`` where unset or blank."""
    return os.environ.get(KERNELS_ENV, "").strip().lower()


def describe_choice() -> str:
    """One line saying which path this process's TROLL steps take, for the start-up log."""
    choice = kernel_choice()
    source = f"{KERNELS_ENV}={os.environ[KERNELS_ENV]}" if _env_choice() else "config"
    if choice == "torch":
        return f"TROLL kernels: torch ({source}): the torch path on every device."
    if not torch.cuda.is_available() and not (choice == "triton" and interpreting()):
        return f"TROLL kernels: {choice} ({source}): no CUDA device here, so the torch path."
    if not triton_available():
        return f"TROLL kernels: {choice} ({source}): triton does not import here, so the torch path."
    return (
        f"TROLL kernels: {choice} ({source}): Triton kernels for logits in fp32/bf16/fp16 with top-K up to {MAX_TOPK}, "
        "the torch path otherwise."
    )


@functools.cache
def triton_available() -> bool:
    """Whether triton imports in this process."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: no kernels
        return False
    return True


def interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``): kernels then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_kernels(logits: torch.Tensor, topk: int = 64, old_topk: int = 0) -> bool:
    """Whether the kernels serve these logits: CUDA (or the interpreter, with the choice ``triton``), a dtype of
    :data:`KERNEL_DTYPES`, top-K widths up to :data:`MAX_TOPK`, triton importable, and :func:`kernel_choice` not
    ``torch``.

    Args:
        logits: ``(N, V)`` logits the step would read.
        topk: the current side's K.
        old_topk: the stored old top-K's width (0 in the old pass).
    """
    choice = kernel_choice()
    if choice == "torch" or logits.dtype not in KERNEL_DTYPES or max(topk, old_topk) > MAX_TOPK:
        return False
    on_device = logits.is_cuda or (choice == "triton" and interpreting() and logits.device.type == "cpu")
    return on_device and triton_available()


# ------------------------------------------------------------------------------------------------ the fast paths
# Each imports its kernel module at the call, so that a module reloaded (the tests' interpreted and compiled
# definitions) is the one that runs.
def old_topk_fast_path(logits, topk, mass_delta, floor, value_dtype, chunk_size, rows):
    """The old pass's top-K (``core.sparse.old_topk_from_logits``) by the kernels, or None where they do not serve."""
    if not use_kernels(logits, topk):
        return None
    from . import sparse

    return sparse.triton_old_topk_from_logits(logits, topk, mass_delta, floor, value_dtype, chunk_size, rows)


def sparse_support_fast_path(logits, sampled_ids, old, old_sampled_logprob, **kwargs):
    """The update pass's support (``core.sparse.troll_sparse_from_logits``) by the kernels, or None where they do not
    serve (``kwargs``: ``topk, mass_delta, floor, chunk_size, rows, old_estimate``)."""
    if not use_kernels(logits, kwargs["topk"], old.ids.shape[-1]):
        return None
    from . import sparse

    return sparse.triton_sparse_from_logits(logits, sampled_ids, old, old_sampled_logprob, **kwargs)


def token_terms_fast_path(support, cfg, row_mask):
    """The per-token terms (``core.terms.troll_token_terms``) by the kernels, or None where they do not serve: the
    Newton solver (``cfg.solver``), supports of two top-K of at most :data:`MAX_TOPK` plus o_t and the tail, and
    logits :func:`use_kernels` accepts."""
    if (
        cfg.solver != "newton"
        or support.new_logprobs.shape[-1] > 2 * MAX_TOPK + 2
        or not use_kernels(support.new_logprobs)
    ):
        return None
    from . import terms

    return terms.triton_token_terms(support, cfg, row_mask)


def register() -> None:
    """Register the three fast paths with the core (:mod:`troll_verl.core.fast_paths`); idempotent."""
    register_fast_path("old_topk", old_topk_fast_path)
    register_fast_path("sparse_support", sparse_support_fast_path)
    register_fast_path("token_terms", token_terms_fast_path)


register()

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
"""Variants: other implementations of four of TROLL's choices, supplied by an extension under a name of its own.

The core implements the paper's choice of each (TROLL §3-§5) and names it in :data:`CORE_VARIANTS`; ``TrollConfig``
selects one by name, and an extension (an ablation, a baseline) registers any other here with
:func:`register_variant`. The code that makes the choice asks its switch once per call (:func:`variant`): ``None``
for the core's own name, which it computes itself, else the registered function, which it calls as below.

================  =============  ======================  =======================================================
switch            core           asked by                a registered function
================  =============  ======================  =======================================================
``solver``        ``newton``     :func:`.projection.     ``(moments, kl_before, target, w_min, max_iter, tol,
                                 project`                active, host) -> (u, iters)``: ``u = log w`` per row
                                                         ``(R,)`` and the passes made (a 0-d int64 tensor);
                                                         rows outside ``active`` are discarded by the caller
``tail``          ``bucket``     :func:`.support.        ``(new_logprobs, mask) -> (new_logprobs, mask)``, both
                                 projected_support`      ``(..., S + 1)`` (the tail bucket last): what the
                                                         projection acts on
``old_estimate``  ``floor``      :func:`.old_side.       ``(new, old_u, unknown, stored, old, room, floor) ->
                                 old_side_estimate`      (old_u, q)``: the ``(c, S)`` old log-probs with the
                                                         unknown tokens' filled in, and their masses (float64,
                                                         0 elsewhere) taken out of the old tail
``regression``    ``projected``  :func:`.losses.         ``(regression, advantages, mask) -> regression``, all
                                 troll_policy_           ``(bsz, T)``: the per-token regression term that
                                 objective`              enters the loss (the core's: every token's, zero where
                                                         it was not projected)
================  =============  ======================  =======================================================

A solver's ``moments(w, need_var)`` returns ``(KL(π_w ‖ π_old), Var_w(s) or None)`` per row at ``w = 1 / (1 + η)``
``(R,)``; it must bring ``KL`` to ``target`` or below within ``[log w_min, 0]`` (TROLL §2). The other arguments are
those of the asking function's docstring. The core registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CORE_VARIANTS", "REGISTER_HINT", "register_variant", "variant", "variant_names"]

# switch -> the name of the core's own implementation (the paper's choice)
CORE_VARIANTS = {"solver": "newton", "tail": "bucket", "old_estimate": "floor", "regression": "projected"}

_TABLE: dict[str, dict[str, Callable]] = {switch: {} for switch in CORE_VARIANTS}
# how to add a name a switch refuses (the refusals' last words)
REGISTER_HINT = "an extension registers others with register_variant"


def register_variant(switch: str, name: str, fn: Callable) -> None:
    """Register ``fn`` as variant ``name`` of ``switch`` (a key of :data:`CORE_VARIANTS`); registering the same
    function again is a no-op.

    Raises:
        ValueError: for an unknown switch, the core's own name, or a name another function holds.
    """
    if switch not in _TABLE:
        raise ValueError(f"variant switch {switch!r} is not one of {tuple(CORE_VARIANTS)}.")
    if name == CORE_VARIANTS[switch]:
        raise ValueError(f"{switch} {name!r} is the core's own; register the variant under another name.")
    held = _TABLE[switch].get(name)
    if held is not None and held is not fn:
        raise ValueError(f"{switch} {name!r} is already registered ({held.__module__}.{held.__qualname__}).")
    _TABLE[switch][name] = fn


def variant_names(switch: str) -> tuple[str, ...]:
    """The names ``switch`` may take now: the core's first, then the registered ones in registration order."""
    return (CORE_VARIANTS[switch], *_TABLE[switch])


def variant(switch: str, name: str) -> Callable | None:
    """The function registered as ``name`` of ``switch``, or ``None`` for the core's own name.

    Raises:
        ValueError: for a name nobody registered (the message lists the names ``switch`` may take).
    """
    if name == CORE_VARIANTS[switch]:
        return None
    fn = _TABLE[switch].get(name)
    if fn is None:
        raise ValueError(
            f"{switch} must be one of {variant_names(switch)}, got {name!r}; {REGISTER_HINT} before the run."
        )
    return fn

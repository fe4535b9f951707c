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
"""Fast paths: faster implementations of three core entry points, supplied by an extension for the tensors it serves.

The core computes everything in torch, the reference every other implementation is tested against. An extension (a
fused GPU kernel, for instance) registers a function here under one of :data:`FAST_PATHS`; the core's entry point
asks its entry once per call and hands it the call's arguments. The function returns the entry point's result where
it serves these tensors and ``None`` where it does not (another device, dtype or shape), and the torch path runs.

=====================  ==========================================
entry                  core entry point
=====================  ==========================================
``"old_topk"``         :func:`.sparse.old_topk_from_logits`
``"sparse_support"``   :func:`.sparse.troll_sparse_from_logits`
``"token_terms"``      :func:`.terms.troll_token_terms`
=====================  ==========================================

Each entry point hands its fast path its own arguments (but ``statistics``), positional and keyword as in its
signature. The two sparse entry points ask only where they read the whole vocabulary of their logits (a backend
that shards the vocabulary passes its own statistics and stays on the torch path). The core registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FAST_PATHS", "FastPath", "register_fast_path", "fast_path"]

# the entry points that ask (see the module docstring)
FAST_PATHS = ("old_topk", "sparse_support", "token_terms")

# a fast path: the entry point's arguments -> its result, or None where it does not serve them
FastPath = Callable[..., Any]

_TABLE: dict[str, FastPath | None] = dict.fromkeys(FAST_PATHS)


def register_fast_path(name: str, fn: FastPath | None) -> None:
    """Register ``fn`` as the fast path of entry ``name`` (one of :data:`FAST_PATHS`); ``None`` removes it.

    Raises:
        ValueError: for a name not in :data:`FAST_PATHS`.
    """
    if name not in _TABLE:
        raise ValueError(f"fast path {name!r} is not one of {FAST_PATHS}; register under one of those names.")
    _TABLE[name] = fn


def fast_path(name: str) -> FastPath | None:
    """The function registered for entry ``name`` (one of :data:`FAST_PATHS`), or None."""
    return _TABLE[name]

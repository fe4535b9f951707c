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
"""One kernel launch as a value: the kernel, its grid, every parameter by name, its warps.

Each launcher of this package builds a :class:`Launch` and runs it. Built on ``meta`` tensors, the same launcher
gives the launch's Triton signature (:meth:`Launch.signature`) without running anything: that is how the ahead-of-time
compile (``benchmarks/kernels/aot.py``) lists the specialisations the launchers make, so the two cannot disagree. A
pointer the kernel does not read (a constexpr flag turns it off) receives :func:`unused` of its own dtype, so the
specialisation does not depend on which tensor stood in for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Launch", "unused", "POINTER_TYPES"]

# Triton's pointer types for the tensors the kernels take
POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.uint8: "*u8",
}


@functools.cache
def unused(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A one-element stand-in of ``dtype`` for a pointer parameter that a constexpr flag leaves unread; one per dtype
    and device for the process, so a launch allocates nothing for it."""
    return torch.empty(1, dtype=dtype, device=device)


@dataclass(frozen=True)
class Launch:
    """A kernel launch: ``kernel[grid](**args, **constexprs, num_warps=num_warps)``.

    Attributes:
        kernel: the ``@triton.jit`` function.
        grid: the program grid.
        args: every runtime parameter by name: tensors (pointers), ints, floats.
        constexprs: every ``tl.constexpr`` parameter by name.
        num_warps: warps per program.
    """

    kernel: Any
    grid: tuple[int, ...]
    args: dict[str, Any]
    constexprs: dict[str, Any]
    num_warps: int

    def __post_init__(self):
        names = list(self.kernel.arg_names)
        given = [*self.args, *self.constexprs]
        if sorted(given) != sorted(names):
            missing, extra = sorted(set(names) - set(given)), sorted(set(given) - set(names))
            raise TypeError(f"{self.kernel.__name__}: launch lacks {missing} and names unknown {extra}")

    def __call__(self) -> None:
        """Run the launch."""
        self.kernel[self.grid](**self.args, **self.constexprs, num_warps=self.num_warps)

    def signature(self) -> dict[str, str]:
        """Triton's signature of this launch, in the kernel's parameter order: ``"*fp32"``-style pointer types,
        ``"i32"``/``"i64"`` and ``"fp32"`` scalars, ``"constexpr"``."""
        return {
            name: "constexpr" if name in self.constexprs else _type(name, self.args[name])
            for name in self.kernel.arg_names
        }


def _type(name: str, value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.dtype not in POINTER_TYPES:
            raise TypeError(f"parameter {name}: no Triton pointer type for {value.dtype}")
        return POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        raise TypeError(f"parameter {name}: a bool belongs in the constexprs")
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"parameter {name}: no Triton type for {type(value).__name__}")

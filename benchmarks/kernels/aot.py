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
"""Every kernel specialisation the entry points launch, compiled ahead of time for a GPU this machine need not have
(``triton.compile`` of an ``ASTSource`` for a ``GPUTarget``, e.g. ``cuda`` sm_90), with its register use and spills
(``cuobjdump --dump-resource-usage``, bundled with triton's NVIDIA backend: LOCAL and STACK bytes are spills).

The specialisations are not written here: each is the :class:`~troll_verl.kernels.launch.Launch` that a launcher of
``troll_verl.kernels`` builds for inputs on the ``meta`` device (dtype and shape, no data), so its signature and
constexprs are the launch's own.

    python -m benchmarks.kernels.aot [--dtypes ...] [--vocabs ...] [--topks ...] [--rows yes no]
                                     [--value-dtypes ...] [--arch 90] [--jobs N]

The triton API used (``triton.compiler.ASTSource(fn, signature, constexprs)`` with string keys, every parameter in the
signature and constexpr ones typed ``"constexpr"``; ``triton.backends.compiler.GPUTarget``; ``CompiledKernel.asm``)
is the same in triton 3.6 and 3.9. Must run where the kernels were defined compiled (``TRITON_INTERPRET`` unset).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
import triton

from troll_verl.kernels import grad, projection, stats, topk
from troll_verl.kernels.launch import Launch

__all__ = ["KernelSpec", "specializations", "compile_spec", "resource_usage", "compile_report", "SPEC_VOCABS", "DTYPES"]

# vocabularies whose chunk counts span the compile-time shapes: Qwen3 (151936 → 2048 chunks padded), Llama 3
# (128256 → 1024), 65536 (512), 32768 (256)
SPEC_VOCABS = (151936, 128256, 65536, 32768)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_META = torch.device("meta")


@dataclass
class KernelSpec:
    """One specialisation: the kernel, its parameters' types (``signature``), its constexpr values and warps."""

    name: str
    kernel: object
    signature: dict[str, str]
    constexprs: dict[str, object]
    num_warps: int
    attrs: dict = field(default_factory=dict)


def _spec(name: str, launch: Launch) -> KernelSpec:
    return KernelSpec(name, launch.kernel, launch.signature(), dict(launch.constexprs), launch.num_warps)


def _empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=_META)


def _logits(dtype, vocab: int, has_rows: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One row of logits, and its row selection where ``has_rows``."""
    return _empty(1, vocab, dtype=dtype), (_empty(1, dtype=torch.int64) if has_rows else None)


def _stats_specs(dtype, rows) -> list[KernelSpec]:
    out = []
    for has_rows in rows:
        logits, sel = _logits(dtype, stats.CHUNK, has_rows)
        for chunk_stats, target in ((True, None), (False, _empty(1, dtype=torch.int64))):
            launch, _ = stats.stats_launch(logits, sel, chunk_stats=chunk_stats, target=target)
            name = f"stats[{dtype}, rows={has_rows}, chunks={chunk_stats}, target={target is not None}]"
            out.append(_spec(name, launch))
    return out


def _topk_specs(dtype, vocab: int, k: int, rows, value_dtypes) -> list[KernelSpec]:
    out = []
    for has_rows in rows:
        logits, sel = _logits(dtype, vocab, has_rows)
        _, (lse, cmax, csum, _) = stats.stats_launch(logits, sel, chunk_stats=True)
        for value_dtype in value_dtypes:
            launch, (old_ids, old_lp, _) = topk.old_topk_launch(
                logits, sel, k, 1e-5, -27.6, value_dtype, (lse, cmax, csum)
            )
            tag = f"{dtype}, V={vocab}, K={k}, values={value_dtype}, rows={has_rows}"
            out.append(_spec(f"old_topk[{tag}]", launch))
            launch, _ = topk.support_launch(
                logits, sel, old_ids, old_lp, _empty(1, dtype=torch.int64), _empty(1), k, 1e-5, -27.6, (lse, cmax, csum)
            )
            out.append(_spec(f"support[{tag}]", launch))
    return out


def _grad_specs(dtype, c: int, has_tail: bool, rows) -> list[KernelSpec]:
    out = []
    for has_rows in rows:
        logits, sel = _logits(dtype, stats.CHUNK, has_rows)
        tail = (_empty(1), _empty(1)) if has_tail else (None, None)
        launch, _ = grad.grad_launch(
            logits, sel, _empty(1), _empty(1, c, dtype=torch.int64), _empty(1, c, dtype=torch.bool), _empty(1, c),
            _empty(1, c), *tail, -27.6,
        )  # fmt: skip
        out.append(_spec(f"grad[{dtype}, C={c}, tail={has_tail}, rows={has_rows}]", launch))
    return out


def _projection_specs(width: int) -> list[KernelSpec]:
    out = []
    rows = projection._config(width)[1]  # one full block
    new, old, mask, w = _empty(rows, width), _empty(rows, width), _empty(rows, width, dtype=torch.bool), _empty(rows)
    projected = _empty(rows, dtype=torch.bool)
    for terms in (False, True):
        idx = _empty(rows, dtype=torch.int32) if terms else None
        launch, _ = projection.forward_launch(new, old, mask, idx, 0.05, 30, None, 1e6, terms)
        out.append(_spec(f"project_fwd[S={width}, terms={terms}]", launch))
        # the upstream gradient: the projected rows', or the three terms'
        upstream = (None, *(_empty(rows) for _ in range(3))) if terms else (_empty(rows, width), None, None, None)
        launch, _ = projection.backward_launch(new, old, mask, idx, w, projected, *upstream, terms)
        out.append(_spec(f"project_bwd[S={width}, terms={terms}]", launch))
    return out


def specializations(dtypes=None, vocabs=SPEC_VOCABS, topks=(64,), rows=(False, True), value_dtypes=None):
    """The specialisations the entry points launch for these logits dtypes, vocabularies, top-Ks (old and new top-K
    alike), row selections (``rows=`` given or not) and old top-K value dtypes (``old_value_dtype``; default all
    three): statistics, old top-K, support, backward with the union (TROLL) and with one token (clip), and the
    projection and token terms (fp32, on the union plus the tail). The register tiles grow with the top-K and the
    vocabulary's chunk count, so the largest of each bounds the rest."""
    dtypes = tuple(DTYPES.values()) if dtypes is None else dtypes
    value_dtypes = tuple(DTYPES.values()) if value_dtypes is None else value_dtypes
    specs = []
    for dtype in dtypes:
        specs += _stats_specs(dtype, rows)
        for k in topks:
            for vocab in vocabs:
                specs += _topk_specs(dtype, vocab, k, rows, value_dtypes)
            specs += _grad_specs(dtype, 2 * k + 1, True, rows)
        specs += _grad_specs(dtype, 1, False, rows)
    for k in topks:
        specs += _projection_specs(2 * k + 2)
    return specs


def compile_spec(spec: KernelSpec, arch: int = 90):
    """``spec`` compiled for CUDA ``sm_<arch>`` (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        src = ASTSource(fn=spec.kernel, signature=spec.signature, constexprs=spec.constexprs, attrs=spec.attrs or None)
    except TypeError as exc:  # the string-keyed ASTSource of triton 3.2+ (3.6 and 3.9 have it)
        raise RuntimeError(f"triton {triton.__version__}: ASTSource(fn, signature, constexprs) failed ({exc}); "
                           "the ahead-of-time compile needs triton >= 3.2") from exc  # fmt: skip
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": spec.num_warps})


def _cuobjdump() -> str:
    import triton.backends.nvidia as nvidia

    return os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")


def resource_usage(compiled) -> dict[str, int]:
    """``{"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}`` of a compiled kernel's cubin (cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             timeout=60, check=True).stdout  # fmt: skip
    usage = {key: int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}
    if "REG" not in usage:
        raise RuntimeError(f"cuobjdump reported no resource usage: {out[-500:]}")
    return usage


def _report_one(spec: KernelSpec, arch: int) -> dict:
    start = time.perf_counter()
    try:
        usage = resource_usage(compile_spec(spec, arch))
        return {"name": spec.name, "seconds": round(time.perf_counter() - start, 2), **usage}
    except Exception as exc:  # noqa: BLE001 - one failing specialisation must not hide the others
        return {"name": spec.name, "error": f"{type(exc).__name__}: {exc}"[-2000:]}


_POOL_SPECS: list[KernelSpec] = []  # what forked workers compile, by index (a kernel object does not pickle)


def _report_index(i: int, arch: int) -> dict:
    return _report_one(_POOL_SPECS[i], arch)


def compile_report(specs: list[KernelSpec], arch: int = 90, jobs: int = 1) -> list[dict]:
    """Compile every spec for ``sm_<arch>``: ``[{"name", "seconds", "REG", "STACK", "LOCAL", "SHARED"} or
    {"name", "error"}]`` in the order of ``specs``; a failing spec is reported, not raised. ``jobs > 1`` compiles in
    that many forked processes (each compile is single-threaded)."""
    if jobs <= 1 or len(specs) <= 1:
        return [_report_one(spec, arch) for spec in specs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _POOL_SPECS[:] = specs
    try:
        with ProcessPoolExecutor(min(jobs, len(specs)), mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_report_index, range(len(specs)), [arch] * len(specs)))
    finally:
        _POOL_SPECS.clear()


def main(argv=None) -> int:
    """``python -m benchmarks.kernels.aot``: compile the specialisations, print one JSON list; exit 1 on a
    failure or a spill (LOCAL or STACK bytes)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--vocabs", nargs="+", type=int, default=list(SPEC_VOCABS))
    parser.add_argument("--topks", nargs="+", type=int, default=[64])
    parser.add_argument("--rows", nargs="+", choices=["yes", "no"], default=["no", "yes"])
    parser.add_argument("--value-dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES),
                        help="the old top-K's value dtypes (old_value_dtype)")  # fmt: skip
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes (one per core)")
    args = parser.parse_args(argv)
    specs = specializations(
        tuple(DTYPES[d] for d in args.dtypes), tuple(args.vocabs), tuple(args.topks),
        tuple(r == "yes" for r in args.rows), tuple(DTYPES[d] for d in args.value_dtypes),
    )  # fmt: skip
    report = compile_report(specs, args.arch, args.jobs)
    print(json.dumps(report))
    bad = [r for r in report if "error" in r or r["LOCAL"] or r["STACK"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

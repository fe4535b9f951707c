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

from . import grad, projection, stats, topk

__all__ = ["KernelSpec", "specializations", "compile_spec", "resource_usage", "compile_report", "SPEC_VOCABS", "DTYPES"]

# vocabularies whose chunk counts span the compile-time shapes: Qwen3 (151936 → 2048 chunks padded), Llama 3
# (128256 → 1024), 65536 (512), 32768 (256)
SPEC_VOCABS = (151936, 128256, 65536, 32768)
_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class KernelSpec:
    """One specialisation: the kernel, its parameters' types (``signature``), its constexpr values and warps."""

    name: str
    kernel: object
    signature: dict[str, str]
    constexprs: dict[str, object]
    num_warps: int
    attrs: dict = field(default_factory=dict)


def _signature(kernel, types: dict[str, str], constexprs: dict[str, object]) -> dict[str, str]:
    names = kernel.arg_names
    missing = set(names) - set(types) - set(constexprs)
    if missing:
        raise ValueError(f"{kernel.__name__}: no type for {sorted(missing)}")
    return {n: "constexpr" if n in constexprs else types[n] for n in names}


def _stats_specs(dtype, rows) -> list[KernelSpec]:
    out = []
    for has_rows in rows:
        for chunk_stats, target in ((True, False), (False, True)):
            constexprs = dict(HAS_ROWS=has_rows, CHUNK_STATS=chunk_stats, HAS_TARGET=target, CHUNK_=stats.CHUNK,
                              CPT=stats._CHUNKS_PER_TILE)  # fmt: skip
            types = dict(z_ptr=_PTR[dtype], stride_z="i32", rows_ptr="*i64", lse_ptr="*fp32", cmax_ptr="*fp32",
                         csum_ptr="*fp32", target_ptr="*i64", target_lp_ptr="*fp32", V="i32", NC="i32")  # fmt: skip
            name = f"stats[{dtype}, rows={has_rows}, chunks={chunk_stats}, target={target}]"
            out.append(KernelSpec(name, stats._stats_kernel, _signature(stats._stats_kernel, types, constexprs),
                                  constexprs, stats._WARPS))  # fmt: skip
    return out


def _topk_specs(dtype, vocab: int, k: int, ko: int, rows) -> list[KernelSpec]:
    cfg = topk.topk_config(vocab, k, ko)
    out = []
    for has_rows in rows:
        common = dict(HAS_ROWS=has_rows, KC=cfg.KC, NC_P2=cfg.NC_P2, K_P2=cfg.K_P2, C_P2=cfg.C_P2, CHUNK_=stats.CHUNK,
                      LOW_BIT=topk.LOW_BITS[dtype], SB=topk._SB)  # fmt: skip
        types = dict(z_ptr=_PTR[dtype], stride_z="i32", rows_ptr="*i64", lse_ptr="*fp32", cmax_ptr="*fp32",
                     csum_ptr="*fp32", scr_ptr="*i64", ids_ptr="*i32", lps_ptr="*fp32", tail_ptr="*fp32", V="i32",
                     NC="i32", K="i32", SCR="i32", keep_mass="fp32", log_floor="fp32")  # fmt: skip
        kern = topk._old_topk_kernel
        out.append(KernelSpec(f"old_topk[{dtype}, V={vocab}, K={k}, rows={has_rows}]", kern,
                              _signature(kern, types, common), common, cfg.WARPS))  # fmt: skip
        constexprs = {**common, "KO_P2": cfg.KO_P2, "RB": topk._RB}
        types.update(ids_ptr="*i64", old_ids_ptr="*i32", old_lp_ptr="*fp32", sampled_ptr="*i64",
                     sampled_old_lp_ptr="*fp32", old_ptr="*fp32", valid_ptr="*u8", new_ptr="*fp32", KO="i32",
                     C="i32")  # fmt: skip
        kern = topk._support_kernel
        out.append(KernelSpec(f"support[{dtype}, V={vocab}, K={k}, K_old={ko}, rows={has_rows}]", kern,
                              _signature(kern, types, constexprs), constexprs, cfg.WARPS))  # fmt: skip
    return out


def _grad_specs(dtype, c: int, has_tail: bool, rows) -> list[KernelSpec]:
    out = []
    for has_rows in rows:
        constexprs = dict(HAS_ROWS=has_rows, HAS_TAIL=has_tail, C_P2=triton.next_power_of_2(c),
                          BLOCK_V=grad._BLOCK_V)  # fmt: skip
        types = dict(z_ptr=_PTR[dtype], stride_z="i32", g_ptr=_PTR[dtype], stride_g="i32", sel_ptr="*i32",
                     lse_ptr="*fp32", ids_ptr="*i64", valid_ptr="*u8", gnew_ptr="*fp32", newlp_ptr="*fp32",
                     gtail_ptr="*fp32", tail_ptr="*fp32", V="i32", C="i32", log_floor="fp32", tiny="fp32")  # fmt: skip
        out.append(KernelSpec(f"grad[{dtype}, C={c}, tail={has_tail}, rows={has_rows}]", grad._grad_kernel,
                              _signature(grad._grad_kernel, types, constexprs), constexprs, grad._WARPS))  # fmt: skip
    return out


def _projection_specs(width: int) -> list[KernelSpec]:
    s_p2, block_r = projection._config(width)
    out = []
    for terms in (False, True):
        constexprs = dict(HAS_MASK=True, TERMS=terms, BLOCK_R=block_r, S_P2=s_p2)
        types = dict(new_ptr="*fp32", old_ptr="*fp32", mask_ptr="*u8", idx_ptr="*i32", out_ptr="*fp32",
                     eta_ptr="*fp32", klb_ptr="*fp32", kla_ptr="*fp32", proj_ptr="*u8", w_ptr="*fp32",
                     iters_ptr="*i32", plp_ptr="*fp32", lp_ptr="*fp32", reg_ptr="*fp32", R="i32", S="i32",
                     target_base="fp32", ulps_eps="fp32", half_bound="fp32", u_min="fp32", max_iter="i32", tol="fp32",
                     trust_phi="fp32", phi_conv="fp32", tiny="fp32", g_ptr="*fp32", gplp_ptr="*fp32",
                     glp_ptr="*fp32", greg_ptr="*fp32", grad_ptr="*fp32")  # fmt: skip
        for kern, name in ((projection._project_fwd_kernel, "project_fwd"), (projection._project_bwd_kernel,
                                                                              "project_bwd")):  # fmt: skip
            out.append(KernelSpec(f"{name}[S={width}, terms={terms}]", kern,
                                  _signature(kern, {k: v for k, v in types.items() if k in kern.arg_names}, constexprs),
                                  constexprs, projection._WARPS))  # fmt: skip
    return out


def specializations(dtypes=None, vocabs=SPEC_VOCABS, topks=(64,), rows=(False, True)) -> list[KernelSpec]:
    """The specialisations the entry points launch for these logits dtypes, vocabularies, top-Ks (old and new top-K
    alike) and row selections (``rows=`` given or not): statistics, old top-K, support, backward with the union
    (TROLL) and with one token (clip), and the projection and token terms (fp32, on the union plus the tail). The
    register tiles grow with the top-K and the vocabulary's chunk count, so the largest of each bounds the rest."""
    specs = []
    for dtype in tuple(DTYPES.values()) if dtypes is None else dtypes:
        specs += _stats_specs(dtype, rows)
        for k in topks:
            for vocab in vocabs:
                specs += _topk_specs(dtype, vocab, k, k, rows)
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
    """``python -m troll_verl.kernels.aot``: compile the specialisations, print one JSON list; exit 1 on a
    failure or a spill (LOCAL or STACK bytes)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--vocabs", nargs="+", type=int, default=list(SPEC_VOCABS))
    parser.add_argument("--topks", nargs="+", type=int, default=[64])
    parser.add_argument("--rows", nargs="+", choices=["yes", "no"], default=["no", "yes"])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes (one per core)")
    args = parser.parse_args(argv)
    specs = specializations(tuple(DTYPES[d] for d in args.dtypes), tuple(args.vocabs), tuple(args.topks),
                            tuple(r == "yes" for r in args.rows))  # fmt: skip
    report = compile_report(specs, args.arch, args.jobs)
    print(json.dumps(report))
    bad = [r for r in report if "error" in r or r["LOCAL"] or r["STACK"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

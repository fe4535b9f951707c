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
"""Every kernel compiles for an H100 (sm_90) on this CPU machine, without register spills (benchmarks.kernels.aot).

The compile runs in a child process: the kernels must be defined compiled there, while this session may hold them
interpreted (tests/kernels/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from troll_verl.testing import REPO as ROOT

pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend cannot compile for sm_90")

from benchmarks.kernels.aot import DTYPES, specializations  # noqa: E402


def _compile(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "benchmarks.kernels.aot", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert lines, f"no report (exit {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def _check(report: list[dict], kernels: set[str]) -> None:
    failed = [r for r in report if "error" in r]
    assert not failed, failed
    spills = [r for r in report if r["LOCAL"] or r["STACK"]]
    assert not spills, f"register spills (LOCAL/STACK bytes): {spills}"
    assert {r["name"].split("[")[0] for r in report} == kernels
    assert all(0 < r["REG"] <= 255 for r in report)


KERNELS = {"stats", "old_topk", "support", "grad", "project_fwd", "project_bwd"}


@pytest.mark.slow  # compiles in child processes: seconds on a warm Triton cache, about 3 minutes on a cold one
def test_every_kernel_compiles_for_sm90_without_spills_at_the_largest_tiles():
    """Each kernel in every logits dtype at its largest register tiles (K = 64, Qwen3's 151936-token vocabulary: 2048
    chunks), with ``rows=`` as the engines call it, the old top-K in each ``old_value_dtype``."""
    report = _compile("--vocabs", "151936", "--rows", "yes")
    _check(report, KERNELS)
    # logits dtypes x (stats x2, (old_topk and support) x value dtypes, grad with and without tail), projection and
    # terms x (fwd, bwd)
    assert len(report) == 3 * (2 + 3 * 2 + 2) + 2 * 2
    assert {r["name"] for r in report} >= {f"old_topk[{dt}, V=151936, K=64, values={vt}, rows=True]"
                                           for dt in DTYPES.values() for vt in DTYPES.values()}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_specialisation_compiles_for_sm90_without_spills():
    """Every specialisation the entry points launch: dtypes x vocabularies x rows= given or not, with fp32 old values
    (the value dtype is a store's element type, which the test above compiles at the largest tiles)."""
    _check(_compile("--value-dtypes", "fp32"), KERNELS)


def test_the_specialisations_are_the_launchers_own():
    """The compiled list comes from the launchers (on meta tensors): a launch that passes another dtype, drops a
    parameter or names an unknown one shows in the list or fails to build."""
    from troll_verl.kernels import stats
    from troll_verl.kernels.launch import Launch

    specs = {s.name: s for s in specializations(dtypes=(torch.bfloat16,), vocabs=(151936,), rows=(False, True))}
    assert specs["old_topk[torch.bfloat16, V=151936, K=64, values=torch.float16, rows=True]"].signature["lps_ptr"] == (
        "*fp16"
    )
    unread = specs["stats[torch.bfloat16, rows=False, chunks=True, target=False]"].signature
    assert (unread["rows_ptr"], unread["target_ptr"], unread["target_lp_ptr"]) == ("*i64", "*i64", "*fp32")
    launch, _ = stats.stats_launch(torch.empty(1, 128, device="meta"))
    with pytest.raises(TypeError, match=r"lacks \['V'\] and names unknown \['vocab'\]"):
        Launch(launch.kernel, launch.grid, {**{k: v for k, v in launch.args.items() if k != "V"}, "vocab": 128},
               launch.constexprs, launch.num_warps)  # fmt: skip

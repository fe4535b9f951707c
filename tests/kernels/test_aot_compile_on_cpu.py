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
"""Every kernel compiles for an H100 (sm_90) on this CPU machine, without register spills (troll_verl.kernels.aot).

The compile runs in a child process: the kernels must be defined compiled there, while this session may hold them
interpreted (tests/kernels/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from troll_verl.testing import REPO as ROOT

pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend cannot compile for sm_90")


def _compile(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "troll_verl.kernels.aot", *args]
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


def test_every_kernel_compiles_for_sm90_without_spills_at_the_largest_tiles():
    """Each kernel in every logits dtype at its largest register tiles (K = 64, Qwen3's 151936-token vocabulary: 2048
    chunks), with ``rows=`` as the engines call it."""
    report = _compile("--vocabs", "151936", "--rows", "yes")
    _check(report, KERNELS)
    # dtypes x (stats x2, old_topk and support, grad with and without tail), projection and terms x (fwd, bwd)
    assert len(report) == 3 * (2 + 2 + 2) + 2 * 2


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_specialisation_compiles_for_sm90_without_spills():
    """Every specialisation the entry points launch: dtypes x vocabularies x rows= given or not."""
    _check(_compile(), KERNELS)

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
"""scripts/bench_kernels.py and .sh, everything that needs no GPU: the whole run in ``--smoke`` mode (every stage but
the tests, on the CPU under Triton's interpreter, tiny sizes) with verl and the other packages a bare GPU machine lacks
made unimportable, the report it leaves, the wrapper's refusal on a machine without CUDA."""

import json
import os
import subprocess
import sys

import pytest

from troll_verl.testing import REPO as ROOT
from troll_verl.testing import load_script

bench = load_script("bench_kernels")
# what a bare GPU machine does not have: importing any of them fails the smoke run
ABSENT = ("verl", "tensordict", "vllm", "transformers", "ray")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_kernels")
    stubs = tmp / "stubs"
    for name in ABSENT:
        (stubs / name).mkdir(parents=True)
        (stubs / name / "__init__.py").write_text(f"raise ImportError('{name} is not on a bare GPU machine')\n")
    env = {**os.environ, "PYTHONPATH": f"{stubs}{os.pathsep}{ROOT}"}
    env.pop("TRITON_INTERPRET", None)
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "scripts/bench_kernels.py", "--smoke", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    return proc, out


@pytest.mark.timeout(1300)
def test_the_smoke_run_passes_every_stage_without_verl(smoke_run):
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "bench_kernels.json").read_text())
    assert report["smoke"] is True
    stages = [s for s in bench.STAGES if s != "tests"]
    assert {s: report[s]["status"] for s in stages} == dict.fromkeys(stages, "ok")
    assert "tests" not in report
    checks = report["correctness"]["result"]["checks"]
    assert report["correctness"]["result"]["all_ok"] and len(checks) == 2 * 6  # six checks per dtype
    (case,) = report["loss"]["result"]["cases"]
    assert set(case["results"]) == set(bench.VARIANTS), case  # every variant passed its check and was timed
    assert case["checks"]["troll_kernels"]["bound_held"]
    assert set(report["loss"]["result"]["loss_alone"]["results"]) == set(bench.VARIANTS)
    assert report["loss"]["result"]["old_pass"]["kernels_ms"] > 0
    kernels = report["kernels"]["result"]["kernels"]
    assert kernels and not [k for k in kernels if "error" in k]
    assert set(report["profile"]["result"]["variants"]) == set(bench.VARIANTS)


@pytest.mark.timeout(1300)
def test_the_report_is_written_and_the_short_table_printed_last(smoke_run):
    proc, out = smoke_run
    markdown = (out / "bench_kernels.md").read_text()
    assert "SMOKE RUN" in markdown and "| TROLL loss and gradient bf16 | yes |" in markdown
    assert "TROLL kernels / fused clip" in markdown and "Launches and host syncs per step" in markdown
    tail = proc.stdout.strip().splitlines()
    assert tail[-1].startswith("stages: env ok, floor ok, correctness ok, loss ok, kernels ok, profile ok")
    assert any(line.startswith("== bench_kernels:") for line in tail[-6:])
    assert (out / "bench_kernels.log").read_text().count("=====") >= 2 * 6


def test_a_failing_stage_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    """Stage results are read back even from a stage that failed after saving part of its work."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "loss.partial.json").write_text(json.dumps({"cases": [{"N": 1, "H": 2, "V": 3, "dtype": "bf16"}]}))
    args = bench.build_parser().parse_args(["--smoke", "--out", str(tmp_path), "--work", str(work)])
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "boom", ""))
    stage = bench.run_stage("loss", args, limit=5)
    assert stage["status"] == "failed" and stage["result"]["cases"][0]["N"] == 1 and "boom" in stage["error"]
    markdown = bench.render_markdown({"loss": stage})
    assert "| 1 | 2 | 3 | bf16 |" in markdown and "torch_clip, fused_clip, troll_torch, troll_kernels" in markdown


def test_the_wrapper_refuses_a_machine_without_cuda():
    proc = subprocess.run(["bash", "scripts/bench_kernels.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "--smoke" in proc.stderr

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

import glob
import json
import math
import os
import subprocess
import sys
import tempfile

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
    scratch = set(glob.glob(os.path.join(tempfile.gettempdir(), "troll-bench-kernels-*")))
    proc = subprocess.run(
        [sys.executable, "scripts/bench_kernels.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    left = set(glob.glob(os.path.join(tempfile.gettempdir(), "troll-bench-kernels-*"))) - scratch
    return proc, out, left


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_the_smoke_run_passes_every_stage_without_verl(smoke_run):
    proc, out, _ = smoke_run
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


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_the_report_is_written_and_the_short_table_printed_last(smoke_run):
    """The report and the log in ``--out``; the intermediate files' temporary folder removed at the end."""
    proc, out, left = smoke_run
    assert not left, f"temporary folders left: {left}"
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
    proc = subprocess.run(
        ["bash", "scripts/bench_kernels.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "--smoke" in proc.stderr


def _cut_row(delta):
    """Logits of one row whose second entry sits at the mass rule's cut: the mass before it is 1 − δ − 5e-7, inside
    fp32's rounding window of the cut, then 3e-6 and a tail of 300 small entries."""
    import torch

    p = torch.full((302,), 0.0, dtype=torch.float64)
    p[0], p[1] = 1 - delta - 5e-7, 3e-6
    p[2:] = (1 - p[0] - p[1]) * torch.linspace(2, 1, 300, dtype=torch.float64) / torch.linspace(2, 1, 300).sum()
    return p.log()


def test_the_correctness_criteria_accept_the_cut_rounding_and_nothing_else():
    """The GPU check's agreement rules (old top-K, support): a path that keeps one entry less where the cut lies
    inside the rounding window agrees; a wrong log-prob, a count outside the window, a union differing by a token
    that is not at the cut, or a wrong tail does not."""
    import torch

    from troll_verl.core.sparse import OldTopK, old_topk_from_logits, troll_sparse_from_logits

    delta, k = 1e-5, 16
    g = torch.Generator().manual_seed(0)
    z = torch.cat([torch.randn(3, 302, generator=g, dtype=torch.float64) * 3, _cut_row(delta)[None]]).float()
    window = bench.mass_rule_window(z, k, delta)
    assert int(window["lo"][3]) == 1 and int(window["hi"][3]) >= 2  # row 3's cut is ambiguous in fp32
    assert (window["lo"][:3] == window["hi"][:3]).all()  # the others' cut is not
    # the reference decides its cut in fp64, where row 3 keeps 2; an fp32 cut may land on either side of the window
    ref64 = old_topk_from_logits(z.double(), topk=k, mass_delta=delta)
    ref = OldTopK(ref64.ids, ref64.logprobs.float(), ref64.tail_logprob.float())
    assert bench.old_topk_agreement(ref, ref, window)["ok"]

    def planted(row, fn):
        ids, lps, tail = ref.ids.clone(), ref.logprobs.clone(), ref.tail_logprob.clone()
        fn(row, ids, lps, tail)
        return OldTopK(ids, lps, tail)

    def drop_last(row, ids, lps, tail):
        last = int((ids[row] >= 0).sum()) - 1
        ids[row, last], lps[row, last] = -1, math.log(1e-12)

    assert int((ref.ids[3] >= 0).sum()) == 2
    assert bench.old_topk_agreement(planted(3, drop_last), ref, window)["ok"]  # the cut's rounding: agrees
    assert not bench.old_topk_agreement(planted(0, drop_last), ref, window)["ok"]  # a cut outside the window
    assert not bench.old_topk_agreement(
        planted(1, lambda r, i, lp, t: lp[r].__setitem__(0, lp[r, 0] + 1e-3)), ref, window
    )["ok"]
    assert not bench.old_topk_agreement(planted(2, lambda r, i, lp, t: t.__setitem__(r, t[r] + 0.1)), ref, window)["ok"]

    sampled = torch.tensor([0, 1, 2, 0])
    old_lp = torch.log_softmax(z, -1).gather(1, sampled[:, None])[:, 0]
    sup = troll_sparse_from_logits(z, sampled, ref, old_lp, topk=k, mass_delta=delta)
    assert bench.support_agreement(sup, sup, window)["ok"]
    ids = sup.ids.clone()
    ids[0, 0] = ids[0, 0] + 1 if int(ids[0, 0]) + 1 not in ids[0].tolist() else 301  # a token nowhere near the cut
    assert not bench.support_agreement(sup._replace(ids=ids), sup, window)["ok"]
    new = sup.new_logprobs.clone()
    new[2, -1] += 0.1
    assert not bench.support_agreement(sup._replace(new_logprobs=new), sup, window)["ok"]

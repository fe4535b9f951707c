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
"""Every ``scripts/bench_*.py`` runs at a tiny size, so a benchmark cannot break silently (no timing is checked).

The two that need the real model (bench_sparsity, bench_rollout_topk) run in ``tests/e2e/test_real_model_on_cpu.py``,
on the asset those tests build.
"""

import glob
import json
import os
import subprocess
import sys

import pytest

from benchmarks.study.docs_block import STUDIES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# every benchmark script -> the test file that runs it at a tiny size
SMOKE_TESTS = {
    "bench_loss.py": "tests/scripts/test_benchmarks_on_cpu.py",
    "bench_learning.py": "tests/scripts/test_benchmarks_on_cpu.py",
    "bench_import.py": "tests/scripts/test_benchmarks_on_cpu.py",
    "bench_kernels.py": "tests/scripts/test_bench_kernels_on_cpu.py",
    "bench_sparsity.py": "tests/e2e/test_real_model_on_cpu.py",  # on the real model's asset
    "bench_rollout_topk.py": "tests/e2e/test_real_model_on_cpu.py",
    "bench_task.py": "tests/e2e/test_real_model_on_cpu.py",
}


def _run(*args, timeout=600, **env):
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_every_benchmark_script_has_a_smoke_test():
    scripts = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "scripts", "bench_*.py"))}
    assert scripts == set(SMOKE_TESTS)
    for script, test_file in SMOKE_TESTS.items():  # the named file runs that script
        assert script.removesuffix(".py") in open(os.path.join(ROOT, test_file)).read(), (script, test_file)


@pytest.mark.slow
def test_bench_loss_at_a_tiny_size(tmp_path):
    out = _run(
        "scripts/bench_loss.py",
        "--shapes",
        "64x32x500",
        "40x16x300",
        "--repeats",
        "1",
        "--solver-rows",
        "64",
        "--solver-repeats",
        "1",
        "--json",
        str(tmp_path / "b.json"),
        "--markdown",
        str(tmp_path / "b.md"),
    )
    summary = json.loads((tmp_path / "b.json").read_text())
    assert [(c["N"], c["dtype"]) for c in summary["cases"]] == [(64, "fp32"), (64, "bf16"), (40, "fp32"), (40, "bf16")]
    assert all(c["time_ratio"] > 0 and c["projected_frac"] > 0 for c in summary["cases"])
    assert "solver_time_ratio" in summary and json.loads(out.strip().splitlines()[-1]) == summary
    assert (tmp_path / "b.md").read_text().count("\n") == 2 + len(summary["cases"])


@pytest.mark.slow
def test_bench_learning_arms_compose_and_the_report_regenerates(tmp_path):
    # one arm of every kind through TROLL's dry run (verl's config path, nothing started)
    out = _run(
        "scripts/bench_learning.py",
        "--model",
        "tiny",
        "--variants",
        "grpo",
        "gspo8",
        "lr1e-4_tight",
        "lr1e-4_upper",
        "async1",
        "bypass",
        "--seeds",
        "0",
        "--steps",
        "1",
        "--dry-run",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert "10 of 10 commands checked: 10 OK, 0 failed" in out
    # the committed stress-map results regenerate their tables (the runs themselves are benchmarks, not tests)
    out = _run(
        "scripts/bench_learning.py",
        "--model",
        "smollm2",
        "--report-only",
        "--stress",
        "--variants",
        "lr1e-4",
        "--seeds",
        "0",
        "--steps",
        "10",
        "--results-dir",
        "benchmarks/results/stress_map",
    )
    assert "| lr1e-4 | troll | 1 |" in out and "| lr1e-4 | clip | 1 |" in out


def test_the_tables_in_the_docs_are_the_committed_results():
    """docs/benchmarks.md's learning tables sit between markers naming the command that prints them, run on the
    committed raw results: the stress map's command prints every table row of its block, and the powered study's
    block (``--study``) is exactly what its command prints, so no number there can drift from the runs."""
    import re
    import shlex

    text = open(os.path.join(ROOT, "docs", "benchmarks.md")).read()
    blocks = re.findall(r"<!-- report: (.+?) -->\n(.*?)<!-- end report -->", text, flags=re.S)
    assert {"--report-only", "--study"} <= {arg for command, _ in blocks for arg in shlex.split(command)}, blocks
    for command, block in blocks:
        argv = shlex.split(command)
        assert argv[:2] == [".venv/bin/python", "scripts/bench_learning.py"], command
        printed = _run(*argv[1:])
        if "--study" in argv:
            assert block.strip() == printed.strip(), f"{command} prints something else: run it with --docs"
            study = argv[argv.index("--study") + 1] if argv[argv.index("--study") + 1] in STUDIES else "powered"
            assert {"late_decay": "**Stage 1 (late8", "after_mastery": "**P1, step 1"}.get(study, "**Stage 1:") in block
            continue
        assert "--report-only" in argv, command
        rows = [line for line in block.splitlines() if line.startswith("|")]
        assert len(rows) >= 6, block
        printed_lines = set(printed.splitlines())
        missing = [row for row in rows if row not in printed_lines]
        assert not missing, f"{command} no longer prints: {missing[:3]}"


@pytest.mark.slow
def test_bench_import_at_a_tiny_size():
    """One repeat: each row's ratio and extra seconds are its time against the first row's (up to the printed
    rounding), so the table's columns say what their headers say."""
    out = _run("scripts/bench_import.py", "--repeats", "1")
    rows = [line for line in out.splitlines() if line.startswith("| import verl") or line.startswith("| +")]
    assert len(rows) == 3
    cells = [[float(cell) for cell in row.strip("|").split("|")[1:]] for row in rows]
    base = cells[0][0]
    assert base > 0
    for seconds, ratio, extra in cells:
        assert seconds > 0
        assert ratio == pytest.approx(seconds / base, abs=0.005 * (1 + seconds / base) / base + 0.006), rows
        assert extra == pytest.approx(seconds - base, abs=0.016), rows

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
"""scripts/gpu_check.sh and its fetch step, everything that needs no GPU: the wheel list, the fetch (with a stand-in
pip, no network), the refusal on a machine without CUDA, the core tests' device switch, the engine stage's code (on
the CPU platform) and the report."""

import glob
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from troll_verl.testing import REPO as ROOT
from troll_verl.testing import load_script

gpu_check = load_script("gpu_check")


def _wheels() -> list[tuple[str, str, bool]]:
    out = []
    for line in open(os.path.join(ROOT, "scripts", "gpu", "wheels.txt")):
        line = line.split("#")[0].strip()
        if line:
            build = line.startswith("build:")
            name, version = line.removeprefix("build:").split("==")
            out.append((name, version, build))
    return out


def test_the_wheel_list_pins_what_verl_needs_and_matches_this_venv():
    from importlib.metadata import version

    wheels = _wheels()
    names = {name for name, _, _ in wheels}
    assert {"verl", "tensordict", "omegaconf", "hydra-core", "antlr4-python3-runtime"} <= names
    assert "ray" not in names  # 76 MiB: the stub stands in
    for name, pinned, _ in wheels:  # the versions this suite runs with, so the GPU runs the same code
        assert version(name) == pinned, f"{name}: wheels.txt pins {pinned}, this venv has {version(name)}"


def _fake_pip(tmp_path, sizes: dict[str, int]) -> str:
    """A pip that 'downloads' each requested name==version as a wheel file of the given size."""
    script = tmp_path / "fake_pip.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys
        sizes = {sizes!r}
        args = sys.argv[1:]
        folder = args[args.index("-d") + 1] if "-d" in args else args[args.index("-w") + 1]
        for spec in [a for a in args if "==" in a]:
            name, version = spec.split("==")
            path = os.path.join(folder, f"{{name.replace('-', '_')}}-{{version}}-py3-none-any.whl")
            with open(path, "wb") as f:
                f.write(b"0" * sizes.get(name, 1000))
    """)
    )
    return f"{sys.executable} {script}"


def _fetch(tmp_path, **env):
    return subprocess.run(
        ["bash", "scripts/gpu_fetch.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WHEEL_DIR": str(tmp_path / "whl"), **env},
    )


def test_fetch_asks_pip_for_wheels_of_the_gpu_machines_python():
    proc = subprocess.run(
        ["bash", "scripts/gpu_fetch.sh"], cwd=ROOT, capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1"}
    )
    download, build = proc.stdout.strip().splitlines()
    assert "download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp" in download
    assert "--platform manylinux2014_x86_64" in download
    for name, version, from_sdist in _wheels():
        assert f"{name}=={version}" in (build if from_sdist else download)
    assert build.split()[3] == "wheel"


def test_fetch_checks_what_it_got(tmp_path):
    ok = _fetch(tmp_path, PIP=_fake_pip(tmp_path, {}))
    assert ok.returncode == 0, ok.stderr
    assert f"{len(_wheels())}/{len(_wheels())} wheels" in ok.stdout
    (tmp_path / "whl" / "verl-0.8.0-py3-none-any.whl").write_bytes(b"0")  # a second version stops pip's install
    stale = _fetch(tmp_path, PIP=_fake_pip(tmp_path, {}))
    assert stale.returncode != 0 and "verl-0.8.0" in stale.stderr
    (tmp_path / "whl" / "verl-0.8.0-py3-none-any.whl").unlink()
    big = _fetch(tmp_path, PIP=_fake_pip(tmp_path, {"verl": 3 * 2**20}), MAX_WHEEL_MIB="2")
    assert big.returncode != 0 and "over the 2 MiB budget" in big.stderr


def test_the_check_refuses_a_machine_without_cuda(tmp_path):
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path)},
    )
    assert proc.returncode == 2
    assert "no CUDA GPU" in proc.stderr and "scripts/gpu_fetch.sh" in proc.stderr
    assert not os.listdir(tmp_path)


def test_core_tests_run_their_functions_on_the_test_device():
    # cpu:0 is a device other than "cpu" for the switch: the core's functions get wrapped (the move makes a copy), so
    # the identity test is skipped and the numerics tests pass through the wrappers
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/core/test_sparse_on_cpu.py",
            "-k",
            "gradcheck or vocab_sized or row_subset",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TROLL_TEST_DEVICE": "cpu:0"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert gpu_check.parse_pytest_summary(proc.stdout) == {"passed": 5, "failed": 0, "skipped": 1, "errors": 0}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_stage_runs_on_the_cpu_platform(tmp_path):
    """The engine stage on the tiny model; the intermediate files' temporary folder is removed at the end."""
    scratch = set(glob.glob(os.path.join(tempfile.gettempdir(), "troll-gpu-check-*")))
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--stages", "engine", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "GPU_CHECK_ENGINE": "tiny"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + open(tmp_path / "gpu_check.log").read()[-3000:]
    report = (tmp_path / "gpu_check.md").read_text()
    assert "Bound held on every token: yes." in report and "| engine | ok |" in report
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "troll-gpu-check-*"))) == scratch


def test_pytest_summary_parsing():
    assert gpu_check.parse_pytest_summary("...\n93 passed, 1 skipped in 51.2s\n") == {
        "passed": 93,
        "failed": 0,
        "skipped": 1,
        "errors": 0,
    }
    assert gpu_check.parse_pytest_summary("2 failed, 90 passed, 1 error in 3s") == {
        "passed": 90,
        "failed": 2,
        "skipped": 0,
        "errors": 1,
    }


def test_report_tables():
    bench_table = "| N | H | V | dtype |\n|---|---|---|---|\n| 8192 | 2560 | 151936 | bf16 |\n"
    report = {
        "date": "2026-11-25 19:30",
        "env": {
            "status": "ok",
            "seconds": 4.0,
            "result": {
                "gpu": "NVIDIA H100",
                "gpu_memory_gib": 79.2,
                "torch": "2.11",
                "cuda": "13.0",
                "verl": "0.9.1",
                "driver": "580",
            },
        },
        "core": {
            "status": "failed",
            "seconds": 50.0,
            "result": {"passed": 92, "failed": 1, "skipped": 1, "errors": 0, "failed_tests": ["tests/x.py::test_y"]},
        },
        "bench_loss": {
            "status": "ok",
            "seconds": 39.0,
            "result": {
                "cases": [{"N": 8192, "H": 2560, "V": 151936, "dtype": "bf16", "time_ratio": 2.08, "mem_ratio": 0.67}],
                "table": bench_table,
            },
        },
        "engine": {"status": "timed out", "seconds": 180.0, "error": "...\ntimed out after 180 s"},
    }
    md = gpu_check.render_markdown(report)
    assert md.startswith("GPU check, 2026-11-25 19:30: NVIDIA H100 (79.2 GiB), driver 580, torch 2.11 (CUDA 13.0)")
    assert "| core | failed | 50 | 92 passed, 1 failed, 1 skipped (tests/x.py::test_y) |" in md
    assert "| bench_loss | ok | 39 | bf16 H=2560: time 2.080, memory 0.670 |" in md
    assert "| engine | timed out | 180 | timed out after 180 s |" in md
    assert bench_table.strip() in md and "One update through verl's FSDP2 engine" not in md

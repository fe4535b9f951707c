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
"""A real sandbox for locally scored programs: bubblewrap (``bwrap``), where the machine allows it.

:func:`sandbox_argv` wraps the code runner's command so that the candidate program runs

- on a **read-only** view of the whole file system (``--ro-bind / /``), with a private ``/dev``, ``/proc`` and a
  read-only, empty ``/tmp`` (except, read-only, the Python environment and code the runner needs when they live
  under ``/tmp``: :func:`tmp_paths_to_keep`); the only writable place is its own work directory;
- with **no network** (its own, empty network namespace: even 127.0.0.1 is unreachable) and its own IPC, UTS and
  cgroup namespaces;
- in its **own PID namespace**, so every process it starts (a daemon, a fork bomb) dies with it: when the runner
  is killed (the scorer kills its process group after every run) the namespace's init dies and the kernel ends
  everything in it; its parent there is bwrap's init, which it cannot signal;
- with ``--die-with-parent`` (it dies with the scorer), a new terminal session, all capabilities dropped, and the
  runner's own rlimits (address space, CPU time, no core files, file size) set inside as before.

:func:`sandbox_available` checks once per process that ``bwrap`` exists and can create those namespaces (user
namespaces can be switched off, or forbidden inside containers). Where it cannot, :func:`sandbox_argv` returns
``None`` and the scorer falls back to the plain runner (a fresh process group and rlimits, no isolation) after one
warning. ``TROLL_CODE_SANDBOX=off`` forces the fallback, ``=require`` makes a missing sandbox an error.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys

logger = logging.getLogger(__name__)

__all__ = ["SANDBOX_ENV", "SandboxUnavailable", "sandbox_available", "sandbox_argv", "tmp_paths_to_keep"]

SANDBOX_ENV = "TROLL_CODE_SANDBOX"  # auto (default) | require | off
_warned = False


class SandboxUnavailable(RuntimeError):
    """``TROLL_CODE_SANDBOX=require`` but bubblewrap cannot run here."""


def tmp_paths_to_keep(candidates: list[str], tmp: str = "/tmp") -> list[str]:
    """The directories among ``candidates`` that lie under ``tmp`` (resolved, existing, none inside another).

    The sandbox hides ``/tmp`` behind an empty tmpfs; a Python environment or checkout that lives there (a CI clone in
    ``/tmp``) must stay visible, read-only, or the runner cannot even start its interpreter.
    """
    root = os.path.realpath(tmp)
    found = set()
    for path in candidates:
        if not path:
            continue
        real = os.path.realpath(path)
        if real != root and real.startswith(root + os.sep) and os.path.isdir(real):
            found.add(real)
    return sorted(p for p in found if not any(p.startswith(q + os.sep) for q in found))


@functools.lru_cache(maxsize=1)
def _runner_paths() -> tuple[str, ...]:
    """Where the runner's interpreter and code live: the environment, every import path and this package."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
                  package_root, *sys.path]  # fmt: skip
    return tuple(tmp_paths_to_keep(candidates))


def _bwrap_prefix(bwrap: str, workdir: str) -> list[str]:
    keep = [arg for path in _runner_paths() for arg in ("--ro-bind", path, path)]
    return [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        *keep,
        "--bind", workdir, workdir,
        "--remount-ro", "/tmp",
        "--chdir", workdir,
        "--unshare-all",  # user, ipc, pid, net, uts, cgroup
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--",
    ]  # fmt: skip


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[str | None, str]:
    """``(bwrap path or None, reason)``: can bwrap build the sandbox here? Checked once per process."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    workdir = os.path.realpath(os.getcwd())
    try:
        # the real interpreter importing this package: proves the runner can start in there, not only that bwrap can
        probe = [sys.executable, "-c", "import troll_verl.recipes.rewards.sandbox"]
        proc = subprocess.run([*_bwrap_prefix(bwrap, workdir), *probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"bwrap could not run: {e!r}"
    if proc.returncode != 0:
        return None, f"bwrap cannot create its namespaces here ({proc.stderr.strip()[:200]}); user namespaces off?"
    return bwrap, "ok"


def sandbox_available() -> bool:
    """True when bubblewrap can sandbox scored programs on this machine."""
    return _probe()[0] is not None


def sandbox_argv(argv: list[str], workdir: str) -> list[str] | None:
    """``argv`` run inside the bubblewrap sandbox with ``workdir`` writable, or None for the plain runner.

    Raises:
        SandboxUnavailable: when ``TROLL_CODE_SANDBOX=require`` and bubblewrap cannot run.
    """
    global _warned
    mode = os.environ.get(SANDBOX_ENV, "auto").strip().lower()
    if mode not in ("auto", "require", "off"):
        raise ValueError(f"{SANDBOX_ENV} must be auto, require or off, got {mode!r}.")
    if mode == "off":
        return None
    bwrap, reason = _probe()
    if bwrap is None:
        if mode == "require":
            raise SandboxUnavailable(f"{SANDBOX_ENV}=require, but {reason}.")
        if not _warned:
            _warned = True
            logger.warning(
                "Local code rewards run WITHOUT a sandbox: %s. Candidate programs can then write files and open "
                "connections as this user (time and memory limits still apply). Install bubblewrap, or use Sandbox "
                "Fusion (reward sandbox_fusion_url) for untrusted models.",
                reason,
            )
        return None
    return [*_bwrap_prefix(bwrap, os.path.realpath(workdir)), *argv]

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
"""What the test suite needs of the machine, checked before pytest starts: one message naming every missing thing and
its fix, instead of tests failing one by one far from the cause.

    .venv/bin/python scripts/machine_check.py     # scripts/test.sh runs it after building .venv

- bubblewrap able to build the sandbox (the code-reward tests and the code recipe require it);
- free space in ``/dev/shm`` (Ray's object store), on the checkout's disk and in the temporary folder.

(The Python version is checked by ``scripts/_venv.sh`` before it creates ``.venv``.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
# (what, the least the suite needs, GiB)
NEEDS = {
    "shm": 2,  # Ray's object store lives in /dev/shm; below this Ray falls back to disk or fails to start
    "disk": 5,  # runs, checkpoints, the SmolLM2 asset, the upstream check's trees (the checkout's disk)
    "tmp": 5,  # the tests' temporary folders (pytest's tmp_path, Ray's session folders)
}


def _free(path: str) -> float:
    return shutil.disk_usage(path).free / GIB


def _sandbox() -> str | None:
    from troll_verl.recipes.rewards.sandbox import _probe

    bwrap, reason = _probe()
    return None if bwrap else reason


def problems(free=_free, sandbox=_sandbox) -> list[str]:
    """Every way this machine falls short of what the suite needs, each with its fix (empty: it is fit)."""
    out = []
    reason = sandbox()
    if reason:
        out.append(
            f"the code sandbox cannot run: {reason}. Fix: apt-get install bubblewrap, and allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1) or run where they are allowed"
        )
    for key, path, fix in (
        ("shm", "/dev/shm", "give the container a larger /dev/shm (docker run --shm-size=8g)"),
        ("disk", str(ROOT), "free space on the checkout's disk"),
        ("tmp", tempfile.gettempdir(), "free space there, or point TMPDIR at a disk with room"),
    ):
        have = free(path) if os.path.exists(path) else 0.0
        if have < NEEDS[key]:
            out.append(f"{path} has {have:.1f} GiB free, the suite needs {NEEDS[key]}. Fix: {fix}")
    return out


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    found = problems()
    if found:
        print("[machine] ERROR: this machine cannot run the test suite:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    print("[machine] bubblewrap, /dev/shm, disk and the temporary folder are enough for the suite")
    return 0


if __name__ == "__main__":
    sys.exit(main())

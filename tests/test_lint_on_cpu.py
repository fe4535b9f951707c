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
"""Lint: ``ruff check`` (settings in pyproject.toml) is clean on the whole repository; CI runs this with the suite."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert ruff, "ruff is missing: pip install -e '.[test]' (it pins ruff)"
    proc = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_format_is_clean():
    """The tree is formatted as ``ruff format`` writes it (verl's pre-commit runs the formatter too)."""
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    proc = subprocess.run(
        [ruff, "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, "run `ruff format .`:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]


def _undocumented(source: str) -> list[str]:
    """Public functions, classes and public methods of public classes without a docstring, as ``line name``."""
    import ast

    missing = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None:
            missing.append(f"{node.lineno} {node.name}")
        for member in node.body if isinstance(node, ast.ClassDef) else ():
            public = isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and not member.name.startswith("_")
            if public and ast.get_docstring(member) is None:
                missing.append(f"{member.lineno} {node.name}.{member.name}")
    return missing


def test_every_public_function_and_class_has_a_docstring():
    """The package's public API and the study harness are documented (verl's pre-commit checks docstrings the same
    way)."""
    missing = [
        f"{path.relative_to(ROOT)}:{entry}"
        for folder in ("troll_verl", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for entry in _undocumented(path.read_text())
    ]
    assert not missing, f"public names without a docstring: {missing}"
    # the rule sees what it must: a public function, a public method, and not a private helper
    planted = 'def f():\n    pass\n\n\nclass C:\n    """doc"""\n\n    def m(self):\n        pass\n\n\n'
    planted += "def _g():\n    pass\n"
    assert _undocumented(planted) == ["1 f", "8 C.m"]


# the most lines of the package, the benchmarks, scripts and tests that may opt out of `ruff format` with `# fmt: skip`
FMT_SKIP_MAX_LINES = 150


def _fmt_skips(paths) -> list[str]:
    """``path:line`` of every line ending in ``# fmt: skip`` among ``paths``."""
    return [
        f"{path.relative_to(ROOT)}:{number}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]


def test_fmt_skip_stays_capped():
    """The formatter's layout is the rule; ``# fmt: skip`` is kept for the few statements it lays out worse (the
    core's math, mostly) and cannot grow past the cap."""
    paths = sorted(
        p for folder in ("troll_verl", "benchmarks", "scripts", "tests") for p in (ROOT / folder).rglob("*.py")
    )
    skips = _fmt_skips(paths)
    assert len(skips) <= FMT_SKIP_MAX_LINES, f"{len(skips)} lines with # fmt: skip (cap {FMT_SKIP_MAX_LINES})"
    assert skips and all(":" in s for s in skips)  # the scan sees the core's own

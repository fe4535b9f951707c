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
"""verl's own repository checks, applied to the files a patch series adds or changes in a verl tree.

    python upstream/verl_checks.py TREE BASE_REF [--patches P ...]
    python upstream/verl_checks.py --pr-docs UPSTREAM_DIR      # the PR descriptions (pr*/PR.md)

verl's PyPI sdist does not ship its pre-commit configuration or ``tests/special_sanity/``. These are the rules as
read in verl-project/verl at ``VERL_COMMIT`` (the ``release/v0.9.0`` head, which 0.9.1 continues), written again here,
not copied; each check names the file it follows. Ruff (pinned 0.12.2 there) and the regeneration of the
``_generated_*.yaml`` run from ``upstream/check.sh``.

Exit status 0 only if every check passes; each failure names the file and the rule.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

VERL_COMMIT = "88512193628b95f24916c0898d51a8a877d09203"

# tests/special_sanity/check_license.py: a tracked .py file passes if it contains any of these strings
LICENSE_HEADS = [
    "Copyright 2024 Bytedance Ltd. and/or its affiliates",
    "Copyright 2025 Bytedance Ltd. and/or its affiliates",
    "Copyright 2026 Bytedance Ltd. and/or its affiliates",
    "Copyright 2024 PRIME team and/or its affiliates",
    "Copyright 2025 Individual Contributor:",
    "Copyright 2023-2024 SGLang Team",
    "Copyright 2025 ModelBest Inc. and/or its affiliates",
    "Copyright 2025 Amazon.com Inc and/or its affiliates",
    "Copyright 2026 Amazon.com Inc and/or its affiliates",
    "Copyright (c) 2016-     Facebook, Inc",
    "Copyright 2025 Meituan Ltd. and/or its affiliates",
    "Copyright (c) 2025 Huawei Technologies Co., Ltd. All Rights Reserved.",
    "Copyright (c) 2026 Huawei Technologies Co., Ltd. All Rights Reserved.",
    "Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.",
    "Copyright (c) 2026 BAAI. All rights reserved.",
]
# tests/special_sanity/test_config_docs.py: the yaml files whose every key needs a comment above and a blank line after
COMMENTED_CONFIGS = [
    "verl/trainer/config/ppo_trainer.yaml",
    "verl/trainer/config/actor/actor.yaml",
    "verl/trainer/config/actor/dp_actor.yaml",
    "verl/trainer/config/critic/critic.yaml",
    "verl/trainer/config/critic/dp_critic.yaml",
    "verl/trainer/config/ref/ref.yaml",
    "verl/trainer/config/ref/dp_ref.yaml",
    "verl/trainer/config/rollout/rollout.yaml",
    "verl/trainer/config/transfer_queue/transfer_queue.yaml",
]
# tests/special_sanity/validate_structure.py: allowed first folders under tests/ besides verl's top-level packages
SPECIAL_TEST_DIRS = {"special_e2e", "special_sanity", "special_standalone", "special_distributed"}
# tests/special_sanity/check_example_naming.py
EXAMPLE_BACKENDS = ("fsdp", "fsdp2", "megatron", "megatron_lite", "mindspeed", "automodel", "veomni")
EXAMPLE_FORBIDDEN_TOKENS = {"vllm", "sglang", "trtllm", "npu", "amd", "gb200", "b200", "blackwell", "fp8"}
# tests/special_sanity/check_device_api_usage.py (no whitelisted path among the files a TROLL patch touches)
DEVICE_API_STRINGS = (".cuda", '"cuda"', '"nccl"')
DEVICE_API_WHITELIST = ("verl/utils/device.py", "verl/checkpoint_engine", "verl/third_party", "verl/workers/rollout")


def changed_files(tree: Path, base: str) -> list[str]:
    """Files added or modified between ``base`` and HEAD (deleted files are not checked)."""
    out = subprocess.run(
        ["git", "-C", str(tree), "diff", "--name-only", "--diff-filter=AM", base, "HEAD"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return sorted(line for line in out.splitlines() if line)


def license_heads(patches: list[Path]) -> list[str]:
    """verl's accepted headers plus the ones the patches add to check_license.py (``+license_head_x = "..."``)."""
    added = []
    for patch in patches:
        in_license_file = False
        for line in patch.read_text().splitlines():
            if line.startswith("diff --git "):
                in_license_file = line.endswith("tests/special_sanity/check_license.py")
            elif in_license_file:
                m = re.match(r'^\+license_head_\w+ = "(.+)"$', line)
                if m:
                    added.append(m.group(1))
    return LICENSE_HEADS + added


def check_license(tree: Path, files: list[str], heads: list[str]) -> list[str]:
    """Every .py file contains an accepted header string (check_license.py)."""
    return [
        f"{f}: no accepted license header (one of verl's, or one the patches add to check_license.py)"
        for f in files
        if f.endswith(".py") and not any(head in (tree / f).read_text() for head in heads)
    ]


def _undocumented(source: str) -> dict[str, int]:
    """``{qualified name: line}`` of public module-level functions, classes and methods without a docstring."""
    found: dict[str, int] = {}

    def visit(node, prefix, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                is_function = not isinstance(child, ast.ClassDef)
                public = not child.name.startswith("_") and not (is_function and in_function)
                if public and ast.get_docstring(child) is None:
                    found[name] = child.lineno
                visit(child, name + ".", in_function or is_function)

    visit(ast.parse(source), "", False)
    return found


def check_docstrings(tree: Path, files: list[str], base: str) -> list[str]:
    """Public module-level functions, classes and their methods that the patches add have docstrings
    (check_docstrings.py's rule, applied to every .py file the patches touch under verl/, not only its six)."""
    errors = []
    for f in files:
        if f.startswith("verl/") and f.endswith(".py"):
            before = _undocumented(_base_text(tree, base, f))
            for name, line in _undocumented((tree / f).read_text()).items():
                if name not in before:
                    errors.append(f"{f}:{line}: public {name!r} has no docstring")
    return errors


def check_config_comments(tree: Path, files: list[str]) -> list[str]:
    """Every key of the documented yaml files has a comment line right above it, no inline comment and a blank line
    after it (test_config_docs.py)."""
    errors = []
    key = re.compile(r"^(\s*)([a-zA-Z0-9_]+):")
    for f in COMMENTED_CONFIGS:
        if f not in files:
            continue
        lines = (tree / f).read_text().splitlines()
        for i, line in enumerate(lines):
            if not key.match(line):
                continue
            if i == 0 or not lines[i - 1].strip().startswith("#"):
                errors.append(f"{f}:{i + 1}: key without a comment line directly above: {line.strip()}")
            if "#" in line.split(":", 1)[1]:
                errors.append(f"{f}:{i + 1}: inline comment: {line.strip()}")
            if i + 1 < len(lines) and lines[i + 1].strip() != "":
                errors.append(f"{f}:{i + 1}: no blank line after the key: {line.strip()}")
    return errors


def check_docs(tree: Path, files: list[str]) -> list[str]:
    """Every doc under docs/ says when it was last updated (check_docs_time_info.py; index.rst is exempt)."""
    return [
        f"{f}: no 'Last updated' line"
        for f in files
        if f.startswith("docs/") and f.endswith((".md", ".rst")) and f != "docs/index.rst"
        and "Last updated" not in (tree / f).read_text()
    ]  # fmt: skip


def check_tests(tree: Path, files: list[str]) -> list[str]:
    """Test files live under a folder named like a verl package or special_*, and every new test is a CPU test
    (validate_structure.py; the CPU job collects ``*_on_cpu.py``)."""
    packages = {p.name for p in (tree / "verl").iterdir() if p.is_dir() and not p.name.startswith("__")}
    errors = []
    for f in files:
        parts = Path(f).parts
        if parts[0] != "tests" or not parts[-1].startswith("test") or not f.endswith(".py"):
            continue
        if len(parts) < 3 or (parts[1] not in packages and parts[1] not in SPECIAL_TEST_DIRS):
            errors.append(f"{f}: tests/<folder> must be one of verl's packages or special_* (validate_structure.py)")
        if not parts[-1].endswith("_on_cpu.py"):
            errors.append(f"{f}: not a CPU test (name it test_*_on_cpu.py, as the CPU job collects)")
    return errors


def check_examples(files: list[str]) -> list[str]:
    """Example scripts are named run_<model>_<backend>.sh, the backend last (check_example_naming.py)."""
    errors = []
    for f in files:
        if not (f.startswith("examples/") and f.endswith(".sh")):
            continue
        stem = Path(f).name[: -len(".sh")]
        tokens = stem.split("_")
        if not stem.startswith("run_") or not stem.endswith(tuple(f"_{b}" for b in EXAMPLE_BACKENDS)):
            errors.append(f"{f}: name must be run_<model>_<backend>.sh with backend in {EXAMPLE_BACKENDS}")
        if EXAMPLE_FORBIDDEN_TOKENS.intersection(tokens):
            errors.append(f"{f}: no inference backend or device in the name ({sorted(EXAMPLE_FORBIDDEN_TOKENS)})")
    return errors


def check_compile(tree: Path, files: list[str]) -> list[str]:
    """Every .py file compiles with warnings as errors (the compileall hook with PYTHONWARNINGS=error)."""
    errors = []
    for f in files:
        if not f.endswith(".py"):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile((tree / f).read_text(), f, "exec")
            except (SyntaxError, SyntaxWarning, DeprecationWarning) as e:
                errors.append(f"{f}: does not compile cleanly: {e}")
    return errors


def check_names(tree: Path, files: list[str]) -> list[str]:
    """verl is written verl, SGLang SGLang or sglang (the check-naming-conventions hook)."""
    bad = re.compile(r"veRL|Sglang|sgLang|sglAng|sglaNg|sglanG")
    return [f"{f}: spells verl or SGLang wrongly" for f in files if bad.search((tree / f).read_text())]


def check_device_api(tree: Path, files: list[str], base: str) -> list[str]:
    """No new raw device API in verl's code: use verl.utils.device (check_device_api_usage.py)."""
    return [
        f"{f}: adds {s!r}; use verl.utils.device's helpers"
        for f in files
        if f.startswith("verl/") and f.endswith(".py") and not f.startswith(DEVICE_API_WHITELIST)
        for s in DEVICE_API_STRINGS
        if (tree / f).read_text().count(s) > _base_text(tree, base, f).count(s)
    ]


def _base_text(tree: Path, base: str, path: str) -> str:
    """``path`` as it was at ``base`` ('' for a file the patches add)."""
    result = subprocess.run(["git", "-C", str(tree), "show", f"{base}:{path}"], capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else ""


def check_dataproto(tree: Path, files: list[str]) -> list[str]:
    """The engines do not use DataProto (check_dataproto_usage.py)."""
    return [
        f"{f}: uses DataProto" for f in files
        if f.startswith("verl/workers/engine/") and "DataProto" in (tree / f).read_text()
    ]  # fmt: skip


# .github/PULL_REQUEST_TEMPLATE.md's sections, in order, and tests/special_sanity/check_pr_title.py's vocabulary
PR_SECTIONS = ("### What does this PR do?", "### Checklist Before Starting", "### Test", "### API and Usage Example",
               "### Design & Code Changes", "### Checklist Before Submitting")  # fmt: skip
PR_MODULES = {
    "fsdp", "megatron", "veomni", "sglang", "vllm", "trtllm", "rollout", "trainer", "tests", "training_utils", "recipe",
    "hardware", "deployment", "ray", "worker", "single_controller", "misc", "docker", "ci", "perf", "model", "algo",
    "env", "tool", "ckpt", "doc", "data", "cfg", "reward", "fully_async", "one_step_off",
}  # fmt: skip
PR_TYPES = ("feat", "fix", "refactor", "chore", "test")
# lines that may follow another line without being a hard-wrapped paragraph
_BLOCK_LINE = re.compile(r"^\s*([-*>|#]|\d+\.\s|<!--|\$\$|\\|\[[ x]\])")


def check_pr_title(title: str) -> list[str]:
    """verl's check_pr_title.py: ``[BREAKING][1/N][modules] type: description`` with known modules and types."""
    core = re.sub(r"^\[\d/[\dNn]\]\s*", "", title)
    core = re.sub(r"^\[BREAKING\]\s*", "", core, flags=re.I)
    match = re.match(r"^\[([a-z_,\s]+)\]\s+(\w+):\s+.+$", core, re.I)
    if not match:
        return [f"title {title!r}: expected [modules] type: description"]
    errors = [f"title {title!r}: unknown module {m!r}" for m in re.findall(r"[a-z_]+", match.group(1).lower())
              if m not in PR_MODULES]  # fmt: skip
    if match.group(2).lower() not in PR_TYPES:
        errors.append(f"title {title!r}: type must be one of {PR_TYPES}")
    return errors


def check_pr_description(text: str) -> list[str]:
    """The template's sections in order, no hard-wrapped paragraph (verl's .agent/skills/pr/SKILL.md: one logical
    line per paragraph and list item), a test command block, the AI-assistance statement (AGENTS.md), no unfilled
    ``RESULTS_``/``SIZE_`` placeholder of the kit."""
    errors = check_pr_title(text.splitlines()[0].removeprefix("# ").strip())
    positions = [text.find(section) for section in PR_SECTIONS]
    if -1 in positions or positions != sorted(positions):
        errors.append(f"sections missing or out of order; expected {PR_SECTIONS}")
    fenced, previous = False, ""
    for number, line in enumerate(text.splitlines()[1:], start=2):
        if line.startswith("```"):
            fenced, previous = not fenced, ""
            continue
        if fenced:
            continue
        if previous and line.strip() and not _BLOCK_LINE.match(line) and not line.startswith("  "):
            errors.append(f"line {number}: hard-wrapped paragraph ({previous[:40]!r} continues on the next line)")
        previous = line if line.strip() and not _BLOCK_LINE.match(line) else ""
    test_section = text.split("### Test", 1)[-1].split("### API and Usage Example", 1)[0]
    if "```bash" not in test_section:
        errors.append("the Test section has no ```bash block with the commands run")
    if "AI assistance" not in text:
        errors.append("no statement that AI assistance was used (verl's AGENTS.md)")
    errors += [f"unfilled placeholder {m!r}" for m in re.findall(r"\b(?:RESULTS|SIZE)_[A-E]\b", text)]
    return errors


def check_pr_docs(upstream: Path) -> int:
    """Check every ``pr*/PR.md`` under ``upstream``; print failures; exit status."""
    failed = 0
    for pr in sorted(upstream.glob("pr*/PR.md")):
        errors = check_pr_description(pr.read_text())
        print(f"  {'PASS' if not errors else 'FAIL'}  {pr.relative_to(upstream.parent)}")
        for error in errors:
            print(f"        {error}")
        failed += bool(errors)
    return 1 if failed else 0


def main(argv=None) -> int:
    """Run every check on the files changed since BASE_REF; print each failure; exit 1 if any."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pr-docs"]:
        return check_pr_docs(Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path)
    parser.add_argument("base")
    parser.add_argument("--patches", type=Path, nargs="*", default=[])
    args = parser.parse_args(argv)
    files = [f for f in changed_files(args.tree, args.base) if os.path.isfile(args.tree / f)]
    checks = {
        "license headers": check_license(args.tree, files, license_heads(args.patches)),
        "docstrings": check_docstrings(args.tree, files, args.base),
        "config comments": check_config_comments(args.tree, files),
        "docs last updated": check_docs(args.tree, files),
        "test layout and naming": check_tests(args.tree, files),
        "example naming": check_examples(files),
        "compiles without warnings": check_compile(args.tree, files),
        "naming conventions": check_names(args.tree, files),
        "device API": check_device_api(args.tree, files, args.base),
        "no DataProto in engines": check_dataproto(args.tree, files),
    }
    failed = 0
    for name, errors in checks.items():
        print(f"  {'PASS' if not errors else 'FAIL'}  {name}")
        for error in errors:
            print(f"        {error}")
        failed += bool(errors)
    print(f"[verl_checks] {len(files)} changed file(s), {len(checks) - failed}/{len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

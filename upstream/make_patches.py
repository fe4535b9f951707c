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
"""Write the two upstream patch series (``upstream/patches/``) from this repository's sources.

    python upstream/make_patches.py [--check] [--work DIR] [--out DIR]
    python upstream/make_patches.py --pristine --work DIR      # a pristine tree only; prints its path

PR 1 (the seam) is ``upstream/pr1/verl.diff`` (edits to verl's files) plus the new files under ``upstream/pr1/files``.
PR 2 (TROLL) is generated from the package: the modules in :data:`MODULES` are copied into verl's tree with the import
rewrites of :data:`REWRITES` (each must match, so a source change that breaks one stops generation), the tests in
:data:`TESTS` likewise, the ``troll:`` block of ``actor.yaml`` comes from ``troll_verl/config/troll_trainer.yaml``,
and verl's ``_generated_*.yaml`` are regenerated with verl's own ``scripts/print_cfg.py``; plus
``upstream/pr2/verl.diff`` and ``upstream/pr2/files``. Generated Python is import-sorted and formatted with the
interpreter's ruff under verl's settings (verl pins ruff 0.12.2; ``upstream/check.sh`` installs it).

Hunks for files verl's PyPI sdist does not carry (``docs/index.rst``, ``tests/special_sanity/check_license.py``,
``examples/README.md``: GitHub only) are kept in ``upstream/pr*/github_only.diff`` and appended to the PR's patch.

``--check`` writes nothing and exits 1 if the committed patches differ from what the sources give (drift).
Needs git, network access to PyPI once (the sdist is cached in the work directory) and hydra-core.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "upstream"
VERL_VERSION = os.environ.get("VERL_VERSION", "0.9.1")

# Fixed identity and dates, so that the same sources always give byte-identical patches.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "The troll-verl authors",
    "GIT_AUTHOR_EMAIL": "troll-verl@users.noreply.github.com",
    "GIT_AUTHOR_DATE": "2026-11-24T12:00:00+0000",
    "GIT_COMMITTER_NAME": "The troll-verl authors",
    "GIT_COMMITTER_EMAIL": "troll-verl@users.noreply.github.com",
    "GIT_COMMITTER_DATE": "2026-11-24T12:00:00+0000",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}

# package module -> path in verl's tree (PR 2)
MODULES = {
    "troll_verl/core/projection.py": "verl/trainer/troll/projection.py",
    "troll_verl/core/sparse.py": "verl/trainer/troll/sparse.py",
    "troll_verl/core/layout.py": "verl/trainer/troll/layout.py",
    "troll_verl/core/terms.py": "verl/trainer/troll/terms.py",
    "troll_verl/core/losses.py": "verl/trainer/troll/losses.py",
    "troll_verl/core/fsdp/__init__.py": "verl/trainer/troll/fsdp/__init__.py",
    "troll_verl/core/fsdp/losses.py": "verl/trainer/troll/fsdp/losses.py",
    "troll_verl/core/megatron/__init__.py": "verl/trainer/troll/megatron/__init__.py",
    "troll_verl/core/megatron/losses.py": "verl/trainer/troll/megatron/losses.py",
    "troll_verl/core/config.py": "verl/workers/config/troll.py",
}
# package test -> path in verl's tree (PR 2); troll_verl/testing/reference.py is their shared brute-force reference
TESTS = {
    "troll_verl/testing/reference.py": "tests/trainer/ppo/_troll_reference.py",
    "tests/core/test_projection_on_cpu.py": "tests/trainer/ppo/test_troll_projection_on_cpu.py",
    "tests/core/test_sparse_on_cpu.py": "tests/trainer/ppo/test_troll_sparse_on_cpu.py",
    "tests/core/test_losses_on_cpu.py": "tests/trainer/ppo/test_troll_losses_on_cpu.py",
    "tests/integration/test_seam_on_cpu.py": "tests/trainer/ppo/test_troll_ppo_loss_on_cpu.py",
}
_SUBMODULES = "projection|sparse|layout|terms|losses|fsdp|megatron"
_USES_SETTINGS = ("troll_verl/core/terms.py", "troll_verl/core/fsdp/losses.py", "troll_verl/core/megatron/losses.py")
_USES_CONFIG = ("tests/core/test_losses_on_cpu.py", "tests/integration/test_seam_on_cpu.py")
# (pattern, replacement, the sources it must match in); regular expressions, applied to every generated file in order
REWRITES = [
    (r"from \.{1,2}config import", "from verl.workers.config.troll import", _USES_SETTINGS),
    (r"from \.sparse import OLD_ESTIMATES", "from verl.trainer.troll.sparse import OLD_ESTIMATES",
     ("troll_verl/core/config.py",)),
    (rf"\btroll_verl\.core\.({_SUBMODULES})\b", r"verl.trainer.troll.\1", ()),
    (r"\btroll_verl\.core\.config\b", "verl.workers.config.troll", ()),
    (r"from troll_verl\.testing\.reference import", "from tests.trainer.ppo._troll_reference import",
     ("tests/core/test_projection_on_cpu.py", "tests/core/test_sparse_on_cpu.py", "tests/core/test_losses_on_cpu.py")),
    (r"sharing no code with troll_verl", "sharing no code with verl.trainer.troll",
     ("troll_verl/testing/reference.py",)),
    # the plugin's flat TrollPolicyLossConfig is verl's PolicyLossConfig with a nested TrollConfig upstream
    (r"from verl\.workers\.config import FSDPActorConfig\n",
     "from verl.workers.config import FSDPActorConfig, PolicyLossConfig, TrollConfig\n", _USES_CONFIG),
    (r"from troll_verl\.config import TrollPolicyLossConfig\n", "", _USES_CONFIG),
    (r"TrollPolicyLossConfig\((\*\*\w+)\)", r'PolicyLossConfig(loss_mode="troll", troll=TrollConfig(\1))',
     _USES_CONFIG),
    # the package's seam test skips on a verl without the seam; verl's own copy has it
    (r'pytestmark = pytest\.mark\.skipif\(not hasattr\(core_algos, "PolicyLossSpec"\).*\n\n', "",
     ("tests/integration/test_seam_on_cpu.py",)),
    # loss "troll" registers itself with verl, its hooks in its PolicyLossSpec
    (r"from verl\.trainer\.ppo\.core_algos import agg_loss\n",
     "from verl.trainer.ppo.core_algos import PolicyLossSpec, agg_loss, register_policy_loss\n",
     ("troll_verl/core/losses.py",)),
    (r"\ndef compute_policy_loss_troll\(",
     '\n@register_policy_loss("troll", spec=PolicyLossSpec(**TROLL_SPEC_FIELDS))\ndef compute_policy_loss_troll(',
     ("troll_verl/core/losses.py",)),
]  # fmt: skip
# the one line where the package's name may remain in generated files
COPYRIGHT = "# Copyright 2026 The troll-verl authors"
# the line of docs/algo/troll.md that config_doc() replaces
DOC_MARKER = "<!-- generated from TrollConfig -->"
# where actor.yaml's troll block goes: after this key's line and the blank line after it
ACTOR_YAML = "verl/trainer/config/actor/actor.yaml"
ACTOR_YAML_ANCHOR = "  dro_beta: null\n"
GENERATED_CONFIGS = [  # (file, extra print_cfg.py argument), as verl's scripts/generate_trainer_config.sh
    ("_generated_ppo_trainer.yaml", ""),
    ("_generated_ppo_megatron_trainer.yaml", "model_engine=megatron"),
    ("_generated_ppo_veomni_trainer.yaml", "model_engine=veomni"),
    ("_generated_ppo_torchtitan_trainer.yaml", "model_engine=torchtitan"),
]


class GenerationError(RuntimeError):
    """A source changed so that a rule of the generator no longer applies; the message names the file and rule."""


def _git(tree: Path, *args: str, capture: bool = False) -> str:
    result = subprocess.run(
        ["git", "-C", str(tree), *args], check=True, text=True, capture_output=True, env={**os.environ, **GIT_ENV}
    )
    return result.stdout if capture else ""


def pristine_tree(work: Path) -> Path:
    """A fresh git tree of verl ``VERL_VERSION`` from its PyPI sdist (``verl/``, ``tests/``, ``scripts/``)."""
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"verl-{VERL_VERSION}.tar.gz"
    if not sdist.is_file() or sdist.stat().st_size == 0:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
             "--no-binary", ":all:", "-d", str(work), f"verl=={VERL_VERSION}"],
            check=True,
        )  # fmt: skip
    tree = work / f"verl-{VERL_VERSION}"
    shutil.rmtree(tree, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    for egg in tree.glob("*.egg-info"):
        shutil.rmtree(egg)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", f"verl {VERL_VERSION} (PyPI sdist)")
    return tree


def _pr_message(pr_dir: Path) -> str:
    """The commit message: the PR title (first ``# `` line of PR.md) and its one-paragraph summary."""
    text = (pr_dir / "PR.md").read_text()
    title = text.splitlines()[0].removeprefix("# ").strip()
    summary = text.split("### What does this PR do?", 1)[1].strip().split("\n\n", 1)[0]
    return f"{title}\n\n{summary}\n"


def _copy_files(pr_dir: Path, tree: Path) -> list[str]:
    copied = []
    for src in sorted((pr_dir / "files").rglob("*")):
        if src.is_file():
            rel = src.relative_to(pr_dir / "files")
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / rel)
            copied.append(str(rel))
    return copied


def _apply(tree: Path, diff: Path) -> None:
    try:
        _git(tree, "apply", "--check", str(diff))
    except subprocess.CalledProcessError as e:
        raise GenerationError(f"{diff.relative_to(ROOT)} no longer applies to verl {VERL_VERSION}:\n{e.stderr}") from e
    _git(tree, "apply", str(diff))


def rewrite(source: str, text: str) -> str:
    """``text`` of the package file ``source`` with every rule of :data:`REWRITES` applied."""
    for pattern, replacement, required_in in REWRITES:
        text, n = re.subn(pattern, replacement, text)
        if n == 0 and source in required_in:
            raise GenerationError(f"rewrite {pattern!r} no longer matches {source}; update upstream/make_patches.py")
    leftover = [
        line for line in text.splitlines() if ("troll_verl" in line or "troll-verl" in line) and line != COPYRIGHT
    ]
    if leftover:
        raise GenerationError(f"{source} still names the package after rewriting: {leftover[:3]}")
    return text


def actor_yaml_block() -> str:
    """The ``troll:`` block of verl's actor.yaml: TROLL's keys with their comments, from the package's yaml."""
    lines = (ROOT / "troll_verl/config/troll_trainer.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "loss_mode: troll") + 2
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith("      "))
    body = [line[2:] if line else line for line in lines[start:end]]  # policy_loss keys (6) -> troll keys (4)
    while body and not body[-1]:
        body.pop()
    head = [
        "  # TROLL (arXiv:2510.03817): a per-token KL trust-region projection on sparse top-K token distributions",
        '  # instead of ratio clipping; read when policy_loss.loss_mode is "troll" (docs/algo/troll.md)',
        "  troll:",
        "",
        "    # Required when using verl.utils.omega_conf_to_dataclass to instantiate dataclass configs",
        "    _target_: verl.workers.config.TrollConfig",
        "",
    ]
    return "\n".join(head + body) + "\n\n"


def config_doc() -> str:
    """One ``### `troll.<key>` (type)`` section per field of ``TrollConfig``: its default and its docstring entry."""
    import ast

    source = (ROOT / "troll_verl/core/config.py").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "TrollConfig")
    args = ast.get_docstring(cls).split("Args:", 1)[1]
    described = dict(re.findall(r"^\s{4}(\w+) \([^)]*\): (.+?)(?=^\s{4}\w+ \(|\Z)", args, re.M | re.S))
    sections = []
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or "ClassVar" in ast.unparse(node.annotation):
            continue
        name = node.target.id
        if name not in described:
            raise GenerationError(f"TrollConfig.{name} has no entry in the class docstring's Args")
        annotation = ast.unparse(node.annotation)
        kind = re.sub(r"^Optional\[(.*)\]$|^(.*) \| None$", r"\1\2 or null", annotation)
        value = ast.literal_eval(node.value)
        if value is None or isinstance(value, str):
            default = "null" if value is None else value
        else:
            default = ast.get_source_segment(source, node.value)
        text = " ".join(line.strip() for line in described[name].strip().splitlines()).replace("``", "`")
        if text[:1].isascii():  # a sentence starts with a capital; a symbol keeps its case (ε, α, δ are not Ε, Α, Δ)
            text = text[:1].upper() + text[1:]
        sections.append(f"### `troll.{name}` ({kind})\n\nDefault: `{default}`. {text}\n")
    head = (
        "Under `actor_rollout_ref.actor.policy_loss` (`verl.workers.config.TrollConfig`), validated on construction.\n"
    )
    return head + "\n" + "\n".join(sections)


def regenerate_configs(tree: Path) -> None:
    """Regenerate verl's ``_generated_*.yaml`` as its ``scripts/generate_trainer_config.sh`` does."""
    for name, arg in GENERATED_CONFIGS:
        dump = subprocess.run(
            [sys.executable, "scripts/print_cfg.py", "--cfg", "job", *([arg] if arg else [])],
            cwd=tree, check=True, text=True, capture_output=True,
        ).stdout  # fmt: skip
        body = dump[dump.index("\nactor_rollout_ref") + 1 :] if not dump.startswith("actor_rollout_ref") else dump
        header = (
            "# This reference configration yaml is automatically generated via 'scripts/generate_trainer_config.sh'\n"
            f"# in which it invokes 'python3 scripts/print_cfg.py --cfg job {arg}' to flatten the "
            "'verl/trainer/config/ppo_trainer.yaml' config fields into a single file.\n"
            "# Do not modify this file directly.\n"
            "# The file is usually only for reference and never used.\n\n"
        )
        (tree / "verl/trainer/config" / name).write_text(header + body)


def _ruff(tree: Path, files: list[str]) -> None:
    """Sort imports and format ``files`` with verl's settings (its pyproject.toml), as its pre-commit would."""
    py = [f for f in files if f.endswith(".py")]
    if not py:
        return
    subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "-q", "--select", "I", "--fix", *py],
                   cwd=tree, check=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "ruff", "format", "--no-cache", "-q", *py], cwd=tree, check=True)


def build_pr1(tree: Path) -> None:
    """Apply PR 1 (the seam) to ``tree`` and commit it."""
    pr = UPSTREAM / "pr1"
    _apply(tree, pr / "verl.diff")
    _copy_files(pr, tree)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", _pr_message(pr))


def build_pr2(tree: Path) -> None:
    """Generate PR 2 (TROLL) into ``tree`` (PR 1 applied) and commit it."""
    pr = UPSTREAM / "pr2"
    generated = []
    for source, target in {**MODULES, **TESTS}.items():
        (tree / target).parent.mkdir(parents=True, exist_ok=True)
        (tree / target).write_text(rewrite(source, (ROOT / source).read_text()))
        generated.append(target)
    _apply(tree, pr / "verl.diff")
    generated += [f for f in _copy_files(pr, tree) if f.endswith(".py")]
    doc = tree / "docs/algo/troll.md"
    text = doc.read_text()
    if text.count(DOC_MARKER) != 1:
        raise GenerationError(f"upstream/pr2/files/docs/algo/troll.md needs the line {DOC_MARKER!r} once")
    doc.write_text(text.replace(DOC_MARKER, config_doc().rstrip("\n")))
    actor = tree / ACTOR_YAML
    text = actor.read_text()
    if text.count(ACTOR_YAML_ANCHOR) != 1:
        raise GenerationError(f"{ACTOR_YAML} no longer has {ACTOR_YAML_ANCHOR.strip()!r} once; move the troll block")
    at = text.index(ACTOR_YAML_ANCHOR) + len(ACTOR_YAML_ANCHOR) + 1
    actor.write_text(text[:at] + actor_yaml_block() + text[at:])
    _ruff(tree, generated)
    regenerate_configs(tree)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", _pr_message(pr))


def _with_github_only(patch: str, extra: Path) -> str:
    """Append the hunks for files the sdist lacks and recount the diffstat over the whole patch."""
    if not extra.is_file():
        return patch
    head, rest = patch.split("\n---\n", 1)
    diff_start = rest.index("\ndiff --git ") + 1
    signature = rest.rindex("\n-- \n")
    diff = rest[diff_start:signature + 1] + extra.read_text()
    stat = subprocess.run(
        ["git", "apply", "--stat", "--summary"], input=diff, text=True, capture_output=True, check=True
    ).stdout
    return f"{head}\n---\n{stat}\n{diff}{rest[signature + 1:]}"


def build_patches(work: Path) -> dict[str, str]:
    """Both PRs as ``{file name: format-patch text}``."""
    tree = pristine_tree(work)
    build_pr1(tree)
    build_pr2(tree)
    out = {}
    for index, pr in ((1, "pr1"), (2, "pr2")):
        text = _git(tree, "format-patch", "--stdout", "-1", f"HEAD~{2 - index}", "--zero-commit", "--no-signature",
                    capture=True)  # fmt: skip
        text = _with_github_only(text + "-- \n", UPSTREAM / pr / "github_only.diff")
        title = text.split("Subject: [PATCH] ", 1)[1].splitlines()[0]
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60].rstrip("-")
        out[f"{index:04d}-{slug}.patch"] = text
    return out


def main(argv=None) -> int:
    """Write (or, with ``--check``, compare) ``upstream/patches/*.patch``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed patches; write nothing")
    parser.add_argument("--work", type=Path, default=UPSTREAM / ".work" / "generate", help="scratch directory")
    parser.add_argument("--out", type=Path, default=UPSTREAM / "patches")
    parser.add_argument("--pristine", action="store_true", help="only prepare the pristine tree; print its path")
    args = parser.parse_args(argv)
    if args.pristine:
        print(pristine_tree(args.work))
        return 0
    try:
        patches = build_patches(args.work)
    except GenerationError as e:
        print(f"[make_patches] ERROR: {e}", file=sys.stderr)
        return 2
    current = {p.name: p.read_text() for p in sorted(args.out.glob("*.patch"))} if args.out.is_dir() else {}
    if args.check:
        if current == patches:
            print(f"[make_patches] {len(patches)} patch(es) in {args.out} match the sources")
            return 0
        for name in sorted(set(current) | set(patches)):
            diff = difflib.unified_diff(
                current.get(name, "").splitlines(True), patches.get(name, "").splitlines(True),
                f"committed/{name}", f"generated/{name}", n=1,
            )  # fmt: skip
            sys.stdout.writelines(list(diff)[:80])
        print("[make_patches] the committed patches are stale: run python upstream/make_patches.py", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in set(current) - set(patches):
        (args.out / stale).unlink()
    for name, text in patches.items():
        (args.out / name).write_text(text)
        print(f"[make_patches] wrote {args.out / name} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

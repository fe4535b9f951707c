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
"""Write the upstream patch series (``upstream/patches/``, PRs A to E) from this repository's sources.

    python upstream/make_patches.py [--check] [--work DIR] [--out DIR]
    python upstream/make_patches.py --pristine --work DIR      # a pristine tree only; prints its path

Each PR is a folder ``upstream/pr<X>/``: ``PR.md`` (title and description; its first paragraph is the commit
message), ``verl.diff`` (edits to verl's files, written by hand), ``files/`` (new files, written by hand) and
``github_only.diff`` (hunks for files verl's PyPI sdist does not carry, appended to the patch).

PR D (TROLL for FSDP) and PR E (its Megatron backend) are generated from the package's numerical core,
``troll_verl/core``: the modules in :data:`MODULES_D` / :data:`MODULES_E` and the tests in :data:`TESTS_D` /
:data:`TESTS_E` are copied into verl's tree with the import rewrites of :data:`REWRITES` and the per-file edits of
:data:`EDITS` (tests that need the package's harness or a setting that is a constant in verl), and the settings that
are not config keys become constants (:func:`troll_config`). The core
holds no ablation (they are ``troll_verl.ablations``, registered in the core's ``variants`` table), so nothing of them
is edited out. Every rewrite and edit must match what it names, so a
source change that breaks one stops generation with the file and the rule. ``actor.yaml``'s ``troll:`` block and
the configuration section of ``docs/algo/troll.md`` come from the same config; verl's ``_generated_*.yaml`` are
regenerated with verl's own ``scripts/print_cfg.py``. Generated Python is import-sorted (unused imports dropped)
and formatted with the interpreter's ruff under verl's settings (verl pins ruff 0.12.2; ``upstream/check.sh``
installs it).

``--check`` writes nothing and exits 1 if the committed patches differ from what the sources give (drift).
Needs git, network access to PyPI once (the sdist is cached in the work directory; with ``TROLL_VERL_WHEELHOUSE`` set
it comes from there, never from the network) and hydra-core.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "upstream"
VERL_VERSION = os.environ.get("VERL_VERSION", "0.9.1")
SERIES = ("prA", "prB", "prC", "prD", "prE", "prF", "prG", "prH")

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
# verl's AGENTS.md asks for attribution trailers; the submitter adds Signed-off-by (git am -s)
TRAILERS = "Co-authored-by: Claude <noreply@anthropic.com>\n"

# package module -> path in verl's tree
MODULES_D = {
    "troll_verl/core/host.py": "verl/trainer/troll/host.py",
    "troll_verl/core/fast_paths.py": "verl/trainer/troll/fast_paths.py",
    "troll_verl/core/variants.py": "verl/trainer/troll/variants.py",
    "troll_verl/core/projection.py": "verl/trainer/troll/projection.py",
    "troll_verl/core/support.py": "verl/trainer/troll/support.py",
    "troll_verl/core/sparse.py": "verl/trainer/troll/sparse.py",
    "troll_verl/core/old_side.py": "verl/trainer/troll/old_side.py",
    "troll_verl/core/layout.py": "verl/trainer/troll/layout.py",
    "troll_verl/core/terms.py": "verl/trainer/troll/terms.py",
    "troll_verl/core/losses.py": "verl/trainer/troll/losses.py",
    "troll_verl/core/fsdp/__init__.py": "verl/trainer/troll/fsdp/__init__.py",
    "troll_verl/core/fsdp/losses.py": "verl/trainer/troll/fsdp/losses.py",
    "troll_verl/core/config.py": "verl/workers/config/troll.py",
}
MODULES_E = {
    "troll_verl/core/megatron/__init__.py": "verl/trainer/troll/megatron/__init__.py",
    "troll_verl/core/megatron/losses.py": "verl/trainer/troll/megatron/losses.py",
}
# package test -> path in verl's tree; troll_verl/testing/reference.py is their shared brute-force reference
TESTS_D = {
    "troll_verl/testing/reference.py": "tests/trainer/ppo/_troll_reference.py",
    "tests/core/test_projection_on_cpu.py": "tests/trainer/ppo/test_troll_projection_on_cpu.py",
    "tests/core/test_sparse_on_cpu.py": "tests/trainer/ppo/test_troll_sparse_on_cpu.py",
    "tests/core/test_losses_on_cpu.py": "tests/trainer/ppo/test_troll_losses_on_cpu.py",
    "tests/core/test_variants_on_cpu.py": "tests/trainer/ppo/test_troll_variants_on_cpu.py",
    "tests/integration/test_seam_on_cpu.py": "tests/trainer/ppo/test_troll_ppo_loss_on_cpu.py",
}
TESTS_E = {
    "troll_verl/testing/dist.py": "tests/trainer/ppo/_troll_dist.py",
    "tests/core/test_megatron_losses_on_cpu.py": "tests/trainer/ppo/test_troll_megatron_on_cpu.py",
}

# TrollConfig's fields that stay config keys (TROLL §6 names them); every other field becomes a class constant of
# TrollConfig (not a key) with its value and docstring (the variant switches too: verl runs the core's variants)
EXPOSED = ("kl_bound", "alpha", "topk", "ratio_level")

_SUBMODULES = "host|fast_paths|variants|projection|support|sparse|old_side|layout|terms|losses|fsdp|megatron"
_USES_SETTINGS = (
    "troll_verl/core/support.py",
    "troll_verl/core/terms.py",
    "troll_verl/core/fsdp/losses.py",
    "troll_verl/core/megatron/losses.py",
)
_USES_CONFIG = ("tests/core/test_losses_on_cpu.py", "tests/integration/test_seam_on_cpu.py")
# (pattern, replacement, the sources it must match in); regular expressions, applied to every generated file in order
REWRITES = [
    (r"from \.{1,2}config import", "from verl.workers.config.troll import", _USES_SETTINGS),
    (rf"\btroll_verl\.core\.({_SUBMODULES})\b", r"verl.trainer.troll.\1", ()),
    (r"\btroll_verl\.core\.config\b", "verl.workers.config.troll", ()),
    (r"from troll_verl\.testing\.reference import", "from tests.trainer.ppo._troll_reference import",
     ("tests/core/test_projection_on_cpu.py", "tests/core/test_sparse_on_cpu.py", "tests/core/test_losses_on_cpu.py")),
    (r"from troll_verl\.testing\.dist import", "from tests.trainer.ppo._troll_dist import",
     ("tests/core/test_megatron_losses_on_cpu.py",)),
    # the plugin's flat TrollPolicyLossConfig is verl's PolicyLossConfig with a nested TrollConfig upstream
    (r"from verl\.workers\.config import FSDPActorConfig\n",
     "from verl.workers.config import FSDPActorConfig, PolicyLossConfig, TrollConfig\n", _USES_CONFIG),
    (r"from troll_verl\.config import TrollPolicyLossConfig\n", "", _USES_CONFIG),
    (r"TrollPolicyLossConfig\((\*\*\w+)\)", r'PolicyLossConfig(loss_mode="troll", troll=TrollConfig(\1))',
     _USES_CONFIG),
]  # fmt: skip
# the package's copyright line; generated files carry verl's header (check_license.py) above it, as derived files
COPYRIGHT = "# Copyright 2026 The troll-verl authors"
VERL_HEADER = "# Copyright 2026 Bytedance Ltd. and/or its affiliates"
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


# ----------------------------------------------------------------------------------------------------------------
# edits of the generated copy: each names what it removes and must find it exactly once (or `count` times)
# ----------------------------------------------------------------------------------------------------------------
def sub(pattern: str, replacement: str, count: int = 1):
    """Replace the regular expression ``pattern`` (multi-line mode), which must match exactly ``count`` times."""
    return ("sub", pattern, replacement, count)


def drop(name: str):
    """Remove the definition (function, class or assignment) of ``name`` and the comment lines right above it."""
    return ("drop", name)


EDITS = {
    "tests/core/test_losses_on_cpu.py": [
        # it caps eta through the config's eta_max, a constant upstream
        drop("test_a_bound_the_solver_cannot_reach_is_reported"),
    ],
    "tests/integration/test_seam_on_cpu.py": [
        # the hook runs with TrollConfig.mass_delta, a constant upstream
        sub(r"^VOCAB, K, DELTA = 50, 8, 1e-4$", "VOCAB, K, DELTA = 50, 8, TrollConfig.mass_delta"),
        sub(r"_actor_config\(topk=K, mass_delta=DELTA, kl_bound=0\.05\)", "_actor_config(topk=K, kl_bound=0.05)"),
        # in verl's tree the seam is there: no plugin to ask (and no route marker: check.sh's seam stage runs ours)
        sub(r"^from troll_verl\.integration\.seam import seam_available\n", ""),
        sub(r"^pytestmark = \[pytest\.mark\.skipif\(not seam_available\(\).*pytest\.mark\.route\]\n\n", ""),
    ],
    # verl's tests know no slow marker
    "tests/core/test_megatron_losses_on_cpu.py": [sub(r"^@pytest\.mark\.slow\n", "")],
}
# D without the Megatron backend (PR E adds it)
NO_MEGATRON = {"troll_verl/core/losses.py": [sub(r', "megatron": "megatron"\}', "}")]}


def _definitions(tree: ast.AST, name: str) -> list[ast.stmt]:
    found = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for child in body if isinstance(body, list) else []:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == name:
                found.append(child)
            elif isinstance(child, (ast.Assign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                if name in names:
                    found.append(child)
    return found


def apply_edit(source: str, text: str, edit: tuple) -> str:
    """``text`` with one edit of :data:`EDITS` applied; :class:`GenerationError` if it does not match as declared."""
    kind, *args = edit
    if kind == "sub":
        pattern, replacement, count = args
        text, n = re.subn(pattern, replacement, text, flags=re.M)
        if n != count:
            raise GenerationError(f"edit sub({pattern!r}) matched {source} {n} times, not {count}")
        return text
    (name,) = args  # drop
    lines = text.splitlines(keepends=True)
    nodes = _definitions(ast.parse(text), name)
    if len(nodes) != 1:
        raise GenerationError(f"edit drop({name!r}) found {len(nodes)} definitions in {source}, not 1")
    node = nodes[0]
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while start > 0 and lines[start - 1].strip().startswith("#"):
        start -= 1
    return "".join(lines[:start] + lines[node.end_lineno :])


def troll_config(text: str) -> str:
    """verl's ``TrollConfig`` from the package's: the :data:`EXPOSED` fields stay config keys; every other field
    becomes a class constant (``ClassVar``, not a key) with its value and its docstring entry as a comment, and its
    validation goes."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrollConfig")
    fields = [n for n in cls.body if isinstance(n, ast.AnnAssign) and "ClassVar" not in ast.unparse(n.annotation)]
    names = [f.target.id for f in fields]
    missing = [name for name in EXPOSED if name not in names]
    if missing:
        raise GenerationError(f"troll_verl/core/config.py: TrollConfig lacks {missing}; update EXPOSED")
    described = _docstring_args(cls)
    lines = text.splitlines(keepends=True)
    drop_lines: set[int] = set()
    replace: dict[int, str] = {}
    fixed = [f for f in fields if f.target.id not in EXPOSED]
    for f in fields:
        name = f.target.id
        if name in EXPOSED:
            continue
        drop_lines.update(range(f.lineno - 1, f.end_lineno))
    post_init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
    removed = {f.target.id for f in fields if f.target.id not in EXPOSED}
    kept = []
    for stmt in post_init.body[1:]:  # [0] is the docstring
        if any(re.search(rf"\b{name}\b", ast.get_source_segment(text, stmt)) for name in removed):
            drop_lines.update(range(stmt.lineno - 1, stmt.end_lineno))
        else:
            kept.append(stmt)
    # an import inside __post_init__ that only the dropped validation used goes with it
    for stmt in kept:
        if isinstance(stmt, ast.ImportFrom):
            rest = "\n".join(ast.get_source_segment(text, other) for other in kept if other is not stmt)
            if not any(re.search(rf"\b{alias.asname or alias.name}\b", rest) for alias in stmt.names):
                drop_lines.update(range(stmt.lineno - 1, stmt.end_lineno))
    # the class constants, after the last config key
    last = max(f.end_lineno for f in fields if f.target.id in EXPOSED)
    block = ["\n", "    # Fixed settings (TROLL §5-6 values; class constants, not config keys)\n"]
    for f in fixed:
        name = f.target.id
        comment = textwrap.wrap(described[name], 112)
        block += [f"    # {line}\n" for line in comment]
        block.append(f"    {name}: ClassVar[{ast.unparse(f.annotation)}] = {ast.get_source_segment(text, f.value)}\n")
    replace[last - 1] = lines[last - 1] + "".join(block)
    out = [replace.get(i, line) for i, line in enumerate(lines) if i not in drop_lines or i in replace]
    text = "".join(out)
    # the class docstring keeps the config keys' entries only
    doc = ast.get_docstring(cls)
    args_block = doc.split("Args:", 1)[1]
    entries = re.findall(r"^( {4}(\w+) \([^)]*\): .+?)(?=^ {4}\w+ \(|\Z)", args_block, re.M | re.S)
    for entry, name in entries:
        if name not in EXPOSED:
            text = text.replace(textwrap.indent(entry.rstrip("\n"), "    ") + "\n", "", 1)
    return text


def _docstring_args(cls: ast.ClassDef) -> dict[str, str]:
    """``{field: its description}`` from the class docstring's ``Args:`` section, on one line."""
    args = ast.get_docstring(cls).split("Args:", 1)[1]
    entries = dict(re.findall(r"^\s{4}(\w+) \([^)]*\): (.+?)(?=^\s{4}\w+ \(|\Z)", args, re.M | re.S))
    return {k: " ".join(line.strip() for line in v.strip().splitlines()).replace("``", "`") for k, v in entries.items()}


# ----------------------------------------------------------------------------------------------------------------
# trees, patches
# ----------------------------------------------------------------------------------------------------------------
def _git(tree: Path, *args: str, capture: bool = False) -> str:
    result = subprocess.run(
        ["git", "-C", str(tree), *args], check=True, text=True, capture_output=True, env={**os.environ, **GIT_ENV}
    )
    return result.stdout if capture else ""


def pristine_tree(work: Path) -> Path:
    """A fresh git tree of verl ``VERL_VERSION`` from its PyPI sdist (``verl/``, ``tests/``, ``scripts/``)."""
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"verl-{VERL_VERSION}.tar.gz"
    wheelhouse = os.environ.get("TROLL_VERL_WHEELHOUSE")  # the test suite's install step fetched it there
    if not sdist.is_file() or sdist.stat().st_size == 0:
        if wheelhouse:
            fetched = Path(wheelhouse) / sdist.name
            if not fetched.is_file():
                raise SystemExit(
                    f"{sdist.name} is not in TROLL_VERL_WHEELHOUSE={wheelhouse}: with that variable set nothing is "
                    "downloaded during a run. Run .venv/bin/python scripts/prefetch.py first (scripts/test.sh does), "
                    "or unset TROLL_VERL_WHEELHOUSE to download it now."
                )
            shutil.copyfile(fetched, sdist)
        else:
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


def pr_title(pr: str) -> str:
    """The PR's title: the first ``# `` line of its PR.md."""
    return (UPSTREAM / pr / "PR.md").read_text().splitlines()[0].removeprefix("# ").strip()


def _pr_message(pr_dir: Path) -> str:
    """The commit message: the PR title, the first paragraph of "What does this PR do?", the trailers."""
    text = (pr_dir / "PR.md").read_text()
    title = text.splitlines()[0].removeprefix("# ").strip()
    summary = text.split("### What does this PR do?", 1)[1].strip().split("\n\n", 1)[0]
    return f"{title}\n\n{summary}\n\n{TRAILERS}"


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
    if not diff.is_file():
        return
    try:
        _git(tree, "apply", "--check", str(diff))
    except subprocess.CalledProcessError as e:
        raise GenerationError(f"{diff.relative_to(ROOT)} no longer applies to verl {VERL_VERSION}:\n{e.stderr}") from e
    _git(tree, "apply", str(diff))


def rewrite(source: str, text: str) -> str:
    """``text`` of the package file ``source`` with every rule of :data:`REWRITES` and :data:`EDITS` applied."""
    for edit in EDITS.get(source, []):
        text = apply_edit(source, text, edit)
    for pattern, replacement, required_in in REWRITES:
        text, n = re.subn(pattern, replacement, text)
        if n == 0 and source in required_in:
            raise GenerationError(f"rewrite {pattern!r} no longer matches {source}; update upstream/make_patches.py")
    if source == "troll_verl/core/config.py":
        text = troll_config(text)
    if text.startswith(COPYRIGHT + "\n"):
        text = f"{VERL_HEADER}\n{text}"
    names_package = ("troll_verl", "troll-verl")
    leftover = [line for line in text.splitlines() if any(n in line for n in names_package) and line != COPYRIGHT]
    if leftover:
        raise GenerationError(f"{source} still names the package after rewriting: {leftover[:3]}")
    return text


def _generate(tree: Path, files: dict[str, str], extra_edits: dict[str, list] | None = None) -> list[str]:
    written = []
    for source, target in files.items():
        text = (ROOT / source).read_text()
        for edit in (extra_edits or {}).get(source, []):
            text = apply_edit(source, text, edit)
        (tree / target).parent.mkdir(parents=True, exist_ok=True)
        (tree / target).write_text(rewrite(source, text))
        written.append(target)
    return written


def actor_yaml_block() -> str:
    """The ``troll:`` block of verl's actor.yaml: the config keys (:data:`EXPOSED`) with their comments, from the
    package's yaml."""
    lines = (ROOT / "troll_verl/config/troll_trainer.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "loss_mode: troll") + 2
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith("      "))
    groups, comments = {}, []
    for line in lines[start:end]:
        if line.strip().startswith("#"):
            comments.append(line[2:])
        elif line.strip():
            groups[line.split(":", 1)[0].strip()] = [*comments, line[2:]]
            comments = []
    missing = [k for k in EXPOSED if k not in groups]
    if missing:
        raise GenerationError(f"troll_verl/config/troll_trainer.yaml has no key {missing}")
    head = [
        "  # TROLL (arXiv:2510.03817): a per-token KL trust-region projection on sparse top-K token distributions",
        '  # instead of ratio clipping; read when policy_loss.loss_mode is "troll" (docs/algo/troll.md)',
        "  troll:",
        "",
        "    # Required when using verl.utils.omega_conf_to_dataclass to instantiate dataclass configs",
        "    _target_: verl.workers.config.TrollConfig",
        "",
    ]
    body = [line for key in EXPOSED for line in [*groups[key], ""]]
    return "\n".join(head + body) + "\n"


def config_doc() -> str:
    """The configuration section of docs/algo/troll.md: one ``### `troll.<key>` (type)`` section per config key of
    the generated ``TrollConfig`` (default and docstring entry), then its fixed settings."""
    source = troll_config((ROOT / "troll_verl/core/config.py").read_text())
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "TrollConfig")
    described = _docstring_args(next(
        n for n in ast.parse((ROOT / "troll_verl/core/config.py").read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "TrollConfig"
    ))  # fmt: skip
    sections, fixed = [], []
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or node.target.id == "key_prefix":
            continue
        name = node.target.id
        if name not in described:
            raise GenerationError(f"TrollConfig.{name} has no entry in the class docstring's Args")
        annotation = ast.unparse(node.annotation)
        value = ast.literal_eval(node.value)
        default = (
            "null" if value is None else value if isinstance(value, str) else ast.get_source_segment(source, node.value)
        )
        text = _sentence(described[name])
        if "ClassVar" in annotation:
            fixed.append(f"- `{name}` = `{default}`: {text}")
            continue
        kind = re.sub(r"^Optional\[(.*)\]$|^(.*) \| None$", r"\1\2 or null", annotation)
        sections.append(f"### `troll.{name}` ({kind})\n\nDefault: `{default}`. {text}\n")
    head = "Under `actor_rollout_ref.actor.policy_loss` (`verl.workers.config.TrollConfig`), validated when built.\n"
    tail = (
        "\nThe other settings are constants of `TrollConfig` (the values of TROLL §5-6), not config keys:\n\n"
        + "\n".join(fixed)
        + "\n"
    )
    return head + "\n" + "\n".join(sections) + tail


def _sentence(text: str) -> str:
    """A docstring entry as a sentence: an ASCII first letter is capitalised; a symbol keeps its case (ε, α, δ
    are not Ε, Α, Δ)."""
    return text[:1].upper() + text[1:] if text[:1].isascii() else text


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
    """Sort imports, drop the unused ones and format ``files`` with verl's settings (its pyproject.toml)."""
    py = [f for f in files if f.endswith(".py")]
    if not py:
        return
    subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "-q", "--select", "I,F401", "--fix", *py],
                   cwd=tree, check=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "ruff", "format", "--no-cache", "-q", *py], cwd=tree, check=True)


def _hand_written(tree: Path, pr: str) -> list[str]:
    _apply(tree, UPSTREAM / pr / "verl.diff")
    return _copy_files(UPSTREAM / pr, tree)


def build_d(tree: Path) -> None:
    """TROLL for FSDP: the generated package plus ``prD``'s hand-written part, the actor.yaml block, the docs'
    configuration section and verl's regenerated yamls."""
    generated = _generate(tree, {**MODULES_D, **TESTS_D}, NO_MEGATRON)
    generated += [f for f in _hand_written(tree, "prD") if f.endswith(".py")]
    doc = tree / "docs/algo/troll.md"
    text = doc.read_text()
    if text.count(DOC_MARKER) != 1:
        raise GenerationError(f"upstream/prD/files/docs/algo/troll.md needs the line {DOC_MARKER!r} once")
    doc.write_text(text.replace(DOC_MARKER, config_doc().rstrip("\n")))
    actor = tree / ACTOR_YAML
    text = actor.read_text()
    if text.count(ACTOR_YAML_ANCHOR) != 1:
        raise GenerationError(f"{ACTOR_YAML} no longer has {ACTOR_YAML_ANCHOR.strip()!r} once; move the troll block")
    at = text.index(ACTOR_YAML_ANCHOR) + len(ACTOR_YAML_ANCHOR) + 1
    actor.write_text(text[:at] + actor_yaml_block() + text[at:])
    _ruff(tree, generated)
    regenerate_configs(tree)


def build_c(tree: Path) -> None:
    """The old-log-prob pass's named top-K: ``prC``'s hand-written part and verl's regenerated yamls (C adds
    ``actor.calculate_old_topk`` to ``actor.yaml``)."""
    _hand_written(tree, "prC")
    regenerate_configs(tree)


def build_e(tree: Path) -> None:
    """TROLL's Megatron backend: the generated ``megatron/`` package and its test, and the strategy switch."""
    generated = _generate(tree, {"troll_verl/core/losses.py": "verl/trainer/troll/losses.py", **MODULES_E, **TESTS_E})
    generated += [f for f in _hand_written(tree, "prE") if f.endswith(".py")]
    _ruff(tree, generated)


BUILDERS = {"prC": build_c, "prD": build_d, "prE": build_e}


def build_series(tree: Path) -> None:
    """Apply PRs A to E to ``tree``, one commit each."""
    for pr in SERIES:
        if pr in BUILDERS:
            BUILDERS[pr](tree)
        else:
            _hand_written(tree, pr)
        _git(tree, "add", "-A")
        _git(tree, "commit", "-q", "-m", _pr_message(UPSTREAM / pr))


def _with_github_only(patch: str, extra: Path) -> str:
    """Append the hunks for files the sdist lacks and recount the diffstat over the whole patch."""
    if not extra.is_file():
        return patch
    head, rest = patch.split("\n---\n", 1)
    diff_start = rest.index("\ndiff --git ") + 1
    signature = rest.rindex("\n-- \n")
    diff = rest[diff_start : signature + 1] + extra.read_text()
    stat = subprocess.run(
        ["git", "apply", "--stat", "--summary"], input=diff, text=True, capture_output=True, check=True
    ).stdout
    return f"{head}\n---\n{stat}\n{diff}{rest[signature + 1 :]}"


def build_patches(work: Path) -> dict[str, str]:
    """The series as ``{file name: format-patch text}``."""
    tree = pristine_tree(work)
    build_series(tree)
    out = {}
    for index, pr in enumerate(SERIES, start=1):
        text = _git(tree, "format-patch", "--stdout", "-1", f"HEAD~{len(SERIES) - index}", "--zero-commit",
                    "--no-signature", capture=True)  # fmt: skip
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

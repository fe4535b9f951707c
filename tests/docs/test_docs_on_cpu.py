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
"""The docs a user reads line by line, checked against the code (fast: no Ray, no model, no run).

Pages: ``README.md``, ``docs/*.md`` and ``recipe/troll/README.md``. Checked:

- every ``policy_loss.<key>`` they mention is a key of ``TrollPolicyLossConfig`` (TROLL's ``TrollConfig`` plus verl's
  ``PolicyLossConfig``), and every config table (``| key | default | ...``) and ``policy_loss:`` yaml block gives the
  key's real default;
- every metric they name, ``troll/<name>`` or ``actor/troll/<name>``, is a string the package logs: the loss's
  metrics (which verl prefixes with ``actor/``) in ``troll_verl/core`` and ``troll_verl/integration/loss_fn.py``, the
  trainer's (no prefix) elsewhere; an ``actor/troll/`` name must be one of the loss's;
- every Hydra key they quote in code (``actor_rollout_ref.…``, ``critic.…``, ``ray_kwargs.…``, ...) is a key of
  ``python -m troll_verl.main``'s config, or one Hydra can add where it is quoted with ``+``;
- every ``scripts/<name>.py <arguments>`` command line parses with that script's own parser (``build_parser()``),
  except the removed ``bench_rollout.py`` that benchmarks.md quotes as history;
- every relative link and image resolves, and every ``#anchor`` is a heading of its target (GitHub's slug rules).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import re
import shlex
import unicodedata
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

from troll_verl.testing import load_script

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "recipe" / "troll" / "README.md"])
# the scripts the docs quote; bench_rollout.py was removed (benchmarks.md keeps its command as history, naming the
# commit to check out)
SCRIPTS = (
    "bench_learning",
    "bench_loss",
    "bench_sparsity",
    "bench_rollout_topk",
    "bench_task",
    "gpu_check",
    "plot_runs",
    "install_vllm_cpu",
)
REMOVED_SCRIPTS = {"bench_rollout"}

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]+`")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _code_snippets(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks: where the docs quote keys, metrics and commands."""
    snippets = [span[1:-1] for span in _CODE_SPAN.findall(_FENCE.sub("", text))]
    for block in _FENCE.findall(text):
        snippets.extend(block.splitlines()[1:-1])
    return snippets


def test_the_pages_exist():
    names = {_page_id(p) for p in PAGES}
    for page in (
        "README.md",
        "docs/troll.md",
        "docs/benchmarks.md",
        "docs/cpu.md",
        "docs/bypass.md",
        "docs/async.md",
        "docs/design.md",
        "recipe/troll/README.md",
    ):
        assert page in names, page


# ---------------------------------------------------------------------------------------------------------------------
# config keys and defaults
# ---------------------------------------------------------------------------------------------------------------------
def _config_defaults() -> dict:
    from troll_verl.config import TrollPolicyLossConfig

    return {f.name: f.default for f in fields(TrollPolicyLossConfig)}


def _parse_default(text: str):
    text = text.strip().strip("`")
    if text in ("null", "None"):
        return None
    if text in ("true", "false"):  # yaml's booleans
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _same(documented, real) -> bool:
    if isinstance(real, bool) or isinstance(documented, bool):
        return documented is real
    if isinstance(real, int | float) and isinstance(documented, int | float):
        return float(documented) == float(real)
    return documented == real


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_policy_loss_key_exists(page):
    defaults = _config_defaults()
    keys = set(re.findall(r"policy_loss\.([A-Za-z_]\w*)", _text(page)))
    unknown = sorted(keys - set(defaults))
    assert not unknown, f"{_page_id(page)} names policy_loss keys TrollPolicyLossConfig lacks: {unknown}"


def _config_table_rows(text: str) -> list[tuple[str, str]]:
    rows, in_table = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            in_table = False
        elif cells[:2] == ["key", "default"]:
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            rows.append((cells[0].strip("`"), cells[1]))
    return rows


def _yaml_policy_loss_rows(text: str) -> list[tuple[str, str]]:
    rows = []
    for block in _FENCE.findall(text):
        if not block.startswith("```yaml"):
            continue
        lines = block.splitlines()
        starts = [i for i, line in enumerate(lines) if line.strip() == "policy_loss:"]
        for start in starts:
            indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
            for line in lines[start + 1 :]:
                if not line.strip() or len(line) - len(line.lstrip()) < indent or line.startswith("```"):
                    break
                key, _, value = line.split("#", 1)[0].strip().partition(":")
                rows.append((key.strip(), value.strip()))
    return rows


def test_config_tables_and_yaml_blocks_give_the_real_defaults():
    defaults = _config_defaults()
    checked = 0
    for page in PAGES:
        text = _text(page)
        for key, documented in _config_table_rows(text) + _yaml_policy_loss_rows(text):
            assert key in defaults, f"{_page_id(page)}: config key {key!r} is not in TrollPolicyLossConfig"
            real = defaults[key]
            if key == "_target_":
                assert documented == "troll_verl.config.TrollPolicyLossConfig", (_page_id(page), documented)
                continue
            assert real is not MISSING, key
            assert _same(_parse_default(documented), real), (
                f"{_page_id(page)}: {key} documented with default {documented}, the code's is {real!r}"
            )
            checked += 1
    assert checked >= 16  # at least docs/troll.md's yaml block, every TROLL key


def test_the_configuration_reference_covers_every_troll_key():
    """docs/troll.md's yaml block is the configuration reference (the README links to it)."""
    from troll_verl.core.config import TrollConfig

    documented = {key for key, _ in _yaml_policy_loss_rows(_text(ROOT / "docs" / "troll.md"))}
    assert {f.name for f in fields(TrollConfig) if f.name != "_target_"} | {"loss_mode"} <= documented


# verl's and TROLL's top-level config sections, where a quoted Hydra key starts
_HYDRA_KEY = re.compile(
    r"(?:^|(?<=[\s'\"(=]))(\+{0,2})((?:actor_rollout_ref|critic|ray_kwargs|trainer|algorithm|data|reward|distillation)"
    r"(?:\.[A-Za-z_]\w*)+)"
)


@functools.cache
def _configs() -> tuple[dict, dict]:
    """As plain data, interpolations unresolved: troll_trainer.yaml (``python -m troll_verl.main``'s config: verl's
    ppo_trainer plus TROLL's keys) and verl's own ppo_trainer (``verl.trainer.main_ppo``'s)."""
    from omegaconf import OmegaConf

    from troll_verl.testing.verl_engine import compose_config

    troll = OmegaConf.to_container(compose_config("/nonexistent", base=()), resolve=False)
    verl_dir = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
    return troll, yaml.safe_load((verl_dir / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text())


def _lookup(config: dict, key: str) -> tuple[bool, str | None]:
    """Whether ``key`` is in ``config``, and where it first leaves it (the missing part; None where it is in)."""
    node, parts = config, key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict):
            return False, f"{'.'.join(parts[:depth])} is not a mapping"
        if part not in node:
            return False, f"no {part!r} in {'.'.join(parts[:depth])}"
        node = node[part]
    return True, None


def _hydra_key_problem(configs: tuple[dict, dict], plus: str, key: str) -> str | None:
    """Why ``<plus><key>`` cannot be set as the docs quote it (None: it can). Without ``+`` it must be a key of
    troll_trainer.yaml. ``+`` adds a key below an existing mapping, so its parent must be in troll_trainer.yaml; and
    Hydra refuses ``+`` for a key that exists, so it must not be in verl's ppo_trainer (on which the docs' ``+`` lines,
    like ``+...policy_loss.kl_bound``, run). ``++`` sets or adds."""
    troll, verl = configs
    found, where = _lookup(troll, key)
    if not plus:
        return where
    if plus == "+" and _lookup(verl, key)[0]:
        return f"{key} is in verl's config: Hydra refuses '+' for it (drop the '+', or '++')"
    if found or where.startswith("no "):
        return None
    return where


def test_the_hydra_key_check_sees_what_hydra_refuses():
    troll, verl = {"a": {"b": {"c": 1, "k": 2}, "d": "x"}}, {"a": {"b": {"c": 1}, "d": "x"}}
    configs = (troll, verl)
    assert _hydra_key_problem(configs, "", "a.b.c") is None and _hydra_key_problem(configs, "+", "a.b.e.f") is None
    assert _hydra_key_problem(configs, "", "a.b.e") == "no 'e' in a.b"
    assert "in verl's config" in _hydra_key_problem(configs, "+", "a.b.c")
    assert _hydra_key_problem(configs, "++", "a.b.c") is None and _hydra_key_problem(configs, "+", "a.b.k") is None
    assert "not a mapping" in _hydra_key_problem(configs, "+", "a.d.e")
    assert _HYDRA_KEY.findall("+actor_rollout_ref.model.override_config.attn_implementation=sdpa and x.critic.y") == [
        ("+", "actor_rollout_ref.model.override_config.attn_implementation")
    ]


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_quoted_hydra_key_exists(page):
    """A Hydra key the docs quote in code (``actor_rollout_ref.…``, ``critic.…``, ``ray_kwargs.…``, ...) is a key of
    ``python -m troll_verl.main``'s config, or, quoted with ``+``, one Hydra can add."""
    configs = _configs()
    problems = [
        f"{plus}{key}: {problem}"
        for snippet in _code_snippets(_text(page))
        for plus, key in _HYDRA_KEY.findall(snippet)
        if (problem := _hydra_key_problem(configs, plus, key)) is not None
    ]
    assert not problems, f"{_page_id(page)}:\n" + "\n".join(sorted(set(problems)))


# ---------------------------------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------------------------------
_METRIC = re.compile(r"(?<![\w/.-])(actor/)?troll/([a-z_]+)\b(?![/.(])")
_LOGGED = re.compile(r"""["'](troll/[a-z_]+)["']""")


def _logged_metrics() -> tuple[set[str], set[str]]:
    """(the actor worker's metrics (the loss's and where the old top-K came from), which verl logs as actor/troll/...,
    and every troll/... string the package writes)."""
    package = ROOT / "troll_verl"
    loss_files = [
        *(package / "core").rglob("*.py"),
        *(package / "integration" / f for f in ("loss_fn.py", "workers.py", "diagnostics.py")),
        package / "bypass" / "mode.py",  # the rollout's tail mass, logged by the actor worker
    ]
    loss = {m for path in loss_files for m in _LOGGED.findall(path.read_text())}
    every = {m for path in package.rglob("*.py") for m in _LOGGED.findall(path.read_text())}
    return loss, every


def test_the_metric_scan_finds_the_actor_workers_metrics():
    loss, every = _logged_metrics()
    assert {"troll/kl_after", "troll/projected_frac", "troll/mismatch_kl", "troll/old_from_rollout"} <= loss
    assert "troll/rollout_tail_mass" in loss and loss <= every


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_documented_metric_is_logged_under_that_name(page):
    loss, every = _logged_metrics()
    problems = []
    for snippet in _code_snippets(_text(page)):
        for prefix, name in _METRIC.findall(snippet):
            metric = f"troll/{name}"
            if prefix and metric not in loss:
                problems.append(f"actor/{metric}: not a metric of the loss (verl prefixes only those with actor/)")
            elif metric not in every:
                problems.append(f"{prefix}{metric}: no module of troll_verl logs it")
    assert not problems, f"{_page_id(page)}: {sorted(set(problems))}"


# ---------------------------------------------------------------------------------------------------------------------
# script command lines
# ---------------------------------------------------------------------------------------------------------------------
_COMMAND = re.compile(r"(?:^|\s)(?:\S*python\S*\s+)?scripts/(\w+)\.py\b(.*)$")


def _commands(text: str) -> list[tuple[str, str, bool]]:
    """``(script, argument text, run with python)`` of every quoted ``scripts/<name>.py`` command line."""
    found = []
    snippets = _code_snippets(text)
    # a fenced command continued with a trailing backslash is one line
    joined, pending = [], ""
    for snippet in snippets:
        if snippet.rstrip().endswith("\\"):
            pending += snippet.rstrip()[:-1] + " "
            continue
        joined.append(pending + snippet)
        pending = ""
    for snippet in joined:
        for match in re.finditer(r"(\S*python\S*\s+)?scripts/(\w+)\.py\b([^`]*)", snippet):
            args = re.split(r"\s#|&&|\|\||[;|]", match.group(3))[0]
            found.append((match.group(2), " ".join(args.split()), bool(match.group(1))))
    return found


def _parsers() -> dict:
    return {name: load_script(name).build_parser() for name in SCRIPTS}


def test_every_documented_script_exposes_its_parser():
    for name, parser in _parsers().items():
        assert parser.prog, name


def test_every_documented_command_line_parses():
    parsers = _parsers()
    checked, problems = 0, []
    for page in PAGES:
        for script, args, with_python in _commands(_text(page)):
            if script in REMOVED_SCRIPTS:
                assert not (ROOT / "scripts" / f"{script}.py").exists()
                continue
            if not args and not with_python:
                continue  # the script named, not a command
            if script not in parsers:  # a script the docs started quoting: it exposes its parser too
                assert (ROOT / "scripts" / f"{script}.py").exists(), f"{_page_id(page)}: no scripts/{script}.py"
                parsers[script] = load_script(script).build_parser()
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    parsers[script].parse_args(shlex.split(args))
            except SystemExit:
                problems.append(f"{_page_id(page)}: scripts/{script}.py {args}: {err.getvalue().strip()[-300:]}")
            checked += 1
    assert not problems, "\n".join(problems)
    assert checked >= 15


def test_the_command_scan_sees_continued_lines_and_skips_comments():
    text = "```bash\n.venv/bin/python scripts/bench_learning.py --model smollm2 \\\n    --steps 10   # ten\n```\n"
    assert _commands(text) == [("bench_learning", "--model smollm2 --steps 10", True)]
    assert _commands("run `python scripts/plot_runs.py a=b/ --out-dir x && ls`") == [
        ("plot_runs", "a=b/ --out-dir x", True)
    ]


_REPO_PATH = re.compile(r"(?:^|(?<=[\s(=]))((?:troll_verl|tests|scripts|upstream|recipe|examples)/[\w./*-]*)")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_quoted_repository_path_exists(page):
    """A path the docs quote (`troll_verl/...`, `tests/...::test`, `scripts/...`, globs allowed) is in the checkout."""
    missing = []
    for snippet in _code_snippets(_text(page)):
        if "{" in snippet or "<" in snippet:
            continue  # a pattern ({a,b}, <name>), not a path
        for path in _REPO_PATH.findall(snippet.strip()):
            path = path.rstrip(".")
            if Path(path).stem in REMOVED_SCRIPTS:
                continue
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(path)
    assert not missing, f"{_page_id(page)} quotes paths that do not exist: {missing}"


# ---------------------------------------------------------------------------------------------------------------------
# links, images and anchors
# ---------------------------------------------------------------------------------------------------------------------
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, every character that is not a letter,
    mark, number, connector, space or hyphen removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(
        c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc"
    )
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", _text(path)).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_github_slugs():
    assert github_slug("Bypass mode: the old distribution (`scripts/bench_learning.py --variants a b`)") == (
        "bypass-mode-the-old-distribution-scriptsbench_learningpy---variants-a-b"
    )
    slug = github_slug("CPU at the real model's shapes: V = 49152, N = 512")
    assert slug == "cpu-at-the-real-models-shapes-v--49152-n--512"
    assert github_slug("Why `trainer.v1.trainer_mode=troll`") == "why-trainerv1trainer_modetroll"
    assert github_slug("KL(π ‖ π_old) — ε ≤ 0.05") == "klπ--π_old--ε--005"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_link_image_and_anchor_resolves(page):
    text = _CODE_SPAN.sub("", _FENCE.sub("", _text(page)))
    problems = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor:
            if resolved.suffix != ".md":
                problems.append(f"{target}: an anchor into a file that is not markdown")
            elif anchor not in _anchors(resolved):
                problems.append(f"{target}: no heading of {resolved.name} has that anchor")
    assert not problems, f"{_page_id(page)}: {problems}"


def test_the_module_table_names_every_module():
    """docs/design.md's module table names every module of the package, itself or by its folder (a row whose path
    ends in ``/``), so a new module cannot go undocumented."""
    text = _text(ROOT / "docs" / "design.md")
    table = text[text.index("Module by module:") : text.index("## Extending")]
    named = [
        path
        for line in table.splitlines()
        if line.startswith("| `")
        for path in re.findall(r"`([^`]+)`", line.split("|")[1])
    ]
    modules = sorted(
        str(path.relative_to(ROOT)) for path in (ROOT / "troll_verl").rglob("*.py") if path.name != "__init__.py"
    )
    assert len(modules) > 50, modules
    missing = [m for m in modules if not any(m == p or (p.endswith("/") and m.startswith(p)) for p in named)]
    assert not missing, f"docs/design.md's module table does not name: {missing}"


README_MAX_LINES = 110


def test_the_readme_stays_short():
    """The README gives the two commands, the switch, the headline with its evidence, the GPU status and links; the
    rest lives in docs/ (the status table in docs/status.md)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"

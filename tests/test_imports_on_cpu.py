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
"""The package's import structure: no cycle between its modules, backends are leaves, every module imports alone."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import troll_verl

PACKAGE = Path(troll_verl.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> list[str]:
    return sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def _imports(path: Path) -> set[str]:
    """Every troll_verl module ``path`` imports, at module level or inside functions, ``importlib`` included."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            found.update(n for n in [target, *names] if n in _MODULES)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in _MODULES)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in _MODULES:
                found.add(arg.value)
    found.discard(module)
    return found


_MODULES = set(_modules())


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__main__.py":
            # importing a submodule imports its packages first; those edges are not cycles of ours
            graph[_module_name(path)] = {m for m in _imports(path) if not _module_name(path).startswith(m + ".")}
    return graph


def test_no_import_cycle_between_the_packages_modules():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_backends_are_leaves():
    """The backends (core.losses.BACKENDS) import shared pieces by public names from neutral modules, never each
    other."""
    from troll_verl.core.losses import BACKENDS

    backends = {f"troll_verl.core.{folder}" for folder in BACKENDS.values()}
    assert backends == {"troll_verl.core.fsdp", "troll_verl.core.megatron"}
    for backend in sorted(backends):
        for path in PACKAGE.joinpath(*backend.split(".")[1:]).rglob("*.py"):
            source = path.read_text()
            assert not any(m.startswith(other) for other in backends - {backend} for m in _imports(path)), path
            for node in ast.walk(ast.parse(source)):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and "troll_verl" in (node.module or "")
                    or (isinstance(node, ast.ImportFrom) and node.level)
                ):
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    assert not private, f"{path.name} imports private {private} from {node.module}"


# Each module is imported in a fresh child forked from one interpreter that has imported only third-party libraries
# (nothing of troll_verl, and not verl, whose import loads our plugin through its entry point): the import-order
# independence of a fresh interpreter at a fraction of the start-up cost of one interpreter per module.
_FORK_IMPORTS = """
import json, os, sys, traceback
# third-party only (verl's slow start-up), paid once
import datasets, numpy, omegaconf, ray, tensordict, torch, transformers, vllm
failed = []
for module in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            __import__(module)
        except BaseException:
            os.write(w, traceback.format_exc()[-1500:].encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append((module, err or f"exit status {status}"))
print("FAILED_IMPORTS", json.dumps(failed))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_module_imports_in_a_fresh_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    modules = _modules()
    half = len(modules) // 2

    def load(chunk):
        proc = subprocess.run(
            [sys.executable, "-c", _FORK_IMPORTS, *chunk], capture_output=True, text=True, env=env, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = [line for line in proc.stdout.splitlines() if line.startswith("FAILED_IMPORTS ")]
        assert report, proc.stdout[-3000:] + proc.stderr[-3000:]
        return [tuple(f) for f in json.loads(report[-1].removeprefix("FAILED_IMPORTS "))]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [f for chunk_failed in pool.map(load, (modules[:half], modules[half:])) for f in chunk_failed]
    assert not failed, failed


# ------------------------------------------------------------------------------------------------------ the layers
# A module may import modules of its own layer and of lower ones only (lower = smaller rank). The numerical core is
# the bottom: it imports nothing else of the package.
LAYER_RANK = {
    "core": 0,
    "compat": 1,
    "kernels": 1,
    "ablations": 1,
    "platform": 2,
    "assets": 2,
    "recipes": 2,
    "rollout": 2,
    "bypass": 3,
    "integration": 4,
    "tools": 5,
    "testing": 6,
    "main": 6,
    "config": 6,
}
# the public verl APIs the core may use (what goes upstream imports them from verl itself)
CORE_VERL_IMPORTS = {
    "verl.base_config": {"BaseConfig"},
    "verl.trainer.ppo.core_algos": {"agg_loss"},
    "verl.utils": {"torch_functional"},
    "verl.utils.metric": {"AggregationType", "Metric"},
    "verl.utils.ulysses": {
        "gather_outputs_and_unpad",
        "get_ulysses_sequence_parallel_rank",
        "get_ulysses_sequence_parallel_world_size",
    },
    "verl.models.mcore.util": {"preprocess_bshd_engine", "preprocess_thd_engine"},
}


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def test_every_module_belongs_to_a_layer():
    assert {_layer(m) for m in _MODULES} - {"__init__"} <= set(LAYER_RANK)


def test_layers_import_only_downward():
    upward = [
        f"{m} -> {d}"
        for m, deps in _graph().items()
        for d in deps
        if _layer(m) != "__init__" and LAYER_RANK[_layer(d)] > LAYER_RANK[_layer(m)]
    ]
    assert not upward, upward


def test_the_core_imports_only_public_verl_apis():
    found = {}
    for path in (PACKAGE / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
                found.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "verl" for a in node.names), path
    extra = {m: names - CORE_VERL_IMPORTS.get(m, set()) for m, names in found.items()}
    assert not {m: n for m, n in extra.items() if n}, extra
    assert not any(name.startswith("_") for names in found.values() for name in names)

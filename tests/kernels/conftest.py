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
"""The kernels under test (fixture ``kernels``): interpreted on CPU tensors (Triton's interpreter, no GPU), or compiled
on CUDA tensors with ``TROLL_TEST_DEVICE=cuda`` (``scripts/bench_kernels.py`` runs these tests so on a GPU).

Triton decides when a function is *defined* whether it is interpreted, its own ``tl.max``, ``tl.sum`` ... included,
which it defines when triton is first imported (``import verl`` does that). So:

- where triton is not imported yet (this folder's tests run alone), it is imported here with ``TRITON_INTERPRET=1``
  set for the import only, and the kernel modules with it;
- where another test already imported it compiled (the whole suite), every test of this folder that uses ``kernels``
  runs in one child pytest process started with ``TRITON_INTERPRET=1``, and reports the child's outcome as its own.

Either way the suite needs no environment variable and the rest of the session never sees one.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

DEVICE = os.environ.get("TROLL_TEST_DEVICE", "cpu")
# in dependency order (a re-import must see the re-imported modules below it)
KERNEL_MODULES = {
    name: f"troll_verl.kernels.{name}" for name in ("stats", "topk", "grad", "sparse", "projection", "terms")
}
KERNEL_MODULES["clip"] = "benchmarks.kernels.clip"  # the clip baseline, outside the package
ROOT = Path(__file__).resolve().parents[2]
_CHILD_TIMEOUT_S = 600


def _triton_state() -> str:
    """``fresh`` (triton not imported), ``interpreted`` or ``compiled`` (how its own functions were defined)."""
    if "triton.language" not in sys.modules:
        return "fresh"
    from triton.runtime.interpreter import InterpretedFunction

    return "interpreted" if isinstance(sys.modules["triton.language"].standard.max, InterpretedFunction) else "compiled"


def load_kernels(interpret: bool) -> SimpleNamespace:
    """The kernel modules, defined interpreted (``interpret``, with triton itself) or compiled."""
    saved = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.experimental.gluon  # noqa: F401 - the interpreter imports it at the first launch and checks it
        from triton.runtime.interpreter import InterpretedFunction

        modules = {}
        for name, full in KERNEL_MODULES.items():
            module = sys.modules.get(full)
            if module is None:
                module = importlib.import_module(full)
            elif any(isinstance(v, InterpretedFunction) for v in vars(module).values()) != interpret:
                module = importlib.reload(module)
            modules[name] = module
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return SimpleNamespace(**modules)


_delegated: dict[str, tuple[str, str]] | None = None  # nodeid -> (outcome, report) from the child run


def _child_results(session) -> dict[str, tuple[str, str]]:
    """Run every item of this folder that uses ``kernels`` in one child pytest with ``TRITON_INTERPRET=1``."""
    global _delegated
    if _delegated is None:
        here = Path(__file__).parent
        ids = [i.nodeid for i in session.items if "kernels" in i.fixturenames and Path(i.path).parent == here]
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--no-header", *ids]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S)
        out = proc.stdout + proc.stderr
        _delegated = {}
        for outcome, nodeid in re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED)(?: \[\d+\])? (\S+)", out, re.M):
            section = re.search(rf"_{{3,}} {re.escape(nodeid.split('::')[-1])} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n=+ )",
                                out, re.S)  # fmt: skip
            _delegated[nodeid] = (outcome, section.group(1)[-4000:] if section else out[-4000:])
        _delegated["<run>"] = ("", out[-4000:])
    return _delegated


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Where triton is compiled in this process, a ``kernels`` test reports the child's outcome (module docstring)."""
    if DEVICE != "cpu" or "kernels" not in pyfuncitem.fixturenames or _triton_state() != "compiled":
        return None
    results = _child_results(pyfuncitem.session)
    outcome, report = results.get(pyfuncitem.nodeid, ("MISSING", results["<run>"][1]))
    if outcome == "SKIPPED":
        pytest.skip(f"skipped in the interpreter's child run: {report[-300:]}")
    if outcome != "PASSED":
        pytest.fail(f"{outcome} in the interpreter's child run (TRITON_INTERPRET=1):\n{report}", pytrace=False)
    return True


@pytest.fixture(scope="session")
def kernels() -> SimpleNamespace | None:
    """The kernel modules for :data:`DEVICE` (None where the tests run in the child process, module docstring)."""
    if DEVICE == "cpu":
        return None if _triton_state() == "compiled" else load_kernels(interpret=True)
    if not torch.cuda.is_available():
        pytest.skip(f"TROLL_TEST_DEVICE={DEVICE} but no CUDA device")
    return load_kernels(interpret=False)


@pytest.fixture(autouse=True)
def torch_reference(monkeypatch):
    """The torch functions the kernels are compared with stay on the torch path (on CUDA they would dispatch to the
    kernels themselves); the kernels are called directly."""
    monkeypatch.setenv("TROLL_KERNELS", "torch")


_FILL = {torch.bool: True, torch.uint8: 0xA5, torch.int32: -7, torch.int64: -7}


@pytest.fixture
def poisoned(monkeypatch):
    """Every ``torch.empty`` during the test comes back filled with NaN (floats) or a sentinel (ints: −7, bytes:
    0xA5), so an output element a kernel fails to write shows up. Returns the sentinels by dtype."""
    empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(_FILL.get(t.dtype, float("nan")))

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    return _FILL

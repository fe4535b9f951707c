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
"""Tests of troll_verl.integration.plugin: entry point, import hooks, capability check, collisions, CPU-platform gating.

verl swallows plugin import errors at DEBUG level, so each behaviour is checked in a fresh interpreter.
"""

import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM",)}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=180
    )


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.route
def test_import_verl_alone_registers_the_loss_and_no_trainer():
    """The plugin registers loss troll and TROLL's actor worker, and no trainer: verl's own trainers run TROLL."""
    out = _ok(
        _run(
            """
            import verl
            from verl.trainer.ppo.core_algos import get_policy_loss_fn
            from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
            print(get_policy_loss_fn("troll").__module__, sorted(n for n in TRAINER_REGISTRY if "troll" in n))
            """
        )
    )
    assert out.split() == ["troll_verl.integration.plugin", "[]"]


def test_import_verl_stays_cheap():
    """The entry point registers lazily: plain `import verl` pulls in neither the trainer nor the loss modules."""
    out = _ok(
        _run(
            """
            import sys, verl
            heavy = ["verl.trainer.ppo.v1.trainer_base", "verl.trainer.ppo.core_algos", "troll_verl.core.losses",
                     "troll_verl.bypass.vllm_replica", "troll_verl.platform.vllm_cpu", "vllm"]
            print([m for m in heavy if m in sys.modules], "troll_verl.integration.plugin" in sys.modules)
            """
        )
    )
    assert out.strip() == "[] True"


@pytest.mark.route
def test_external_modules_alternative():
    """VERL_USE_EXTERNAL_MODULES=troll_verl.integration.plugin works with entry-point discovery switched off."""
    out = _ok(
        _run(
            """
            import verl
            from verl.trainer.ppo.core_algos import get_policy_loss_fn
            print(get_policy_loss_fn("troll").__name__)
            """,
            VERL_USE_EXTERNAL_PLUGINS="none",
            VERL_USE_EXTERNAL_MODULES="troll_verl.integration.plugin",
        )
    )
    from troll_verl.integration.seam import seam_available

    # the route chosen at registration: verl 0.9.1 has no seam, a tree with upstream/'s PRs A-C has
    assert out.strip() == ("troll_policy_loss_seam" if seam_available() else "troll_policy_loss_stock")
    missing = _run(
        """
        import verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        get_policy_loss_fn("troll")
        """,
        VERL_USE_EXTERNAL_PLUGINS="none",
    )
    assert missing.returncode != 0 and "Unsupported loss mode: troll" in missing.stderr


@pytest.mark.route
def test_registered_loss_called_by_plain_ppo_loss_names_the_fix():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import troll_verl.integration.plugin  # noqa: F401

    # stock verl: TROLL's actor training worker is missing from this process; the seam: the settings class
    with pytest.raises(ValueError, match="actor training worker.*not installed|python -m troll_verl.main"):
        get_policy_loss_fn("troll")(None, None, None, None, config=object())


@pytest.mark.route
def test_the_route_is_chosen_once_at_registration(monkeypatch):
    """The registered loss is its route's own forwarder, chosen when verl's registry loads: the seam's, with its spec,
    where verl has the seam, else the stock route's (which never looks for the seam again)."""
    import troll_verl.core.losses  # noqa: F401  (verl's registry loaded and registered first, on the real route)
    import troll_verl.integration.plugin as plugin
    from troll_verl.integration import seam

    registered = {}

    class FakeCoreAlgos:
        class PolicyLossSpec:
            def __init__(self, **fields):
                self.fields = fields

        @staticmethod
        def register_policy_loss(name, spec=None):
            def decorate(fn):
                registered[name] = (fn, spec)
                return fn

            return decorate

    for route, forwarder in ((seam.SEAM, plugin.troll_policy_loss_seam), (seam.STOCK, plugin.troll_policy_loss_stock)):
        monkeypatch.setattr(seam, "route", lambda route=route: route)
        plugin._register_policy_loss(FakeCoreAlgos)
        fn, spec = registered[plugin.POLICY_LOSS_NAME]
        assert fn is forwarder
        assert (spec is not None and spec.fields["logits_fn"] is plugin.troll_logits_hook) == (route == seam.SEAM)
    assert "route" not in plugin.troll_policy_loss_stock.__code__.co_names


def _verl_tree(tmp_path, drop: tuple[str, str] | None = None):
    """A copy of the installed verl's capability files (compat.VERL_CAPABILITIES) under tmp_path, with the statement
    ``drop[1]`` removed from the file ``drop[0]``."""
    from troll_verl.compat import VERL_CAPABILITIES, _verl_dir

    root = tmp_path / "verl"
    for path, _ in VERL_CAPABILITIES.values():
        rel = path.removeprefix("verl/")
        text = open(os.path.join(_verl_dir(), rel)).read()
        if drop is not None and drop[0] == path:
            assert drop[1] in text
            text = text.replace(drop[1], "")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(root)


def test_the_capability_check_names_each_missing_capability(tmp_path, caplog):
    from troll_verl.compat import (
        VERL_CAPABILITIES,
        VerlVersionError,
        check_verl_capabilities,
        missing_verl_capabilities,
    )

    assert missing_verl_capabilities() == []  # the installed verl 0.9.1
    assert missing_verl_capabilities(_verl_tree(tmp_path / "whole")) == []
    for capability, (path, statements) in VERL_CAPABILITIES.items():
        tree = _verl_tree(tmp_path / path.replace("/", "_"), drop=(path, statements[0]))
        assert missing_verl_capabilities(tree) == [capability]
        with pytest.raises(VerlVersionError, match=r"verl 0\.10\.0 lacks .*pip install 'verl\[verl-core\]==0\.9\.1'"):
            check_verl_capabilities("0.10.0", tree)
    assert missing_verl_capabilities(str(tmp_path / "nothing")) == list(VERL_CAPABILITIES)


def test_a_verl_with_every_capability_runs_whatever_its_version_with_a_warning(tmp_path, caplog):
    from troll_verl.compat import check_verl_capabilities

    tree = _verl_tree(tmp_path)
    with caplog.at_level("WARNING", logger="troll_verl.compat"):
        assert check_verl_capabilities("0.9.1", tree) == "0.9.1"
    assert not caplog.records
    for untested in ("0.10.0.dev0", "0.9.0.dev", "1.0.0"):  # main, neo and a release to come
        caplog.clear()
        with caplog.at_level("WARNING", logger="troll_verl.compat"):
            assert check_verl_capabilities(untested, tree) == untested
        assert len(caplog.records) == (untested.split(".")[:2] != ["0", "9"])
        assert all(f"verl {untested} has every capability" in r.getMessage() for r in caplog.records)
    # neo reports 0.9 but its worker adapts its batch: named, whatever its version
    worker = tmp_path / "verl" / "workers" / "engine_workers.py"
    worker.write_text(worker.read_text() + "\n    def _train_mini_batch_impl(self, data):\n        pass\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="troll_verl.compat"):
        assert check_verl_capabilities("0.9.0.dev0", tree) == "0.9.0.dev0"
    assert len(caplog.records) == 1 and "verl's neo branch: TrainingWorker adapts its batch" in caplog.text


def test_policy_loss_name_collision_is_refused():
    out = _run(
        """
        from verl.trainer.ppo import core_algos
        core_algos.register_policy_loss("troll")(lambda *a, **k: None)
        import troll_verl.integration.plugin as p
        p._register_policy_loss(core_algos)
        """
    )
    assert out.returncode != 0 and "already has 'troll'" in out.stderr and "overwrite" in out.stderr


def test_cpu_platform_only_with_the_switch():
    code = """
        import verl
        from verl.plugin.platform import PlatformRegistry
        from verl.workers.engine import EngineRegistry
        print(PlatformRegistry.get("cpu") is not None, "cpu" in EngineRegistry._engines["language_model"]["fsdp2"])
        """
    assert _ok(_run(code)).split() == ["False", "False"]
    assert _ok(_run(code, VERL_PLATFORM="cpu")).split() == ["True", "True"]


def test_cpu_platform_registration_is_strict_identity():
    """The CPU platform class is built once per process, and the registry is (re)filled unless it holds that very
    class: a stand-in from the same module, as a stale registration would be, is replaced."""
    out = _ok(
        _run(
            """
        import verl
        from verl.plugin.platform import PlatformRegistry
        from troll_verl.integration import plugin
        from troll_verl.platform.cpu import CPU_PLATFORM_NAME, make_platform_cls
        ours = make_platform_cls()
        assert make_platform_cls() is ours and PlatformRegistry.get(CPU_PLATFORM_NAME) is ours
        stale = type("PlatformCPU", (ours,), {"__module__": "troll_verl.platform.cpu"})
        PlatformRegistry.register(CPU_PLATFORM_NAME)(stale)
        plugin._register_cpu_platform()
        print(PlatformRegistry.get(CPU_PLATFORM_NAME) is ours)
        """,
            VERL_PLATFORM="cpu",
        )
    )
    assert out.split()[-1] == "True"


def test_cpu_platform_is_never_auto_detected():
    from troll_verl.platform.cpu import make_platform_cls

    platform = make_platform_cls()()
    assert not platform.is_platform_available(use_smi_check=True) and platform.is_available()
    assert platform.device_name == "cpu" and platform.communication_backend_name() == "gloo"
    assert str(platform.current_device()) == "cpu" and platform.device_module.max_memory_allocated() == 0
    free, total = platform.device_module.mem_get_info()
    assert 0 < free <= total

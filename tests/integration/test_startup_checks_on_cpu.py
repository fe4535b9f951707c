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
"""TROLL's start-up checks (troll_verl.integration.startup): the plugin active in every process of a run, and an
attention implementation that can load; each refuses, naming the node and the fix, in the driver before Ray starts
(``troll_verl.main.prepare``) and in TROLL's workers at init.

The plugin is disabled the way a cluster disables it, through ``VERL_USE_EXTERNAL_PLUGINS``; where verl itself must
have loaded (or skipped) it, the check runs in a fresh interpreter. No Ray is started: the workers are constructed in
the test's process, where their checks run before verl's worker code.
"""

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from troll_verl.integration import startup
from troll_verl.testing.verl_engine import CPU_OVERRIDES, compose_config

HOST = socket.gethostname()
ACTOR_SDPA = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
CRITIC_SDPA = "+critic.model.override_config.attn_implementation=sdpa"


@pytest.fixture
def gpu_machine(monkeypatch):
    """As on a GPU node: not troll-verl's CPU platform (conftest.py selects it for the suite)."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)


def _config(*overrides, base=()):
    """troll_trainer.yaml with verl's own defaults (flash_attention_2, no CPU settings) plus ``overrides``."""
    return compose_config("/nonexistent", "algorithm.adv_estimator=grpo", *overrides, base=base)


def _flash_attn(monkeypatch, present: bool, provider: str = "flash_attn") -> None:
    monkeypatch.setattr(startup, "_importable", lambda package: present and package == provider)


# --- the plugin: verl's own loading, mirrored -------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, reason",
    [
        ({}, None),
        ({"VERL_USE_EXTERNAL_PLUGINS": "auto"}, None),
        ({"VERL_USE_EXTERNAL_PLUGINS": "other, TROLL"}, None),  # verl compares names in lower case
        ({"VERL_USE_EXTERNAL_PLUGINS": "none"}, "VERL_USE_EXTERNAL_PLUGINS=none switches verl's plugin loading off"),
        ({"VERL_USE_EXTERNAL_PLUGINS": "other"}, "VERL_USE_EXTERNAL_PLUGINS=other lets verl load only ['other']"),
        ({"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "x, troll_verl.integration.plugin"}, None),
    ],
)
def test_plugin_problem_reads_verls_variables(environ, reason):
    problem = startup.plugin_problem(environ)
    assert (problem is None) == (reason is None)
    if problem is not None:
        assert problem[0].startswith(reason)
        assert "unset" in problem[1] or "add it" in problem[1]


def test_plugin_problem_names_a_missing_or_foreign_entry_point(monkeypatch):
    monkeypatch.setattr(startup, "_entry_point_targets", lambda: [])
    reason, fix = startup.plugin_problem({})
    assert "no 'troll' entry point in verl's 'verl.plugins' group" in reason and sys.prefix in reason
    assert "pip install -e ." in fix and "VERL_USE_EXTERNAL_MODULES=troll_verl.integration.plugin" in fix
    monkeypatch.setattr(startup, "_entry_point_targets", lambda: ["other_package.plugin"])
    reason, fix = startup.plugin_problem({})
    assert "['other_package.plugin']" in reason and "uninstall the other package" in fix


@pytest.mark.parametrize("plugins", ["other", "Other,Troll"])
def test_plugin_problem_agrees_with_what_import_verl_loads(plugins):
    """The mirror is checked against verl: in a fresh interpreter with that environment, ``import verl`` loads TROLL's
    plugin exactly where :func:`plugin_problem` finds none."""
    environ = {"VERL_USE_EXTERNAL_PLUGINS": plugins}
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    code = "import sys, verl; print('troll_verl.integration.plugin' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, **environ}, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == str(startup.plugin_problem(environ) is None)


# --- the plugin: the driver, before Ray starts ------------------------------------------------------------------


def test_the_driver_refuses_troll_when_the_workers_would_not_load_the_plugin(monkeypatch):
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    with pytest.raises(RuntimeError) as err:
        startup.check_plugin_active(_config(ACTOR_SDPA))
    msg = str(err.value)
    assert f"not active in the driver on node {HOST}" in msg and "VERL_USE_EXTERNAL_PLUGINS=none" in msg
    assert "policy_loss.loss_mode=troll" in msg and "Fix: unset VERL_USE_EXTERNAL_PLUGINS" in msg
    assert "docs/install.md#clusters" in msg
    # a run that asks for no TROLL (verl's own trainer, clip) needs no plugin
    startup.check_plugin_active(
        _config("trainer.v1.trainer_mode=sync", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla")
    )
    # the Ray job's environment counts too: the workers see ray_init.runtime_env.env_vars
    monkeypatch.delenv("VERL_USE_EXTERNAL_PLUGINS")
    startup.check_plugin_active(_config())
    with pytest.raises(RuntimeError, match="VERL_USE_EXTERNAL_PLUGINS=foo lets verl load only"):
        startup.check_plugin_active(_config("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_PLUGINS=foo"))


def test_prepare_refuses_before_ray_starts(monkeypatch, gpu_machine):
    """``python -m troll_verl.main``'s prepare(), which runs before verl's run_ppo starts Ray, refuses both ways."""
    from troll_verl.main import prepare
    from troll_verl.tools.dry_run import without_model_loading  # verl's validate_config would read the model

    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    with pytest.raises(RuntimeError, match=f"not active in the driver on node {HOST}"):
        prepare(_config(ACTOR_SDPA))
    monkeypatch.delenv("VERL_USE_EXTERNAL_PLUGINS")
    _flash_attn(monkeypatch, present=False)
    runnable = [o for o in CPU_OVERRIDES if "attn_implementation" not in o]  # a config verl validates, flash default
    with pytest.raises(ValueError, match=r"flash_attn package, and neither .* set \+actor_rollout_ref"):
        prepare(without_model_loading(_config("actor_rollout_ref.rollout.name=vllm", base=runnable)))


def test_the_dry_run_command_refuses_a_disabled_plugin(tmp_path):
    """End to end, the driver of ``python -m troll_verl.main`` (TROLL_DRY_RUN=1: the same prepare(), nothing started)
    with the plugin disabled for the run: it exits naming the node and the fix."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(TROLL_DRY_RUN="1", VERL_USE_EXTERNAL_PLUGINS="none", HYDRA_FULL_ERROR="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "troll_verl.main",
            "actor_rollout_ref.model.path=/nonexistent",
            ACTOR_SDPA,
            "actor_rollout_ref.rollout.name=vllm",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode != 0
    expected = f"not active in the driver on node {HOST}: VERL_USE_EXTERNAL_PLUGINS=none"
    assert expected in proc.stderr, proc.stderr[-3000:]


# --- the plugin: each worker, at init ---------------------------------------------------------------------------

_WORKERS_WITHOUT_THE_PLUGIN = """
import os, sys
from types import SimpleNamespace
import verl  # verl's own loading, with VERL_USE_EXTERNAL_PLUGINS=none: TROLL's plugin stays out
from hydra import compose, initialize_config_dir
import troll_verl
from troll_verl.integration.workers import TrollActorTrainingWorker, TrollTrainingWorker

actor = SimpleNamespace(model_type="language_model", model_config=None, engine_config=None)
critic = SimpleNamespace(model_type="value_model", model_config=None, engine_config=None)
for make in (lambda: TrollActorTrainingWorker(actor), lambda: TrollTrainingWorker(critic)):
    try:
        make()
        print("STARTED")
    except RuntimeError as exc:
        print("REFUSED", exc)
print("plugin loaded:", "troll_verl.integration.plugin" in sys.modules)
"""


def test_each_worker_refuses_where_the_plugin_is_not_active():
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    proc = subprocess.run(
        [sys.executable, "-c", _WORKERS_WITHOUT_THE_PLUGIN], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("REFUSED", "STARTED", "plugin"))]
    assert len(lines) == 3 and lines[-1] == "plugin loaded: False", proc.stdout
    for line, process in zip(lines[:2], ("the language_model worker", "the value_model worker"), strict=True):
        assert line.startswith("REFUSED This run asks for TROLL (TROLL's worker started in this process)"), line
        assert f"not active in {process} on node {HOST}: VERL_USE_EXTERNAL_PLUGINS=none" in line, line


def test_a_worker_names_the_error_of_a_plugin_that_failed_to_load(monkeypatch):
    """verl swallows a failing plugin at DEBUG level; the worker check says what failed."""
    monkeypatch.delitem(sys.modules, startup.PLUGIN_MODULE, raising=False)
    monkeypatch.delenv("VERL_USE_EXTERNAL_PLUGINS", raising=False)

    def failing():
        raise ImportError("cannot import name 'x' from 'verl': something is broken")

    monkeypatch.setattr(startup, "_import_plugin", failing)
    with pytest.raises(RuntimeError, match=r"importing troll_verl.integration.plugin fails \(ImportError: cannot"):
        startup.check_worker_start(_config(ACTOR_SDPA).actor_rollout_ref, "actor")


# --- the attention implementation -------------------------------------------------------------------------------


def test_flash_attention_without_flash_attn_is_refused_with_both_fixes(monkeypatch, gpu_machine):
    _flash_attn(monkeypatch, present=False)
    with pytest.raises(ValueError) as err:
        startup.check_attention(_config())
    msg = str(err.value)
    assert "attn_implementation=flash_attention_2 (verl's default" in msg and f"node {HOST}" in msg
    assert "verl[vllm,fsdp]==0.9.1" in msg and f"set {ACTOR_SDPA} (PyTorch's attention" in msg
    # set explicitly: the fix overrides the key (no '+', which Hydra refuses for a key that exists)
    with pytest.raises(ValueError, match=r"set actor_rollout_ref\.model\.override_config\.attn_implementation=sdpa"):
        startup.check_attention(
            _config("+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2")
        )
    startup.check_attention(_config(ACTOR_SDPA))  # PyTorch's attention needs no package
    startup.check_attention(_config(ACTOR_SDPA, "actor_rollout_ref.actor.use_kl_loss=True"))  # and the reference
    _flash_attn(monkeypatch, present=True)
    startup.check_attention(_config())
    # without flash_attn, transformers fetches flash attention from the hub where the kernels package is installed
    _flash_attn(monkeypatch, present=True, provider="kernels")
    startup.check_attention(_config())


def test_the_critic_needs_flash_attn_whatever_its_config_says(monkeypatch, gpu_machine):
    """verl 0.9.1 hard-codes flash_attention_2 for the critic on GPU: sdpa is not offered as its fix."""
    _flash_attn(monkeypatch, present=False)
    ppo = ("algorithm.adv_estimator=gae", ACTOR_SDPA)
    for critic_attention in ((), (CRITIC_SDPA,)):
        with pytest.raises(ValueError) as err:
            startup.check_attention(_config(*ppo, *critic_attention))
        msg = str(err.value)
        assert "PPO's critic" in msg and "setting it to sdpa is no fix" in msg and "verl[vllm,fsdp]==0.9.1" in msg
    _flash_attn(monkeypatch, present=True)
    startup.check_attention(_config(*ppo))


def test_megatron_is_not_checked(monkeypatch, gpu_machine):
    """verl's Megatron engine builds attention with Megatron-Core, not transformers' attn_implementation."""
    _flash_attn(monkeypatch, present=False)
    startup.check_attention(_config("model_engine=megatron", "algorithm.adv_estimator=gae"))


def test_on_the_cpu_platform_flash_attention_is_refused_for_the_critic_too(monkeypatch):
    _flash_attn(monkeypatch, present=True)  # irrelevant on CPU: flash attention cannot run there
    with pytest.raises(ValueError, match=r"On the CPU platform .* set \+critic\.model\.override_config"):
        startup.check_attention(_config(ACTOR_SDPA, "algorithm.adv_estimator=gae"))
    startup.check_attention(_config(ACTOR_SDPA, CRITIC_SDPA, "algorithm.adv_estimator=gae"))


def test_a_dry_run_reports_a_package_missing_here_but_refuses_a_bad_config(monkeypatch, gpu_machine):
    """A dry run validates a run meant for other machines: flash-attn missing *here* is a warning."""
    _flash_attn(monkeypatch, present=False)
    (warning,) = startup.check_attention(_config(), local=False)
    assert "neither flash_attn nor kernels" in warning
    assert startup.check_attention(_config(ACTOR_SDPA), local=False) == []
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    with pytest.raises(ValueError, match="On the CPU platform"):
        startup.check_attention(_config(ACTOR_SDPA, "algorithm.adv_estimator=gae"), local=False)


def test_each_worker_refuses_an_attention_it_cannot_load(monkeypatch, gpu_machine):
    """TROLL's workers run the check first at init, before verl's worker code (no process group, no model)."""
    from troll_verl.integration.workers import TrollActorTrainingWorker, TrollTrainingWorker

    _flash_attn(monkeypatch, present=False)
    cfg = _config()
    actor = SimpleNamespace(
        model_type="language_model",
        model_config=SimpleNamespace(override_config={}),
        engine_config=SimpleNamespace(strategy="fsdp2"),
    )
    with pytest.raises(ValueError, match=r"The actor \(and the reference\) load with attn_implementation=flash"):
        TrollActorTrainingWorker(actor)
    startup.check_worker_start(cfg.actor_rollout_ref, "rollout")  # a rollout-only worker loads no FSDP model
    critic = SimpleNamespace(
        model_type="value_model",
        model_config=SimpleNamespace(override_config={"attn_implementation": "sdpa"}),
        engine_config=SimpleNamespace(strategy="fsdp2"),
    )
    with pytest.raises(ValueError, match="PPO's critic with attn_implementation=flash_attention_2 whatever"):
        TrollTrainingWorker(critic)
    critic.engine_config.strategy = "megatron"
    startup.check_training_worker_start(critic)
    critic.engine_config.strategy, critic.model_type = "fsdp2", "language_model"
    startup.check_training_worker_start(critic)


# ---------------------------------------------------------------------------------------------------------------------
# route_troll_logs: TROLL's warnings in a worker whose root logger vLLM's server import set to ERROR

_ROUTE_SCRIPT = """
import logging, sys
from model_hosting_container_standards.logging_config import configure_root_logger
from troll_verl.integration.startup import route_troll_logs
logging.basicConfig(level=logging.WARNING)  # as importing verl does
if sys.argv[1] == "routed":
    route_troll_logs()
    route_troll_logs()
warn = logging.getLogger("troll_verl.integration.loss_fn").warning
warn("before the import")
configure_root_logger()  # what importing vLLM's OpenAI server (verl's vLLM server) does to the root logger
warn("after the import")
"""


@pytest.mark.parametrize("routed", [True, False])
def test_troll_warnings_survive_vllms_root_logger_change(routed):
    """Each warning is printed once with the route, also after vLLM's server import set the root logger to ERROR;
    without it (verl's worker before), the later one is lost."""
    env = {k: v for k, v in os.environ.items() if k not in ("SAGEMAKER_CONTAINER_LOG_LEVEL", "LOG_LEVEL")}
    proc = subprocess.run(
        [sys.executable, "-c", _ROUTE_SCRIPT, "routed" if routed else "plain"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("before the import") == 1, proc.stderr
    assert proc.stderr.count("after the import") == (1 if routed else 0), proc.stderr


def test_routed_troll_warnings_still_reach_the_root_handlers(caplog, capsys):
    """Where a root handler emits them (pytest's here, Hydra's in the driver), the route prints nothing of its own."""
    import logging

    startup.route_troll_logs()
    with caplog.at_level("WARNING"):
        logging.getLogger("troll_verl.integration.loss_fn").warning("seen by the root")
    assert [r.getMessage() for r in caplog.records] == ["seen by the root"]
    assert "seen by the root" not in capsys.readouterr().err

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
"""Tests of troll_verl.integration.checks and what ``python -m troll_verl.main`` prepares before Ray: the refusals
(each message checked), the settings, and the config keys it sets for verl's own trainers."""

import pytest
from verl.utils.config import omega_conf_to_dataclass

from troll_verl.integration.checks import prepare_troll_run, validate_troll_config
from troll_verl.integration.config import TrollPolicyLossConfig
from troll_verl.testing.verl_engine import compose_config


@pytest.mark.parametrize(
    "override, match",
    [
        ("algorithm.rollout_correction.bypass_mode=true", r"takes the old top-K from verl's vLLM rollout"),
        ("actor_rollout_ref.model.use_fused_kernels=true", r"use_fused_kernels=false"),
        ("actor_rollout_ref.actor.strategy=veomni", r"strategy=fsdp2"),
        ("actor_rollout_ref.actor.pad_to_length=true", r"pad_to_length=false"),
        ("+actor_rollout_ref.actor.megatron.pad_to_length=true", r"megatron\.pad_to_length=true pads"),
        ("distillation.enabled=true", r"distillation.enabled=false"),
        ("trainer.v1.trainer_mode=troll", r"troll-verl's trainer, which is gone.*Set trainer\.v1\.trainer_mode=sync"),
        ("trainer.v1.trainer_mode=troll_colocate_async", r"Set trainer\.v1\.trainer_mode=colocate_async\."),
        ("actor_rollout_ref.actor.policy_loss.kl_bound=-1", r"policy_loss\.kl_bound must be a finite float > 0"),
        ("actor_rollout_ref.actor.policy_loss.topk=0", r"policy_loss\.topk must be an int >= 1"),
        ("actor_rollout_ref.actor.policy_loss.tail=drop", r"policy_loss\.tail must be one of"),
    ],
)
def test_refusals_name_the_setting(override, match):
    with pytest.raises(Exception, match=match):
        validate_troll_config(compose_config("/nonexistent", override))


@pytest.mark.route
def test_the_legacy_trainer_runs_troll_and_its_bypass_mode():
    """trainer.use_v1=false is verl's legacy trainer, whatever the v1 mode key says, in bypass mode too (TROLL's worker
    turns the rollout's top-K columns into the old fields). With the seam
    (upstream/), verl's own legacy trainer tags the passes, untried with TROLL: refused naming trainer.use_v1=true."""
    from troll_verl.integration.seam import seam_available

    if not seam_available():
        bypass = compose_config(
            "/nonexistent",
            "trainer.use_v1=false",
            "algorithm.rollout_correction.bypass_mode=true",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
        )
        assert validate_troll_config(bypass).kl_bound == 0.05
    config = compose_config("/nonexistent", "trainer.use_v1=false", "trainer.v1.trainer_mode=sync")
    if seam_available():
        with pytest.raises(ValueError, match=r"seam.*Set trainer\.use_v1=true"):
            validate_troll_config(config)
    else:
        assert validate_troll_config(config).kl_bound == 0.05


@pytest.mark.route
@pytest.mark.parametrize("stored, refused", [(8, True), (63, True), (0, False), (64, False), (100, False)])
def test_an_old_pass_that_stores_fewer_tokens_than_topk_is_refused_on_the_seam(monkeypatch, stored, refused):
    """With the seam (upstream/ PR C), verl's old-log-prob pass stores actor.calculate_old_topk tokens and TROLL reads
    them: fewer than policy_loss.troll.topk (64) is refused naming the key; 0 means troll_verl.main sets it to topk.
    Stock verl has no such key: the same config passes there."""
    import troll_verl.integration.seam as seam

    config = compose_config("/nonexistent", f"++actor_rollout_ref.actor.calculate_old_topk={stored}")
    monkeypatch.setattr(seam, "route", lambda: seam.SEAM)
    if refused:
        with pytest.raises(
            ValueError,
            match=rf"calculate_old_topk={stored} stores fewer than "
            r"policy_loss\.troll\.topk=64\. Set actor_rollout_ref\.actor\."
            r"calculate_old_topk=64",
        ):
            validate_troll_config(config)
    else:
        assert validate_troll_config(config).topk == 64
    monkeypatch.setattr(seam, "route", lambda: seam.STOCK)
    assert validate_troll_config(config).topk == 64


@pytest.mark.route
@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_verls_own_trainer_modes_run_troll(mode, monkeypatch):
    """TROLL lives in the actor worker: verl's own trainers need no TROLL trainer, on stock verl as on the seam (on a
    GPU machine: separate_async is refused on the CPU platform, below)."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert validate_troll_config(compose_config("/nonexistent", f"trainer.v1.trainer_mode={mode}")).topk == 64


def test_troll_trainer_yaml_and_cli_overrides():
    cfg = compose_config(
        "/nonexistent", "actor_rollout_ref.actor.policy_loss.kl_bound=0.2", "algorithm.adv_estimator=grpo"
    )
    assert cfg.trainer.v1.trainer_mode == "sync"  # verl's own trainer: TROLL lives in the actor worker
    settings = validate_troll_config(cfg)
    assert isinstance(settings, TrollPolicyLossConfig) and settings.kl_bound == 0.2 and settings.topk == 64
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, TrollPolicyLossConfig) and actor.policy_loss.kl_bound == 0.2


@pytest.mark.route
def test_plain_verl_config_with_loss_mode_troll_uses_paper_defaults():
    """verl's stock ppo_trainer config plus loss_mode=troll (no _target_): TROLL runs with the paper's settings."""
    import os

    import verl.trainer
    from hydra import compose, initialize_config_dir

    troll = ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"]
    with initialize_config_dir(os.path.join(os.path.dirname(verl.trainer.__file__), "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=troll)
    settings = validate_troll_config(cfg)
    assert isinstance(settings, TrollPolicyLossConfig)
    assert (settings.kl_bound, settings.alpha, settings.topk, settings.mass_delta) == (0.05, 1.0, 64, 1e-5)

    # ... and with the settings class selected, its keys become overridable (README: "Using TROLL in a verl run")
    overrides = [
        *troll,
        "actor_rollout_ref.actor.policy_loss._target_=troll_verl.config.TrollPolicyLossConfig",
        "+actor_rollout_ref.actor.policy_loss.kl_bound=0.1",
    ]
    with initialize_config_dir(os.path.join(os.path.dirname(verl.trainer.__file__), "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    assert validate_troll_config(cfg).kl_bound == 0.1


@pytest.mark.route
@pytest.mark.parametrize("loss_mode", ["troll", "vanilla"])
def test_what_troll_verl_main_prepares(loss_mode):
    """prepare_troll_run, what troll_verl.main does before Ray starts: nothing for another loss; for TROLL the
    validated settings, TROLL's settings class, and on a verl with the seam the old pass's top-K."""
    import os

    import verl.trainer
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from troll_verl.integration.config import POLICY_LOSS_CONFIG_TARGET
    from troll_verl.integration.seam import seam_available

    overrides = [f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"]
    with initialize_config_dir(os.path.join(os.path.dirname(verl.trainer.__file__), "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    before = OmegaConf.to_yaml(cfg)
    settings = prepare_troll_run(cfg)
    if loss_mode != "troll":
        assert settings is None and OmegaConf.to_yaml(cfg) == before
        return
    assert isinstance(settings, TrollPolicyLossConfig) and settings.topk == 64
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == POLICY_LOSS_CONFIG_TARGET
    stored = cfg.actor_rollout_ref.actor.get("calculate_old_topk", 0)
    assert stored == (settings.topk if seam_available() else 0)
    custom = cfg.actor_rollout_ref.rollout.get("custom") or {}
    assert "troll_topk" not in custom  # not in bypass mode: the rollout is not asked for its top-K


@pytest.mark.route
def test_a_verl_in_neos_shape_runs_its_legacy_trainer(monkeypatch):
    """verl's neo branch: no v1 task runner (refused, naming the fix), and its legacy trainer runs TROLL: nothing of
    TROLL's crosses neo's data plane, whose whitelists keep only the keys they list."""
    from troll_verl import compat

    monkeypatch.setattr(compat, "has_v1_task_runner", lambda: False)
    with pytest.raises(ValueError, match=r"only its legacy trainer.*Set trainer\.use_v1=false"):
        validate_troll_config(compose_config("/nonexistent"))
    legacy = compose_config("/nonexistent", "trainer.use_v1=false")
    from troll_verl.integration.seam import seam_available

    if seam_available():  # upstream/check.sh's seam route: the legacy trainer is refused there for its own reason
        with pytest.raises(ValueError, match=r"seam.*Set trainer\.use_v1=true"):
            validate_troll_config(legacy)
    else:
        assert validate_troll_config(legacy).topk > 0


OFFLOAD = ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.param_offload=true"]


def test_separate_async_is_refused_on_the_cpu_platform(monkeypatch):
    """verl saves separate_async's pi_old with .cpu(), which aliases parameters already on the CPU (and its checkpoint
    engines need NCCL-class backends): refused on the CPU platform, naming the mode to use."""
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    config = compose_config("/nonexistent", "trainer.v1.trainer_mode=separate_async")
    with pytest.raises(ValueError, match=r"on the CPU platform.*trainer_mode=colocate_async"):
        validate_troll_config(config)


def test_separate_async_with_offload_and_several_local_steps_is_refused(monkeypatch):
    """On a GPU the same aliasing with FSDP2's parameter offload: every local step after the first restarts from pi_old
    (for every loss, clip too). Refused naming both settings and verl's function; one local step, or no offload, or
    FSDP1 (whose save copies) pass."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    mode = "trainer.v1.trainer_mode=separate_async"
    steps = "trainer.v1.separate_async.parameter_sync_step=2"
    with pytest.raises(ValueError, match=r"param_offload=true and .*parameter_sync_step=2 .*fsdp2_sharded_save_to_cpu"):
        validate_troll_config(compose_config("/nonexistent", mode, *OFFLOAD, steps))
    one_step = "trainer.v1.separate_async.parameter_sync_step=1"  # verl's default is 4
    for passing in (
        [*OFFLOAD, one_step],
        [OFFLOAD[0], steps],
        ["actor_rollout_ref.actor.strategy=fsdp", OFFLOAD[1], steps],
    ):
        assert validate_troll_config(compose_config("/nonexistent", mode, *passing)).topk == 64


@pytest.mark.route
@pytest.mark.parametrize("mode, manager", [("sync", None), ("colocate_async", "troll_verl.bypass.agent_loop")])
def test_bypass_on_the_asynchronous_trainers_names_trolls_agent_loop_manager(monkeypatch, mode, manager):
    """Bypass mode through troll_verl.main: the rollout is asked for its top-K; on an asynchronous trainer verl builds
    TROLL's agent-loop manager (its client keeps the top-K of resumed requests), named by verl's documented key; a
    manager of the user's own there is refused, naming the key."""
    import importlib

    from omegaconf import OmegaConf

    from troll_verl.bypass.mode import TOPK_AGENT_LOOP_MANAGER

    bypass = [
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"trainer.v1.trainer_mode={mode}",
    ]
    config = compose_config("/nonexistent", *bypass)
    prepare_troll_run(config)
    assert config.actor_rollout_ref.rollout.custom.troll_topk == 64
    named = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class")
    if manager is None:
        assert named is None
        return
    assert named == TOPK_AGENT_LOOP_MANAGER and named.startswith(manager)
    module, cls = named.rsplit(".", 1)
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    assert issubclass(getattr(importlib.import_module(module), cls), AgentLoopManagerTQ)
    own = compose_config(
        "/nonexistent", *bypass, "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.Manager"
    )
    with pytest.raises(ValueError, match=r"agent_loop_manager_class=my\.Manager\. Unset it"):
        prepare_troll_run(own)


@pytest.mark.parametrize("legacy, loop, named", [
    (True, "seeded_single_turn_agent", True), (False, "seeded_single_turn_agent", False),
    (True, "single_turn_agent", False),
])  # fmt: skip
def test_the_seeded_loop_on_the_legacy_trainer_gets_its_manager(legacy, loop, named):
    """verl's legacy agent loop passes no step or answer number: troll_verl.main names the seeded loop's manager there
    (for every loss), through verl's documented key; nowhere else."""
    from omegaconf import OmegaConf

    from troll_verl.rollout import SEEDED_AGENT_LOOP_MANAGER, prepare_seeded_loop

    config = compose_config(
        "/nonexistent",
        f"trainer.use_v1={not legacy}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={loop}",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
    )
    assert prepare_seeded_loop(config) is named
    key = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    assert OmegaConf.select(config, key) == (SEEDED_AGENT_LOOP_MANAGER if named else None)

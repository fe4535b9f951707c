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
"""Tests of troll_verl.integration.trainer: refusals (each message checked), the shared preparation, worker classes,
config path."""

from types import SimpleNamespace

import pytest
import ray
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from troll_verl.integration.checks import validate_troll_config
from troll_verl.integration.config import TrollPolicyLossConfig
from troll_verl.integration.ray_workers import TrollDetachActorWorker
from troll_verl.integration.trainer import (
    TROLL_TRAINERS,
    TrollTrainer,
    TrollTrainerColocateAsync,
    TrollTrainerSeparateAsync,
)
from troll_verl.integration.workers import TrollTrainingWorker
from troll_verl.testing.verl_engine import compose_config

TROLL_CLASSES = [TrollTrainer, TrollTrainerColocateAsync, TrollTrainerSeparateAsync]


@pytest.mark.parametrize(
    "override, match",
    [
        ("algorithm.rollout_correction.bypass_mode=true", r"takes the old top-K from verl's vLLM rollout"),
        ("actor_rollout_ref.model.use_fused_kernels=true", r"use_fused_kernels=false"),
        ("actor_rollout_ref.actor.strategy=veomni", r"strategy=fsdp2"),
        ("actor_rollout_ref.actor.pad_to_length=true", r"pad_to_length=false"),
        ("+actor_rollout_ref.actor.megatron.pad_to_length=true", r"megatron\.pad_to_length=true pads"),
        ("distillation.enabled=true", r"distillation.enabled=false"),
        ("trainer.v1.trainer_mode=troll_colocate", r"not one of TROLL's trainers; use one of \['troll', "),
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
    """trainer.use_v1=false is TROLL's legacy task runner (troll_verl.integration.legacy), whatever the v1 mode key
    says, in bypass mode too (TROLL's worker turns the rollout's top-K columns into the old fields). With the seam
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
    them: fewer than policy_loss.troll.topk (64) is refused naming the key; 0 means TROLL's trainer sets it to topk.
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
def test_verls_own_trainer_modes_run_troll(mode):
    """TROLL lives in the actor worker: verl's own trainers need no TROLL trainer, on stock verl as on the seam."""
    assert validate_troll_config(compose_config("/nonexistent", f"trainer.v1.trainer_mode={mode}")).topk == 64


def test_troll_trainer_yaml_and_cli_overrides():
    cfg = compose_config(
        "/nonexistent", "actor_rollout_ref.actor.policy_loss.kl_bound=0.2", "algorithm.adv_estimator=grpo"
    )
    assert cfg.trainer.v1.trainer_mode == "troll"
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
def test_the_trainers_shared_preparation(loss_mode):
    """prepare_troll_run, what the v1 and legacy trainers do before the workers start: nothing for another loss; for
    TROLL the validated settings, TROLL's settings class, and on a verl with the seam the old pass's top-K."""
    import os

    import verl.trainer
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from troll_verl.integration.checks import prepare_troll_run
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


class _Batch(SimpleNamespace):
    pass


def _trainer(troll=True, cls=TrollTrainer):
    trainer = object.__new__(cls)
    trainer.troll_bypass = False  # the actor recomputes the old distribution (bypass mode: test_bypass_on_cpu.py)
    trainer.troll_settings = TrollPolicyLossConfig() if troll else None
    return trainer


@pytest.mark.parametrize("cls", TROLL_CLASSES, ids=lambda c: c.troll_base_mode)
def test_outside_bypass_mode_the_passes_are_verls_own(monkeypatch, cls):
    """TROLL's trainers tag no pass: the old-log-prob pass, the reference pass and the update are verl's."""
    seen = []

    def record(name):
        def fn(self, batch, metrics):
            seen.append((name, dict(batch.extra_info)))
            return batch

        return fn

    for name in ("_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor"):
        monkeypatch.setattr(PPOTrainer, name, record(name))
    monkeypatch.setattr(PPOTrainerSeparateAsync, "_compute_old_log_prob", record("_compute_old_log_prob"))
    trainer = _trainer(cls=cls)
    for name in ("_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor"):
        getattr(trainer, name)(_Batch(extra_info={}), {})
    assert seen == [(name, {}) for name in ("_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor")]


@pytest.mark.parametrize("cls", TROLL_CLASSES, ids=lambda c: c.troll_base_mode)
def test_worker_classes_are_swapped(monkeypatch, cls):
    from verl.trainer.ppo.utils import Role

    def base(self):
        self.role_worker_mapping = {
            Role.ActorRolloutRef: ray.remote(ActorRolloutRefWorker),
            Role.Critic: ray.remote(TrainingWorker),
        }

    monkeypatch.setattr(PPOTrainer, "_init_resource_pool_mgr", base)
    trainer = _trainer(cls=cls)
    trainer._init_resource_pool_mgr()  # separate_async: verl puts its DetachActorWorker in between
    # verl's actor worker stays (its training worker is TROLL's); separate_async's keeps pi_old apart on the CPU
    actor = TrollDetachActorWorker if cls is TrollTrainerSeparateAsync else ActorRolloutRefWorker
    assert trainer.role_worker_mapping[Role.ActorRolloutRef].__ray_actor_class__ is actor
    assert trainer.role_worker_mapping[Role.Critic].__ray_actor_class__ is TrollTrainingWorker


def test_every_mode_has_one_troll_trainer_in_verls_registry():
    from verl.trainer.ppo.v1 import get_trainer_cls

    bases = {
        "sync": PPOTrainerSync,
        "colocate_async": PPOTrainerColocateAsync,
        "separate_async": PPOTrainerSeparateAsync,
    }
    for name, cls in TROLL_TRAINERS.items():
        assert get_trainer_cls(name) is cls and issubclass(cls, bases[cls.troll_base_mode])
    assert set(TROLL_TRAINERS) == {"troll", "troll_sync", "troll_colocate_async", "troll_separate_async"}
    assert issubclass(TrollDetachActorWorker, DetachActorWorker)


@pytest.mark.parametrize("cls", TROLL_CLASSES, ids=lambda c: c.troll_base_mode)
def test_trainer_runs_as_verls_own_mode(monkeypatch, cls):
    """__init__ validates TROLL, then hands verl a config whose trainer_mode is verl's own (its code paths)."""
    seen = {}

    def init(self, config):
        seen["mode"] = config.trainer.v1.trainer_mode
        self.replay_buffer = SimpleNamespace(poll_interval=2.0)

    monkeypatch.setattr(PPOTrainer, "__init__", init)
    monkeypatch.setattr(PPOTrainerSeparateAsync, "__init__", PPOTrainer.__init__)  # its asserts: tested by the dry run
    mode = "troll" if cls is TrollTrainer else f"troll_{cls.troll_base_mode}"
    cls(compose_config("/nonexistent", f"trainer.v1.trainer_mode={mode}"))
    assert seen["mode"] == cls.troll_base_mode


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

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
"""benchmarks.study.arms: each variant's overrides, schedule and learning rate (no training here)."""

import pytest

from benchmarks.study import arms, powered
from troll_verl.tools.quickstart import MODELS


def test_staleness_arms_run_both_losses_on_the_colocate_async_trainer():
    for variant, warmup in (("async1", 1), ("async2", 2)):
        for loss in ("troll", "clip"):
            overrides = arms.VARIANTS[variant][loss]
            assert "trainer.v1.trainer_mode=colocate_async" in overrides
            assert f"trainer.v1.colocate_async.num_warmup_batches={warmup}" in overrides
        assert "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla" in arms.VARIANTS[variant]["clip"]


def test_eight_updates_per_batch_on_each_model():

    tiny = arms.arm_overrides("grpo8", "troll", MODELS["tiny"])  # 16 prompts x 8 samples: the schedule measured before
    assert tiny[-2:] == [
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    ]
    smollm2 = arms.arm_overrides("grpo8", "clip", MODELS["smollm2"])  # 8 prompts x 4 samples
    assert smollm2[-2:] == [
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]
    assert arms.arm_overrides("grpo", "troll", MODELS["smollm2"]) == arms.VARIANTS["grpo"]["troll"]
    with pytest.raises(ValueError, match="do not split into 3"):
        arms.updates_overrides(3, MODELS["tiny"])


def test_stress_arms_set_the_learning_rate_the_clip_range_and_the_schedule():

    assert arms.LEARNING_RATE["lr1e-4"] == 1e-4 and arms.LEARNING_RATE["lr5e-5_tight"] == 5e-5
    # verl's actor config sets both clip sides explicitly, so each arm sets both
    assert {"actor_rollout_ref.actor.clip_ratio_low=0.1", "actor_rollout_ref.actor.clip_ratio_high=0.1"} <= set(
        arms.VARIANTS["lr1e-4_tight"]["clip"]
    )
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in arms.VARIANTS["lr1e-4_loose"]["clip"]
    assert "actor_rollout_ref.actor.policy_loss.kl_bound=0.02" in arms.VARIANTS["lr1e-4_tight"]["troll"]
    gspo_clip = arms.arm_overrides("gspo8", "clip", MODELS["smollm2"])
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=0.0003",
        "actor_rollout_ref.actor.clip_ratio_high=0.0004",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    } <= set(gspo_clip)
    assert "actor_rollout_ref.actor.policy_loss.ratio_level=sequence" in arms.VARIANTS["gspo8"]["troll"]
    assert arms.BASELINE["lr1e-4_upper"] == "lr1e-4" and set(arms.VARIANTS["lr1e-4_upper"]) == {"troll"}
    assert "actor_rollout_ref.actor.policy_loss.old_estimate=upper" in arms.VARIANTS["gspo8_upper"]["troll"]


def test_the_learning_rate_reaches_the_run_overrides():
    from types import SimpleNamespace

    from troll_verl.tools.quickstart import cpu_run_overrides

    assets = SimpleNamespace(train_file="t", val_file="v", model_dir="m")
    overrides = cpu_run_overrides(MODELS["smollm2"], assets, lr=arms.LEARNING_RATE["lr7e-5"])
    assert "actor_rollout_ref.actor.optim.lr=7e-05" in overrides


def test_the_study_arms_are_the_papers_schedule_and_baselines():

    smollm2 = MODELS["smollm2"]
    for loss in ("troll", "clip", "dppo"):  # 8 optimizer steps per batch: mini-batches of 1 prompt x 4 answers
        assert arms.arm_overrides("paper8", loss, smollm2)[-2:] == [
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        ]
    clip = set(arms.VARIANTS["paper8"]["clip"])
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.2",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
    } == clip
    dppo = set(arms.VARIANTS["paper8"]["dppo"])
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl",
        "actor_rollout_ref.actor.clip_ratio_low=0.05",
        "actor_rollout_ref.actor.clip_ratio_high=0.05",
        "actor_rollout_ref.actor.clip_ratio_c=10000.0",
    } == dppo
    assert arms.VARIANTS["paper8"]["troll"] == ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"]  # defaults
    gspo = set(arms.arm_overrides("paper8_gspo", "clip", smollm2))
    assert {
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    } <= gspo
    assert "actor_rollout_ref.actor.policy_loss.ratio_level=sequence" in arms.VARIANTS["paper8_gspo"]["troll"]
    # the plan's stages: n fixed in advance
    assert [(s.variant, len(s.seeds), s.steps) for s in powered.STUDY] == [
        ("paper8", 15, 30),
        ("paper8", 8, 30),
        ("paper8_gspo", 5, 30),
        ("lr1e-4", 14, 10),
    ]
    assert powered.STUDY[3].seeds == list(range(5, 19))


def test_the_late_decay_arms_are_the_plans(tmp_path):
    # docs/benchmarks.md, "Late-decay study": TROLL's defaults against clip 0.2 / 0.2 with dual-clip 3, 8 updates
    late = arms.VARIANTS["late8"]
    assert late["troll"] == ["actor_rollout_ref.actor.policy_loss.loss_mode=troll"]
    assert "actor_rollout_ref.actor.clip_ratio_c=3.0" in late["clip"]
    assert "actor_rollout_ref.actor.clip_ratio_low=0.2" in late["clip"]
    assert "actor_rollout_ref.actor.clip_ratio_high=0.2" in late["clip"]
    assert arms.UPDATES_PER_BATCH["late8"] == 8

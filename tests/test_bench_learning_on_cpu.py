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
"""scripts/bench_learning.py's statistics and table: the staleness arms and their columns (no training here)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_learning as bl  # noqa: E402

from troll_verl.quickstart import REWARD_KEY  # noqa: E402


def _rows(rewards, staleness=None, kl=None, projected=None, clipped=None, ppo_kl=None):
    rows = []
    for i, reward in enumerate(rewards):
        row = {"step": i + 1, REWARD_KEY: reward, "actor/entropy": 1.0}
        if staleness is not None:
            row["training/off_policy/trajectory_staleness/mean"] = staleness[i]
        if kl is not None:
            row["rollout_corr/kl"] = kl[i]
        if projected is not None:
            row["actor/troll/projected_frac"] = projected
        if clipped is not None:
            row["actor/pg_clipfrac"] = clipped
        if ppo_kl is not None:
            row["actor/ppo_kl"] = ppo_kl[i]
        rows.append(row)
    return rows


def test_staleness_arms_run_both_losses_on_the_colocate_async_trainer():
    for variant, warmup in (("async1", 1), ("async2", 2)):
        for loss in ("troll", "clip"):
            overrides = bl.VARIANTS[variant][loss]
            assert "trainer.v1.trainer_mode=troll_colocate_async" in overrides
            assert f"trainer.v1.colocate_async.num_warmup_batches={warmup}" in overrides
        assert "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla" in bl.VARIANTS[variant]["clip"]


def test_eight_updates_per_batch_on_each_model():
    from troll_verl.quickstart import MODELS

    tiny = bl.arm_overrides("grpo8", "troll", MODELS["tiny"])  # 16 prompts x 8 samples: the schedule measured before
    assert tiny[-2:] == ["actor_rollout_ref.actor.ppo_mini_batch_size=2",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]  # fmt: skip
    smollm2 = bl.arm_overrides("grpo8", "clip", MODELS["smollm2"])  # 8 prompts x 4 samples
    assert smollm2[-2:] == ["actor_rollout_ref.actor.ppo_mini_batch_size=1",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]  # fmt: skip
    assert bl.arm_overrides("grpo", "troll", MODELS["smollm2"]) == bl.VARIANTS["grpo"]["troll"]
    with pytest.raises(ValueError, match="do not split into 3"):
        bl.updates_overrides(3, MODELS["tiny"])


def test_run_stats_reports_staleness_and_kl_to_the_rollout():
    stats = bl.run_stats(_rows([0.1, 0.2, 0.3, 0.4], staleness=[0, 1, 1, 2], kl=[1e-3, 2e-3, 3e-3, 2e-3]), 0.5)
    assert stats["staleness"] == pytest.approx(1.0) and stats["kl_rollout"] == pytest.approx(2e-3)
    synchronous = bl.run_stats(_rows([0.1, 0.2, 0.3]), 0.5)
    assert synchronous["staleness"] is None and synchronous["kl_rollout"] is None and synchronous["kl_update"] is None


def test_run_stats_reports_how_far_the_update_moved_the_policy():
    stats = bl.run_stats(_rows([0.1, 0.2, 0.3, 0.4], ppo_kl=[0.0, 1e-3, 3e-3, 4e-3]), 0.5)
    assert stats["kl_update"] == pytest.approx(2e-3)


def test_report_has_a_staleness_row_per_arm():
    results = {}
    for seed in (0, 1):
        results[f"async2/troll/seed{seed}"] = bl.run_stats(
            _rows([0.1, 0.3, 0.5, 0.6], staleness=[2, 2, 2, 2], kl=[4e-3] * 4, projected=0.2, ppo_kl=[1e-3] * 4), 0.5
        )
        results[f"async2/clip/seed{seed}"] = bl.run_stats(
            _rows([0.1, 0.2, 0.4, 0.5], staleness=[2, 2, 2, 2], kl=[8e-3] * 4, clipped=0.1, ppo_kl=[5e-4] * 4), 0.5
        )
    table = bl.report(results, [0, 1], 4, 0.5, ["async2"])
    (row,) = [line for line in table.splitlines() if line.startswith("| async2 |") and "2.00" in line]
    assert row.rstrip().endswith("| 2.00 | 4.00e-03 / 8.00e-03 | 1.00e-03 / 5.00e-04 |")
    assert "0.200" in row and "0.100" in row  # projected (TROLL), clipped (clip)

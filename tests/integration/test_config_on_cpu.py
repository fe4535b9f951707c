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
"""Tests of troll_verl.integration.config: paper defaults, validation messages, and the _target_ path."""

import pytest
import torch
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from troll_verl.integration.config import TrollPolicyLossConfig, troll_settings


def test_defaults_are_the_papers():
    cfg = TrollPolicyLossConfig()
    assert (cfg.loss_mode, cfg.kl_bound, cfg.alpha, cfg.topk, cfg.mass_delta, cfg.floor) == (
        "troll",
        0.05,
        1.0,
        64,
        1e-5,
        1e-12,
    )
    assert cfg.tail == "bucket" and cfg.ratio_level == "token" and cfg.seq_log_ratio_cap == 10.0
    assert cfg.value_dtype == torch.float32


@pytest.mark.parametrize(
    "field, value",
    [
        ("kl_bound", 0.0),
        ("kl_bound", -0.1),
        ("kl_bound", float("inf")),
        ("alpha", -1.0),
        ("topk", 0),
        ("topk", 2.5),
        ("mass_delta", 0.0),
        ("mass_delta", 1.0),
        ("floor", 0.0),
        ("floor", 2.0),
        ("tail", "drop"),
        ("ratio_level", "seq"),
        ("solver", "brent"),
        ("old_value_dtype", "int8"),
        ("old_estimate", "exact"),
        ("seq_log_ratio_cap", 0.0),
        ("eta_max", -1.0),
        ("solver_max_iter", 0),
        ("solver_tol", 0.0),
        ("chunk_size", 0),
        ("kernels", "cuda"),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"actor_rollout_ref\.actor\.policy_loss\.{field}"):
        TrollPolicyLossConfig(**{field: value})


def test_the_variant_switches_take_the_ablations_and_name_how_to_add_others():
    """troll-verl's settings register the ablations (troll_verl.ablations): every value of theirs is accepted, and a
    value nobody registered is refused with the registered ones listed and the way to add one."""
    cfg = TrollPolicyLossConfig(solver="bisection", tail="renormalize", old_estimate="proportional")
    assert (cfg.solver, cfg.tail, cfg.old_estimate) == ("bisection", "renormalize", "proportional")
    with pytest.raises(ValueError, match=r"tail must be one of \['bucket', 'renormalize'\], got 'drop'; an extension"):
        TrollPolicyLossConfig(tail="drop")


def test_target_path_instantiates_and_validates():
    node = OmegaConf.create(
        {"_target_": "troll_verl.config.TrollPolicyLossConfig", "loss_mode": "troll", "kl_bound": 0.01, "topk": 16}
    )
    cfg = omega_conf_to_dataclass(node)
    assert isinstance(cfg, TrollPolicyLossConfig) and cfg.kl_bound == 0.01 and cfg.topk == 16
    node.kl_bound = -1.0
    with pytest.raises(Exception, match="kl_bound"):
        omega_conf_to_dataclass(node)


def test_troll_settings_from_plain_policy_loss_uses_defaults():
    actor = FSDPActorConfig(
        strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode="troll")
    )
    cfg = troll_settings(actor)
    assert isinstance(cfg, TrollPolicyLossConfig) and cfg.kl_bound == 0.05 and cfg.loss_mode == "troll"
    custom = TrollPolicyLossConfig(kl_bound=0.2)
    actor = FSDPActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=custom)
    assert troll_settings(actor) is custom

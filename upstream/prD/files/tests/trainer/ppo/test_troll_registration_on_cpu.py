# Copyright 2026 Bytedance Ltd. and/or its affiliates
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
"""Loss "troll" in verl's registry: its spec names TROLL's outputs, its modules load on first use, its config keys."""

import dataclasses
import subprocess
import sys

import pytest

from verl.trainer.ppo import core_algos
from verl.workers.config import PolicyLossConfig, TrollConfig


def test_spec_names_the_outputs_of_trolls_hooks():
    from verl.trainer.troll.layout import OLD_TOPK_KEYS
    from verl.trainer.troll.terms import TROLL_LOGITS_OUTPUT_KEYS

    spec = core_algos.get_policy_loss_spec("troll")
    assert spec.logits_output_keys == TROLL_LOGITS_OUTPUT_KEYS
    assert spec.provides_log_probs and spec.needs_logits
    assert OLD_TOPK_KEYS == core_algos.OLD_TOPK_KEYS  # the old top-K it reads is the old pass's named output


def test_registering_imports_no_troll_module():
    code = "import sys, verl.trainer.ppo.core_algos as c; print([m for m in sys.modules if 'verl.trainer.troll' in m])"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_config_keys_and_constants():
    keys = [f.name for f in dataclasses.fields(TrollConfig) if f.name != "_target_"]
    assert keys == ["kl_bound", "alpha", "topk", "ratio_level"]
    assert (TrollConfig.mass_delta, TrollConfig.floor, TrollConfig.seq_log_ratio_cap) == (1e-5, 1e-12, 10.0)
    assert PolicyLossConfig(loss_mode="troll").troll == TrollConfig()
    with pytest.raises(ValueError, match="policy_loss.troll.kl_bound"):
        TrollConfig(kl_bound=0.0)
    with pytest.raises(ValueError, match="ratio_level"):
        TrollConfig(ratio_level="segment")

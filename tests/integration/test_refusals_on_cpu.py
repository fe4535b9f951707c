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
"""What TROLL refuses (docs/design.md, "What TROLL refuses") is refused before training on both ways in:

- ``python -m troll_verl.main``: its ``prepare`` (before Ray) on troll_trainer.yaml;
- ``python -m verl.trainer.main_ppo`` with the one override ``policy_loss.loss_mode=troll``: verl's own
  ppo_trainer.yaml, verl's actor worker built and initialised in this process as main_ppo's workers are (a tiny
  Qwen2, FSDP2, CPU);
  TROLL's actor training worker refuses in ``set_loss_fn``, before any pass.

Each refusal names the setting to change. Bypass mode's refusals are about the rollout's top-K, which only
``troll_verl.main`` asks vLLM for (on verl's own main_ppo the worker recomputes the old top-K, so there is nothing to
refuse): they are in tests/bypass.
"""

import os
import re
import subprocess
import sys

import pytest

from troll_verl.integration.seam import seam_available
from troll_verl.testing.verl_engine import compose_config, make_actor_worker, tiny_model_dir

pytestmark = pytest.mark.skipif(seam_available(), reason="on a verl with the seam verl's own worker runs TROLL")

ONE_OVERRIDE = "actor_rollout_ref.actor.policy_loss.loss_mode=troll"
_SETTINGS = "actor_rollout_ref.actor.policy_loss._target_=troll_verl.config.TrollPolicyLossConfig"
# (row, the setting(s), what the refusal names); {model} is the tiny model's path
REFUSALS = [
    ("fused kernels", ["actor_rollout_ref.model.use_fused_kernels=true"], "use_fused_kernels=false"),
    ("static padding", ["actor_rollout_ref.actor.pad_to_length=true"], "pad_to_length=false"),
    (
        "distillation",
        ["distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path={model}"],
        "distillation.enabled=false",
    ),
    ("an invalid value", [_SETTINGS, "+actor_rollout_ref.actor.policy_loss.kl_bound=-1.0"], "kl_bound must be"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny_qwen2")))


@pytest.mark.parametrize("row,settings,names", REFUSALS, ids=[row for row, _, _ in REFUSALS])
def test_troll_verl_main_refuses_before_ray(model_dir, row, settings, names):
    from troll_verl.main import prepare

    settings = [s.format(model=model_dir).removeprefix("+") for s in settings]  # troll_trainer.yaml declares the keys
    critic = [f"critic.model.path={model_dir}", "critic.ppo_micro_batch_size_per_gpu=2"]  # verl validates it too
    config = compose_config(model_dir, *critic, *settings)
    with pytest.raises(Exception, match=names):
        prepare(config)


# verl's engine patches the model class's forward for fused kernels when it builds the model, before the worker can
# refuse, and for the whole process: that row initialises its worker in a child process
_ISOLATED = {"fused kernels"}
_CHILD = """
import sys
from troll_verl.testing.verl_engine import compose_config, make_actor_worker
try:
    make_actor_worker(compose_config(sys.argv[1], *sys.argv[2:], verls_own=True))
except Exception as error:
    print("REFUSED:", error)
"""


@pytest.mark.parametrize("row,settings,names", REFUSALS, ids=[row for row, _, _ in REFUSALS])
def test_verls_own_main_ppo_refuses_before_any_pass(model_dir, row, settings, names):
    """verl's own config and actor worker with the one override: initialising the worker (what main_ppo's workers do
    before the first step) raises, naming the setting."""
    overrides = [ONE_OVERRIDE, *(s.format(model=model_dir) for s in settings)]
    config = compose_config(model_dir, *overrides, verls_own=True)
    assert config.trainer.v1.trainer_mode == "sync"  # verl's own trainer, nothing of TROLL's config
    if row in _ISOLATED:
        env = {**os.environ, "VERL_PLATFORM": "cpu"}
        child = subprocess.run([sys.executable, "-c", _CHILD, model_dir, *overrides], env=env, capture_output=True,
                               text=True, timeout=300)  # fmt: skip
        assert re.search(f"REFUSED:.*{names}", child.stdout), child.stdout[-2000:] + child.stderr[-2000:]
        return
    with pytest.raises(Exception, match=names):
        make_actor_worker(config)


def test_the_one_override_alone_initialises(model_dir):
    """The control: verl's own config with only the one override builds TROLL's worker (nothing refused)."""
    worker = make_actor_worker(compose_config(model_dir, ONE_OVERRIDE, verls_own=True))
    assert worker.actor.troll_settings is not None and worker.actor.troll_settings.kl_bound == 0.05

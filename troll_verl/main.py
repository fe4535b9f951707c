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
"""``python -m troll_verl.main``: verl's ``main_ppo`` with TROLL's config.

The config is ``troll_verl/config/troll_trainer.yaml`` (``defaults: [ppo_trainer, _self_]``): it selects
``loss_mode=troll`` and TROLL's settings dataclass, every TROLL key declared. Any verl override works as with
``python -m verl.trainer.main_ppo``, on verl's own trainers (``trainer.v1.trainer_mode``, ``trainer.use_v1``);
``actor_rollout_ref.actor.policy_loss.loss_mode=vanilla`` runs the clip baseline. Before Ray starts, :func:`prepare`
runs TROLL's checks (each refusal naming the setting to change) and sets, through verl's own config keys, what TROLL's
actor worker cannot ask for itself: the settings class, bypass mode's rollout top-K and, on the legacy trainer, the
seeded loop's agent-loop manager. Then verl's ``run_ppo`` runs with verl's own task runner (``TaskRunnerV1``, or the
legacy ``TaskRunner``). ``TROLL_DRY_RUN=1`` validates and summarises a run without starting it
(:mod:`troll_verl.tools.dry_run`).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


def prepare(config: DictConfig) -> DictConfig:
    """Validate a composed config as verl's ``main_ppo`` does, plus TROLL's checks and settings
    (:func:`troll_verl.integration.checks.prepare_troll_run`), the seeded loop's manager on the legacy trainer
    (:func:`troll_verl.rollout.prepare_seeded_loop`) and the Ray resource guard.

    Runs before Ray starts; may fill ``ray_kwargs.ray_init.num_cpus``/``num_gpus`` (see
    :mod:`troll_verl.platform.resources`). TROLL's start-up checks refuse, naming the node and the fix, a run whose
    processes would not load troll-verl's plugin and a model whose attention implementation cannot load (in a dry
    run, a package missing on this machine is only reported: the run is meant for others).
    """
    import verl  # noqa: F401  (loads the plugin)
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from troll_verl.compat import check_verl_capabilities
    from troll_verl.integration.checks import prepare_troll_run
    from troll_verl.integration.plugin import register
    from troll_verl.integration.startup import check_attention, check_plugin_active
    from troll_verl.platform.resources import apply_ray_resources, check_cpu_settings
    from troll_verl.rollout import prepare_seeded_loop
    from troll_verl.tools.dry_run import dry_run_requested

    check_verl_capabilities()
    # before register(), which makes this process whole whatever verl loaded: the run's other processes have only verl
    check_plugin_active(config)
    register()
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    prepare_troll_run(config)  # TROLL's refusals and settings (nothing for another loss)
    prepare_seeded_loop(config)
    check_cpu_settings(config)
    check_attention(config, local=not dry_run_requested())
    apply_ray_resources(config)
    return config


@hydra.main(config_path="config", config_name="troll_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Run verl's PPO trainer with TROLL (see the module docstring).

    With ``TROLL_DRY_RUN=1`` in the environment: validate and summarise the run without starting it (no Ray, no
    model or data loading; see :mod:`troll_verl.tools.dry_run`), then return.
    """
    from troll_verl.tools.dry_run import dry_run_requested

    if dry_run_requested():
        from troll_verl.tools.dry_run import dry_run, without_model_loading

        dry_run(prepare(without_model_loading(config)))
        return
    config = prepare(config)
    from verl.trainer.main_ppo import run_ppo

    if config.trainer.get("use_v1", True):
        from troll_verl.compat import has_v1_task_runner

        if not has_v1_task_runner():  # verl's neo branch: its main_ppo runs the legacy trainer only
            raise SystemExit("This verl has no v1 trainer (verl.trainer.main_ppo has no TaskRunnerV1): set "
                             "trainer.use_v1=false to run its legacy trainer.")  # fmt: skip
        from verl.trainer.main_ppo import TaskRunnerV1 as task_runner
    else:  # verl's legacy trainer
        from verl.trainer.main_ppo_v0 import TaskRunner as task_runner
    run_ppo(config, task_runner_class=task_runner)


if __name__ == "__main__":
    main()

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
"""Dry run of ``python -m troll_verl.main`` (TROLL, arXiv:2510.03817): the whole config path, nothing started.

``TROLL_DRY_RUN=1 python -m troll_verl.main <overrides>`` composes the Hydra config as a real run does, passes it
through :func:`troll_verl.main.prepare` (verl's ``validate_config``, TROLL's refusals, the Ray resource guard), then
:func:`dry_run`

- resolves every interpolation (as verl's ``TaskRunnerV1`` does);
- builds the config dataclasses verl's v1 trainer and workers build: actor, rollout, checkpoint engine, model,
  reference (when a KL term needs it), critic (when the advantage estimator needs one), algorithm, distillation
  (when enabled) and the reward's sandbox settings; loads the reward manager class and the custom reward function;
- reads TROLL's settings (``prepare`` ran ``validate_troll_config`` for ``loss_mode=troll``) and runs the start-up
  assertions of verl's workers and engines that depend on the config alone (rollout and Megatron world sizes,
  dynamic-batch flags, token budgets) and of verl's ``separate_async`` trainer (batch = sync steps x mini-batch,
  a standalone rollout pool that holds a replica, a checkpoint engine other than ``naive``), copies of verl's own
  kept in :mod:`troll_verl.tools.verl_startup_checks`;
- prints a compact summary and returns it as a dict.

Nothing else happens: Ray is not started, no model, tokenizer or config file of the model is read or downloaded
(verl's ``HFModelConfig`` loads them in ``__post_init__``; :func:`without_model_loading` swaps in
:class:`UnloadedHFModelConfig`), and the data files are not read (only checked for existence). verl has no config
dataclass for ``data`` (``RLHFDataset`` reads the plain dict when it loads the files), so ``data`` is reported
as is. Used by the recipes in ``recipe/troll`` (``DRY_RUN=1``) and by CI.

``python -m troll_verl.tools.dry_run FILE...`` (:func:`main`) dry-runs several recorded launch commands in one process,
so verl's import (several seconds) is paid once instead of once per command. The recipes record their command
instead of running it with ``DRY_RUN=1 DRY_RUN_RECORD=FILE``; ``recipe/troll/sweep.sh`` checks a grid this way.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from verl.workers.config import HFModelConfig

from .verl_startup_checks import check_startup, check_trainer_mode, trainer_gpus

__all__ = [
    "DRY_RUN_ENV",
    "UnloadedHFModelConfig",
    "dry_run",
    "dry_run_command",
    "dry_run_requested",
    "format_summary",
    "main",
    "read_command",
    "without_model_loading",
]

DRY_RUN_ENV = "TROLL_DRY_RUN"
PREFIX = "[TROLL dry run]"
# Config sections verl instantiates as HFModelConfig (actor/rollout/ref model, critic model).
_MODEL_SECTIONS = ("actor_rollout_ref.model", "critic.model")
# The entry point a recorded command must run (python -m troll_verl.main <overrides>).
ENTRY_MODULE = "troll_verl.main"
# Engine-config fields reported in the summary's actor_parallel, when the engine has them (FSDP or Megatron).
_PARALLEL_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "ulysses_sequence_parallel_size",
    "fsdp_size",
)


def dry_run_requested(environ: dict[str, str] | None = None) -> bool:
    """True when ``TROLL_DRY_RUN`` is set to 1/true/yes (case-insensitive)."""
    value = (os.environ if environ is None else environ).get(DRY_RUN_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


class UnloadedHFModelConfig(HFModelConfig):
    """verl's ``HFModelConfig`` with its fields only: nothing is read, downloaded or tokenised.

    verl's ``__post_init__`` copies the model to local disk, loads the tokenizer, processor, generation config and
    ``AutoConfig`` (a hub download for a hub id); a dry run keeps the declared fields and fills only the paths.
    """

    def __post_init__(self):
        if self.hf_config_path is None:
            self.hf_config_path = self.path
        if self.tokenizer_path is None:
            self.tokenizer_path = self.path


def without_model_loading(config: DictConfig) -> DictConfig:
    """Point every ``HFModelConfig`` section of ``config`` at :class:`UnloadedHFModelConfig` (in place).

    Call it before :func:`troll_verl.main.prepare` in a dry run: verl's ``validate_config`` instantiates the critic
    config, model included, when the advantage estimator needs a critic.

    Returns:
        ``config`` itself.
    """
    target = f"{UnloadedHFModelConfig.__module__}.{UnloadedHFModelConfig.__qualname__}"
    for key in _MODEL_SECTIONS:
        section = OmegaConf.select(config, key, default=None)
        if isinstance(section, DictConfig) and _is_hf_model_target(section.get("_target_")):
            with open_dict(section):
                section._target_ = target
    return config


def _is_hf_model_target(target: Any) -> bool:
    """True when ``target`` names verl's ``HFModelConfig`` (``verl.workers.config.HFModelConfig`` or its module)."""
    if not isinstance(target, str):
        return False
    from hydra.utils import get_class

    try:
        return get_class(target) is HFModelConfig
    except Exception:  # not importable: leave it to verl's own error
        return False


def _infer_variant(loss_mode: str, adv_estimator: str, norm_by_std: bool, agg_mode: str, ratio_level: str | None):
    """The recipe's VARIANT name for a config (the README's variants table), or the advantage estimator's name."""
    if adv_estimator == "gae":
        return "ppo"
    if adv_estimator != "grpo":
        return adv_estimator
    if loss_mode == "gspo" or ratio_level == "sequence":
        return "gspo"
    if not norm_by_std and agg_mode == "seq-mean-token-sum-norm":
        return "drgrpo"
    return "grpo"


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def dry_run(config: DictConfig) -> dict[str, Any]:
    """Build and check everything a run would build from ``config``, start nothing; print and return a summary.

    Args:
        config: a composed ``troll_trainer`` config that went through :func:`troll_verl.main.prepare` (for a dry
            run, after :func:`without_model_loading`). It is not modified.

    Returns:
        The summary: variant, loss settings, data files, model, strategy, batch sizes, GPUs, ... (JSON-serialisable).

    Raises:
        ValueError, AssertionError, omegaconf/hydra errors: verl's or TROLL's message for an invalid configuration.
    """
    from verl.trainer.ppo.reward import get_custom_reward_fn, resolve_reward_manager_cls
    from verl.trainer.ppo.utils import need_critic, need_reference_policy, need_reward_model, need_teacher_policy
    from verl.utils.config import omega_conf_to_dataclass

    from troll_verl.integration.checks import uses_troll
    from troll_verl.integration.config import troll_settings

    config = without_model_loading(copy.deepcopy(config))
    # verl's TaskRunnerV1 resolves the config before building anything: every interpolation must resolve.
    OmegaConf.resolve(config)
    arr = config.actor_rollout_ref

    # What verl's trainer and workers build (v1 trainer_base._setup, engine_workers.ActorRolloutRefWorker).
    model = omega_conf_to_dataclass(arr.model)
    actor = omega_conf_to_dataclass(arr.actor)
    rollout = omega_conf_to_dataclass(arr.rollout)
    omega_conf_to_dataclass(arr.rollout.checkpoint_engine)
    algorithm = omega_conf_to_dataclass(config.algorithm)
    use_ref = need_reference_policy(config)
    if use_ref:
        ref_section = copy.deepcopy(arr.ref)
        with open_dict(ref_section):  # the worker's renames (engine_workers.ActorRolloutRefWorker.init_model)
            ref_section.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
            ref_section.ppo_micro_batch_size = ref_section.pop("log_prob_micro_batch_size", None)
            ref_section.ppo_micro_batch_size_per_gpu = ref_section.pop("log_prob_micro_batch_size_per_gpu", None)
            ref_section.use_dynamic_bsz = ref_section.pop("log_prob_use_dynamic_bsz", False)
            ref_section.ppo_max_token_len_per_gpu = ref_section.pop("log_prob_max_token_len_per_gpu", None)
        omega_conf_to_dataclass(ref_section)
    critic = omega_conf_to_dataclass(config.critic) if need_critic(config) else None
    if need_teacher_policy(config):
        omega_conf_to_dataclass(config.distillation)
    sandbox = omega_conf_to_dataclass(config.reward.sandbox_fusion)
    resolve_reward_manager_cls(config)
    get_custom_reward_fn(config)  # imports the reward module and looks the function up, as the reward loop does

    # prepare() ran validate_troll_config (again here, it would repeat its warnings)
    troll = troll_settings(actor) if uses_troll(config.actor_rollout_ref.actor.policy_loss) else None
    warnings = check_startup(config, actor, rollout, use_ref, critic)
    warnings += check_trainer_mode(config, need_reward_model(config), troll is not None)

    loss_mode = actor.policy_loss.loss_mode
    ratio_level = troll.ratio_level if troll is not None else None
    train_files, val_files = _files(config.data.train_files), _files(config.data.val_files)
    missing = [f for f in train_files + val_files if not os.path.exists(os.path.expanduser(f))]
    custom_fn = config.reward.get("custom_reward_function") or {}
    n_gpus = trainer_gpus(config)
    summary: dict[str, Any] = {
        "variant": _infer_variant(
            loss_mode, algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo, actor.loss_agg_mode, ratio_level
        ),
        "loss_mode": loss_mode,
        "adv_estimator": algorithm.adv_estimator,
        "norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std_in_grpo,
        "loss_agg_mode": actor.loss_agg_mode,
    }
    if troll is not None:
        summary.update(
            ratio_level=troll.ratio_level,
            kl_bound=troll.kl_bound,
            alpha=troll.alpha,
            topk=troll.topk,
            mass_delta=troll.mass_delta,
            tail=troll.tail,
            kernels=troll.kernels,  # the config's; TROLL_KERNELS in a worker overrides it
        )
    else:
        summary.update(
            clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high, clip_ratio_c=actor.clip_ratio_c
        )
    summary.update(
        model=model.path,
        model_loaded=False,
        strategy=actor.strategy,
        actor_parallel={k: getattr(actor.engine, k) for k in _PARALLEL_FIELDS if hasattr(actor.engine, k)},
        param_offload=actor.engine.param_offload,
        optimizer_offload=actor.engine.optimizer_offload,
        rollout=rollout.name,
        rollout_tp=rollout.tensor_model_parallel_size,
        n_gpus=n_gpus,
        nnodes=int(config.trainer.nnodes),
        n_gpus_per_node=int(config.trainer.n_gpus_per_node),
        train_batch_size=int(config.data.train_batch_size),
        rollout_n=rollout.n,
        ppo_mini_batch_size=actor.ppo_mini_batch_size,
        use_dynamic_bsz=actor.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None,
        ppo_micro_batch_size_per_gpu=None if actor.use_dynamic_bsz else actor.ppo_micro_batch_size_per_gpu,
        max_prompt_length=int(config.data.max_prompt_length),
        max_response_length=int(config.data.max_response_length),
        lr=actor.optim.lr,
        entropy_coeff=actor.entropy_coeff,
        use_kl_loss=actor.use_kl_loss,
        use_kl_in_reward=algorithm.use_kl_in_reward,
        temperature=rollout.temperature,
        reference_model=use_ref,
        critic=critic.strategy if critic is not None else None,
        critic_lr=critic.optim.lr if critic is not None else None,
        train_files=train_files,
        val_files=val_files,
        data_files_missing=missing,
        reward_function=f"{custom_fn.get('path')}:{custom_fn.get('name')}" if custom_fn.get("path") else None,
        sandbox_fusion_url=sandbox.url,
        total_training_steps=config.trainer.total_training_steps,
        test_freq=int(config.trainer.test_freq),
        save_freq=int(config.trainer.save_freq),
        trainer_mode=config.trainer.v1.trainer_mode,
        project_name=config.trainer.project_name,
        experiment_name=config.trainer.experiment_name,
        warnings=warnings,
    )
    print(format_summary(summary), flush=True)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The printed form of :func:`dry_run`'s summary: a header, one ``key value`` line each, then one JSON line."""
    lines = [
        f"{PREFIX} OK: the config composed, resolved and passed verl's and TROLL's validation and verl's config "
        "dataclasses were built.",
        f"{PREFIX} Nothing was started: no Ray, no model/tokenizer loaded or downloaded (HFModelConfig skipped), "
        "no data read.",
    ]
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        lines.append(f"{PREFIX}   {key:<{width}}  {value}")
    for file in summary.get("data_files_missing", []):
        lines.append(f"{PREFIX} note: data file not found here: {file}")
    for warning in summary.get("warnings", []):
        lines.append(f"{PREFIX} warning: {warning}")
    lines.append(f"{PREFIX} json {json.dumps(summary, sort_keys=True, default=str)}")
    return "\n".join(lines)


def read_command(path: str) -> list[str]:
    """The overrides of a recorded ``-m troll_verl.main <overrides>`` command (``DRY_RUN_RECORD`` in the recipes).

    Args:
        path: a file holding the interpreter's arguments, each followed by a NUL byte (bash ``printf '%s\\0'``).

    Returns:
        The arguments after ``-m troll_verl.main``.

    Raises:
        ValueError: when the file does not record a ``-m troll_verl.main`` command.
    """
    with open(path, "rb") as f:
        parts = f.read().split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    argv = [part.decode() for part in parts]
    if argv[:2] != ["-m", ENTRY_MODULE]:
        raise ValueError(f"{path} does not record a `-m {ENTRY_MODULE}` command (it starts with {argv[:2]}).")
    return argv[2:]


def dry_run_command(args: Sequence[str]) -> int:
    """Dry-run ``python -m troll_verl.main *args`` in this process, as that command does with ``TROLL_DRY_RUN=1``.

    The module runs as ``__main__`` (``runpy``), so Hydra finds its config as it does for ``python -m``; ``sys.argv``,
    the working directory and ``TROLL_DRY_RUN`` are restored afterwards.

    Args:
        args: the command-line arguments after ``-m troll_verl.main`` (Hydra flags and overrides).

    Returns:
        The exit status the command would have had: 0 when the config is valid, else non-zero (Hydra has printed
        the error).
    """
    saved_argv, saved_cwd, saved_flag = sys.argv, os.getcwd(), os.environ.get(DRY_RUN_ENV)
    os.environ[DRY_RUN_ENV] = "1"
    sys.argv = [ENTRY_MODULE, *args]  # runpy puts the module's file in argv[0], as `python -m` does
    try:
        runpy.run_module(ENTRY_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # Hydra reports an invalid config and exits 1
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception:  # HYDRA_FULL_ERROR=1 re-raises instead of exiting
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        if saved_flag is None:
            os.environ.pop(DRY_RUN_ENV, None)
        else:
            os.environ[DRY_RUN_ENV] = saved_flag
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m troll_verl.tools.dry_run [--stop-on-failure] FILE...``: dry-run recorded commands, one after another.

    Prints ``=== <name> (i/n) ===`` before each command (its summary or Hydra's error follows), ``result <name>: OK``
    or ``FAILED`` after it, and a final tally.

    Returns:
        0 when every command is valid, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="python -m troll_verl.tools.dry_run",
        description="Dry-run recorded `python -m troll_verl.main` commands (DRY_RUN=1 DRY_RUN_RECORD=FILE in "
        "recipe/troll) in one process: each is composed and validated as TROLL_DRY_RUN=1 would, nothing is started.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="a recorded command (NUL-separated arguments)")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first invalid command")
    args = parser.parse_args(argv)

    failed: list[str] = []
    checked = 0
    for i, path in enumerate(args.files, 1):
        name = os.path.splitext(os.path.basename(path))[0]
        print(f"{PREFIX} === {name} ({i}/{len(args.files)}) ===", flush=True)
        try:
            status = dry_run_command(read_command(path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            print(f"{PREFIX} cannot read {path}: {exc}", file=sys.stderr, flush=True)
            status = 2
        checked += 1
        print(f"{PREFIX} result {name}: {'OK' if status == 0 else f'FAILED (exit status {status})'}", flush=True)
        if status:
            failed.append(name)
            if args.stop_on_failure:
                break
    tally = f"{checked} of {len(args.files)} commands checked: {checked - len(failed)} OK, {len(failed)} failed"
    print(f"{PREFIX} {tally}" + (f" ({', '.join(failed)})" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

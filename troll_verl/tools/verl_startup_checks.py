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
"""verl 0.9.1's start-up assertions that only a live worker, engine or trainer would run, as config checks.

The dry run (:mod:`troll_verl.tools.dry_run`) builds verl's config dataclasses and then asks :func:`check_startup`
(workers and engines: rollout and Megatron world sizes, dynamic-batch flags, token budgets) and
:func:`check_trainer_mode` (``separate_async``: batch = sync steps x mini-batch, a standalone rollout pool that holds
a replica, a checkpoint engine other than ``naive``). Each is a copy of a statement inline in verl
(registered in :data:`troll_verl.compat.MIRRORED_STATEMENTS`, whose test checks that verl's source still holds it;
the two whose verl code runs without a cluster, seqlen_balancing's token budget and RolloutReplica's node tiling, are
also tested against verl's behaviour at their boundaries).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig
from verl.workers.config import McoreEngineConfig

__all__ = ["check_startup", "check_trainer_mode", "trainer_gpus"]


def trainer_gpus(config: DictConfig) -> int:
    """The trainer's GPUs: ``trainer.n_gpus_per_node`` x ``trainer.nnodes``."""
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def check_startup(config: DictConfig, actor: Any, rollout: Any, use_ref: bool, critic: Any | None) -> list[str]:
    """verl's start-up assertions that depend on the config alone and that only a live worker would run (see
    :data:`troll_verl.compat.MIRRORED_STATEMENTS`); returns warnings. What verl's own ``validate_config`` checks
    (``prepare`` ran it: batch sizes without dynamic batching, the actor's Megatron parallel sizes) is not repeated
    here.

    Raises:
        ValueError: naming the setting to change.
    """
    warnings: list[str] = []
    arr = config.actor_rollout_ref
    n_gpus = trainer_gpus(config)

    # engine_workers.ActorRolloutRefWorker.init_model: colocated rollout replicas tile the trainer's GPUs (not with
    # separate_async's hybrid_engine=false, where the actor has no rollout role) ...
    infer_world = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    colocated = bool(arr.get("hybrid_engine", True))
    if colocated and n_gpus % infer_world:
        raise ValueError(
            f"rollout world_size ({n_gpus} GPUs = trainer.n_gpus_per_node x trainer.nnodes) is not divisible by "
            f"infer_world_size ({infer_world} = actor_rollout_ref.rollout.tensor_model_parallel_size x "
            "data_parallel_size x pipeline_model_parallel_size)."
        )
    # ... and rollout/replica.RolloutReplica: a replica spans whole nodes or fits in one.
    per_node = int(rollout.n_gpus_per_node)
    if infer_world % min(per_node, infer_world):
        raise ValueError(
            f"a rollout replica of {infer_world} GPUs (tensor x data x pipeline parallel) must fill whole nodes of "
            f"actor_rollout_ref.rollout.n_gpus_per_node={per_node} GPUs; choose a rollout parallel size that divides "
            "it or is a multiple of it."
        )
    # Megatron-Core's initialize_model_parallel: the GPUs tile into TP x PP x CP groups. verl's validate_config checks
    # the actor only without dynamic batching; the critic and the dynamic-batching actor are checked here.
    engines = [("actor_rollout_ref.actor.megatron", actor.engine)] if arr.actor.use_dynamic_bsz else []
    if critic is not None:
        engines.append(("critic.megatron", critic.engine))
    for key, engine in engines:
        if not isinstance(engine, McoreEngineConfig):
            continue
        model_parallel = (
            engine.tensor_model_parallel_size * engine.pipeline_model_parallel_size * engine.context_parallel_size
        )
        if n_gpus % model_parallel:
            raise ValueError(
                f"{n_gpus} GPUs (trainer.n_gpus_per_node x trainer.nnodes) is not divisible by the Megatron model "
                f"parallel size {model_parallel} = {key}.tensor_model_parallel_size x pipeline_model_parallel_size "
                "x context_parallel_size."
            )
    if bool(arr.actor.use_dynamic_bsz) != bool(arr.rollout.log_prob_use_dynamic_bsz):
        raise ValueError(
            "actor_rollout_ref.actor.use_dynamic_bsz and actor_rollout_ref.rollout.log_prob_use_dynamic_bsz must be "
            f"equal, got {arr.actor.use_dynamic_bsz} and {arr.rollout.log_prob_use_dynamic_bsz}."
        )
    # validate_config checks the mini-batch against the batch only without dynamic batching; the v1 trainer then pads
    # the batch up to a multiple of the mini-batch, so a mini-batch larger than the batch trains mostly on padding.
    batch, mini = int(config.data.train_batch_size), int(actor.ppo_mini_batch_size)
    if arr.actor.use_dynamic_bsz and batch < mini:
        raise ValueError(
            f"data.train_batch_size ({batch}) must be >= actor_rollout_ref.actor.ppo_mini_batch_size ({mini})."
        )
    if batch % mini:
        warnings.append(
            f"data.train_batch_size ({batch}) is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size "
            f"({mini}); verl's v1 trainer pads every batch with dummy sequences up to a multiple."
        )
    # seqlen_balancing.rearrange_micro_batches asserts max_token_len_per_gpu x sp_size >= the longest sequence at the
    # first step. The v1 trainer's critic always batches dynamically, with ppo_infer_max_token_len_per_gpu.
    longest = int(config.data.max_prompt_length) + int(config.data.max_response_length)

    def sp_of(engine) -> int:
        return int(
            getattr(engine, "ulysses_sequence_parallel_size", None) or getattr(engine, "context_parallel_size", 1)
        )

    budgets = []
    if arr.actor.use_dynamic_bsz:
        budgets.append(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", arr.actor.ppo_max_token_len_per_gpu,
                        sp_of(actor.engine)))  # fmt: skip
        budgets.append(("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                        arr.rollout.log_prob_max_token_len_per_gpu, sp_of(actor.engine)))  # fmt: skip
    if use_ref and arr.ref.get("log_prob_use_dynamic_bsz", arr.actor.use_dynamic_bsz):
        budgets.append(("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", arr.ref.log_prob_max_token_len_per_gpu,
                        sp_of(actor.engine)))  # fmt: skip
    if critic is not None:
        budgets.append(("critic.ppo_infer_max_token_len_per_gpu", critic.ppo_infer_max_token_len_per_gpu,
                        sp_of(critic.engine)))  # fmt: skip
    for key, budget, sp in budgets:
        if budget is None or int(budget) * sp < longest:
            raise ValueError(
                f"{key}={budget} (x sequence-parallel size {sp}) is below the longest sequence, "
                f"data.max_prompt_length + data.max_response_length = {longest}; verl's dynamic batching would "
                f"fail at the first step. Set {key} >= {(longest + sp - 1) // sp}."
            )
    return warnings


def check_trainer_mode(config: DictConfig, use_reward_model: bool, troll: bool) -> list[str]:
    """verl's async trainers' start-up assertions (``PPOTrainerSeparateAsync.__init__``); returns warnings.

    Raises:
        ValueError: naming the setting to change.
    """
    mode = str(config.trainer.v1.trainer_mode)
    warnings: list[str] = []
    if mode != "separate_async":
        return warnings
    batch, mini = int(config.data.train_batch_size), int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    sync_step = int(config.trainer.v1.separate_async.parameter_sync_step)
    if batch != sync_step * mini:
        raise ValueError(
            f"separate_async needs data.train_batch_size ({batch}) = trainer.v1.separate_async.parameter_sync_step "
            f"({sync_step}) x actor_rollout_ref.actor.ppo_mini_batch_size ({mini}); set data.train_batch_size="
            f"{sync_step * mini} or parameter_sync_step={batch // mini if batch % mini == 0 else '<a divisor>'}."
        )
    rollout = config.actor_rollout_ref.rollout
    for key in ("nnodes", "n_gpus_per_node"):
        if int(rollout[key]) <= 0:
            raise ValueError(
                f"separate_async runs its rollout on a standalone pool: set actor_rollout_ref.rollout.{key} > 0."
            )
    # rollout/llm_server.LLMServerManager: the standalone pool holds num_replicas = its GPUs // a replica's GPUs
    pool_gpus = int(rollout.nnodes) * int(rollout.n_gpus_per_node)
    replica_gpus = (
        int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size)
        * int(rollout.pipeline_model_parallel_size)
    )  # fmt: skip
    if pool_gpus < replica_gpus:
        raise ValueError(
            f"the standalone rollout pool ({pool_gpus} GPUs = actor_rollout_ref.rollout.nnodes x n_gpus_per_node) "
            f"holds no replica of {replica_gpus} GPUs (rollout tensor x data x pipeline parallel): raise the pool "
            "or lower the rollout's parallel sizes."
        )
    switch = config.trainer.v1.separate_async.get("hybrid_rollout", {}) or {}
    if switch.get("enable_switch", False) and (rollout.get("disaggregation", {}) or {}).get("enabled", False):
        raise ValueError(
            "trainer.v1.separate_async.hybrid_rollout.enable_switch does not support rollout disaggregation: set "
            "one of them to false."
        )
    if rollout.checkpoint_engine.backend == "naive":
        raise ValueError(
            "separate_async syncs weights to its standalone rollout through a checkpoint engine: set "
            "actor_rollout_ref.rollout.checkpoint_engine.backend to nccl (or nixl, mooncake, ...), not naive."
        )
    if use_reward_model and not config.reward.reward_model.enable_resource_pool:
        raise ValueError(
            "separate_async cannot colocate the reward model (its rollout never pauses): set "
            "reward.reward_model.enable_resource_pool=true."
        )
    if troll:
        warnings.append(
            "trainer mode separate_async with TROLL has not run end to end (verl's checkpoint engines for a "
            "standalone rollout need NCCL-class backends); its old pass on the restored pi_old weights is "
            "unit-tested on verl's worker group. Check troll/* metrics on the first steps."
        )
    return warnings

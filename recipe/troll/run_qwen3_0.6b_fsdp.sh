#!/usr/bin/env bash
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

# TROLL | text | vLLM rollout | FSDP training | GPU
# TROLL: Trust Regions improve Reinforcement Learning for Large Language Models (arXiv:2510.03817).
# Qwen3-0.6B on one GPU (FSDP2 actor, colocated vLLM). The matrix cell comes from VARIANT / DATASET / LOSS_MODE
# (common.sh); extra Hydra overrides are passed through. DRY_RUN=1 validates it on any machine;
# CPU=1 runs it on a CPU-only one (README "CPU mode").

set -euo pipefail
if [[ "${TRACE:-0}" == 1 ]]; then set -x; fi

########################### user-adjustable ###########################
# Policy (and, for VARIANT=ppo, critic) initialisation: a Hugging Face id or a local path; empty = Qwen/Qwen3-0.6B
# (CPU=1: SmolLM2-135M-Instruct, built by python -m troll_verl.assets.smollm2).
MODEL_PATH=${MODEL_PATH:-}
# Number of nodes and GPUs per node.
NNODES=${NNODES:-1}
NGPUS=${NGPUS:-1}
# Token budget per GPU and micro-batch (training, log-prob, critic); empty = 4 x (prompt + response length).
PPO_MAX_TOKEN_LEN_PER_GPU=${PPO_MAX_TOKEN_LEN_PER_GPU:-}
# vLLM tensor parallelism and the fraction of GPU memory it may take.
ROLLOUT_TP=${ROLLOUT_TP:-1}
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.5}
# 1 = offload FSDP parameters and optimizer state to CPU (less GPU memory, slower).
OFFLOAD=${OFFLOAD:-0}
# Qwen3's chat-template thinking mode: 0 = off (answers fit the response lengths), 1 = on.
THINKING=${THINKING:-0}
########################### end user-adjustable ###########################

recipe_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
model_tag=qwen3_0.6b
default_model_path=Qwen/Qwen3-0.6B
# shellcheck source=common.sh source-path=SCRIPTDIR
source "${recipe_dir}/common.sh"

########################### derived defaults ###########################
ppo_max_token_len_per_gpu=${PPO_MAX_TOKEN_LEN_PER_GPU:-$((4 * (max_prompt_length + max_response_length)))}
offload=False
if [[ "${OFFLOAD}" == 1 ]]; then offload=True; fi
thinking=False
if [[ "${THINKING}" == 1 ]]; then thinking=True; fi

########################### parameter arrays ###########################
MODEL=(
    "actor_rollout_ref.model.path='${model_path}'"
    "+data.apply_chat_template_kwargs.enable_thinking=${thinking}"
)

ACTOR=(
    actor_rollout_ref.actor.strategy=fsdp2
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${ppo_max_token_len_per_gpu}"
    "actor_rollout_ref.actor.fsdp_config.param_offload=${offload}"
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=${offload}"
)

ROLLOUT=(
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${ROLLOUT_GPU_MEM_UTIL}"
)

if ((use_critic)); then
    CRITIC+=(
        "critic.ppo_max_token_len_per_gpu=${ppo_max_token_len_per_gpu}"
        "critic.fsdp.param_offload=${offload}"
        "critic.fsdp.optimizer_offload=${offload}"
    )
fi

TRAINER=(
    "${TRAINER_COMMON[@]}"
    "trainer.nnodes=${NNODES}"
    "trainer.n_gpus_per_node=${NGPUS}"
)

########################### launch ###########################
"${LAUNCH[@]}" -m troll_verl.main \
    "${RECIPE[@]}" \
    "${DATA[@]}" \
    "${ALGORITHM[@]}" \
    "${MODEL[@]}" \
    "${ATTENTION[@]}" \
    "${ACTOR[@]}" \
    "${POLICY_LOSS[@]}" \
    "${ROLLOUT[@]}" \
    "${CRITIC[@]}" \
    "${REWARD[@]}" \
    "${TRAINER[@]}" \
    "${CPU_MODE[@]}" \
    "$@"

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

# TROLL | text | vLLM rollout | Megatron training | GPU
# TROLL: Trust Regions improve Reinforcement Learning for Large Language Models (arXiv:2510.03817).
# Qwen3-8B on one node of 8 GPUs: Megatron-Core actor (and critic for VARIANT=ppo) with tensor / pipeline / context
# parallelism knobs, colocated vLLM with tensor parallelism 2. The matrix cell comes from VARIANT / DATASET /
# LOSS_MODE (common.sh); extra Hydra overrides are passed through. DRY_RUN=1 validates it on any machine.

set -euo pipefail
if [[ "${TRACE:-0}" == 1 ]]; then set -x; fi

########################### user-adjustable ###########################
# Policy (and, for VARIANT=ppo, critic) initialisation: a Hugging Face id or a local path (loaded through
# Megatron-Bridge, verl's default); empty = Qwen/Qwen3-8B.
MODEL_PATH=${MODEL_PATH:-}
# Optional Megatron distributed checkpoint of MODEL_PATH (faster start-up); empty = convert from MODEL_PATH.
MCORE_MODEL_PATH=${MCORE_MODEL_PATH:-}
# Number of nodes and GPUs per node.
NNODES=${NNODES:-1}
NGPUS=${NGPUS:-8}
# Megatron parallelism of the actor (the critic uses the same): tensor, pipeline, virtual pipeline (empty = none;
# needs ACTOR_PP > 1) and context parallel sizes. NNODES x NGPUS must be a multiple of TP x PP x CP.
ACTOR_TP=${ACTOR_TP:-2}
ACTOR_PP=${ACTOR_PP:-1}
ACTOR_VPP=${ACTOR_VPP:-}
ACTOR_CP=${ACTOR_CP:-1}
# Token budget per GPU and micro-batch (training, log-prob, critic); empty = 2 x (prompt + response length).
PPO_MAX_TOKEN_LEN_PER_GPU=${PPO_MAX_TOKEN_LEN_PER_GPU:-}
# vLLM tensor parallelism and the fraction of GPU memory it may take.
ROLLOUT_TP=${ROLLOUT_TP:-2}
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.6}
# 1 = offload Megatron parameters and optimizer state to CPU between phases (slower, more memory for vLLM);
# 0 = keep them on the GPU (TP 2 and the distributed optimizer already shard them 8 ways).
OFFLOAD=${OFFLOAD:-0}
# Qwen3's chat-template thinking mode: 0 = off (answers fit the response lengths), 1 = on.
THINKING=${THINKING:-0}
########################### end user-adjustable ###########################

recipe_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
model_tag=qwen3_8b_megatron
default_model_path=Qwen/Qwen3-8B
# Megatron-Core trains on GPUs only (troll-verl's CPU platform runs verl's FSDP2 engine)
cpu_refusal="Megatron-Core needs GPUs; run the cell with run_qwen3_0.6b_fsdp.sh (or run_qwen3_8b_fsdp.sh)"
# verl's Megatron engine builds attention with Megatron-Core, not transformers' attn_implementation
attention_refusal="verl's Megatron engine builds attention with Megatron-Core; the knob is the FSDP scripts'"
# shellcheck source=common.sh source-path=SCRIPTDIR
source "${recipe_dir}/common.sh"

# Megatron-Core's tensor-parallel communication overlap needs one CUDA connection (as in verl's Megatron examples).
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

########################### derived defaults ###########################
ppo_max_token_len_per_gpu=${PPO_MAX_TOKEN_LEN_PER_GPU:-$((2 * (max_prompt_length + max_response_length)))}
actor_vpp=${ACTOR_VPP:-null}
offload=False
if [[ "${OFFLOAD}" == 1 ]]; then offload=True; fi
thinking=False
if [[ "${THINKING}" == 1 ]]; then thinking=True; fi

########################### parameter arrays ###########################
# verl's Megatron engine for the actor, reference and critic configs (strategy=megatron): ppo_trainer's model_engine
ENGINE=(
    model_engine=megatron
)

MODEL=(
    "actor_rollout_ref.model.path='${model_path}'"
    "+data.apply_chat_template_kwargs.enable_thinking=${thinking}"
)

# the Megatron knobs of the actor, repeated for the critic below
megatron_parallel=(
    "tensor_model_parallel_size=${ACTOR_TP}"
    "pipeline_model_parallel_size=${ACTOR_PP}"
    "virtual_pipeline_model_parallel_size=${actor_vpp}"
    "context_parallel_size=${ACTOR_CP}"
    "param_offload=${offload}"
    "optimizer_offload=${offload}"
)
if [[ -n "${MCORE_MODEL_PATH}" ]]; then
    megatron_parallel+=(use_dist_checkpointing=True "dist_checkpointing_path='${MCORE_MODEL_PATH}'")
fi

ACTOR=(
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${ppo_max_token_len_per_gpu}"
    "${megatron_parallel[@]/#/actor_rollout_ref.actor.megatron.}"
)

ROLLOUT=(
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${ROLLOUT_GPU_MEM_UTIL}"
)

if ((use_critic)); then
    CRITIC+=(
        "critic.ppo_max_token_len_per_gpu=${ppo_max_token_len_per_gpu}"
        "${megatron_parallel[@]/#/critic.megatron.}"
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
    "${ENGINE[@]}" \
    "${DATA[@]}" \
    "${ALGORITHM[@]}" \
    "${MODEL[@]}" \
    "${ACTOR[@]}" \
    "${POLICY_LOSS[@]}" \
    "${ROLLOUT[@]}" \
    "${CRITIC[@]}" \
    "${REWARD[@]}" \
    "${TRAINER[@]}" \
    "${CPU_MODE[@]}" \
    "$@"

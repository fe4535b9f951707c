#!/usr/bin/env bash
# TROLL | text | vLLM rollout | FSDP training | GPU
# TROLL replaces PPO's ratio clip with a per-token KL trust-region projection (paper: arXiv:2510.03817).

set -xeuo pipefail

########################### user-adjustable ###########################
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-8B}
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-8}

# troll (the trust-region projection) or vanilla (the clip baseline: clip 0.2, dual-clip 10)
LOSS_MODE=${LOSS_MODE:-troll}
# TROLL's settings (policy_loss.troll.*); the defaults are the paper's
TROLL_KL_BOUND=${TROLL_KL_BOUND:-0.05}
TROLL_TOPK=${TROLL_TOPK:-64}

TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-256}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-32}
ROLLOUT_N=${ROLLOUT_N:-8}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-2048}
PPO_MAX_TOKEN_LEN_PER_GPU=${PPO_MAX_TOKEN_LEN_PER_GPU:-12288}
ACTOR_LR=${ACTOR_LR:-1e-6}

ROLLOUT_TP=${ROLLOUT_TP:-2}
ROLLOUT_GPU_MEM_UTIL=${ROLLOUT_GPU_MEM_UTIL:-0.6}

TOTAL_EPOCHS=${TOTAL_EPOCHS:-15}
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-10}

PROJECT_NAME=${PROJECT_NAME:-verl_troll_gsm8k_math}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen3_8b_${LOSS_MODE}_fsdp}

GSM8K_TRAIN_FILE=${GSM8K_TRAIN_FILE:-$HOME/data/gsm8k/train.parquet}
GSM8K_TEST_FILE=${GSM8K_TEST_FILE:-$HOME/data/gsm8k/test.parquet}
MATH_TRAIN_FILE=${MATH_TRAIN_FILE:-$HOME/data/math/train.parquet}
MATH_TEST_FILE=${MATH_TEST_FILE:-$HOME/data/math/test.parquet}
########################### end user-adjustable ###########################

########################### derived defaults ###########################
case "${LOSS_MODE}" in
    troll)
        policy_loss=(
            actor_rollout_ref.actor.policy_loss.loss_mode=troll
            "actor_rollout_ref.actor.policy_loss.troll.kl_bound=${TROLL_KL_BOUND}"
            "actor_rollout_ref.actor.policy_loss.troll.topk=${TROLL_TOPK}"
            # the old-log-prob pass stores the old policy's top-K that TROLL reads
            "actor_rollout_ref.actor.calculate_old_topk=${TROLL_TOPK}"
        )
        ;;
    vanilla)
        policy_loss=(
            actor_rollout_ref.actor.policy_loss.loss_mode=vanilla
            actor_rollout_ref.actor.clip_ratio=0.2
            actor_rollout_ref.actor.clip_ratio_c=10.0
        )
        ;;
    *)
        echo "Unsupported LOSS_MODE=${LOSS_MODE} (troll or vanilla)" >&2
        exit 1
        ;;
esac
train_files="['${GSM8K_TRAIN_FILE}', '${MATH_TRAIN_FILE}']"
test_files="['${GSM8K_TEST_FILE}', '${MATH_TEST_FILE}']"

########################### parameter arrays ###########################
DATA=(
    algorithm.adv_estimator=grpo
    "data.train_files=${train_files}"
    "data.val_files=${test_files}"
    "data.train_batch_size=${TRAIN_BATCH_SIZE}"
    "data.max_prompt_length=${MAX_PROMPT_LENGTH}"
    "data.max_response_length=${MAX_RESPONSE_LENGTH}"
    data.filter_overlong_prompts=True
    data.truncation=error
)

MODEL=(
    "actor_rollout_ref.model.path=${MODEL_PATH}"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
)

ACTOR=(
    "${policy_loss[@]}"
    actor_rollout_ref.actor.strategy=fsdp2
    "actor_rollout_ref.actor.optim.lr=${ACTOR_LR}"
    "actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}"
    actor_rollout_ref.actor.use_dynamic_bsz=True
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${PPO_MAX_TOKEN_LEN_PER_GPU}"
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.fsdp_config.param_offload=True
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
)

ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    "actor_rollout_ref.rollout.n=${ROLLOUT_N}"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${ROLLOUT_GPU_MEM_UTIL}"
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=${PPO_MAX_TOKEN_LEN_PER_GPU}"
)

TRAINER=(
    trainer.balance_batch=True
    trainer.logger='["console","wandb"]'
    "trainer.project_name=${PROJECT_NAME}"
    "trainer.experiment_name=${EXPERIMENT_NAME}"
    "trainer.nnodes=${NNODES}"
    "trainer.n_gpus_per_node=${NDEVICES_PER_NODE}"
    "trainer.save_freq=${SAVE_FREQ}"
    "trainer.test_freq=${TEST_FREQ}"
    "trainer.total_epochs=${TOTAL_EPOCHS}"
)

########################### launch ###########################
python3 -m verl.trainer.main_ppo "${DATA[@]}" "${MODEL[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" "${TRAINER[@]}" "$@"

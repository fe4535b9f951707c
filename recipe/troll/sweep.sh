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

# TROLL | the paper's main comparison grid | one run script, one cell after another
# TROLL: Trust Regions improve Reinforcement Learning for Large Language Models (arXiv:2510.03817).
# Runs SCRIPT for every DATASET x VARIANT x LOSS_MODE cell (4 x 4 x 2 = 32 runs by default), sequentially, printing
# each cell before it starts. Extra arguments are Hydra overrides passed to every cell. Any other knob of SCRIPT and
# common.sh (MODEL_PATH, DATA_DIR, NGPUS, GSPO_CLIP, ...) applies to every cell; EXPERIMENT cannot be set (each
# cell's run name comes from the cell).
#
# DRY_RUN=1 validates the grid without a GPU: every cell's script records its command (DRY_RUN_RECORD) and one
# Python process checks them all (`python -m troll_verl.tools.dry_run`), 1-2 s a cell after verl's import on 2 CPU cores;
# DRY_RUN_BATCH=0 instead runs each cell's dry run as its own process.
#
# Exit status: 0 when every cell succeeded, 1 when any failed, 2 for a bad knob (nothing was run).

set -euo pipefail
if [[ "${TRACE:-0}" == 1 ]]; then set -x; fi

########################### user-adjustable ###########################
# The run script: a run_*.sh in this directory (or a path).
SCRIPT=${SCRIPT:-run_qwen3_0.6b_fsdp.sh}
# Space-separated lists restricting the grid (the defaults are the full grid; see common.sh for the values).
VARIANTS=${VARIANTS:-grpo drgrpo gspo ppo}
DATASETS=${DATASETS:-gsm8k dapo_math eurus_math eurus_code}
LOSS_MODES=${LOSS_MODES:-troll vanilla}
# After a failed cell: continue = run the remaining cells and report every failure at the end; stop = exit at once.
ON_FAILURE=${ON_FAILURE:-continue}
# 1 = dry run of every cell (no GPU needed), see above.
DRY_RUN=${DRY_RUN:-0}
# With DRY_RUN=1: 1 = record every cell's command and check them all in one Python process; 0 = one process a cell.
DRY_RUN_BATCH=${DRY_RUN_BATCH:-1}
# Interpreter with troll-verl installed (passed on to the run script; also runs the batched dry run).
PYTHON=${PYTHON:-python3}
########################### end user-adjustable ###########################

recipe_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)

_sweep_die() {
    echo "recipe/troll/sweep.sh: $*" >&2
    exit 2
}

########################### derived values ###########################
script=${SCRIPT}
if [[ "${script}" != */* ]]; then script=${recipe_dir}/${script}; fi
[[ -f "${script}" ]] || _sweep_die "SCRIPT=${SCRIPT} is not a file (expected a run_*.sh in ${recipe_dir} or a path)"

# every list entry is checked here, so a typo fails before hours of runs (common.sh checks each value again)
_check_list() {  # knob name, allowed values (|-separated), entries...
    local knob=$1 allowed=$2 entry
    shift 2
    (($#)) || _sweep_die "${knob} is empty"
    for entry in "$@"; do
        [[ "|${allowed}|" == *"|${entry}|"* ]] || _sweep_die "${knob} contains ${entry}; each must be one of ${allowed}"
    done
}
read -r -a variants <<< "${VARIANTS}"
read -r -a datasets <<< "${DATASETS}"
read -r -a loss_modes <<< "${LOSS_MODES}"
_check_list VARIANTS "grpo|drgrpo|gspo|ppo" "${variants[@]}"
_check_list DATASETS "gsm8k|dapo_math|eurus_math|eurus_code" "${datasets[@]}"
_check_list LOSS_MODES "troll|vanilla" "${loss_modes[@]}"
case "${ON_FAILURE}" in continue | stop) ;; *) _sweep_die "ON_FAILURE=${ON_FAILURE} must be continue or stop" ;; esac
case "${DRY_RUN}" in 0 | 1) ;; *) _sweep_die "DRY_RUN=${DRY_RUN} must be 0 or 1" ;; esac
case "${DRY_RUN_BATCH}" in 0 | 1) ;; *) _sweep_die "DRY_RUN_BATCH=${DRY_RUN_BATCH} must be 0 or 1" ;; esac
[[ -z "${EXPERIMENT:-}" ]] || _sweep_die "EXPERIMENT=${EXPERIMENT} would name every cell alike; unset it"
[[ -z "${DRY_RUN_RECORD:-}" ]] || _sweep_die "DRY_RUN_RECORD is set by the sweep itself; unset it"

# CPU=1 (common.sh, README "CPU mode") runs or validates every cell on troll-verl's CPU platform; the batched dry run
# below must check the recorded commands on it too
if [[ "${CPU:-0}" == 1 ]]; then export VERL_PLATFORM=cpu; fi

batch=0
if [[ "${DRY_RUN}" == 1 && "${DRY_RUN_BATCH}" == 1 ]]; then
    batch=1
    record_dir=$(mktemp -d "${TMPDIR:-/tmp}/troll-sweep.XXXXXX")
    trap 'rm -rf -- "${record_dir}"' EXIT
fi

########################### the grid ###########################
n_cells=$((${#datasets[@]} * ${#variants[@]} * ${#loss_modes[@]}))
i=0
failed=()
records=()
for dataset in "${datasets[@]}"; do
    for variant in "${variants[@]}"; do
        for loss_mode in "${loss_modes[@]}"; do
            i=$((i + 1))
            cell="${dataset}-${variant}-${loss_mode}"
            echo "[sweep] cell ${i}/${n_cells}: DATASET=${dataset} VARIANT=${variant} LOSS_MODE=${loss_mode}" \
                "($(basename -- "${script}"), DRY_RUN=${DRY_RUN}) $(date '+%F %T')"
            cell_env=(DATASET="${dataset}" VARIANT="${variant}" LOSS_MODE="${loss_mode}" DRY_RUN="${DRY_RUN}")
            if ((batch)); then
                record=$(printf '%s/%03d-%s.cmd' "${record_dir}" "${i}" "${cell}")
                cell_env+=(DRY_RUN_RECORD="${record}")
            fi
            status=0
            env "${cell_env[@]}" PYTHON="${PYTHON}" bash "${script}" "$@" || status=$?
            if ((status)); then
                echo "[sweep] cell ${i}/${n_cells} ${cell} FAILED (exit status ${status})" >&2
                failed+=("${cell}")
                if [[ "${ON_FAILURE}" == stop ]]; then
                    echo "[sweep] ON_FAILURE=stop: stopping after ${i} of ${n_cells} cells" >&2
                    exit 1
                fi
            elif ((batch)); then
                records+=("${record}")
            else
                echo "[sweep] cell ${i}/${n_cells} ${cell} done $(date '+%F %T')"
            fi
        done
    done
done

########################### batched dry run ###########################
if ((batch)) && ((${#records[@]})); then
    read -r -a launch <<< "${PYTHON}"
    ((${#launch[@]})) || _sweep_die "PYTHON is empty"
    dry_run_flags=()
    if [[ "${ON_FAILURE}" == stop ]]; then dry_run_flags=(--stop-on-failure); fi
    echo "[sweep] checking ${#records[@]} recorded commands in one process: python -m troll_verl.tools.dry_run"
    "${launch[@]}" -m troll_verl.tools.dry_run "${dry_run_flags[@]}" "${records[@]}" || dry_run_status=$?
fi

if ((${#failed[@]})); then
    echo "[sweep] ${#failed[@]} of ${n_cells} cells failed: ${failed[*]}" >&2
fi
if ((${dry_run_status:-0})); then
    echo "[sweep] the batched dry run found invalid cells: see its FAILED results and tally above" >&2
fi
if ((${#failed[@]} || ${dry_run_status:-0})); then
    exit 1
fi
echo "[sweep] all ${n_cells} cells succeeded"

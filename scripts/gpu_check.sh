#!/usr/bin/env bash
# The GPU check in one command, for a bare CUDA machine (torch with CUDA, transformers, pytest; no verl, no network):
# installs the wheels that scripts/gpu_fetch.sh put in .whl/ into a private folder, stands in for Ray (too big to
# carry; scripts/gpu/stubs/ray), and runs scripts/gpu_check.py: the core's tests on CUDA, bench_loss.py at Qwen3-4B/8B
# shapes, and one TROLL and one clip update through verl's FSDP2 engine. Writes gpu_check.json and gpu_check.md to
# $GPU_CHECK_OUT (default: $OUT where the device tool sets it, else outputs/gpu_check). About 3 minutes on an H100.
#   PYTHON      the interpreter with CUDA torch (default python3)
#   WHEEL_DIR   the fetched wheels (default .whl)
# Exit status: 0 every stage passed, 1 a stage failed (see the tables), 2 this machine cannot run the check.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS="${WHEEL_DIR:-.whl}"
OUT_DIR="${GPU_CHECK_OUT:-${OUT:-outputs/gpu_check}}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "[gpu_check] no CUDA GPU visible to $PY (nvidia-smi and torch.cuda.is_available()): this check runs on a GPU" \
        "machine. There: bash scripts/gpu_check.sh, with the wheels from bash scripts/gpu_fetch.sh in $WHEELS." >&2
    exit 2
fi
if ! "$PY" -c "import verl" 2>/dev/null; then
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "[gpu_check] verl is not installed and $WHEELS holds no wheels: run bash scripts/gpu_fetch.sh on a machine" \
            "with network first, and bring $WHEELS along (device tool: carry [\"$WHEELS\"])." >&2
        exit 2
    fi
    site=$(mktemp -d /tmp/troll-gpu-site.XXXXXX)
    echo "[gpu_check] installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$site" "$WHEELS"/*.whl || { echo "[gpu_check] ERROR: installing the wheels failed" >&2; exit 2; }
    # verl's wheel also installs top-level scripts/ and tests/ packages: they would shadow this repository's
    rm -rf "$site/scripts" "$site/tests" "$site/bin"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import ray" 2>/dev/null; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/scripts/gpu/stubs"
    echo "[gpu_check] Ray is not installed: using the import stand-in scripts/gpu/stubs/ray (one process, no cluster)"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
exec "$PY" scripts/gpu_check.py --out "$OUT_DIR" "$@"

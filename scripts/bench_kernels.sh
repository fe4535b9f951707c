#!/usr/bin/env bash
# The kernels' GPU check in one command, for a bare CUDA machine (torch with CUDA and triton; no verl, no wheels, no
# network): scripts/bench_kernels.py's stages (the floor, correctness, the loss step against two clip baselines, each
# kernel, launches and syncs, the core's tests on CUDA), in at most --budget-s seconds (450 by default). Writes
# bench_kernels.json, bench_kernels.md and bench_kernels.log to $BENCH_KERNELS_OUT (default: $OUT where the device tool
# sets it, else outputs/bench_kernels), as each stage finishes.
#   PYTHON      the interpreter with CUDA torch and triton (default python3)
# Exit status: 0 every stage passed, 1 a stage failed (see the tables), 2 this machine cannot run the check.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY="${PYTHON:-python3}"
OUT_DIR="${BENCH_KERNELS_OUT:-${OUT:-outputs/bench_kernels}}"

if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "[bench_kernels] no CUDA GPU visible to $PY (torch.cuda.is_available()): this check runs on a GPU machine;" \
        "on a CPU machine run: $PY scripts/bench_kernels.py --smoke" >&2
    exit 2
fi
if ! "$PY" -c "import triton" 2>/dev/null; then
    echo "[bench_kernels] triton does not import in $PY: the kernels need it (pip install triton)" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
exec "$PY" scripts/bench_kernels.py --out "$OUT_DIR" "$@"

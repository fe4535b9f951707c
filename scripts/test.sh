#!/usr/bin/env bash
# Create .venv if missing, install torch (CPU build on a CPU machine) first, then troll-verl with its test
# extra, check torch was not replaced, and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv
echo "[test.sh] running pytest"
exec "$VENV_PY" -m pytest tests -q "$@"

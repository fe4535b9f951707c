#!/usr/bin/env bash
# Companion of scripts/gpu_check.sh, run on a machine with network (this CPU machine) before a GPU is lent: download
# the wheels of scripts/gpu/wheels.txt into .whl/ (git-ignored), as wheels for the GPU machine's Python (3.12,
# manylinux x86_64), and check that they fit what one device call carries (64 MiB with the repository).
#   GPU_PYTHON_VERSION  target Python (default 3.12)
#   WHEEL_DIR           where to put them (default .whl)
#   MAX_WHEEL_MIB       size budget of the wheels (default 48: the repository's tracked files take the rest)
#   PIP                 the pip to use (default: python3 -m pip)
#   DRY_RUN=1           print the pip commands instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${GPU_PYTHON_VERSION:-3.12}"
DIR="${WHEEL_DIR:-.whl}"
MAX_MIB="${MAX_WHEEL_MIB:-48}"
read -r -a PIP <<<"${PIP:-python3 -m pip}"
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

binary=()
build=()
while read -r line; do
    line="${line%%#*}"
    line="${line//[[:space:]]/}"
    [ -n "$line" ] || continue
    case "$line" in
        build:*) build+=("${line#build:}") ;;
        *) binary+=("$line") ;;
    esac
done <scripts/gpu/wheels.txt

download=("${PIP[@]}" download --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp
    --disable-pip-version-check -q -d "$DIR")
for p in "${PLATFORMS[@]}"; do download+=(--platform "$p"); done
download+=("${binary[@]}")
# an sdist-only project: a pure-Python wheel built here is the same on every platform
wheel=("${PIP[@]}" wheel --no-deps --disable-pip-version-check -q -w "$DIR" "${build[@]}")

if [ "${DRY_RUN:-0}" = 1 ]; then
    printf '%q ' "${download[@]}"
    echo
    [ "${#build[@]}" = 0 ] || { printf '%q ' "${wheel[@]}"; echo; }
    exit 0
fi
mkdir -p "$DIR"
echo "[gpu_fetch] downloading ${#binary[@]} wheels for Python $PYV into $DIR"
"${download[@]}"
if [ "${#build[@]}" != 0 ]; then
    echo "[gpu_fetch] building ${build[*]} (sdist only on PyPI)"
    "${wheel[@]}"
fi
python3 - "$DIR" "$MAX_MIB" scripts/gpu/wheels.txt <<'PY'
import os, re, sys
folder, max_mib, listing = sys.argv[1], float(sys.argv[2]), sys.argv[3]
wanted = {}
for line in open(listing):
    line = line.split("#")[0].strip().removeprefix("build:")
    if line:
        name, version = line.split("==")
        wanted[re.sub(r"[-_.]+", "_", name).lower()] = version
found = {}
for f in os.listdir(folder):
    if f.endswith(".whl"):
        name, version = f.split("-")[:2]
        found.setdefault(re.sub(r"[-_.]+", "_", name).lower(), []).append((version, f))
missing = [f"{n}=={v}" for n, v in wanted.items() if v not in [ver for ver, _ in found.get(n, [])]]
extra = [f for n, fs in found.items() for v, f in fs if wanted.get(n) != v]
total = sum(os.path.getsize(os.path.join(folder, f)) for fs in found.values() for _, f in fs)
print(f"[gpu_fetch] {len(wanted) - len(missing)}/{len(wanted)} wheels, {total / 2**20:.2f} MiB in {folder}")
if missing:
    sys.exit(f"[gpu_fetch] ERROR: missing {missing}")
if extra:
    sys.exit(f"[gpu_fetch] ERROR: {folder} holds wheels not in {listing} (two versions stop the install): {extra}; "
             "remove them")
if total > max_mib * 2**20:
    sys.exit(f"[gpu_fetch] ERROR: {total / 2**20:.1f} MiB is over the {max_mib:g} MiB budget (MAX_WHEEL_MIB)")
PY
echo "[gpu_fetch] ready: run the GPU check with carry [\"$DIR\"] and the command: bash scripts/gpu_check.sh"

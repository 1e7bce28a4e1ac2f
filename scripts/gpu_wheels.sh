#!/usr/bin/env bash
# Download the wheels the GPU check installs on a device without network into gpu-wheels/
# (ignored by git; carried to the device with the run's `carry`, docs/gpu_check.md).
#   bash scripts/gpu_wheels.sh            # CPython 3.12, manylinux2014 x86_64
#   PY_VERSION=3.11 bash scripts/gpu_wheels.sh   # another device Python
# PYTHON runs pip download (default .venv/bin/python, else python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/gpu-wheels"
PY_VERSION="${PY_VERSION:-3.12}"
ABI="cp${PY_VERSION/./}"
PYTHON="${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
rm -rf "$DEST"
mkdir -p "$DEST"
# --no-deps: the list is resolved already (pins); NumPy and ml_dtypes stay the device's own.
"$PYTHON" -m pip download --disable-pip-version-check --quiet --no-deps \
  --only-binary=:all: --python-version "$PY_VERSION" --implementation cp --abi "$ABI" \
  --platform manylinux2014_x86_64 -d "$DEST" -r "$ROOT/scripts/gpu_requirements.txt"
count="$(find "$DEST" -name '*.whl' | wc -l)"
expected="$(grep -cE '^[A-Za-z]' "$ROOT/scripts/gpu_requirements.txt")"
if [ "$count" -ne "$expected" ]; then
  echo "error: $count wheels in $DEST, $expected requirements" >&2
  exit 1
fi
bytes="$(du -sb "$DEST" | cut -f1)"
echo "==> $count wheels for CPython $PY_VERSION in $DEST: $((bytes / 1024)) KiB"
# The run tool carries at most 64 MiB of ignored paths in all.
if [ "$bytes" -gt $((32 * 1024 * 1024)) ]; then
  echo "error: the wheels take over 32 MiB (the device run carries 64 MiB in all)" >&2
  exit 1
fi

#!/usr/bin/env bash
# Rehearse the GPU check on CPU (docs/gpu_check.md, "Rehearsal"): a Python 3.12 environment with
# only what the device has (JAX 0.11.2, NumPy 2.5 and their dependencies) in .venv-gpu-base,
# then scripts/gpu_check.sh on it with small sizes. Needs a CPython 3.12 (PYTHON312, default
# `python3.12` or pyenv's) and the wheels of scripts/gpu_wheels.sh.
#   OUT=/tmp/gpucheck bash scripts/gpu_rehearse.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="$ROOT/.venv-gpu-base"
PY312="${PYTHON312:-}"
if [ -z "$PY312" ]; then
  for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      PY312="$candidate"
      break
    fi
  done
fi
[ -n "$PY312" ] || { echo "error: no CPython 3.12 found (set PYTHON312)" >&2; exit 1; }
if [ ! -x "$BASE/bin/python" ] || ! "$BASE/bin/python" -c "import jax" 2>/dev/null; then
  echo "==> creating $BASE from $PY312 (jax==0.11.2, numpy 2.5)"
  rm -rf "$BASE"
  "$PY312" -m venv "$BASE"
  "$BASE/bin/pip" install -q --disable-pip-version-check "jax==0.11.2" "numpy==2.5.*"
fi
[ -d "$ROOT/gpu-wheels" ] || PYTHON="$BASE/bin/python" bash "$ROOT/scripts/gpu_wheels.sh"
PYTHON="$BASE/bin/python" GPU_CHECK_QUICK="${GPU_CHECK_QUICK:-1}" bash "$ROOT/scripts/gpu_check.sh"

#!/usr/bin/env bash
# Regenerate the Python code of hloserve/protos/*.proto with grpcio-tools (from the `test`
# extra), or check that the committed code matches the .proto files.
#   bash scripts/gen_protos.sh           rewrite hloserve/protos/*_pb2{.py,.pyi,_grpc.py}
#   bash scripts/gen_protos.sh --check   regenerate into a temporary directory and diff
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
cd "$ROOT"

generate() {  # generate OUT_DIR
  # -I . keeps the package path in the generated imports (from hloserve.protos import ...).
  "$PY" -m grpc_tools.protoc -I . --python_out="$1" --pyi_out="$1" --grpc_python_out="$1" \
    hloserve/protos/*.proto
}

if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  if ! diff -r -u -x '*.proto' -x '__init__.py' -x '__pycache__' \
      "$tmp/hloserve/protos" hloserve/protos; then
    echo "hloserve/protos: the generated code is out of date with its .proto;" \
      "run: bash scripts/gen_protos.sh" >&2
    exit 1
  fi
  echo "hloserve/protos: generated code matches the .proto files"
else
  generate .
  echo "hloserve/protos: regenerated"
fi

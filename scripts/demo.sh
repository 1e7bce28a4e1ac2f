#!/usr/bin/env bash
# The main job on the bundled example: set up .venv, train and export the digits bundle,
# validate and inspect it.
#   bash scripts/demo.sh [BUNDLES_DIR]   (default: bundles/)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
BUNDLES="${1:-bundles}"

setup_serving_env
echo "==> exporting the digits example into $BUNDLES/"
.venv/bin/python examples/digits/export.py --out "$BUNDLES"
echo "==> validating"
.venv/bin/hloserve bundle validate "$BUNDLES/digits"
.venv/bin/hloserve bundle inspect "$BUNDLES/digits"

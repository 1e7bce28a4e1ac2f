#!/usr/bin/env bash
# Run every check: lint (ruff), types (mypy), the test suite (pytest) in the serving
# environment, and the bundle/export tests again under numpy 2 with the newest JAX.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"

setup_serving_env
setup_numpy2_env
source "$ROOT/scripts/haproxy.sh"
ensure_haproxy
source "$ROOT/scripts/docker.sh"
ensure_docker || true  # the docker tests skip (or fail with HLOSERVE_REQUIRE_DOCKER=1) without it

echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> generated protos (scripts/gen_protos.sh --check)"
bash scripts/gen_protos.sh --check
echo "==> mypy"
.venv/bin/mypy
echo "==> pytest (serving env: numpy<2, jax 0.7.1)"
.venv/bin/python -m pytest "$@"
echo "==> pytest (numpy 2, newest JAX: bundle core and exporter)"
.venv-np2/bin/python -m pytest -m "not tritonserver" "$@"

#!/usr/bin/env bash
# The main job on the bundled example, start to finish:
#   set up .venv -> train and export the digits bundle -> build a Triton model repository ->
#   serve it with tritonserver -> classify the held-out split over gRPC and HTTP ->
#   short perf_analyzer sweep -> stop the server.
#   bash scripts/demo.sh            (ports: HTTP 8000, gRPC 8001, metrics 8002, admin 8003;
#                                    override with HLOSERVE_HTTP_PORT / HLOSERVE_GRPC_PORT /
#                                    HLOSERVE_METRICS_PORT / HLOSERVE_ADMIN_PORT)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
HTTP_PORT="${HLOSERVE_HTTP_PORT:-8000}"
GRPC_PORT="${HLOSERVE_GRPC_PORT:-8001}"
METRICS_PORT="${HLOSERVE_METRICS_PORT:-8002}"
ADMIN_PORT="${HLOSERVE_ADMIN_PORT:-8003}"
WORK="$ROOT/demo"

setup_serving_env
rm -rf "$WORK"
mkdir -p "$WORK"
echo "==> 1/5 training and exporting the digits example into demo/bundles/"
.venv/bin/python examples/digits/export.py --out "$WORK/bundles"
.venv/bin/hloserve bundle inspect "$WORK/bundles/digits"

echo "==> 2/5 building the Triton model repository demo/repository/"
.venv/bin/hloserve repo build "$WORK/bundles" -o "$WORK/repository"

echo "==> 3/5 serving it (log: demo/server.log)"
# one worker whatever the GPUs (several would add the gateway, which needs HAProxy)
.venv/bin/hloserve serve "$WORK/repository" --workers 1 --http-port "$HTTP_PORT" \
  --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" --admin-port "$ADMIN_PORT" \
  > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "hloserve: ready after" "$WORK/server.log" && break
  if ! kill -0 $SERVER 2>/dev/null; then cat "$WORK/server.log"; echo "server failed to start"; exit 1; fi
  sleep 0.5
done
grep -q "hloserve: ready after" "$WORK/server.log" || { tail -50 "$WORK/server.log"; exit 1; }
grep -E "^hloserve:|^  (HTTP|gRPC|metrics|model)" "$WORK/server.log"

echo "==> 4/5 classifying the held-out split through Triton"
.venv/bin/python examples/digits/client.py --grpc "127.0.0.1:$GRPC_PORT" --http "127.0.0.1:$HTTP_PORT"

echo "==> 5/5 perf_analyzer sweep (gRPC; concurrency 1, 4, 8)"
.venv/bin/python - "$GRPC_PORT" <<'PY'
import sys
from hloserve.node.perf_analyzer import run_perf_analyzer
for c in (1, 4, 8):
    (r,), _ = run_perf_analyzer("digits", f"127.0.0.1:{sys.argv[1]}", concurrency=(c,),
                                measurement_interval_ms=2000)
    print(f"concurrency {c}: {r.throughput:8.0f} infer/s   p50 {r.p50_us:7.0f} us   p99 {r.p99_us:7.0f} us")
PY

echo "==> stopping the server"
kill -TERM $SERVER
wait $SERVER
trap - EXIT
echo "==> demo finished"

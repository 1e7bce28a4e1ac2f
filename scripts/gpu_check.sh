#!/usr/bin/env bash
# The GPU check of the runtime channel (issue 11), the executable cache (issue 13) and the
# runtime's device memory (issue 26: two runtimes on one card, scratch figure vs peak), in one
# command for a device without network (docs/gpu_check.md). Every step has its own timeout and
# the whole a budget; a failed step does not stop the next. Logs, each step's JSON and
# summary.json go to $OUT.
#   OUT=DIR bash scripts/gpu_check.sh
# Environment: OUT (default ./gpu-check-out), PYTHON (default: the first of python3, python3.12,
# python that imports jax), GPU_CHECK_QUICK=1 (small sizes, for a rehearsal on CPU),
# GPU_CHECK_BUDGET_S (440), GPU_CHECK_WHEELS (./gpu-wheels, from scripts/gpu_wheels.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-check-out}"
if [ -z "${PYTHON:-}" ]; then  # the first interpreter that has JAX
  for candidate in python3 python3.12 python; do
    if "$candidate" -c "import jax" >/dev/null 2>&1; then PYTHON="$candidate" && break; fi
  done
fi
PYTHON="${PYTHON:-python3}"
echo "==> $("$PYTHON" --version 2>&1) ($(command -v "$PYTHON")); results in $OUT"
BUDGET_S="${GPU_CHECK_BUDGET_S:-440}"
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/gpu-wheels}"
mkdir -p "$OUT"
START=$SECONDS
SITE="$(mktemp -d "${TMPDIR:-/tmp}/hloserve-gpu-site.XXXXXX")"
trap 'rm -rf "$SITE"' EXIT
# The wheels' folder first, then hloserve from this tree; JAX allocates as it goes (each JAX
# process otherwise takes 75% of the device at start, and the channel check runs two).
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
: >"$OUT/steps.tsv"

step() {  # step NAME TIMEOUT_S COMMAND...: log to $OUT/NAME.log, a row in $OUT/steps.tsv
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then
    printf '%s\tskipped\t0\t0\n' "$name" >>"$OUT/steps.tsv"
    echo "==> $name: skipped (the ${BUDGET_S} s budget is spent)"
    return 0
  fi
  if [ "$limit" -gt "$left" ]; then limit="$left"; fi
  echo "==> $name (at most $limit s; log $OUT/$name.log)"
  local t0=$SECONDS rc=0
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >>"$OUT/steps.tsv"
  echo "    rc $rc after $((SECONDS - t0)) s"
  tail -n 6 "$OUT/$name.log" | sed 's/^/    | /'
}

if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
  weights=(--bytes 64MiB --repeats 3)
  packed=(--bytes 64MiB --tensors 64 --packed 16MiB --repeats 3)
  models=(--models 2)
  xcache=(--repeats 1)
  channel=(--requests 300 --concurrency 4 --seconds 1)
else
  weights=(--bytes 1GiB --repeats 5)
  packed=(--bytes 1GiB --tensors 256 --packed 64MiB --repeats 5)
  models=(--models 4)
  xcache=(--repeats 3)
  channel=(--requests 2000 --concurrency 8 --seconds 3)
fi

# Most wanted first: a later step may meet the end of the budget.
step env 90 "$PYTHON" scripts/gpu_check.py env --wheels "$WHEELS" --site "$SITE" \
  --json "$OUT/env.json"
step memory 120 "$PYTHON" scripts/gpu_check.py memory --json "$OUT/memory.json"
step device_models 150 "$PYTHON" benchmarks/device_models.py "${models[@]}" \
  --json "$OUT/device_models.json"
step weight_cache 120 "$PYTHON" benchmarks/gpu_weight_cache.py "${weights[@]}" \
  --json "$OUT/weight_cache.json"
step executable_cache 240 "$PYTHON" benchmarks/executable_cache.py --offline "${xcache[@]}" \
  --json "$OUT/executable_cache.json"
step channel_roundtrip 120 "$PYTHON" benchmarks/channel_roundtrip.py --untrained \
  "${channel[@]}" --json "$OUT/channel_roundtrip.json"
step weight_cache_packed 90 "$PYTHON" benchmarks/gpu_weight_cache.py "${packed[@]}" \
  --json "$OUT/weight_cache_packed.json"
echo "==> summary ($((SECONDS - START)) s so far)"
timeout 30 "$PYTHON" scripts/gpu_check.py summary "$OUT" | tee "$OUT/summary.log"

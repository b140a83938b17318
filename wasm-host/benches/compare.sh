#!/usr/bin/env bash
# Measures wasm-host's baselines (see docs/benchmarks.md, section "wasm-host"):
#
#   1. criterion (benches/host.rs), RUNS times: per-request cost with a no-op filter and
#      per-host-call costs; prints each benchmark's median over runs of criterion's
#      median estimate.
#   2. `wasm-host serve` under wrk, RUNS times, alternating "no filter" and "no-op
#      filter" so that both see the same machine load; prints median requests/s and
#      latency of each, and their ratio. serve runs one worker pinned to CPU 1, wrk one
#      thread pinned to CPU 0, so that the proxy's single core is what saturates.
#
# Usage: wasm-host/benches/compare.sh [RUNS] [WRK_SECONDS]   (needs `wrk`: apt-get install -y wrk)
set -euo pipefail

RUNS="${1:-5}"
SECONDS_PER_RUN="${2:-10}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"; [ -n "${SERVE_PID:-}" ] && kill "$SERVE_PID" 2>/dev/null || true' EXIT

cd "$ROOT"
echo "== criterion, $RUNS runs"
for run in $(seq 1 "$RUNS"); do
  cargo bench -q -p wasm-host --bench host >/dev/null 2>&1
  for f in "$TARGET"/criterion/wasm_host_stream/*/new/estimates.json "$TARGET"/criterion/wasm_host_call/*/new/estimates.json; do
    name="$(basename "$(dirname "$(dirname "$f")")")"
    python3 -c "import json,sys; print('$name', json.load(open('$f'))['median']['point_estimate'])" >>"$OUT/criterion.txt"
  done
done
python3 - "$OUT/criterion.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    runs.setdefault(name, []).append(float(value))
for name, values in sorted(runs.items()):
    print(f"{name:28} median {statistics.median(values):10.0f} ns   runs {[round(v) for v in values]}")
EOF

echo "== serve (1 worker, CPU 1) under wrk (1 thread, CPU 0, 16 connections), $RUNS runs of ${SECONDS_PER_RUN}s"
cargo build -q --release -p wasm-host --bin wasm-host
cargo test -q -p wasm-host --test host -- --list >/dev/null 2>&1  # builds the test guest
GUEST="$TARGET/guests/wasm32-wasip1/release/sluice_test_guest.wasm"
BIN="$TARGET/release/wasm-host"
PORT=18089
serve() {
  taskset -c 1 "$BIN" serve --listen "127.0.0.1:$PORT" --workers 1 --log-level warn "$@" >"$OUT/serve.out" 2>"$OUT/serve.err" &
  SERVE_PID=$!
  for _ in $(seq 1 200); do grep -q listening "$OUT/serve.out" 2>/dev/null && return; sleep 0.05; done
  echo "serve did not start"; cat "$OUT/serve.err"; exit 1
}
for run in $(seq 1 "$RUNS"); do
  for mode in none noop; do
    if [ "$mode" = none ]; then serve --no-filter; else serve --wasm "$GUEST" --config-inline "bench=noop"; fi
    taskset -c 0 wrk -t1 -c16 -d"${SECONDS_PER_RUN}s" --latency "http://127.0.0.1:$PORT/api/items" >"$OUT/wrk.txt"
    rps="$(awk '/Requests\/sec/ {print $2}' "$OUT/wrk.txt")"
    p50="$(awk '$1=="50%" {print $2}' "$OUT/wrk.txt")"
    p99="$(awk '$1=="99%" {print $2}' "$OUT/wrk.txt")"
    echo "$mode $rps $p50 $p99" >>"$OUT/wrk-all.txt"
    kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || true; SERVE_PID=
  done
done
python3 - "$OUT/wrk-all.txt" <<'EOF'
import statistics, sys
def us(text):
    units = {"us": 1, "ms": 1000, "s": 1_000_000}
    for unit in ("us", "ms", "s"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)
rows = {}
for line in open(sys.argv[1]):
    mode, rps, p50, p99 = line.split()
    rows.setdefault(mode, []).append((float(rps), us(p50), us(p99)))
med = {m: tuple(statistics.median(v[i] for v in values) for i in range(3)) for m, values in rows.items()}
for mode, (rps, p50, p99) in med.items():
    print(f"{mode:5} median {rps:9.0f} req/s  p50 {p50:7.0f} us  p99 {p99:7.0f} us   runs {[round(v[0]) for v in rows[mode]]}")
if "none" in med and "noop" in med:
    print(f"no-op filter / no filter: throughput {med['noop'][0] / med['none'][0]:.3f}x, p50 {med['noop'][1] / med['none'][1]:.2f}x")
EOF

#!/usr/bin/env bash
# Measures the filter's cost (see docs/benchmarks.md, section "filter"):
#
#   1. criterion (tests/benches/filter.rs), RUNS times: one whole stream through
#      sluice.wasm with one local policy, beside the no-op filter (wasm-host's test guest,
#      bench=noop) in the same run; prints each benchmark's median over runs of
#      criterion's median estimate and the filter's added cost (sluice - noop).
#   2. `wasm-host serve` under wrk, RUNS times, alternating no filter, the no-op filter
#      and sluice.wasm (one policy that admits everything), so that all three see the
#      same machine load; prints median requests/s and latency, and sluice / noop.
#
# Usage: tests/benches/filter-compare.sh [RUNS] [WRK_SECONDS]   (needs wrk: apt-get install -y wrk)
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
  cargo bench -q -p sluice-tests --bench filter >/dev/null 2>&1
  for f in $(find "$TARGET/criterion/filter" -path '*/new/estimates.json'); do
    name="${f#"$TARGET/criterion/filter/"}"
    name="${name%/new/estimates.json}"
    python3 -c "import json; print('$name', json.load(open('$f'))['median']['point_estimate'])" >>"$OUT/criterion.txt"
  done
done
python3 - "$OUT/criterion.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    runs.setdefault(name, []).append(float(value))
medians = {name: statistics.median(values) for name, values in runs.items()}
noop = medians.get("noop")
for name, values in sorted(runs.items()):
    added = f"   added {medians[name] - noop:7.0f} ns" if noop and name.startswith("sluice") else ""
    print(f"{name:32} median {medians[name]:8.0f} ns{added}   runs {[round(v) for v in values]}")
PY

echo "== serve under wrk, $RUNS runs of ${SECONDS_PER_RUN}s, 2 threads, 32 connections"
cargo build -q --release -p wasm-host --bin wasm-host
cargo test -q -p sluice-tests --test filter -- --list >/dev/null 2>&1  # builds the guests
BIN="$TARGET/release/wasm-host"
GUESTS="$TARGET/guests/wasm32-wasip1/release"
CONFIG='{"policies":[{"name":"bench","key":[{"header":"x-key"}],"rate":"1000000000000/second","burst":1000000000000}]}'
PORT=18091
serve() {
  "$BIN" serve --listen "127.0.0.1:$PORT" --workers 2 --log-level warn "$@" >"$OUT/serve.out" 2>"$OUT/serve.err" &
  SERVE_PID=$!
  for _ in $(seq 1 200); do grep -q listening "$OUT/serve.out" 2>/dev/null && return; sleep 0.05; done
  echo "serve did not start"; cat "$OUT/serve.err"; exit 1
}
for run in $(seq 1 "$RUNS"); do
  for mode in none noop sluice; do
    case "$mode" in
      none) serve --no-filter ;;
      noop) serve --wasm "$GUESTS/sluice_test_guest.wasm" --config-inline "bench=noop" ;;
      sluice) serve --wasm "$GUESTS/sluice.wasm" --config-inline "$CONFIG" --vm-id sluice --root-id sluice --plugin-name sluice ;;
    esac
    wrk -t2 -c32 -d"${SECONDS_PER_RUN}s" --latency -H 'x-key: tenant-42' "http://127.0.0.1:$PORT/api/items" >"$OUT/wrk.txt"
    grep -q "Non-2xx" "$OUT/wrk.txt" && { echo "$mode answered non-2xx:"; cat "$OUT/wrk.txt"; exit 1; }
    rps="$(awk '/Requests\/sec/ {print $2}' "$OUT/wrk.txt")"
    p50="$(awk '$1=="50%" {print $2}' "$OUT/wrk.txt")"
    p99="$(awk '$1=="99%" {print $2}' "$OUT/wrk.txt")"
    echo "$mode $rps $p50 $p99" >>"$OUT/wrk-all.txt"
    kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || true; SERVE_PID=
  done
done
python3 - "$OUT/wrk-all.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    mode, rps, p50, p99 = line.split()
    rows.setdefault(mode, []).append((float(rps), p50, p99))
med = {m: statistics.median(r[0] for r in v) for m, v in rows.items()}
for mode, values in rows.items():
    print(f"{mode:7} median {med[mode]:9.0f} req/s   runs {[round(v[0]) for v in values]}   p50/p99 {[(v[1], v[2]) for v in values]}")
if "noop" in med and "sluice" in med:
    print(f"sluice / noop = {med['sluice'] / med['noop']:.3f}")
PY

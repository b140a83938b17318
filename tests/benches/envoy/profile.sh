#!/usr/bin/env bash
# Where one Envoy variant's CPU goes, per request: guest code (V8's compiled wasm),
# host calls made by the guest, Envoy's own work, the kernel (docs/benchmarks.md,
# "Envoy", Where the time goes).
#
#   tests/benches/envoy/profile.sh "sluice, admitted"      # a row of the local or calls group
#   tests/benches/envoy/profile.sh "global: check"         # a mode of the global group
#
# Needs perf, wrk, the Envoy wheel, and `cargo build --release -p sluice-envoy-bench`.
# Envoy's release binary has no symbols, but V8 writes a perf map for the code it
# generates, so a sample whose leaf is in that map is guest code, and a sample with such
# a frame further up its stack is a host call the guest made.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VARIANT="$1"
SAMPLE_SECONDS="${2:-6}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

PROFILE="$VARIANT" SECONDS=$((SAMPLE_SECONDS + 4)) target/release/envoy-bench >"$OUT/bench.log" 2>&1 &
BENCH=$!
for _ in $(seq 1 120); do grep -q 'load starts' "$OUT/bench.log" && break; sleep 0.5; done
grep -q 'load starts' "$OUT/bench.log" || { cat "$OUT/bench.log"; exit 1; }
perf record -F 999 -g -p "$(pgrep -n -x envoy)" -o "$OUT/perf.data" -- sleep "$SAMPLE_SECONDS" >/dev/null 2>&1
wait "$BENCH"
RATE="$(sed -n 's/.*: \([0-9]*\) req\/s.*/\1/p' "$OUT/bench.log" | tail -1)"
perf script -i "$OUT/perf.data" -F ip,sym,dso 2>/dev/null >"$OUT/stacks.txt"

python3 - "$OUT/stacks.txt" "$RATE" "$SAMPLE_SECONDS" "$VARIANT" <<'PY'
import sys
path, rate, seconds, variant = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
stacks, current = [], []
for line in open(path):
    line = line.strip()
    if not line:
        if current:
            stacks.append(current)
        current = []
    else:
        current.append(line)
if current:
    stacks.append(current)
guest = lambda frame: "/perf-" in frame
kinds = {"guest code": 0, "host calls": 0, "kernel": 0, "Envoy, not called from the guest": 0}
for stack in stacks:
    if guest(stack[0]):
        kinds["guest code"] += 1
    elif any(guest(f) for f in stack[1:]):
        kinds["host calls"] += 1
    elif "kernel" in stack[0]:
        kinds["kernel"] += 1
    else:
        kinds["Envoy, not called from the guest"] += 1
# One sample is 1/999 s of CPU; the load ran at `rate` requests per second meanwhile.
per_request_us = 1e6 / 999 / (rate * seconds)
print(f"{variant}: {rate:.0f} req/s under the profiler, {len(stacks)} samples")
print(f"  CPU per request: {len(stacks) * per_request_us:.1f} µs")
for kind, n in kinds.items():
    print(f"  {kind}: {n * per_request_us:.1f} µs")
PY

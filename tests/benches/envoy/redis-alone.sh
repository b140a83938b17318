#!/usr/bin/env bash
# What Redis alone does with the script sluice-counter runs for one RLS decision: the
# service decides one request while `redis-cli MONITOR` captures its EVALSHA, then
# redis-benchmark replays that command at 64 connections, the key random over 10 000
# users (as envoy-bench's rls-load spreads them). Redis on CPU 0, redis-benchmark on CPU 1.
#
#   cargo build --release -p sluice-counter && cargo build --profile lab --bin envoy-bench
#   tests/benches/envoy/redis-alone.sh          (needs redis-server, redis-cli, redis-benchmark)
#
# See docs/benchmarks.md, "RLS v3".
set -euo pipefail
cd "$(dirname "$0")/../../.."
PORT="${PORT:-18895}"
RUN="$(mktemp -d)"
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; kill "${SERVICE:-}" 2>/dev/null || true; rm -rf "$RUN"' EXIT
printf 'domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n' \
  > "$RUN/bench.yaml"
taskset -c 0 redis-server --port "$PORT" --save '' --appendonly no --daemonize yes --logfile "$RUN/redis.log"
sleep 0.5
taskset -c 1 target/release/sluice-counter --listen 127.0.0.1:$((PORT + 1)) --rls-config "$RUN" \
  --rls-listen 127.0.0.1:$((PORT + 2)) --store redis --redis-url "redis://127.0.0.1:$PORT" --log warn \
  >"$RUN/service.log" 2>&1 &
SERVICE=$!
sleep 1
(timeout 3 redis-cli -p "$PORT" MONITOR >"$RUN/monitor.txt" || true) &
sleep 0.5
target/lab/envoy-bench rls-load 127.0.0.1:$((PORT + 2)) 1 1 1 >/dev/null
sleep 3
line="$(grep -m1 '"EVALSHA"' "$RUN/monitor.txt")"
words="$(python3 - "$line" <<'PY'
import shlex, sys
line = sys.argv[1]
args = shlex.split(line[line.index('"EVALSHA"'):])
args[3] = "sluice:{rls:__rand_int__}:v0:__rand_int__"  # the one key, random per call
print(" ".join(shlex.quote(a) for a in args))
PY
)"
eval "taskset -c 1 redis-benchmark -p $PORT -c 64 -n 400000 -r 10000 -q $words" | tr '\r' '\n' | tail -1

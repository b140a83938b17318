#!/usr/bin/env bash
# Counter-service benchmark: sluice-counter (memory and Redis stores) beside
# throttlecrab-server (HTTP) under the same wrk load, and redis-benchmark running EVALSHA
# of a one-command script on the same Redis (the Redis store's ceiling), all in one run.
#
# Usage: counter-service/bench/run.sh [RUNS] [SECONDS]      (defaults: 3 runs, 8 s each)
#
# Needs: wrk, redis-server, redis-benchmark (Debian: wrk redis-server redis-tools),
# throttlecrab-server 0.4.40 (cargo install throttlecrab-server --version 0.4.40 --locked
# --root DIR; set THROTTLECRAB=DIR/bin/throttlecrab-server; it needs protoc to build).
# Everything listens on 127.0.0.1 only. Servers are pinned to CPU 1, load generators
# to CPU 0. Prints one line per measurement, then the medians and ratios.
set -euo pipefail

RUNS=${1:-3}
SECS=${2:-8}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
THROTTLECRAB=${THROTTLECRAB:-throttlecrab-server}
WORK=$(mktemp -d /tmp/sluice-bench.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is not installed (apt-get install redis-tools)"; exit 1; }
command -v "$THROTTLECRAB" >/dev/null || { echo "throttlecrab-server not found: set THROTTLECRAB"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; exit 1; }

cargo build --release -q -p sluice-counter --manifest-path "$ROOT/Cargo.toml"
SLUICE="${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice-counter"

REDIS_PORT=$(free_port)
taskset -c 1 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$WORK" --loglevel warning --maxmemory-policy noeviction >/dev/null &
PIDS+=($!)
wait_port "$REDIS_PORT"

MEM_PORT=$(free_port)
taskset -c 1 "$SLUICE" --listen "127.0.0.1:$MEM_PORT" --log warn &
PIDS+=($!)
RED_PORT=$(free_port)
taskset -c 1 "$SLUICE" --listen "127.0.0.1:$RED_PORT" --store redis --redis-url "redis://127.0.0.1:$REDIS_PORT" \
  --redis-pool-size 4 --log warn &
PIDS+=($!)
TC_PORT=$(free_port)
taskset -c 1 "$THROTTLECRAB" --http --http-host 127.0.0.1 --http-port "$TC_PORT" --log-level warn >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$MEM_PORT"; wait_port "$RED_PORT"; wait_port "$TC_PORT"

# The same workload for every service: GCRA / token bucket, 1000 per second, burst 1000,
# keys drawn uniformly from 10 000, cost 1 (almost every request is admitted).
cat > "$WORK/sluice.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
math.randomseed(os.time())
request = function()
  local key = math.random(1, 10000)
  return wrk.format(nil, "/v1/check", nil,
    '{"entries":[{"key":"k' .. key .. '","limit":{"algorithm":"token_bucket","amount":1000,"per_ms":1000,"burst":1000}}]}')
end
EOF
cat > "$WORK/throttlecrab.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
math.randomseed(os.time())
request = function()
  local key = math.random(1, 10000)
  return wrk.format(nil, "/throttle", nil,
    '{"key":"k' .. key .. '","max_burst":1000,"count_per_period":1000,"period":1,"quantity":1}')
end
EOF

SHA=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "return redis.call('INCR', KEYS[1])")

# wrk prints "Requests/sec: N" and, with --latency, "50% X" / "99% X" with units.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else if (v ~ /s$/) {sub(/s$/,"",v); print v*1000000} else print v}'; }
run_wrk() { # name conns url script
  local threads=1; [ "$2" -gt 1 ] && threads=2
  local out; out=$(taskset -c 0 wrk -t"$threads" -c"$2" -d"${SECS}s" --latency -s "$4" "$3")
  local rps p50 p99 errors
  rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}' | to_us)
  p99=$(echo "$out" | awk '$1=="99%" {print $2}' | to_us)
  errors=$(echo "$out" | awk '/Non-2xx/ {print $5}'); errors=${errors:-0}
  echo "$1 c=$2 rps=$rps p50_us=$p50 p99_us=$p99 non2xx=$errors" | tee -a "$WORK/results"
}
run_redis_benchmark() { # conns
  local n=$(( $1 == 1 ? 60000 : 400000 ))
  local out; out=$(taskset -c 0 redis-benchmark -p "$REDIS_PORT" -c "$1" -n "$n" EVALSHA "$SHA" 1 bench:key 2>/dev/null)
  local rps p50 p99
  rps=$(echo "$out" | awk '/throughput summary/ {print $3}')
  read -r p50 p99 < <(echo "$out" | awk '/avg +min +p50/ {getline; print $3*1000, $5*1000}')
  echo "redis-benchmark-evalsha c=$1 rps=$rps p50_us=$p50 p99_us=$p99 non2xx=0" | tee -a "$WORK/results"
}

for run in $(seq "$RUNS"); do
  echo "# run $run"
  for c in 1 64; do
    run_wrk sluice-memory "$c" "http://127.0.0.1:$MEM_PORT" "$WORK/sluice.lua"
    run_wrk throttlecrab "$c" "http://127.0.0.1:$TC_PORT" "$WORK/throttlecrab.lua"
    run_wrk sluice-redis "$c" "http://127.0.0.1:$RED_PORT" "$WORK/sluice.lua"
    run_redis_benchmark "$c"
  done
done

echo
echo "# medians over $RUNS runs"
python3 - "$WORK/results" <<'EOF'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = line.split()
    fields = dict(p.split("=", 1) for p in parts[1:])
    rows[(parts[0], fields["c"])].append(fields)
med = {}
print(f"{'what':26} {'conns':>5} {'decisions/s':>12} {'p50 us':>8} {'p99 us':>8}")
for (name, c), fs in sorted(rows.items()):
    m = {k: statistics.median(float(f[k]) for f in fs) for k in ("rps", "p50_us", "p99_us")}
    med[(name, c)] = m
    print(f"{name:26} {c:>5} {m['rps']:12.0f} {m['p50_us']:8.0f} {m['p99_us']:8.0f}")
print()
for c in ("1", "64"):
    def ratio(a, b, k="rps"):
        return med[(a, c)][k] / med[(b, c)][k]
    print(f"c={c}: memory / throttlecrab throughput {ratio('sluice-memory', 'throttlecrab'):.2f}x, "
          f"p99 {ratio('sluice-memory', 'throttlecrab', 'p99_us'):.2f}x; "
          f"redis store / EVALSHA ceiling {ratio('sluice-redis', 'redis-benchmark-evalsha'):.2f}x")
EOF

#!/usr/bin/env bash
# What obeying operators' overrides costs a check: sluice-counter (memory store) under the
# same wrk load as counter-service/bench/run.sh, in five rows measured in one run:
#   baseline        BASELINE=path/to/an/older/sluice-counter (a build without overrides),
#                   bodies without `policy` (older services refuse the field)
#   no-policy       this build, the same bodies
#   policy          this build, every entry naming its policy (the filter's bodies)
#   other-override  the same, with a live clamp on another policy (the override set is
#                   not empty, so every entry is matched against it)
#   clamped         the same, with a live clamp on this policy (every entry decided under it)
#
# Usage: BASELINE=... counter-service/bench/overrides.sh [ROUNDS] [SECONDS]   (3, 5)
# Needs wrk. Listens on 127.0.0.1 only; the service is pinned to CPU 1, wrk to CPU 0.
set -euo pipefail

ROUNDS=${1:-3}
SECS=${2:-5}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/sluice-overrides-bench.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
[ -x "${BASELINE:-}" ] || { echo "set BASELINE to an older sluice-counter binary"; exit 1; }

cargo build --release -q -p sluice-counter --manifest-path "$ROOT/Cargo.toml"
SLUICE="${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice-counter"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; exit 1; }

export BENCH_ADMIN_TOKEN="bench-admin-token-0123"
export BENCH_HASH_KEY="bench-hash-key-0123456789abcdef"
start() { # binary [admin flags...]
  local port; port=$(free_port)
  taskset -c 1 "$@" --listen "127.0.0.1:$port" --log warn >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$port"
  echo "$port"
}
BASE_PORT=$(start "$BASELINE")
NEW_PORT=$(start "$SLUICE")
OTHER_PORT=$(start "$SLUICE" --admin-token-env BENCH_ADMIN_TOKEN --hash-key-env BENCH_HASH_KEY)
CLAMP_PORT=$(start "$SLUICE" --admin-token-env BENCH_ADMIN_TOKEN --hash-key-env BENCH_HASH_KEY)

script() { # file policy-field
  cat > "$1" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
math.randomseed(os.time())
request = function()
  local key = math.random(1, 10000)
  return wrk.format(nil, "/v1/check", nil,
    '{"entries":[{"key":"k' .. key .. '"$2,"limit":{"algorithm":"token_bucket","amount":1000,"per_ms":1000,"burst":1000}}]}')
end
EOF
}
script "$WORK/plain.lua" ""
script "$WORK/policy.lua" ',"policy":"bench"'

LIMIT='{"algorithm":"token_bucket","amount":1000,"per_ms":1000,"burst":1000}'
CLAMP='{"algorithm":"token_bucket","amount":500,"per_ms":1000,"burst":500}'
for port in "$OTHER_PORT" "$CLAMP_PORT"; do
  for policy in bench other; do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$port/v1/check" \
      -d "{\"entries\":[{\"key\":\"teach\",\"policy\":\"$policy\",\"limit\":$LIMIT,\"cost\":0}]}"
  done
done
set_clamp() { # port policy
  "$SLUICE" override set --url "http://127.0.0.1:$1" --admin-token-env BENCH_ADMIN_TOKEN --kind clamp \
    --policy "$2" --limit "$CLAMP" --ttl-ms 3600000 --reason bench --operator bench >/dev/null
}
set_clamp "$OTHER_PORT" other
set_clamp "$CLAMP_PORT" bench

to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else print v}'; }
run() { # name port script
  local out; out=$(taskset -c 0 wrk -t2 -c64 -d"${SECS}s" --latency -s "$3" "http://127.0.0.1:$2")
  local rps p50 p99
  rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}' | to_us)
  p99=$(echo "$out" | awk '$1=="99%" {print $2}' | to_us)
  echo "$1 rps=$rps p50_us=$p50 p99_us=$p99" | tee -a "$WORK/results"
}
for round in $(seq "$ROUNDS"); do
  echo "# round $round (load: $(cut -d' ' -f1 /proc/loadavg))"
  run baseline "$BASE_PORT" "$WORK/plain.lua"
  run no-policy "$NEW_PORT" "$WORK/plain.lua"
  run policy "$NEW_PORT" "$WORK/policy.lua"
  run other-override "$OTHER_PORT" "$WORK/policy.lua"
  run clamped "$CLAMP_PORT" "$WORK/policy.lua"
done

echo
echo "# medians over $ROUNDS rounds (ratio: rps over the baseline's)"
python3 - "$WORK/results" <<'EOF'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, *fields = line.split()
    rows[name].append(dict(f.split("=", 1) for f in fields))
med = {n: {k: statistics.median(float(r[k]) for r in rs) for k in rs[0]} for n, rs in rows.items()}
base = med["baseline"]["rps"]
for name, m in med.items():
    print(f"{name:15} rps={m['rps']:9.0f} p50_us={m['p50_us']:7.1f} p99_us={m['p99_us']:7.1f} ratio={m['rps'] / base:.3f}")
EOF

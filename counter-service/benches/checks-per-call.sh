#!/usr/bin/env bash
# Checks per second at sluice-counter: one check per call (POST /v1/check) against
# batches of 8 and 64 (POST /v1/checks), alternated over 3 rounds (docs/benchmarks.md,
# "one check per call against batches"). Needs wrk, taskset, and redis-server for the
# redis store; the service pinned to CPU 0, wrk (and redis-server) to CPU 1.
#
#   cargo build --release -p sluice-counter
#   counter-service/benches/checks-per-call.sh memory   # or: redis
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/sluice-counter}
store=${1:-memory}
dir=$(mktemp -d)
trap 'kill ${SPID:-} ${RPID:-} 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One check: one entry on a token bucket that never runs out; a batch: n such checks,
# each on its own counter.
python3 - "$dir" <<'PY'
import json, sys
one = {"tag": "t", "entries": [{"key": "0" * 32, "policy_version": 0, "cost": 1,
       "limit": {"algorithm": "token_bucket", "amount": 1000000000, "per_ms": 1000, "burst": 1000000000}}]}
def script(body):
    return 'wrk.method = "POST"\nwrk.body = \'%s\'\nwrk.headers["content-type"] = "application/json"\n' % json.dumps(body, separators=(",", ":"))
open(f"{sys.argv[1]}/one.lua", "w").write(script(one))
for n in (8, 64):
    checks = []
    for i in range(n):
        c = json.loads(json.dumps(one)); c["entries"][0]["key"] = "%032x" % i; c["tag"] = "t%d" % i
        checks.append(c)
    open(f"{sys.argv[1]}/batch{n}.lua", "w").write(script({"checks": checks}))
PY

port=$(free_port)
extra=()
if [ "$store" = redis ]; then
  rport=$(free_port)
  taskset -c 1 redis-server --port "$rport" --save "" --appendonly no > "$dir/redis.log" 2>&1 &
  RPID=$!
  sleep 0.5
  extra=(--store redis --redis-url "redis://127.0.0.1:$rport")
fi
taskset -c 0 "$BIN" --listen "127.0.0.1:$port" "${extra[@]}" > "$dir/service.log" 2>&1 &
SPID=$!
sleep 1
for round in 1 2 3; do
  for variant in one:1 batch8:8 batch64:64; do
    name=${variant%%:*}; n=${variant##*:}
    path=$([ "$n" = 1 ] && echo check || echo checks)
    rps=$(taskset -c 1 wrk -t1 -c16 -d6s -s "$dir/$name.lua" "http://127.0.0.1:$port/v1/$path" | awk '/Requests\/sec/ {print $2}')
    echo "$store round $round: $name: $rps calls/s, $(python3 -c "print(round($rps * $n))") checks/s"
  done
done

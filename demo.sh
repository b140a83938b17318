#!/usr/bin/env bash
# Sluice demo: sluice.wasm in Envoy (the official 1.40 build, installed from PyPI into
# target/envoy-venv) in front of a small upstream, with sluice-counter (memory store)
# keeping the global per-tenant budget. The configuration is examples/demo.json: per
# client address, a burst of 5 then 1 per second (local); per tenant (`x-tenant`), 3 then
# 10 per minute across every proxy (global, in lease mode: the proxy leases a tenant's
# tokens from sluice-counter and spends them locally), and an emergency cap of 2 per
# tenant while the counter service is down.
#
# The first step needs no service (a request without a tenant meets only the local
# limit): it is answered as soon as sluice.wasm is built and Envoy installed, while
# sluice-counter builds in the background; the other steps follow once it is up.
#
#   ./demo.sh                    start everything, print what to try (Ctrl-C stops it all)
#   ./demo.sh --check            start it, walk through every step, check each, stop
#   ./demo.sh --host wasm-host   the same in wasm-host's `serve` instead of Envoy
#
# Needs cargo (rustup; rust-toolchain.toml pins the toolchain and wasm target), curl and
# python3. PORT (default 8080) is the proxy; the admin interface is PORT+1, the upstream
# PORT+2 and sluice-counter PORT+3. In Envoy, a last step runs Envoy's own ratelimit filter
# (no wasm) against a second sluice-counter serving envoyproxy/ratelimit's YAML over RLS:
# that Envoy listens on PORT+4 (admin PORT+5), its sluice-counter on PORT+6 (RLS PORT+7).
set -euo pipefail

cd "$(dirname "$0")"
PORT="${PORT:-8080}"
ADMIN=$((PORT + 1)); UPSTREAM=$((PORT + 2)); COUNTER=$((PORT + 3))
RLS_PROXY=$((PORT + 4)); RLS_ADMIN=$((PORT + 5)); RLS_COUNTER=$((PORT + 6)); RLS=$((PORT + 7))
CONFIG="${CONFIG:-examples/demo.json}"
URL="http://127.0.0.1:${PORT}/"
CHECK=false
HOST=envoy
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) CHECK=true ;;
    --host) HOST="${2:-}"; shift ;;
    *) echo "demo.sh: unknown argument $1 (use --check, --host envoy|wasm-host)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$HOST" == envoy || "$HOST" == wasm-host ]] || { echo "demo.sh: --host is envoy or wasm-host" >&2; exit 2; }

for tool in cargo curl python3; do
  command -v "$tool" >/dev/null || { echo "demo.sh: $tool is required" >&2; exit 1; }
done
for port in "$PORT" "$ADMIN" "$UPSTREAM" "$COUNTER" "$RLS_PROXY" "$RLS_ADMIN" "$RLS_COUNTER" "$RLS"; do
  if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:${port}/" 2>/dev/null; then
    echo "demo.sh: something already answers on port ${port}; set PORT to another base port" >&2
    exit 1
  fi
done

# rust-toolchain.toml lists the wasm target, but rustup adds listed targets only when it
# installs the toolchain itself; on a machine that already had it, add the target here.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "==> adding the wasm32-wasip1 target"
  rustup target add wasm32-wasip1
fi

STARTED=$SECONDS
echo "==> building sluice.wasm (wasm32-wasip1, release): about 30 s on a fresh clone"
cargo build --release --target wasm32-wasip1 -p sluice-filter
WASM="target/wasm32-wasip1/release/sluice.wasm"
RUN="target/demo"
mkdir -p "$RUN"

if [[ "$HOST" == wasm-host ]]; then
  echo "==> building wasm-host (the proxy itself: wasmtime takes minutes on a fresh clone)"
  cargo build --profile test -p wasm-host --bin wasm-host
fi
# sluice-counter builds in the background while the proxy starts and the first step (a
# local limit: no service needed) runs. The test profile: dependencies are optimised
# there (see the workspace Cargo.toml), it builds much faster than the LTO release
# profile, its binaries land in target/debug like the dev profile's, and after
# `cargo test` (which builds them the same way) nothing is rebuilt.
echo "==> building sluice-counter in the background (cargo's progress: $RUN/build.log)"
cargo build --profile test -p sluice-counter --bin sluice-counter >"$RUN/build.log" 2>&1 &
BUILD_PID=$!

if [[ "$HOST" == envoy ]]; then
  echo "==> installing Envoy (envoy-config/install-envoy.sh)"
  ENVOY="$(envoy-config/install-envoy.sh | tail -n 1)"
fi

PIDS=("$BUILD_PID")
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_for() { # URL, what, pid
  for _ in $(seq 1 300); do
    curl -s -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "demo.sh: $2 exited; see $RUN/" >&2; exit 1; }
    sleep 0.1
  done
  echo "demo.sh: $2 did not come up; see $RUN/" >&2; exit 1
}

# The secrets: the counter service's bearer token, and the key every proxy hashes global
# keys with. Envoy passes both to the VM from its own environment (host_env_keys).
export SLUICE_COUNTER_TOKEN="demo-token-$RANDOM$RANDOM"
export SLUICE_HASH_KEY="demo-hash-key-0123456789abcdef"
# The operators' token for sluice-counter's admin API (overrides): never the proxies' one.
export SLUICE_ADMIN_TOKEN="demo-admin-$RANDOM$RANDOM"

mkdir -p "$RUN/www/v1" "$RUN/www/api" && echo "hello from the upstream" > "$RUN/www/index.html"
echo "hello from the API" > "$RUN/www/api/index.html"
mkdir -p "$RUN/www/login" && echo "the login form" > "$RUN/www/login/index.html"
# A language model's answer: it reports the tokens it used, which the filter charges.
echo '{"choices": [{"message": {"content": "hello"}}], "usage": {"total_tokens": 120}}' > "$RUN/www/v1/usage.json"
python3 -m http.server --bind 127.0.0.1 --directory "$RUN/www" "$UPSTREAM" >"$RUN/upstream.log" 2>&1 &
PIDS+=($!); wait_for "http://127.0.0.1:${UPSTREAM}/" "the upstream" "${PIDS[-1]}"

if [[ "$HOST" == envoy ]]; then
  # The shipped bootstrap, pointed at this machine (the Envoy tests run the same file).
  target/envoy-venv/bin/python3 envoy-config/local.py --listen "127.0.0.1:${PORT}" --admin "127.0.0.1:${ADMIN}" \
    --backend "127.0.0.1:${UPSTREAM}" --counter "127.0.0.1:${COUNTER}" --wasm "$WASM" --config "$CONFIG" \
    >"$RUN/envoy.json"
  "$ENVOY" -c "$RUN/envoy.json" --concurrency 2 --use-dynamic-base-id --log-path "$RUN/envoy.log" \
    >"$RUN/envoy.out" 2>&1 &
  PROXY_PID=$!; PIDS+=("$PROXY_PID")
  wait_for "http://127.0.0.1:${ADMIN}/ready" "Envoy" "$PROXY_PID"
  STATS="curl -s http://127.0.0.1:${ADMIN}/stats/prometheus | grep '^sluice_'"
else
  target/debug/wasm-host serve --wasm "$WASM" --config "$CONFIG" --listen "127.0.0.1:${PORT}" \
    --upstream "http://127.0.0.1:${UPSTREAM}" --cluster "sluice-counter=127.0.0.1:${COUNTER}" \
    --env SLUICE_HASH_KEY --env SLUICE_COUNTER_TOKEN \
    --vm-id sluice --root-id sluice --plugin-name sluice --workers 2 >"$RUN/wasm-host.log" 2>&1 &
  PROXY_PID=$!; PIDS+=("$PROXY_PID")
  STATS="(wasm-host prints its metrics when it stops)"
fi
wait_for "$URL" "the proxy" "$PROXY_PID"
# The readiness probe spent one of this client's local tokens; wait for it to come back.
sleep 1.1

CODES="curl -s -o /dev/null -w '%{http_code} '"
cat <<FIRST

Sluice is running in ${HOST} at ${URL}, $((SECONDS - STARTED)) s after demo.sh started
(filter configuration: ${CONFIG}); sluice-counter is still building ($RUN/build.log).

1. The local per-client budget (5, then 1 per second, in this proxy's shared data; a
   request without x-tenant meets no global policy, so no counter service is needed):
     for i in 1 2 3 4 5 6; do ${CODES} ${URL}; done; echo
   gives 200 200 200 200 200 429, the 429 with RateLimit: "demo-per-client";r=0;t=1.
FIRST

fail() { echo "demo.sh: $*" >&2; exit 1; }
if $CHECK; then
  step1="$(for _ in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' "$URL"; done)"
  echo "1. no tenant: $step1($((SECONDS - STARTED)) s after demo.sh started)"
  [[ "$step1" == "200 200 200 200 200 429 " ]] || fail "step 1: expected 200 200 200 200 200 429"
  local1="$(curl -si "$URL")"
  grep -qi '^ratelimit: "demo-per-client";r=0' <<<"$local1" || fail "step 1: the 429 lacks the client's RateLimit field"
fi

echo
echo "==> waiting for sluice-counter's build ($RUN/build.log)"
wait "$BUILD_PID" || { tail -n 20 "$RUN/build.log" >&2; fail "sluice-counter did not build"; }
target/debug/sluice-counter --listen "127.0.0.1:${COUNTER}" --admin-token-env SLUICE_ADMIN_TOKEN \
  --hash-key-env SLUICE_HASH_KEY --log-format json >"$RUN/sluice-counter.log" 2>&1 &
COUNTER_PID=$!; PIDS+=("$COUNTER_PID")
wait_for "http://127.0.0.1:${COUNTER}/healthz" "sluice-counter" "$COUNTER_PID"
if [[ "$HOST" == envoy ]]; then
  # Envoy's own ratelimit filter, no wasm: envoy-config/envoy-rls.yaml against a second
  # sluice-counter that serves examples/ratelimit (envoyproxy/ratelimit's YAML) over RLS.
  target/debug/sluice-counter --listen "127.0.0.1:${RLS_COUNTER}" --rls-config examples/ratelimit \
    --rls-listen "127.0.0.1:${RLS}" --rls-response-headers retry-after --log-format json \
    >"$RUN/sluice-counter-rls.log" 2>&1 &
  RLS_COUNTER_PID=$!; PIDS+=("$RLS_COUNTER_PID")
  wait_for "http://127.0.0.1:${RLS_COUNTER}/healthz" "sluice-counter (RLS)" "$RLS_COUNTER_PID"
  target/envoy-venv/bin/python3 envoy-config/local.py --listen "127.0.0.1:${RLS_PROXY}" \
    --admin "127.0.0.1:${RLS_ADMIN}" --backend "127.0.0.1:${UPSTREAM}" --rls "127.0.0.1:${RLS}" \
    --token "$SLUICE_COUNTER_TOKEN" >"$RUN/envoy-rls.json"
  "$ENVOY" -c "$RUN/envoy-rls.json" --concurrency 2 --use-dynamic-base-id --log-path "$RUN/envoy-rls.log" \
    >"$RUN/envoy-rls.out" 2>&1 &
  RLS_PROXY_PID=$!; PIDS+=("$RLS_PROXY_PID")
  wait_for "http://127.0.0.1:${RLS_ADMIN}/ready" "Envoy (native ratelimit)" "$RLS_PROXY_PID"
  RLS_STEP="
7. Envoy's own ratelimit filter, no wasm module: a second Envoy (envoy-config/envoy-rls.yaml)
   at http://127.0.0.1:${RLS_PROXY}/ asks a second sluice-counter over RLS v3, which serves
   examples/ratelimit, envoyproxy/ratelimit's YAML unchanged (5 logins a minute per address):
     for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:${RLS_PROXY}/login/; done; echo
   gives 200 200 200 200 200 429; the 429 carries the exact Retry-After from the service.
"
else
  RLS_STEP=""
fi
# Step 1 emptied this client's local bucket: the global steps need it full again (5 s).
sleep 5.2

TENANT="curl -s -o /dev/null -w '%{http_code} ' -H"
cat <<WALKTHROUGH

sluice-counter is up at http://127.0.0.1:${COUNTER}/, $((SECONDS - STARTED)) s after demo.sh started.

2. The global per-tenant budget (3, then 10 per minute, kept by sluice-counter; this
   proxy leases acme's tokens and spends them locally):
     for i in 1 2 3 4; do ${TENANT} 'x-tenant: acme' ${URL}; done; echo
   gives 200 200 200 429; the 429 carries RateLimit: "demo-per-tenant";r=0;...
   The lease's metrics: ${STATS} | grep lease

3. The local per-client budget again, under a tenant: acme's rejected request gave its
   local token back, so two more for another tenant
     for i in 1 2 3; do ${TENANT} 'x-tenant: globex' ${URL}; done; echo
   gives 200 200 429, this time RateLimit: "demo-per-client";r=0;t=1.

4. A token budget (200 tokens per tenant per minute under /v1/): each request spends an
   estimate of 50 and is charged what the answer reports (120 here):
     for i in 1 2 3; do ${TENANT} 'x-tenant: hooli' ${URL}v1/usage.json; done; echo
   gives 200 200 429: the second answer took the budget 40 tokens into debt, and the 429
   says RateLimit-Policy: "demo-tokens";q=200;w=60;qu="tokens" and when it is paid:
     ${STATS} | grep cost

5. An operator clamps the global API budget (10, then 1 per second per tenant) to 1 a minute
   from sluice-counter's CLI, for a minute, audited:
     ${TENANT} 'x-tenant: umbrella' ${URL}api/; echo     # 200: the service learns the policy
     target/debug/sluice-counter override set --url http://127.0.0.1:${COUNTER} \\
       --admin-token-env SLUICE_ADMIN_TOKEN --kind clamp --policy demo-api \\
       --limit '{"algorithm":"token_bucket","amount":1,"per_ms":60000,"burst":1}' \\
       --ttl-ms 60000 --reason "downstream degraded" --operator you
     curl -si -H 'x-tenant: umbrella' ${URL}api/ | grep -iE '^HTTP|sluice-override'   # twice
   gives 200 then 429, named x-sluice-override: clamp; id=ovr-...; policy=demo-api; the
   audit line is in ${RUN}/sluice-counter.log, and the clamp ends by itself after a minute.

6. Stop the counter service and watch the emergency cap decide (2 per tenant):
     kill ${COUNTER_PID}; sleep 1; curl -si -H 'x-tenant: initech' ${URL} | grep -i sluice-fallback
   gives x-sluice-fallback: emergency; reason=refused; policies=demo-per-tenant, and its metric moves:
     ${STATS} | grep -E 'emergency|degraded'
${RLS_STEP}
Ctrl-C stops everything. Logs are in ${RUN}/.
WALKTHROUGH

if ! $CHECK; then
  wait "$PROXY_PID"
  exit 0
fi

# One series of Envoy's /stats/prometheus (labelled by the shipped bootstrap's stats_tags).
prometheus_series() { curl -s "http://127.0.0.1:${ADMIN}/stats/prometheus" | grep -F "$1 " || true; }
codes() { local out=""; for _ in $(seq 1 "$2"); do out+="$(curl -s -o /dev/null -w '%{http_code}' -H "x-tenant: $1" "$URL") "; done; echo "$out"; }
echo
step2="$(codes acme 4)"; echo "2. acme: $step2"
[[ "$step2" == "200 200 200 429 " ]] || fail "step 2: expected 200 200 200 429"
global="$(curl -si -H 'x-tenant: acme' "$URL")"
grep -qi '^ratelimit: "demo-per-tenant";r=0' <<<"$global" || fail "step 2: the 429 lacks the tenant's RateLimit field"
grep -qi '^retry-after:' <<<"$global" || fail "step 2: the 429 lacks Retry-After"
if [[ "$HOST" == envoy ]]; then
  granted="$(prometheus_series 'sluice_lease_granted_tokens_total{policy="demo-per-tenant"}')"
  echo "   $granted"
  grep -Eq '} [1-9]' <<<"$granted" || fail "step 2: the lease metric shows no tokens granted"
fi
step3="$(codes globex 3)"; echo "3. globex: $step3"
[[ "$step3" == "200 200 429 " ]] || fail "step 3: expected 200 200 429"
local_="$(curl -si -H 'x-tenant: globex' "$URL")"
grep -qi '^ratelimit: "demo-per-client";r=0' <<<"$local_" || fail "step 3: the 429 lacks the client's RateLimit field"
sleep 4.2  # the client's local bucket refills four tokens: step 4 must find it never empty
step4="$(for _ in 1 2 3; do curl -s -o /dev/null -w '%{http_code} ' -H 'x-tenant: hooli' "${URL}v1/usage.json"; done)"
echo "4. hooli's tokens: $step4"
[[ "$step4" == "200 200 429 " ]] || fail "step 4: expected 200 200 429 (120 tokens charged per answer)"
tokens="$(curl -si -H 'x-tenant: hooli' "${URL}v1/usage.json")"
grep -qi '^ratelimit-policy: "demo-tokens";q=200;w=60;qu="tokens"' <<<"$tokens" \
  || fail "step 4: the 429 lacks the token budget's RateLimit-Policy with its unit: $tokens"
grep -qi '^retry-after: [1-9]' <<<"$tokens" || fail "step 4: the 429 lacks Retry-After"
if [[ "$HOST" == envoy ]]; then
  charged="$(prometheus_series 'sluice_cost_charged_units_total{policy="demo-tokens"}')"
  echo "   $charged"
  grep -q '} 140$' <<<"$charged" || fail "step 4: two answers of 120 over estimates of 50 charge 140"
fi
sleep 2.2  # the client's local bucket refills two tokens
before="$(curl -s -o /dev/null -w '%{http_code}' -H 'x-tenant: umbrella' "${URL}api/")"
clamp="$(target/debug/sluice-counter override set --url "http://127.0.0.1:${COUNTER}" \
  --admin-token-env SLUICE_ADMIN_TOKEN --kind clamp --policy demo-api \
  --limit '{"algorithm":"token_bucket","amount":1,"per_ms":60000,"burst":1}' \
  --ttl-ms 60000 --reason "downstream degraded" --operator demo)" || fail "step 5: override set failed"
id="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])' <<<"$clamp")"
first="$(curl -s -o /dev/null -w '%{http_code}' -H 'x-tenant: umbrella' "${URL}api/")"
clamped="$(curl -si -H 'x-tenant: umbrella' "${URL}api/")"
echo "5. umbrella before the clamp: $before; under ${id}: $first $(head -1 <<<"$clamped" | tr -d '\r')"
echo "   $(grep -i '^x-sluice-override' <<<"$clamped" | tr -d '\r')"
[[ "$before $first" == "200 200" ]] || fail "step 5: expected 200, then 200 under the clamp's burst of 1"
grep -qi '^HTTP/1.1 429' <<<"$clamped" || fail "step 5: the clamp should reject the third request"
grep -qi "^x-sluice-override: clamp; id=${id}; policy=demo-api" <<<"$clamped" \
  || fail "step 5: the 429 does not name the clamp"
grep -q 'override_set' "$RUN/sluice-counter.log" && grep -q "$id" "$RUN/sluice-counter.log" \
  || fail "step 5: the clamp is not in the audit log"
echo "   audited: $(grep "$id" "$RUN/sluice-counter.log" | head -1 | python3 -c 'import json, sys
f = json.load(sys.stdin)["fields"]; print(" ".join(f"{k}={f[k]}" for k in ("event", "id", "policy", "operator", "reason")))')"
kill "$COUNTER_PID"; wait "$COUNTER_PID" 2>/dev/null || true
sleep 2.2  # the client's local bucket refills two tokens
fallback="$(curl -si -H 'x-tenant: initech' "$URL")"
echo "6. after stopping sluice-counter: $(grep -i sluice-fallback <<<"$fallback" | tr -d '\r')"
grep -qi '^HTTP/1.1 200' <<<"$fallback" || fail "step 6: the emergency cap should admit"
grep -qi '^x-sluice-fallback: emergency; reason=refused' <<<"$fallback" || fail "step 6: no emergency fallback header"
if [[ "$HOST" == envoy ]]; then
  metric="$(prometheus_series 'sluice_emergency_decisions_total{policy="demo-per-tenant",outcome="allowed"}')"
  echo "   $metric"
  grep -q '} 1$' <<<"$metric" || fail "step 6: the emergency metric did not move"
  # Five logins a minute, in windows aligned to the minute: start well inside one.
  while (( $(date +%s) % 60 > 50 )); do sleep 0.5; done
  step7="$(for _ in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' "http://127.0.0.1:${RLS_PROXY}/login/"; done)"
  echo "7. Envoy's native ratelimit filter, envoyproxy/ratelimit's YAML, sluice-counter over RLS: $step7"
  [[ "$step7" == "200 200 200 200 200 429 " ]] || fail "step 7: expected five logins, then 429"
  refused="$(curl -si "http://127.0.0.1:${RLS_PROXY}/login/")"
  echo "   $(grep -i '^retry-after' <<<"$refused" | tr -d '\r')"
  grep -qi '^retry-after: [1-9]' <<<"$refused" || fail "step 7: the 429 lacks the service's Retry-After"
fi
echo "demo.sh: OK"

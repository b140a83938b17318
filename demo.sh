#!/usr/bin/env bash
# Sluice demo: builds sluice.wasm, runs it in wasm-host's reverse proxy in front of a
# built-in echo upstream, and shows the 429 after the burst.
#
#   ./demo.sh            start the proxy and print the URL and a curl line (Ctrl-C stops it)
#   ./demo.sh --check    start it, run the curl line, check the 429 and its headers, stop
#
# Needs cargo (rustup; rust-toolchain.toml pins the toolchain and wasm target) and curl.
# PORT (default 8080) picks the listening port; CONFIG (default examples/demo.json) the
# filter configuration: 5 requests of burst per client address, then 1 per second.
set -euo pipefail

cd "$(dirname "$0")"
PORT="${PORT:-8080}"
CONFIG="${CONFIG:-examples/demo.json}"
URL="http://127.0.0.1:${PORT}/"
CHECK=false
[[ "${1:-}" == "--check" ]] && CHECK=true

for tool in cargo curl; do
  command -v "$tool" >/dev/null || { echo "demo.sh: $tool is required" >&2; exit 1; }
done

# rust-toolchain.toml lists the wasm target, but rustup adds listed targets only when it
# installs the toolchain itself; on a machine that already had it, add the target here.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "==> adding the wasm32-wasip1 target"
  rustup target add wasm32-wasip1
fi

echo "==> building sluice.wasm (wasm32-wasip1, release) and wasm-host"
cargo build --quiet --release --target wasm32-wasip1 -p sluice-filter
# wasm-host in the dev profile: its dependencies are optimised there too (see the
# workspace Cargo.toml), it builds much faster than the LTO release profile, and it
# shares its build with `cargo test`.
cargo build --quiet -p wasm-host --bin wasm-host
WASM="target/wasm32-wasip1/release/sluice.wasm"
HOST="target/debug/wasm-host"

if curl -s -o /dev/null "$URL" 2>/dev/null; then
  echo "demo.sh: something already answers on port ${PORT}; set PORT to another port" >&2
  exit 1
fi

"$HOST" serve --wasm "$WASM" --config "$CONFIG" --listen "127.0.0.1:${PORT}" \
  --vm-id sluice --root-id sluice --plugin-name sluice --workers 2 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
  curl -s -o /dev/null "$URL" --max-time 1 -H 'x-demo-probe: 1' 2>/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { echo "demo.sh: wasm-host exited" >&2; exit 1; }
  sleep 0.1
done
# The readiness probe spent one token; wait for it to come back (1 per second).
sleep 1.1

CURL_LINE="for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' ${URL}; done; echo; curl -si ${URL}"

cat <<EOF

Sluice is running at ${URL}  (filter config: ${CONFIG})
The echo upstream answers 200; each client address gets a burst of 5, then 1 per second.

Try:
  ${CURL_LINE}

The sixth request and the last one get 429 with Retry-After, RateLimit-Policy, RateLimit
and X-RateLimit-* headers. Ctrl-C stops the proxy.
EOF

if $CHECK; then
  echo
  output="$(bash -c "$CURL_LINE")"
  echo "$output"
  grep -q '^200 200 200 200 200 429' <<<"$output" || { echo "demo.sh: expected five 200s then a 429" >&2; exit 1; }
  grep -qi '^HTTP/1.1 429' <<<"$output" || { echo "demo.sh: expected a 429" >&2; exit 1; }
  for header in retry-after ratelimit-policy ratelimit x-ratelimit-remaining; do
    grep -qi "^${header}:" <<<"$output" || { echo "demo.sh: the 429 lacks ${header}" >&2; exit 1; }
  done
  echo "demo.sh: OK"
  exit 0
fi

wait "$SERVER"

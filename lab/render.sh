#!/usr/bin/env bash
# Renders every shipped scenario of lab/scenarios under its configurations, and the
# comparisons the labs call for, into target/lab-reports (or $1). CI runs it; the tests
# (lab/tests/it/reports.rs) read the `run` lines below and check the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-target/lab-reports}"
cargo build --quiet --release --target wasm32-wasip1 -p sluice-filter
cargo build --quiet --profile test -p sluice-lab
LAB=target/debug/sluice-lab
mkdir -p "$OUT"

run() {
  local scenario="$1" config="$2"
  "$LAB" run "lab/scenarios/$scenario" --config "lab/configs/$config" --out "$OUT/${scenario%.yaml}--${config%.json}"
}
compare() {
  local a="$1" b="$2" scenario="$3"
  "$LAB" compare "lab/configs/$a" "lab/configs/$b" "lab/scenarios/$scenario" \
    --out "$OUT/${scenario%.yaml}--${a%.json}-vs-${b%.json}"
}

# Lab 1: saved burst credit against request pressure (a launch spike, a retry wave;
# immediate rejection against a bounded two-second queue).
run launch-spike.yaml bucket-reject.json
run launch-spike.yaml bucket-queue.json
run retry-wave.yaml bucket-reject.json
run retry-wave.yaml bucket-queue.json
compare bucket-reject.json bucket-queue.json launch-spike.yaml
compare bucket-reject.json bucket-queue.json retry-wave.yaml
# Lab 2: one identity budget across three regions; centralized, local and hybrid
# counters; the abusive region partitioned; fail open against fail closed.
run regions-partition.yaml identity-check-fail-open.json
run regions-partition.yaml identity-check-fail-closed.json
run regions-partition.yaml identity-lease-fail-open.json
run regions-partition.yaml identity-lease-fail-closed.json
run regions-partition.yaml identity-local.json
compare identity-check-fail-open.json identity-check-fail-closed.json regions-partition.yaml
# Lease returns: a caller that moves from one region to another.
run moving-caller.yaml moving-lease.json
# The game day.
run gameday.yaml gameday.json

echo "reports in $OUT: $(ls "$OUT" | wc -l) directories, each with index.html"

#!/usr/bin/env bash
# Runs the decision benchmark RUNS times (default 3) and prints, per benchmark, the
# median over runs of criterion's median estimate, and its ratio to governor's in the
# same group. Usage: shared-store/benches/compare.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
results=$(mktemp)
for _ in $(seq "$runs"); do
  cargo bench -q -p shared-store --bench decision -- --warm-up-time 2 --measurement-time 5 >/dev/null 2>&1
  python3 - >>"$results" <<'PY'
import glob, json, os
for path in glob.glob("target/criterion/**/new/benchmark.json", recursive=True):
    bench = json.load(open(path))
    estimates = json.load(open(os.path.join(os.path.dirname(path), "estimates.json")))
    print(json.dumps([bench["group_id"], bench["full_id"], estimates["median"]["point_estimate"]]))
PY
done
python3 - "$results" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
groups = {}
for line in open(sys.argv[1]):
    group, name, ns = json.loads(line)
    if group.startswith("token bucket"):
        runs[name].append(ns)
        groups[name] = group
median = {name: statistics.median(v) for name, v in runs.items()}
print(f"{'benchmark':<64} {'median ns':>10} {'x governor':>11}  per run")
for name in sorted(median, key=lambda n: (groups[n], "governor" not in n, n)):
    base = next(m for n, m in median.items() if groups[n] == groups[name] and "governor" in n)
    print(f"{name:<64} {median[name]:>10.1f} {median[name] / base:>11.2f}  " + " ".join(f"{t:.1f}" for t in runs[name]))
PY
rm -f "$results"

#!/usr/bin/env bash
# Checks deploy/ without installing anything (needs promtool, from the distribution's
# `prometheus` package, and the Python packages of deploy/requirements.txt):
# * the rule file is valid (promtool check rules) and its unit tests pass (promtool test rules);
# * every dashboard query parses as PromQL (promtool checks them as recording rules);
# * the generated files (dashboard JSON, PrometheusRule, ServiceMonitor) are what
#   deploy/generate.py generates, the dashboard's queries use only $policy, $proxy and
#   $__rate_interval, and every alert has a firing and a quiet test, every recording rule a
#   value test (deploy/generate.py --check).
# Exit status 0 when everything holds.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$1"; }

step "promtool check rules deploy/prometheus/sluice-rules.yaml"
promtool check rules deploy/prometheus/sluice-rules.yaml

step "promtool test rules deploy/prometheus/sluice-rules.test.yaml"
promtool test rules deploy/prometheus/sluice-rules.test.yaml

step "every dashboard query parses (promtool, as recording rules)"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 deploy/generate.py --queries | python3 -c '
import json, sys, yaml
queries = json.load(sys.stdin)
rules = [{"record": f"dashboard:query_{i}:check", "expr": q["expr"]} for i, q in enumerate(queries)]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sys.stdout)
print(f"{len(queries)} queries", file=sys.stderr)
' >"$scratch/dashboard-queries.yaml"
promtool check rules "$scratch/dashboard-queries.yaml"

step "python3 deploy/generate.py --check"
python3 deploy/generate.py --check

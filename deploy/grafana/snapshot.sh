#!/usr/bin/env bash
# Makes docs/dashboard.png: runs the end-to-end Prometheus test (real Envoy with
# sluice.wasm, sluice-counter, a real Prometheus, traffic that admits, rejects, shapes,
# falls back and is overridden) and has it draw the shipped dashboard from what its
# Prometheus scraped (deploy/grafana/render.py). Needs Prometheus (Debian's package),
# Envoy (envoy-config/install-envoy.sh) and matplotlib (render-requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install --quiet --disable-pip-version-check -r deploy/grafana/render-requirements.txt
SLUICE_DASHBOARD_PNG="$PWD/docs/dashboard.png" cargo test -p sluice-tests --test envoy \
  prometheus::every_dashboard_panel -- --nocapture 2>&1 | grep -E "render.py|test result"

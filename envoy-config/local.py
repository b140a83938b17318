#!/usr/bin/env python3
"""Rewrites envoy.yaml (or envoy-rls.yaml) to run on one machine, and prints the result as a JSON bootstrap.

What changes: the listener's and the admin's addresses, the `backend` and
`sluice-counter` endpoints, the path of sluice.wasm, and (with --config) the plugin
configuration. Everything else, the filter block above all, is envoy.yaml as shipped:
./demo.sh runs Envoy with this output, and so does the Envoy test of the deployment
bootstrap, so the two cannot drift apart.

Usage: python3 envoy-config/local.py --listen 127.0.0.1:8080 --admin 127.0.0.1:9901 \\
           --backend 127.0.0.1:8081 --counter 127.0.0.1:8710 --wasm path/to/sluice.wasm \\
           [--config examples/demo.json] > envoy.json
       python3 envoy-config/local.py --listen ... --admin ... --backend ... \\
           --rls 127.0.0.1:8081 --token TOKEN > envoy-rls.json
           (envoy-rls.yaml: Envoy's native ratelimit filter against sluice-counter's RLS
           port, with the bearer token in its initial_metadata)
Needs PyYAML (envoy-config/requirements.txt).
"""

import argparse
import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def address(text: str) -> dict:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"local.py: expected HOST:PORT, got {text!r}")
    return {"socket_address": {"address": host, "port_value": int(port)}}


def wasm_filters(node):
    if isinstance(node, dict):
        if node.get("@type", "").endswith("envoy.extensions.filters.http.wasm.v3.Wasm"):
            yield node["config"]
        for value in node.values():
            yield from wasm_filters(value)
    elif isinstance(node, list):
        for value in node:
            yield from wasm_filters(value)


def on_this_machine(name: str, args, endpoints: dict) -> dict:
    """The bootstrap `name` with the listener, the admin interface and each cluster of
    `endpoints` (cluster name: HOST:PORT) at the addresses given."""
    bootstrap = yaml.safe_load((HERE / name).read_text())
    resources = bootstrap["static_resources"]
    resources["listeners"][0]["address"] = address(args.listen)
    bootstrap["admin"]["address"] = address(args.admin)
    endpoints = dict(endpoints)
    for cluster in resources["clusters"]:
        target = endpoints.pop(cluster["name"], None)
        if target is not None:
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = address(target)
    if endpoints:
        raise SystemExit(f"local.py: {name} has no cluster named {', '.join(endpoints)}")
    return bootstrap


def rls(args) -> int:
    """envoy-rls.yaml on this machine: its addresses and the bearer token."""
    bootstrap = on_this_machine("envoy-rls.yaml", args, {"backend": args.backend, "sluice-counter-rls": args.rls})
    resources = bootstrap["static_resources"]
    if args.token:
        manager = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        for http_filter in manager["http_filters"]:
            service = http_filter["typed_config"].get("rate_limit_service")
            if service:
                service["grpc_service"]["initial_metadata"] = [
                    {"key": "authorization", "value": f"Bearer {args.token}"}
                ]
    json.dump(bootstrap, sys.stdout, indent=2)
    print()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="the listener, HOST:PORT (port 0 lets Envoy pick)")
    parser.add_argument("--admin", required=True, help="the admin interface, HOST:PORT")
    parser.add_argument("--backend", required=True, help="the upstream, HOST:PORT")
    parser.add_argument("--counter", help="sluice-counter, HOST:PORT")
    parser.add_argument("--wasm", help="the sluice.wasm to load")
    parser.add_argument("--config", help="a plugin configuration file to use instead of the embedded one")
    parser.add_argument("--rls", help="sluice-counter's RLS port, HOST:PORT: rewrite envoy-rls.yaml instead")
    parser.add_argument("--token", help="with --rls: the bearer token Envoy sends the service")
    args = parser.parse_args()

    if args.rls:
        return rls(args)
    if not args.counter or not args.wasm:
        raise SystemExit("local.py: --counter and --wasm are required (or --rls for envoy-rls.yaml)")
    bootstrap = on_this_machine("envoy.yaml", args, {"backend": args.backend, "sluice-counter": args.counter})
    filters = list(wasm_filters(bootstrap))
    if len(filters) != 1:
        raise SystemExit(f"local.py: expected one Sluice filter in envoy.yaml, found {len(filters)}")
    filters[0]["vm_config"]["code"]["local"]["filename"] = str(Path(args.wasm).resolve())
    if args.config:
        configuration = Path(args.config).read_text()
        json.loads(configuration)  # a configuration must at least be JSON
        filters[0]["configuration"]["value"] = configuration
    json.dump(bootstrap, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

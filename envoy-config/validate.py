#!/usr/bin/env python3
"""Validates the deployment configs in this folder against their platforms' own schemas.

* envoy.yaml and envoy-rls.yaml (Envoy's native ratelimit filter against sluice-counter's
  RLS front door): parsed as an Envoy v3 Bootstrap by envoy-data-plane (Envoy's API protos
  compiled to Python). Parsing is strict: an unknown field anywhere, including inside
  every typed_config (resolved through its @type), is an error, and so is a value of the
  wrong type or an unknown enum name.
* wasmplugin.yaml: validated against Istio's WasmPlugin CRD (schemas/, copied from
  istio/api) with jsonschema, plus a strictness walk: Kubernetes prunes unknown fields
  silently, so a typo there would be ignored by the cluster; here it is an error.

Also checks that the Sluice plugin configuration embedded in each file is a JSON object
(the filter itself validates its content: see tests/tests/deployment_configs.rs).

Usage: python3 envoy-config/validate.py   (after pip install -r envoy-config/requirements.txt)
Exit status 0 when every file is valid.
"""

import importlib
import json
import sys
from pathlib import Path

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent


def import_type(type_url: str) -> None:
    """Imports the envoy-data-plane module that registers a type URL in the message pool."""
    name = type_url.rsplit("/", 1)[-1]
    package = name.rsplit(".", 1)[0]
    importlib.import_module(f"envoy_data_plane.{package}")


def type_urls(node):
    if isinstance(node, dict):
        if isinstance(node.get("@type"), str):
            yield node["@type"]
        for value in node.values():
            yield from type_urls(value)
    elif isinstance(node, list):
        for value in node:
            yield from type_urls(value)


def find_wasm_configurations(node):
    """Yields the `configuration` Any of every wasm filter config."""
    if isinstance(node, dict):
        if node.get("@type", "").endswith("envoy.extensions.filters.http.wasm.v3.Wasm"):
            yield node["config"]["configuration"]
        for value in node.values():
            yield from find_wasm_configurations(value)
    elif isinstance(node, list):
        for value in node:
            yield from find_wasm_configurations(value)


def validate_envoy(path: Path, wasm_required: bool = True) -> list[str]:
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap

    document = yaml.safe_load(path.read_text())
    errors = []
    for url in set(type_urls(document)):
        try:
            import_type(url)
        except ModuleNotFoundError:
            errors.append(f"{path.name}: unknown @type {url}")
    if errors:
        return errors
    try:
        Bootstrap.from_dict(document)
    except Exception as error:  # envoy-data-plane raises KeyError/TypeError/ValueError/ValidationError
        return [f"{path.name}: not a valid Envoy v3 Bootstrap: {type(error).__name__}: {error}"]
    configurations = list(find_wasm_configurations(document))
    if not configurations and wasm_required:
        return [f"{path.name}: no envoy.filters.http.wasm filter found"]
    for any_value in configurations:
        if not any_value.get("@type", "").endswith("google.protobuf.StringValue"):
            errors.append(f"{path.name}: the wasm configuration must be a google.protobuf.StringValue")
            continue
        try:
            if not isinstance(json.loads(any_value["value"]), dict):
                errors.append(f"{path.name}: the Sluice configuration must be a JSON object")
        except json.JSONDecodeError as error:
            errors.append(f"{path.name}: the Sluice configuration is not JSON: {error}")
    return errors


def unknown_fields(instance, schema, where="") -> list[str]:
    """Fields present in the manifest but absent from the (structural) CRD schema."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(instance, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, value in instance.items():
            if properties is not None and key in properties:
                found += unknown_fields(value, properties[key], f"{where}.{key}")
            elif isinstance(additional, dict):
                found += unknown_fields(value, additional, f"{where}.{key}")
            elif properties is not None:
                found.append(f"{where}.{key}" if where else key)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for index, value in enumerate(instance):
            found += unknown_fields(value, schema["items"], f"{where}[{index}]")
    return found


def validate_istio(path: Path) -> list[str]:
    crd = yaml.safe_load((HERE / "schemas" / "istio-wasmplugin-crd.yaml").read_text())
    manifest = yaml.safe_load(path.read_text())
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    versions = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    api_group, _, version = manifest.get("apiVersion", "").partition("/")
    if api_group != group or version not in versions or manifest.get("kind") != kind:
        return [f"{path.name}: expected apiVersion {group}/<{'|'.join(versions)}> and kind {kind}"]
    schema = versions[version]["schema"]["openAPIV3Schema"]
    errors = [
        f"{path.name}: {'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in jsonschema.Draft7Validator(schema).iter_errors(manifest)
    ]
    spec_schema = schema["properties"]["spec"]
    errors += [
        f"{path.name}: {field}: not a field of {kind}"
        for field in unknown_fields(manifest.get("spec", {}), spec_schema, "spec")
    ]
    metadata = manifest.get("metadata", {})
    for field in metadata:
        if field not in {"name", "namespace", "labels", "annotations"}:
            errors.append(f"{path.name}: metadata.{field}: unexpected in a manifest")
    if not isinstance(manifest.get("spec", {}).get("pluginConfig"), dict):
        errors.append(f"{path.name}: spec.pluginConfig must hold the Sluice configuration")
    return errors


def validate_counter(path: Path, plugin: Path) -> list[str]:
    """The counter service's manifests: a Service and a Deployment, and the cluster name the
    WasmPlugin's configuration calls (Istio's `outbound|<port>||<host>`) is this Service's."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {(d.get("apiVersion"), d.get("kind")) for d in documents}
    errors = [
        f"{path.name}: expected a {kind} ({version})"
        for version, kind in [("v1", "Service"), ("apps/v1", "Deployment")]
        if (version, kind) not in kinds
    ]
    service = next((d for d in documents if d.get("kind") == "Service"), None)
    if service is None:
        return errors
    meta = service.get("metadata", {})
    ports = [p.get("port") for p in service.get("spec", {}).get("ports", [])]
    cluster = yaml.safe_load(plugin.read_text())["spec"]["pluginConfig"]["counter_service"]["cluster"]
    expected = {f"outbound|{port}||{meta.get('name')}.{meta.get('namespace')}.svc.cluster.local" for port in ports}
    if cluster not in expected:
        errors.append(f"{plugin.name}: counter_service.cluster {cluster!r} is not the Service's cluster ({sorted(expected)})")
    return errors


def self_test() -> list[str]:
    """Proves the checks are not vacuous: each seeded mistake must be reported."""
    import tempfile

    def rls(path: Path) -> list[str]:
        return validate_envoy(path, wasm_required=False)

    mutants = [
        ("envoy.yaml", validate_envoy, "stat_prefix: ingress_http", "stat_prefx: ingress_http"),
        ("envoy.yaml", validate_envoy, "vm_id: sluice", "vm_idd: sluice"),
        ("envoy.yaml", validate_envoy, "failure_policy: FAIL_RELOAD", "failure_policy: FAIL_SOMETIMES"),
        ("envoy-rls.yaml", rls, "failure_mode_deny: true", "failure_mode_denny: true"),
        ("envoy-rls.yaml", rls, "enable_x_ratelimit_headers: DRAFT_VERSION_03", "enable_x_ratelimit_headers: DRAFT_04"),
        ("wasmplugin.yaml", validate_istio, "failStrategy: FAIL_RELOAD", "failStratgy: FAIL_RELOAD"),
        ("wasmplugin.yaml", validate_istio, "phase: AUTHN", "phase: EARLY"),
        ("wasmplugin.yaml", validate_istio, "valueFrom: HOST\n    - name", "valueFrom: ELSEWHERE\n    - name"),
        (
            "sluice-counter.yaml",
            lambda p: validate_counter(p, HERE / "wasmplugin.yaml"),
            "port: 8710\n    targetPort",
            "port: 8711\n    targetPort",
        ),
    ]
    problems = []
    for name, check, before, after in mutants:
        text = (HERE / name).read_text()
        if before not in text:
            problems.append(f"self-test: {name} no longer contains {before!r}")
            continue
        with tempfile.TemporaryDirectory() as folder:
            mutant = Path(folder) / name
            mutant.write_text(text.replace(before, after, 1))
            if not check(mutant):
                problems.append(f"self-test: {name} with {after!r} was accepted")
    return problems


def main() -> int:
    errors = (
        validate_envoy(HERE / "envoy.yaml")
        + validate_envoy(HERE / "envoy-rls.yaml", wasm_required=False)
        + validate_istio(HERE / "wasmplugin.yaml")
        + validate_counter(HERE / "sluice-counter.yaml", HERE / "wasmplugin.yaml")
        + self_test()
    )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return 1
    print(
        "envoy.yaml, envoy-rls.yaml: valid Envoy v3 Bootstraps; wasmplugin.yaml: valid Istio WasmPlugin; "
        "sluice-counter.yaml: the Service the WasmPlugin calls"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Validates the deployment configs in this folder against their platforms' own schemas.

* envoy.yaml and envoy-rls.yaml (Envoy's native ratelimit filter against sluice-counter's
  RLS front door): parsed as an Envoy v3 Bootstrap by envoy-data-plane (Envoy's API protos
  compiled to Python). Parsing is strict: an unknown field anywhere, including inside
  every typed_config (resolved through its @type), is an error, and so is a value of the
  wrong type or an unknown enum name.
* Every document of every Kubernetes manifest (a YAML file of envoy-config/, or anywhere
  under deploy/ at the repository's root, whose documents have an apiVersion and a kind):
  - a built-in kind (Service, Deployment, ...): against Kubernetes' own OpenAPI schema of
    KUBERNETES_VERSION, bundled by kubernetes-validate, strictly: an unknown field is an
    error, and so is a value of the wrong type;
  - a custom resource (Istio's WasmPlugin, prometheus-operator's PrometheusRule and
    ServiceMonitor): against its CRD's openAPIV3Schema (schemas/, copied from upstream:
    see each header) with jsonschema, plus a strictness walk: Kubernetes prunes unknown
    fields silently, so a typo there would be ignored by the cluster; here it is an error.
    A kind with no CRD in schemas/ is an error that names the schema to add.
* wasmplugin.yaml and sluice-counter.yaml, beyond their schemas: what Sluice depends on
  (the plugin configuration, and the counter's Service being the cluster it calls).
* istio-stats.yaml, a strategic-merge patch of the `api` Deployment (not an object itself):
  it sets the pod annotation proxy.istio.io/config and nothing else, and the Deployment it
  makes is valid against Kubernetes' schema; the annotation is an istio.mesh.v1alpha1
  ProxyConfig, checked strictly against istio/api's proto (schemas/, read by a small proto
  parser: an unknown field, a wrong type or enum value is an error, where Istio would ignore
  an unknown field); its extraStatTags are exactly the filter's label keys (LABEL_KEYS), as
  are envoy.yaml's `key=.=value` stats_tags (with the regex Istio generates) and the
  filter's LABELS (filter/src/series.rs) wherever those exist.

Also checks that the Sluice plugin configuration embedded in each file is a JSON object
(the filter itself validates its content: see tests/tests/deployment_configs.rs).

Errors name the file, the document (kind/name) and the path of the wrong field.

Usage: python3 envoy-config/validate.py   (after pip install -r envoy-config/requirements.txt)
Exit status 0 when every file is valid.
"""

import difflib
import functools
import importlib
import json
import re
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEPLOY = ROOT / "deploy"

# The Kubernetes release whose API schemas built-in kinds are checked against. Kubernetes
# supports its three newest minors; this is the oldest of the three that kubernetes-validate
# 1.37.0 bundles (1.35, 1.36, 1.37), so a field only newer clusters know is an error too.
KUBERNETES_VERSION = "1.35"


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


def documents_in(text: str) -> list:
    """The documents of a YAML text, empty ones left out."""
    return [document for document in yaml.safe_load_all(text) if document is not None]


def yaml_documents(path: Path) -> list:
    """The documents of a YAML file, empty ones left out."""
    return documents_in(path.read_text())


def is_object(document) -> bool:
    """A Kubernetes object: a mapping with a string apiVersion and kind."""
    return (
        isinstance(document, dict)
        and isinstance(document.get("apiVersion"), str)
        and isinstance(document.get("kind"), str)
    )


def kubernetes_manifests() -> list[Path]:
    """The Kubernetes manifests to validate: the YAML files directly in envoy-config/ (not
    schemas/, upstream's CRDs) and at any depth under deploy/ that hold a Kubernetes object.
    A file that is not YAML is listed too, so that validate_manifest reports it."""
    files = [*sorted(HERE.glob("*")), *sorted(DEPLOY.rglob("*"))]
    found = []
    for path in files:
        if path.suffix not in {".yaml", ".yml"} or not path.is_file():
            continue
        try:
            if any(is_object(document) for document in yaml_documents(path)):
                found.append(path)
        except yaml.YAMLError:
            found.append(path)
    return found


def shown(path: Path) -> str:
    """A file as errors name it: relative to envoy-config/, else to the repository."""
    for base in (HERE, ROOT):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return path.name


def described(document: dict) -> str:
    """A document as errors name it: kind/name."""
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return f"{document['kind']}/{name or '<no name>'}"


def dotted(path) -> str:
    """A field's path as kubectl writes it: spec.ports[0].port; the document itself is (root)."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(root)"


def schema_errors(error: jsonschema.ValidationError) -> list[str]:
    """A schema violation as `path: what`; a field the schema does not declare is named by its
    own path (jsonschema names the object that holds it)."""
    where = list(error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False and isinstance(error.instance, dict):
        declared = error.schema.get("properties", {})
        return [f"{dotted(where + [key])}: unknown field" for key in error.instance if key not in declared]
    return [f"{dotted(where)}: {error.message}"]


def unknown_fields(instance, schema, where: list | None = None) -> list[str]:
    """Fields present in the manifest but absent from the (structural) CRD schema."""
    where = where or []
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(instance, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, value in instance.items():
            if properties is not None and key in properties:
                found += unknown_fields(value, properties[key], where + [key])
            elif isinstance(additional, dict):
                found += unknown_fields(value, additional, where + [key])
            elif properties is not None:
                found.append(dotted(where + [key]))
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for index, value in enumerate(instance):
            found += unknown_fields(value, schema["items"], where + [index])
    return found


def go_pattern(validator, pattern: str, instance, schema):
    """jsonschema's `pattern` for CRDs, whose regular expressions are Go's (RE2): RE2 takes
    flags after the anchor (prometheus-operator's `^(?i)(abort|warn)?$`), Python only first."""
    if not validator.is_type(instance, "string"):
        return
    flags = re.match(r"\^\(\?([ims]+)\)", pattern)
    python = f"(?{flags[1]})^{pattern[flags.end():]}" if flags else pattern
    if not re.search(python, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


CrdValidator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": go_pattern})


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema, for every served version of every
    CustomResourceDefinition in schemas/."""
    table = {}
    for path in sorted((HERE / "schemas").glob("*.yaml")):
        for crd in yaml_documents(path):
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served"):
                    api_version = f"{spec['group']}/{version['name']}"
                    table[(api_version, spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return table


def custom_errors(document: dict, schema: dict) -> list[str]:
    """A custom resource against its CRD's schema, every violation; plus the fields the schema
    does not declare (the API server would prune them silently) and metadata beyond what a
    manifest sets (the CRD's schema leaves metadata to the API server)."""
    errors = [message for error in CrdValidator(schema).iter_errors(document) for message in schema_errors(error)]
    body = {key: value for key, value in document.items() if key not in {"apiVersion", "kind", "metadata"}}
    errors += [f"{field}: unknown field" for field in unknown_fields(body, schema)]  # those three: every object's
    metadata = document.get("metadata")
    for field in metadata if isinstance(metadata, dict) else []:
        if field not in {"name", "namespace", "labels", "annotations"}:
            errors.append(f"metadata.{field}: unexpected in a manifest")
    return errors


def is_builtin(api_version: str) -> bool:
    """Whether an apiVersion's group can be Kubernetes' own: the core group, a group without a
    domain (apps, batch, ...) or one of *.k8s.io. kubernetes-validate drops a group's domain,
    so a custom group must never reach it (networking.istio.io/v1 would be networking/v1)."""
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def builtin_errors(document: dict) -> list[str] | None:
    """A built-in kind against Kubernetes' schema of KUBERNETES_VERSION, strictly (unknown
    fields are errors): its first violation (kubernetes-validate stops there), or None when
    that Kubernetes has no such kind."""
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return None
    except kubernetes_validate.ValidationError as error:
        return schema_errors(error)
    return []


def missing_schema(document: dict) -> str:
    """The error for a kind with no schema here, naming the schema to add."""
    api_version, kind = document["apiVersion"], document["kind"]
    if api_version.startswith("monitoring.coreos.com/"):
        plural = kind.lower() + ("es" if kind.endswith("s") else "s")
        wanted = (
            f"envoy-config/schemas/prometheus-operator-{plural}-crd.yaml (prometheus-operator's "
            f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml, with a header naming its origin)"
        )
    else:
        wanted = "its CustomResourceDefinition to envoy-config/schemas/ (with a header naming its origin)"
    return (
        f"no schema for {api_version} {kind} (neither Kubernetes {KUBERNETES_VERSION} nor a CRD in "
        f"envoy-config/schemas/ defines it): add {wanted}"
    )


def document_errors(document: dict) -> list[str]:
    """One Kubernetes object against its kind's schema: its CRD's when schemas/ has one, else
    Kubernetes' own; a kind neither knows is an error."""
    schema = crd_schemas().get((document["apiVersion"], document["kind"]))
    if schema is not None:
        return custom_errors(document, schema)
    errors = builtin_errors(document) if is_builtin(document["apiVersion"]) else None
    return [missing_schema(document)] if errors is None else errors


def validate_manifest(path: Path) -> list[str]:
    """Every document of a Kubernetes manifest against its kind's schema; each error names the
    file, the document (kind/name) and the path of the wrong field."""
    try:
        documents = yaml_documents(path)
    except yaml.YAMLError as error:
        return [f"{shown(path)}: not YAML: {error}"]
    errors = []
    for index, document in enumerate(documents, 1):
        if not is_object(document):
            errors.append(f"{shown(path)}: document {index}: not a Kubernetes object (no apiVersion and kind)")
            continue
        errors += [f"{shown(path)}: {described(document)}: {error}" for error in document_errors(document)]
    return errors


def validate_istio(path: Path) -> list[str]:
    """wasmplugin.yaml beyond its CRD's schema (validate_manifest checks that): a WasmPlugin of
    a served version, whose pluginConfig holds the Sluice configuration."""
    crd = yaml_documents(HERE / "schemas" / "istio-wasmplugin-crd.yaml")[0]
    manifest = yaml.safe_load(path.read_text())
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    versions = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    api_group, _, version = manifest.get("apiVersion", "").partition("/")
    if api_group != group or version not in versions or manifest.get("kind") != kind:
        return [f"{path.name}: expected apiVersion {group}/<{'|'.join(versions)}> and kind {kind}"]
    if not isinstance(manifest.get("spec", {}).get("pluginConfig"), dict):
        return [f"{path.name}: {described(manifest)}: spec.pluginConfig must hold the Sluice configuration"]
    return []


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


# --- Istio's ProxyConfig (istio-stats.yaml) ----------------------------------------------

# The label keys the filter writes into its metric names (`key=.=value;.;`, issue 42):
# istio-stats.yaml's extraStatTags must be exactly these, and so must envoy.yaml's stats_tags
# and the filter's own list (filter/src/series.rs, LABELS) wherever those exist.
LABEL_KEYS = ("policy", "outcome", "reason", "kind")

# The extractor Istio writes into a sidecar's bootstrap for each name of extraStatTags:
# istio/istio, tools/packaging/common/envoy_bootstrap.json (`{{- range $a, $tag :=
# .extraStatTags }}`), the same in 1.28, 1.29, 1.30 and master (86c9f01fd).
ISTIO_STAT_TAG_REGEX = "({tag}=\\.=(.*?);\\.;)"

PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
PROXY_CONFIG_PROTO = HERE / "schemas" / "istio-mesh-v1alpha1-proxy.proto"
PROXY_CONFIG = "istio.mesh.v1alpha1.ProxyConfig"

# The workload the patch is for: wasmplugin.yaml selects its pods (app: api).
PATCHED_DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "api"},
    "spec": {
        "selector": {"matchLabels": {"app": "api"}},
        "template": {
            "metadata": {"labels": {"app": "api"}},
            "spec": {"containers": [{"name": "api", "image": "api"}]},
        },
    },
}

PROTO_TOKEN = re.compile(
    r"""\s+|//[^\n]*|/\*.*?\*/|("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(\.?[A-Za-z_][\w.]*)|([-+]?\d[\w.]*)|(\S)""",
    re.S,
)

# The proto3 JSON mapping of the well-known types ProxyConfig uses, as the scalar each is
# written as (Duration: a string such as "5s").
WELL_KNOWN = {
    "google.protobuf.Duration": "duration",
    "google.protobuf.BoolValue": "bool",
    "google.protobuf.StringValue": "string",
    "google.protobuf.BytesValue": "bytes",
    "google.protobuf.DoubleValue": "double",
    "google.protobuf.FloatValue": "float",
    "google.protobuf.Int32Value": "int32",
    "google.protobuf.UInt32Value": "uint32",
    "google.protobuf.Int64Value": "int64",
    "google.protobuf.UInt64Value": "uint64",
}
INTEGERS = {
    "int32": (-(2**31), 2**31 - 1), "sint32": (-(2**31), 2**31 - 1), "sfixed32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1), "fixed32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1), "sint64": (-(2**63), 2**63 - 1), "sfixed64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1), "fixed64": (0, 2**64 - 1),
}  # fmt: skip
SCALARS = {"string", "bool", "bytes", "double", "float", *INTEGERS}


def json_name(name: str) -> str:
    """A field's JSON name as protoc derives it: each underscore dropped, the letter after it
    upper-cased (extra_stat_tags -> extraStatTags)."""
    parts = name.split("_")
    return parts[0] + "".join(part[:1].upper() + part[1:] for part in parts[1:])


class ProtoSchema:
    """The messages and enums of one .proto file, read by a small parser of the proto3
    grammar that file uses (messages, nested messages and enums, oneofs, maps, repeated
    fields, options, reserved). messages: qualified name -> {field name -> field}, a field
    being a dict of name, json, type (qualified, or a scalar), repeated, key (of a map),
    oneof; enums: qualified name -> value names."""

    def __init__(self, text: str):
        self.tokens = [next(group for group in match.groups() if group is not None)
                       for match in PROTO_TOKEN.finditer(text) if any(match.groups())]  # fmt: skip
        self.at = 0
        self.package = ""
        self.messages: dict[str, dict[str, dict]] = {}
        self.enums: dict[str, set[str]] = {}
        self.references: list[tuple[str, dict]] = []  # (scope, field) whose type to resolve
        while self.at < len(self.tokens):
            self.statement("")
        for scope, field in self.references:
            field["type"] = self.resolve(field["type"], scope)

    def take(self, expected: str | None = None) -> str:
        if self.at >= len(self.tokens):
            raise ValueError(f"unexpected end of the proto, expected {expected or 'more'}")
        token = self.tokens[self.at]
        self.at += 1
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r} in the proto, found {token!r} (token {self.at})")
        return token

    def skip_statement(self) -> None:
        """Skips to the end of a statement (options, reserved, syntax, import)."""
        while self.take() != ";":
            pass

    def skip_options(self) -> dict[str, str]:
        """A field's `[name = value, ...]`, if any, as a dict."""
        options = {}
        if self.tokens[self.at] == "[":
            self.take("[")
            while True:
                name = self.take()
                self.take("=")
                options[name] = self.take().strip("\"'")
                if self.take() == "]":
                    break
        return options

    def statement(self, scope: str) -> None:
        keyword = self.take()
        if keyword == "package":
            self.package = self.take()
            self.take(";")
        elif keyword in {"syntax", "import", "option"}:
            self.skip_statement()
        elif keyword == "message":
            self.message(self.qualified(scope, self.take()))
        elif keyword == "enum":
            self.enum(self.qualified(scope, self.take()))
        elif keyword != ";":
            raise ValueError(f"unsupported top-level statement {keyword!r} in the proto")

    def qualified(self, scope: str, name: str) -> str:
        return f"{scope or self.package}.{name}" if scope or self.package else name

    def message(self, name: str, oneof: str | None = None) -> None:
        if oneof is None:
            self.messages[name] = {}
        self.take("{")
        while (token := self.take()) != "}":
            if token == "message":
                self.message(self.qualified(name, self.take()))
            elif token == "enum":
                self.enum(self.qualified(name, self.take()))
            elif token == "oneof":
                self.message(name, oneof=self.take())
            elif token in {"option", "reserved", "extensions"}:
                self.skip_statement()
            elif token == ";":
                continue
            else:
                self.field(name, token, oneof)

    def field(self, message: str, token: str, oneof: str | None) -> None:
        repeated = token == "repeated"
        key = None
        if token in {"repeated", "optional"}:
            token = self.take()
        if token == "map":
            self.take("<")
            key = self.take()
            self.take(",")
            token = self.take()
            self.take(">")
        name = self.take()
        self.take("=")
        self.take()  # the field number
        options = self.skip_options()
        self.take(";")
        field = {"name": name, "json": options.get("json_name", json_name(name)), "type": token,
                 "repeated": repeated, "key": key, "oneof": oneof}  # fmt: skip
        self.messages[message][name] = field
        if token not in SCALARS:
            self.references.append((message, field))

    def enum(self, name: str) -> None:
        self.enums[name] = set()
        self.take("{")
        while (token := self.take()) != "}":
            if token in {"option", "reserved"}:
                self.skip_statement()
            elif token != ";":
                self.take("=")
                self.take()
                self.skip_options()
                self.take(";")
                self.enums[name].add(token)

    def resolve(self, name: str, scope: str) -> str:
        """A type name as protoc resolves it: in the innermost enclosing scope that defines
        it, else as written (a type of another file: google.protobuf.Duration, ...)."""
        if name.startswith("."):
            return name[1:]
        while True:
            candidate = f"{scope}.{name}" if scope else name
            if candidate in self.messages or candidate in self.enums or not scope:
                return candidate
            scope = scope.rpartition(".")[0]


@functools.cache
def proxy_config_schema() -> ProtoSchema:
    return ProtoSchema(PROXY_CONFIG_PROTO.read_text())


def proto_value_errors(value, type_name: str, where: list, schema: ProtoSchema) -> list[str]:
    """One value against a proto type, in the proto3 JSON mapping Istio reads YAML with."""
    short = type_name.rpartition(".")[2]
    if value is None:
        return [f"{dotted(where)}: null (Istio would leave the field unset)"]
    if type_name in schema.messages:
        return proto_message_errors(value, type_name, where, schema)
    if type_name in schema.enums:
        if isinstance(value, str) and value in schema.enums[type_name]:
            return []
        if isinstance(value, int) and not isinstance(value, bool):
            return []
        return [f"{dotted(where)}: {value!r} is not a value of {short} ({', '.join(sorted(schema.enums[type_name]))})"]
    scalar = WELL_KNOWN.get(type_name, type_name)
    if scalar == "duration":
        ok = isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d{1,9})?s", value)
        return [] if ok else [f"{dotted(where)}: {value!r} is not a duration (a string such as \"5s\")"]
    if scalar in {"string", "bytes"}:
        return [] if isinstance(value, str) else [f"{dotted(where)}: {value!r} is not a string"]
    if scalar == "bool":
        return [] if isinstance(value, bool) else [f"{dotted(where)}: {value!r} is not a boolean"]
    if scalar in {"double", "float"}:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{dotted(where)}: {value!r} is not a number"]
    if scalar in INTEGERS:
        low, high = INTEGERS[scalar]
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            number = int(value)  # the JSON mapping takes an integer as a string too
        if number is None or not low <= number <= high:
            return [f"{dotted(where)}: {value!r} is not of type {scalar}"]
        return []
    return [
        f"{dotted(where)}: of type {type_name}, which {PROXY_CONFIG_PROTO.name} does not define: "
        f"copy its schema to schemas/ to check it"
    ]


def proto_message_errors(value, message: str, where: list, schema: ProtoSchema) -> list[str]:
    """A mapping against a message: every field known (by its JSON name, or its proto name,
    which Istio's reader takes too), of its type, at most one of a oneof."""
    short = message.rpartition(".")[2]
    if not isinstance(value, dict):
        return [f"{dotted(where)}: {value!r} is not a {short} (a mapping)"]
    fields = schema.messages[message]
    by_name = {field["json"]: field for field in fields.values()} | fields
    errors, seen, oneofs = [], {}, {}
    for key, item in value.items():
        field = by_name.get(key)
        if field is None:
            close = difflib.get_close_matches(str(key), [field["json"] for field in fields.values()], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            errors.append(f"{dotted(where + [key])}: unknown field of {short}{hint}")
            continue
        if field["name"] in seen:
            errors.append(f"{dotted(where + [key])}: {seen[field['name']]} set twice")
        seen[field["name"]] = key
        if field["oneof"]:
            other = oneofs.setdefault(field["oneof"], key)
            if other != key:
                errors.append(f"{dotted(where + [key])}: {other} is set too, and only one of oneof {field['oneof']} may be")
        if field["key"] is not None:
            if not isinstance(item, dict):
                errors.append(f"{dotted(where + [key])}: {item!r} is not a map (a mapping)")
                continue
            for name, entry in item.items():
                errors += proto_value_errors(entry, field["type"], where + [key, name], schema)
        elif field["repeated"]:
            if not isinstance(item, list):
                errors.append(f"{dotted(where + [key])}: {item!r} is not a list")
                continue
            for index, entry in enumerate(item):
                errors += proto_value_errors(entry, field["type"], where + [key, index], schema)
        else:
            errors += proto_value_errors(item, field["type"], where + [key], schema)
    return errors


def proxy_config_errors(value) -> list[str]:
    """A ProxyConfig (YAML already parsed) against istio/api's proto, strictly."""
    return proto_message_errors(value, PROXY_CONFIG, [], proxy_config_schema())


def stat_tags_errors(tags, where: str) -> list[str]:
    """A list of tag names to extract: exactly LABEL_KEYS, each once."""
    if not isinstance(tags, list):
        return [f"{where}: {tags!r} is not the list {list(LABEL_KEYS)}"]
    names = [str(tag) for tag in tags]
    errors = [f"{where}: {tag!r} listed more than once" for tag in sorted({tag for tag in names if names.count(tag) > 1})]
    missing = [key for key in LABEL_KEYS if key not in tags]
    extra = [tag for tag in tags if tag not in LABEL_KEYS]
    if missing:
        errors.append(
            f"{where}: lacks {', '.join(missing)} (a label key of the filter's metric names; "
            f"without its extractor the label stays in the name)"
        )
    if extra:
        errors.append(f"{where}: {', '.join(map(repr, extra))} is not a label key of the filter's ({', '.join(LABEL_KEYS)})")
    return errors


def envoy_stats_tags_errors(bootstrap, name: str) -> list[str]:
    """An Envoy bootstrap's extractors of `key=.=value;.;` labels, when it has any: exactly
    LABEL_KEYS, each with the regex Istio generates for extraStatTags, so a plain Envoy and an
    Istio sidecar label the same series the same way."""
    stats_config = bootstrap.get("stats_config") if isinstance(bootstrap, dict) else None
    tags = stats_config.get("stats_tags") if isinstance(stats_config, dict) else None
    labelled = [tag for tag in tags or [] if isinstance(tag, dict) and "=\\.=" in str(tag.get("regex"))]
    if not labelled:
        return []  # no key=.=value extractors in this bootstrap
    errors = stat_tags_errors([tag.get("tag_name") for tag in labelled], f"{name}: stats_config.stats_tags")
    for tag in labelled:
        expected = ISTIO_STAT_TAG_REGEX.format(tag=tag.get("tag_name"))
        if tag.get("regex") != expected:
            errors.append(
                f"{name}: stats_config.stats_tags {tag.get('tag_name')}: regex {tag.get('regex')!r} is not "
                f"{expected!r}, the one Istio generates from extraStatTags"
            )
    return errors


def filter_label_errors(source: Path) -> list[str]:
    """The filter's own list of label keys (LABELS in filter/src/series.rs), when that file
    exists: the same keys as LABEL_KEYS."""
    if not source.is_file():
        return []
    declared = re.search(r"\bconst LABELS\s*:\s*\[&(?:'static )?str;\s*\d+\]\s*=\s*\[([^\]]*)\]", source.read_text())
    if declared is None:
        return [f"{shown(source)}: no `const LABELS: [&str; N] = [...]` found: validate.py reads the filter's label keys there"]
    keys = re.findall(r'"([^"]*)"', declared[1])
    if sorted(keys) != sorted(LABEL_KEYS):
        return [f"{shown(source)}: LABELS is {keys}, validate.py's LABEL_KEYS (and istio-stats.yaml) {list(LABEL_KEYS)}"]
    return []


def merged(base: dict, patch: dict) -> dict:
    """base with patch merged in, mapping by mapping (a strategic merge, for patches that set
    no list)."""
    result = dict(base)
    for key, value in patch.items():
        result[key] = merged(base[key], value) if isinstance(base.get(key), dict) and isinstance(value, dict) else value
    return result


def validate_istio_stats(path: Path) -> list[str]:
    """istio-stats.yaml: a strategic-merge patch of the `api` Deployment that sets the pod
    annotation proxy.istio.io/config and nothing else; the Deployment it makes is valid
    against Kubernetes' schema (strict); the annotation is a ProxyConfig, strictly against
    istio/api's proto (schemas/istio-mesh-v1alpha1-proxy.proto); its extraStatTags are the
    filter's label keys, exactly."""
    name = shown(path)
    try:
        documents = yaml_documents(path)
    except yaml.YAMLError as error:
        return [f"{name}: not YAML: {error}"]
    if len(documents) != 1 or not isinstance(documents[0], dict):
        return [f"{name}: expected one document, a patch of the Deployment's pod template"]
    patch = documents[0]
    errors = []
    node, where = patch, []
    for key in ("spec", "template", "metadata", "annotations", PROXY_CONFIG_ANNOTATION):
        if not isinstance(node, dict) or key not in node:
            missing = f"{name}: {dotted(where + [key])}: missing"
            return errors + [f"{missing} (the patch sets the pod annotation {PROXY_CONFIG_ANNOTATION})"]
        for other in (other for other in node if other != key):
            errors.append(f"{name}: {dotted(where + [other])}: unexpected (the patch sets {PROXY_CONFIG_ANNOTATION} only)")
        node, where = node[key], where + [key]
    deployment = merged(PATCHED_DEPLOYMENT, patch)
    errors += [f"{name}: as applied to Deployment/api: {error}" for error in builtin_errors(deployment) or []]
    text, where = node, f"{name}: {dotted(where)}"
    if not isinstance(text, str):
        return errors + [f"{where}: an annotation's value is a string (here, the ProxyConfig as YAML)"]
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return errors + [f"{where}: not YAML: {error}"]
    errors += [f"{where}: {error}" for error in proxy_config_errors(config)]
    if isinstance(config, dict):
        errors += stat_tags_errors(config.get("extraStatTags", []), f"{where}: extraStatTags")
    return errors


# A ProxyConfig that uses most kinds of field (scalars, enums, wrappers, durations, maps,
# lists, nested messages, a oneof), from Istio's own tests and docs: the parser must accept it.
PROXY_CONFIG_SAMPLE = """\
discoveryAddress: istiod.istio-system.svc:15012
drainDuration: 5s
terminationDrainDuration: 1.5s
proxyMetadata:
  ISTIO_META_DNS_CAPTURE: "true"
concurrency: 2
statusPort: 15020
holdApplicationUntilProxyStarts: true
interceptionMode: TPROXY
controlPlaneAuthPolicy: MUTUAL_TLS
tracingServiceName: CANONICAL_NAME_ONLY
tracing:
  sampling: 10
  maxPathTagLength: 256
  zipkin:
    address: zipkin.istio-system:9411
  customTags:
    env:
      environment:
        name: POD_NAMESPACE
extraStatTags: [policy, outcome, reason, kind]
proxyStatsMatcher:
  inclusionPrefixes: [wasmcustom]
  inclusionRegexps: [".*upstream_rq_retry.*"]
proxyHeaders:
  forwardedClientCert: SANITIZE
  server:
    disabled: true
"""


# Stand-ins for deploy/'s prometheus-operator manifests, so the self-test exercises the CRDs
# in schemas/ before (and whether or not) deploy/ has such a manifest.
PROMETHEUS_OPERATOR_SAMPLE = """\
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sluice
  namespace: sluice-system
spec:
  groups:
  - name: sluice
    partial_response_strategy: warn
    rules:
    - alert: SluiceCounterDown
      expr: up{job="sluice-counter"} == 0
      for: 5m
      labels:
        severity: page
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: sluice-counter
  namespace: sluice-system
spec:
  selector:
    matchLabels:
      app: sluice-counter
  endpoints:
  - port: http
    interval: 30s
"""


def errors_in(name: str, text: str, check) -> list[str]:
    """What check reports for text written as a file called name, in a scratch folder."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_text(text)
        return check(path)


def with_unknown_field(text: str, index: int) -> str:
    """The manifest with a field no schema declares added to its index-th document's spec (to
    the document itself when it has no spec)."""
    documents = documents_in(text)
    spec = documents[index].get("spec")
    (spec if isinstance(spec, dict) else documents[index])["sluiceSelfTest"] = True
    return yaml.safe_dump_all(documents, sort_keys=False)


def self_test() -> list[str]:
    """Proves the checks are not vacuous: each seeded mistake must be reported, every document
    of every Kubernetes manifest must reject a field its schema lacks, and the sample
    prometheus-operator manifests must pass as written."""

    def rls(path: Path) -> list[str]:
        return validate_envoy(path, wasm_required=False)

    def counter(path: Path) -> list[str]:
        return validate_counter(path, HERE / "wasmplugin.yaml")

    def names_missing_schema(path: Path) -> list[str]:
        return [error for error in validate_manifest(path) if "prometheus-operator-podmonitors-crd.yaml" in error]

    sample = "prometheus-operator-sample.yaml"
    sources = {sample: PROMETHEUS_OPERATOR_SAMPLE}
    mutants = [
        ("envoy.yaml", validate_envoy, "stat_prefix: ingress_http", "stat_prefx: ingress_http"),
        ("envoy.yaml", validate_envoy, "vm_id: sluice", "vm_idd: sluice"),
        ("envoy.yaml", validate_envoy, "failure_policy: FAIL_RELOAD", "failure_policy: FAIL_SOMETIMES"),
        ("envoy-rls.yaml", rls, "failure_mode_deny: true", "failure_mode_denny: true"),
        ("envoy-rls.yaml", rls, "enable_x_ratelimit_headers: DRAFT_VERSION_03", "enable_x_ratelimit_headers: DRAFT_04"),
        ("wasmplugin.yaml", validate_manifest, "failStrategy: FAIL_RELOAD", "failStratgy: FAIL_RELOAD"),
        ("wasmplugin.yaml", validate_manifest, "phase: AUTHN", "phase: EARLY"),
        ("wasmplugin.yaml", validate_manifest, "valueFrom: HOST\n    - name", "valueFrom: ELSEWHERE\n    - name"),
        ("sluice-counter.yaml", counter, "port: 8710\n    targetPort", "port: 8711\n    targetPort"),
        # Kubernetes' schema alone catches these: validate_counter accepts both.
        ("sluice-counter.yaml", validate_manifest, "port: 8710\n    targetPort", 'port: "8710"\n    targetPort'),
        ("sluice-counter.yaml", validate_manifest, "readOnly: true", "readonly: true"),
        (sample, validate_manifest, "for: 5m", "for: 5 minutes"),
        (sample, validate_manifest, "- port: http", "- prot: http"),
        (sample, names_missing_schema, "kind: ServiceMonitor", "kind: PodMonitor"),
        # istio-stats.yaml. Istio takes the first three and a misnamed annotation silently
        # (an unknown field is ignored, tags are not checked), and the labels go missing.
        ("istio-stats.yaml", validate_istio_stats, "          extraStatTags:", "          extraStatTag:"),
        ("istio-stats.yaml", validate_istio_stats, "          - kind\n", ""),
        ("istio-stats.yaml", validate_istio_stats, "- kind\n", "- kind\n          - route\n"),
        ("istio-stats.yaml", validate_istio_stats, "- kind\n", "- kind\n          - kind\n"),
        ("istio-stats.yaml", validate_istio_stats, "- kind\n", "- kind\n          proxyStatsMatcher: {inclusionPrefixes: wasm}\n"),
        ("istio-stats.yaml", validate_istio_stats, "- kind\n", "- kind\n          concurrency: two\n"),
        ("istio-stats.yaml", validate_istio_stats, "- kind\n", "- kind\n          interceptionMode: REDIRECTED\n"),
        ("istio-stats.yaml", validate_istio_stats, "proxy.istio.io/config: |", "proxy.istio.io/configs: |"),
        ("istio-stats.yaml", validate_istio_stats, "proxy.istio.io/config: |", "proxy.istio.io/config:"),
        ("istio-stats.yaml", validate_istio_stats, "      annotations:", "      annotation:"),
        ("istio-stats.yaml", validate_istio_stats, "  template:", "  replicas: 2\n  template:"),
    ]
    problems = [f"self-test: {sample}: {error}" for error in errors_in(sample, PROMETHEUS_OPERATOR_SAMPLE, validate_manifest)]
    for name, check, before, after in mutants:
        text = sources[name] if name in sources else (HERE / name).read_text()
        if before not in text:
            problems.append(f"self-test: {name} no longer contains {before!r}")
        elif not errors_in(name, text.replace(before, after, 1), check):
            problems.append(f"self-test: {name} with {after!r} was accepted")
    problems += [f"self-test: PROXY_CONFIG_SAMPLE: {error}" for error in proxy_config_errors(yaml.safe_load(PROXY_CONFIG_SAMPLE))]
    problems += [f"self-test: merged(PATCHED_DEPLOYMENT, {{}}): {error}" for error in builtin_errors(PATCHED_DEPLOYMENT) or []]
    labelled = {"stats_config": {"stats_tags": [
        {"tag_name": key, "regex": ISTIO_STAT_TAG_REGEX.format(tag=key)} for key in LABEL_KEYS
    ]}}  # fmt: skip
    problems += [f"self-test: Istio's stats_tags: {error}" for error in envoy_stats_tags_errors(labelled, "sample")]
    for mistake in ("drop kind", "anchor", "rename"):
        tags = [dict(tag) for tag in labelled["stats_config"]["stats_tags"]]
        if mistake == "drop kind":
            tags.pop()
        elif mistake == "anchor":
            tags[0]["regex"] = "^" + tags[0]["regex"]
        else:
            tags[1] = {"tag_name": "result", "regex": ISTIO_STAT_TAG_REGEX.format(tag="result")}
        if not envoy_stats_tags_errors({"stats_config": {"stats_tags": tags}}, "sample"):
            problems.append(f"self-test: stats_tags with the mistake {mistake!r} were accepted")
    series = 'pub const LABELS: [&str; 4] = ["policy", "outcome", "reason", "kind"];\n'
    for text, accepted in ((series, True), (series.replace('"kind"', '"kinds"'), False), ("", False)):
        if (not errors_in("series.rs", text, filter_label_errors)) != accepted:
            problems.append(f"self-test: filter_label_errors {'rejected' if accepted else 'accepted'} {text!r}")
    for name, text in ({shown(path): path.read_text() for path in kubernetes_manifests()} | sources).items():
        try:
            documents = documents_in(text)
        except yaml.YAMLError:
            continue  # validate_manifest reports it
        for index, document in enumerate(documents):
            if not is_object(document) or document_errors(document):
                continue  # validate_manifest reports it
            errors = errors_in(Path(name).name, with_unknown_field(text, index), validate_manifest)
            if not any("sluiceSelfTest" in error for error in errors):
                problems.append(f"self-test: {name}: {described(document)}: a field its schema lacks was accepted")
    return problems


def main() -> int:
    manifests = kubernetes_manifests()
    errors = (
        validate_envoy(HERE / "envoy.yaml")
        + validate_envoy(HERE / "envoy-rls.yaml", wasm_required=False)
        + [error for path in manifests for error in validate_manifest(path)]
        + validate_istio(HERE / "wasmplugin.yaml")
        + validate_counter(HERE / "sluice-counter.yaml", HERE / "wasmplugin.yaml")
        + validate_istio_stats(HERE / "istio-stats.yaml")
        + envoy_stats_tags_errors(yaml.safe_load((HERE / "envoy.yaml").read_text()), "envoy.yaml")
        + filter_label_errors(ROOT / "filter" / "src" / "series.rs")
        + self_test()
    )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return 1
    objects = "; ".join(
        f"{shown(path)}: {', '.join(described(document) for document in yaml_documents(path))}" for path in manifests
    )
    print(
        "envoy.yaml, envoy-rls.yaml: valid Envoy v3 Bootstraps; wasmplugin.yaml: the WasmPlugin Sluice runs as; "
        "sluice-counter.yaml: the Service the WasmPlugin calls"
    )
    print(f"Kubernetes manifests, valid against Kubernetes {KUBERNETES_VERSION} (strict) or their CRDs: {objects}")
    print(
        f"istio-stats.yaml: a patch of Deployment/api whose {PROXY_CONFIG_ANNOTATION} is a valid ProxyConfig "
        f"({shown(PROXY_CONFIG_PROTO)}, strict) extracting the labels {', '.join(LABEL_KEYS)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

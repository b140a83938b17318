//! Configuration through the compiled module: every invalid fixture makes
//! `proxy_on_configure` return false with its exact message logged; every example and
//! the configurations embedded in envoy-config/ are accepted.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use wasm_host::{HostError, LogLevel, LogSource};
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

const VALID: &str = r#"{"policies":[{"name":"p","key":["client_address"],"rate":"1/second"}]}"#;

/// The status of a request that may first wait for a lease refill (a tick or two).
fn eventual_status(host: &mut Host, request: Request) -> u16 {
    let stream = host.worker(0).request(request);
    host.advance(millis(30));
    match host.worker(0).outcome(stream).unwrap() {
        wasm_host::Outcome::Forwarded(_) => 200,
        wasm_host::Outcome::Responded(response) => response.status,
        other => panic!("the request is still {other:?}"),
    }
}

/// The VM environment the examples' `*_env` fields name, with test values.
fn with_secrets(builder: wasm_host::HostBuilder) -> wasm_host::HostBuilder {
    builder.env("SLUICE_HASH_KEY", "test-hash-key-0123456789abcdef").env("SLUICE_COUNTER_TOKEN", "test-token")
}

#[test]
fn every_invalid_fixture_is_refused_by_on_configure_with_its_message_logged() {
    let mut host = host(VALID);
    let fixtures = files(&repo().join("filter/tests/fixtures/invalid"), "json");
    assert!(fixtures.len() >= 30);

    for fixture in fixtures {
        let expected = fs::read_to_string(fixture.with_extension("err")).unwrap();
        host.clear_logs();

        let error = host.reconfigure(fs::read(&fixture).unwrap()).unwrap_err();

        let HostError::ConfigurationRejected { .. } = error else { panic!("{}: {error}", fixture.display()) };
        let logged: Vec<String> = host
            .logs()
            .into_iter()
            .filter(|r| r.source == LogSource::Guest && r.level == LogLevel::Error)
            .map(|r| r.message)
            .collect();
        assert_eq!(
            logged,
            vec![format!("sluice: invalid configuration: {}", expected.trim_end())],
            "{}",
            fixture.display()
        );
    }
    // The last good configuration keeps serving.
    assert_eq!(status(&mut host, Request::get("/")), 200);
}

#[test]
fn a_rejected_configuration_fails_the_first_start_with_the_reason() {
    let error = builder(r#"{"policies":[{"name":"p","key":["path"],"rate":"10/fortnight"}]}"#).build().unwrap_err();

    let message = error.to_string();
    assert!(
        message.contains(r#"policies[0].rate: expected "<n>/<second|minute|hour|day>", got "10/fortnight""#),
        "{message}"
    );
}

#[test]
fn every_example_configuration_is_accepted_by_the_compiled_filter() {
    let examples = files(&repo().join("examples"), "json");
    assert!(examples.len() >= 6);
    let mut host = with_secrets(builder(VALID)).build().unwrap();

    for example in examples {
        if let Err(error) = host.reconfigure(fs::read(&example).unwrap()) {
            panic!("{}: {error}", example.display());
        }
    }
}

fn yaml_to_json(yaml: &Yaml) -> serde_json::Value {
    match yaml {
        Yaml::Hash(map) => serde_json::Value::Object(
            map.iter().map(|(k, v)| (k.as_str().unwrap().to_owned(), yaml_to_json(v))).collect(),
        ),
        Yaml::Array(items) => serde_json::Value::Array(items.iter().map(yaml_to_json).collect()),
        Yaml::String(s) => serde_json::Value::String(s.clone()),
        Yaml::Integer(i) => serde_json::Value::from(*i),
        Yaml::Real(r) => serde_json::Value::from(r.parse::<f64>().unwrap()),
        Yaml::Boolean(b) => serde_json::Value::Bool(*b),
        Yaml::Null => serde_json::Value::Null,
        other => panic!("unexpected YAML value {other:?}"),
    }
}

fn load_yaml(path: &str) -> serde_json::Value {
    let text = fs::read_to_string(repo().join(path)).unwrap();
    yaml_to_json(&YamlLoader::load_from_str(&text).unwrap()[0])
}

/// The Sluice configuration inside the Envoy bootstrap: the wasm filter's StringValue.
fn envoy_plugin_configuration() -> (String, serde_json::Value) {
    let bootstrap = load_yaml("envoy-config/envoy.yaml");
    let filters = &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
    let wasm = filters.as_array().unwrap().iter().find(|f| f["name"] == "envoy.filters.http.wasm").unwrap();
    let config = &wasm["typed_config"]["config"];
    assert_eq!(config["vm_config"]["vm_id"], "sluice", "vm_id must be explicit");
    assert_eq!(config["configuration"]["@type"], "type.googleapis.com/google.protobuf.StringValue");
    (config["root_id"].as_str().unwrap().to_owned(), config["configuration"].clone())
}

#[test]
fn the_configuration_embedded_in_the_envoy_bootstrap_passes_the_filter() {
    let (root_id, configuration) = envoy_plugin_configuration();
    let value = configuration["value"].as_str().unwrap();

    let mut host = with_secrets(builder(value)).root_id(root_id).build().unwrap_or_else(|e| panic!("{e}"));

    let same: serde_json::Value = serde_json::from_str(value).unwrap();
    let example: serde_json::Value =
        serde_json::from_slice(&fs::read(repo().join("examples/gateway.json")).unwrap()).unwrap();
    assert_eq!(same, example, "envoy.yaml embeds examples/gateway.json");
    assert_eq!(eventual_status(&mut host, Request::get("/")), 200);
}

#[test]
fn the_plugin_configuration_in_the_istio_manifest_passes_the_filter() {
    let manifest = load_yaml("envoy-config/wasmplugin.yaml");
    assert_eq!(manifest["apiVersion"], "extensions.istio.io/v1alpha1");
    let configuration = manifest["spec"]["pluginConfig"].to_string();

    let mut host = with_secrets(builder(&configuration)).build().unwrap_or_else(|e| panic!("{e}"));

    let mut example: serde_json::Value =
        serde_json::from_slice(&fs::read(repo().join("examples/gateway.json")).unwrap()).unwrap();
    // The one difference: Istio's name for the counter service's cluster.
    example["counter_service"]["cluster"] =
        serde_json::json!("outbound|8710||sluice-counter.sluice-system.svc.cluster.local");
    assert_eq!(manifest["spec"]["pluginConfig"], example, "wasmplugin.yaml embeds examples/gateway.json");
    assert_eq!(eventual_status(&mut host, Request::get("/api/x").header("x-api-key", "k")), 200);
}

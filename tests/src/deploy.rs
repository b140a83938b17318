//! The deployment configurations in `envoy-config/`, read as the tests need them.

use crate::envoy::repo;
use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// A YAML document as JSON (what Envoy's bootstrap loader sees).
pub fn yaml_to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => text.parse::<f64>().map_or(Value::Null, Value::from),
        Yaml::Integer(n) => Value::from(*n),
        Yaml::String(s) => Value::from(s.clone()),
        Yaml::Boolean(b) => Value::from(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(yaml_to_json).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .filter_map(|(k, v)| {
                    Some((
                        k.as_str().map(str::to_owned).or_else(|| k.as_i64().map(|n| n.to_string()))?,
                        yaml_to_json(v),
                    ))
                })
                .collect::<Map<String, Value>>(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// `envoy-config/envoy.yaml` as JSON.
///
/// # Panics
/// When the file is missing or not YAML.
pub fn bootstrap_json() -> Value {
    envoy_config_json("envoy.yaml")
}

/// `envoy-config/<name>` as JSON.
///
/// # Panics
/// When the file is missing or not YAML.
pub fn envoy_config_json(name: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("envoy-config").join(name)).expect("a file in envoy-config/");
    let docs = YamlLoader::load_from_str(&text).expect("YAML");
    yaml_to_json(docs.first().expect("one document"))
}

/// Every Sluice filter configuration embedded in a bootstrap (the `configuration` value
/// of each wasm filter).
pub fn filter_configurations(node: &Value) -> Vec<String> {
    let mut found = Vec::new();
    match node {
        Value::Object(map) => {
            if map.get("@type").and_then(Value::as_str).is_some_and(|t| t.ends_with("filters.http.wasm.v3.Wasm"))
                && let Some(value) = node["config"]["configuration"]["value"].as_str()
            {
                found.push(value.to_owned());
            }
            for value in map.values() {
                found.extend(filter_configurations(value));
            }
        }
        Value::Array(items) => items.iter().for_each(|v| found.extend(filter_configurations(v))),
        _ => {}
    }
    found
}

/// The one Sluice filter configuration of a bootstrap.
///
/// # Panics
/// When there is not exactly one.
pub fn embedded_filter_configuration(bootstrap: &Value) -> String {
    let mut found = filter_configurations(bootstrap);
    assert_eq!(found.len(), 1, "the bootstrap has one Sluice filter");
    found.remove(0)
}

/// Where the deployment bootstrap should point, for [`local_bootstrap`].
#[derive(Debug, Clone)]
pub struct Local<'a> {
    /// The listener (`127.0.0.1:0` lets Envoy pick).
    pub listen: &'a str,
    /// The admin interface.
    pub admin: &'a str,
    /// The upstream.
    pub backend: std::net::SocketAddr,
    /// The counter service.
    pub counter: std::net::SocketAddr,
    /// Another plugin configuration than the embedded one.
    pub config: Option<&'a std::path::Path>,
}

/// `envoy-config/envoy.yaml` rewritten for this machine by `envoy-config/local.py`, the
/// same script `./demo.sh` runs (so the demo and the tests run one bootstrap).
///
/// # Panics
/// When the script fails (it needs PyYAML: `envoy-config/install-envoy.sh` puts it in
/// the virtualenv, `.ci/run` also installs it system-wide).
pub fn local_bootstrap(local: &Local<'_>) -> Value {
    let venv = repo().join("target/envoy-venv/bin/python3");
    let python = if venv.is_file() { venv } else { std::path::PathBuf::from("python3") };
    let mut command = std::process::Command::new(&python);
    command
        .arg(repo().join("envoy-config/local.py"))
        .args(["--listen", local.listen, "--admin", local.admin])
        .args(["--backend", &local.backend.to_string(), "--counter", &local.counter.to_string()])
        .args(["--wasm", sluice_artifacts::SLUICE_WASM]);
    if let Some(config) = local.config {
        command.arg("--config").arg(config);
    }
    let output =
        command.output().unwrap_or_else(|e| panic!("cannot run {} envoy-config/local.py: {e}", python.display()));
    assert!(output.status.success(), "envoy-config/local.py failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("local.py prints JSON")
}

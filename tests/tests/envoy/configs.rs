//! Configurations in Envoy: every example loads; a bad configuration stops Envoy at
//! startup with Sluice's message naming the field; a bad configuration pushed by xDS is
//! rejected while the previous one keeps serving, buckets intact.

use super::*;
use serde_json::Value;
use sluice::host::{Counter, PluginCounter};
use sluice_tests::envoy::{SluiceFilter, cluster, repo};
use std::fs;
use std::path::PathBuf;

fn files(dir: &str, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

/// An Envoy for a filter configuration: with the counter service's cluster (pointing at a
/// port nothing listens on: loading needs no service) and the secrets it names, when it
/// has one.
pub fn envoy_for(config: &str) -> Result<Envoy, sluice_tests::envoy::StartError> {
    let parsed: Value = serde_json::from_str(config).unwrap();
    let mut builder = Envoy::builder().workers(1);
    let mut filter = sluice(config);
    if let Some(service) = parsed.get("counter_service") {
        let name = service["cluster"].as_str().unwrap();
        builder = builder.cluster(cluster(name, "127.0.0.1:1".parse().unwrap(), false));
        filter = with_secrets(filter, service);
    }
    builder.sluice(filter).start()
}

/// The VM environment a configuration's `*_env` fields name, with test values.
pub fn with_secrets(mut filter: SluiceFilter, service: &Value) -> SluiceFilter {
    if let Some(name) = service["hash_key_env"].as_str() {
        filter = filter.env(name, "test-hash-key-0123456789abcdef");
    }
    if let Some(name) = service["token_env"].as_str() {
        filter = filter.env(name, "test-token");
    }
    filter
}

#[test]
fn every_example_loads_in_envoy() {
    let examples = files("examples", "json");
    assert!(examples.len() >= 6);
    std::thread::scope(|scope| {
        for example in &examples {
            scope.spawn(move || {
                let config = fs::read_to_string(example).unwrap();
                let envoy = envoy_for(&config).unwrap_or_else(|e| panic!("{}: {e}", example.display()));
                let response = send(&envoy, &Request::get("/").header("x-api-key", "k"));
                assert!(response.status < 600, "{}", example.display());
                assert!(envoy.sluice_log().iter().all(|l| !l.contains("invalid configuration")));
            });
        }
    });
}

#[test]
fn a_bad_configuration_stops_envoy_at_startup_with_the_message_naming_the_field() {
    for fixture in
        ["rate_in_an_unknown_unit", "unknown_field_in_policy", "cost_above_capacity", "global_without_counter_service"]
    {
        let dir = repo().join("filter/tests/fixtures/invalid");
        let config = fs::read_to_string(dir.join(format!("{fixture}.json"))).unwrap();
        let expected = fs::read_to_string(dir.join(format!("{fixture}.err"))).unwrap();

        let error = Envoy::builder().workers(1).sluice(sluice(&config)).start().err();

        let error = error.unwrap_or_else(|| panic!("{fixture}: Envoy started with a bad configuration"));
        assert!(error.reason.contains("exited"), "{fixture}: {}", error.reason);
        let line = format!("sluice: invalid configuration: {}", expected.trim_end());
        assert!(error.log.contains(&line), "{fixture}: Envoy's log lacks {line:?}\n{}", error.log);
    }
}

const THREE: &str = r#"{"policies":[{"name":"p","key":[{"header":"x-k"}],"rate":"1/hour","burst":3}]}"#;

fn spend(envoy: &Envoy, key: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| send(envoy, &Request::get("/").header("x-k", key)).status).collect()
}

#[test]
fn a_bad_configuration_pushed_by_xds_is_rejected_and_the_previous_one_keeps_its_buckets() {
    let envoy = Envoy::builder().workers(2).xds().sluice(sluice(THREE)).start().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spend(&envoy, "a", 2), [200, 200]);

    let pushed = envoy.push_filter(&sluice(r#"{"policies":[{"name":"p","key":["path"],"rate":"1/fortnight"}]}"#));

    assert!(pushed.is_err(), "Envoy accepted a configuration Sluice refuses");
    assert!(envoy.sluice_log().iter().any(|l| l.contains(
        r#"sluice: invalid configuration: policies[0].rate: expected "<n>/<second|minute|hour|day>", got "1/fortnight""#
    )));
    assert_eq!(spend(&envoy, "a", 2), [200, 429], "the bucket kept its two spends");
}

#[test]
fn the_configuration_embedded_in_the_envoy_bootstrap_loads_in_envoy() {
    let bootstrap = sluice_tests::deploy::bootstrap_json();
    let config = sluice_tests::deploy::embedded_filter_configuration(&bootstrap);

    let envoy = envoy_for(&config).unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(send(&envoy, &Request::get("/")).status, 200);
}

/// Envoy on the shipped bootstrap (`envoy-config/envoy.yaml` through `local.py`), with its
/// embedded filter configuration or `config`, in front of a local upstream and a local
/// counter service (both returned: they live as long as the test needs them).
fn deployed(
    config: Option<&std::path::Path>,
) -> (Envoy, sluice_tests::upstream::Upstream, sluice_tests::counter::Counter) {
    use sluice_tests::counter::{self, Counter};
    use sluice_tests::deploy::{Local, local_bootstrap};
    let upstream = sluice_tests::upstream::Upstream::start(&[]);
    let service = Counter::start(counter::with_token(counter::memory(), "deploy-token"));
    let bootstrap = local_bootstrap(&Local {
        listen: "127.0.0.1:0",
        admin: "127.0.0.1:0",
        backend: upstream.addr(),
        counter: service.addr(),
        config,
    });
    let envoy = Envoy::builder()
        .bootstrap(bootstrap)
        .process_env("SLUICE_HASH_KEY", "deploy-hash-key-0123456789abcdef")
        .process_env("SLUICE_COUNTER_TOKEN", "deploy-token")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    (envoy, upstream, service)
}

#[test]
fn the_deployment_bootstrap_serves_once_pointed_at_local_services() {
    let (envoy, _upstream, _service) = deployed(None);

    let response = send(&envoy, &Request::get("/orders").header("x-tenant-id", "acme"));

    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "upstream saw /orders\n");
    assert_eq!(response.header("x-sluice-fallback"), None, "the counter service decided");
    assert_eq!(envoy.plugin_metric(PluginCounter::Callouts).as_ref(), Some(&1));
    assert_eq!(envoy.metric("per-tenant", Counter::Allowed), 1);
}

#[test]
fn the_deployment_bootstrap_merges_slashes_so_a_doubled_slash_cannot_slip_past_a_path_policy() {
    let config = r#"{"policies": [{"name": "v1", "match": {"path_prefix": "/v1/"}, "key": ["client_address"],
        "rate": "1/hour", "burst": 1}]}"#;
    let dir = std::env::temp_dir().join(format!("sluice-merge-slashes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("v1.json");
    std::fs::write(&path, config).unwrap();
    let (envoy, _upstream, _service) = deployed(Some(&path));

    let first = send(&envoy, &Request::get("//v1/models"));
    let second = send(&envoy, &Request::get("/v1/./models"));

    assert_eq!(first.status, 200);
    assert_eq!(first.text(), "upstream saw /v1/models\n", "the upstream sees the path the policy matched");
    assert_eq!(second.status, 429, "normalised to /v1/models: the policy's one request is spent");
    assert_eq!(envoy.metric("v1", Counter::Offered), 2);
}

//! envoyproxy/ratelimit's YAML: the same keys, the same load errors (each naming the
//! file and the descriptor), Sluice's extensions, and a directory loaded whole or not at
//! all.

use sluice_counter::rls::config::{RlsConfig, RuleAlgorithm};
use sluice_counter::rls::matching::Found;

fn load(yaml: &str) -> Result<RlsConfig, String> {
    RlsConfig::from_files([("limits.yaml", yaml)], false).map_err(|e| e.to_string())
}

fn refused(yaml: &str) -> String {
    load(yaml).expect_err("refused")
}

#[test]
fn every_load_error_of_envoyproxy_ratelimit_is_refused_with_the_file_and_the_descriptor() {
    let cases = [
        ("domain: d\ndescriptors:\n  - key: a\n    colour: red\n", "limits.yaml: config error, unknown key 'colour'"),
        ("descriptors:\n  - key: a\n", "limits.yaml: config file cannot have empty domain"),
        ("domain: d\ndescriptors:\n  - value: v\n", "limits.yaml: d: descriptor has empty key"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n",
            "limits.yaml: duplicate descriptor composite key 'd.a_b'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "limits.yaml: d.a: invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "limits.yaml: d.a: should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n",
            "limits.yaml: d.a: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
            "limits.yaml: d.a: replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
            "limits.yaml: d.a_b: share_threshold can only be used with wildcard values",
        ),
        (
            "domain: d\ndescriptors:\n  - 5\n",
            "limits.yaml: config error, yaml file contains list of type other than map: 5",
        ),
        ("domain: d\n7: x\n", "limits.yaml: config error, key is not of type string"),
    ];
    for (yaml, expected) in cases {
        let error = refused(yaml);
        assert!(error.starts_with(expected), "{yaml:?}\n  gave: {error}\n  wanted: {expected}");
    }
}

#[test]
fn a_nested_descriptors_error_names_its_whole_path() {
    let error = refused(
        "domain: shop\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: plan\n        value: free\n        rate_limit: {unit: eon}\n",
    );

    assert_eq!(error, "limits.yaml: shop.tenant.plan_free: invalid rate limit unit 'eon'");
}

#[test]
fn a_year_is_refused_at_load_as_longer_than_the_stores_keep() {
    let error = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: year, requests_per_unit: 1}\n");

    assert!(error.starts_with("limits.yaml: d.a: unit: year × 1 is longer than"), "{error}");
}

#[test]
fn the_extensions_choose_an_algorithm_a_burst_and_a_window_of_several_units() {
    let config = load(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: token_bucket, burst: 20}\n",
    )
    .expect("loads");
    let rules = config.rules();

    assert_eq!(rules.len(), 1);
    assert_eq!((rules[0].algorithm, rules[0].unit_multiplier), (RuleAlgorithm::TokenBucket, 5));
    assert_eq!(rules[0].limit.as_ref().map(|l| l.capacity()), Some(20));
}

#[test]
fn an_extension_that_cannot_be_served_is_refused_by_name() {
    let leaky = refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket}\n",
    );
    let burst = refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n",
    );
    let log = refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: sliding_log}\n",
    );

    assert!(leaky.contains("Envoy's ratelimit filter cannot delay a request"), "{leaky}");
    assert!(burst.contains("d.a: burst: only a token_bucket has a burst"), "{burst}");
    assert!(log.starts_with("limits.yaml: d.a: rate_limit: "), "{log}");
}

#[test]
fn a_domain_in_two_files_is_refused_unless_merging_is_asked_for() {
    let files = [
        ("a.yaml", "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
        ("b.yaml", "domain: d\ndescriptors:\n  - key: y\n    rate_limit: {unit: second, requests_per_unit: 2}\n"),
    ];

    let refused = RlsConfig::from_files(files, false).expect_err("refused").to_string();
    let merged = RlsConfig::from_files(files, true).expect("merged");

    assert_eq!(refused, "b.yaml: duplicate domain 'd' in config file");
    assert!(matches!(merged.find("d", &[("y", "1")]), Found::Rule { rule, .. } if rule.requests_per_unit == 2));
}

#[test]
fn a_directory_loads_its_yaml_files_and_skips_hidden_ones_and_subdirectories() {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("a.yaml"), "domain: a\n").expect("write");
    std::fs::write(dir.path().join("b.yml"), "domain: b\n").expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not yaml").expect("write");
    std::fs::write(dir.path().join(".hidden.yaml"), "domain: a\n").expect("write");
    std::fs::create_dir(dir.path().join("..data")).expect("mkdir");
    std::fs::write(dir.path().join("..data").join("c.yaml"), "domain: a\n").expect("write");

    let config = RlsConfig::load_dir(dir.path(), false).expect("loads");

    assert_eq!(config.domains.keys().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn a_bad_file_refuses_the_whole_directory_naming_it() {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("a.yaml"), "domain: a\n").expect("write");
    std::fs::write(dir.path().join("b.yaml"), "domain: b\nextra: 1\n").expect("write");

    let error = RlsConfig::load_dir(dir.path(), false).expect_err("refused").to_string();

    assert!(error.ends_with("b.yaml: config error, unknown key 'extra'"), "{error}");
}

#[test]
fn a_rule_goes_by_its_name_as_a_policy_or_by_a_name_made_from_its_path() {
    let config = load(
        "domain: shop\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: per-user}\n  - key: b\n    value: 'x y'\n    rate_limit: {unit: second, requests_per_unit: 1, name: 'not a policy'}\n",
    )
    .expect("loads");
    let policies: Vec<&str> = config.rules().iter().map(|r| r.policy.as_str()).collect();

    assert_eq!(policies, ["per-user", "rls.shop.b_x-y"]);
}

#[test]
fn all_or_nothing_is_a_domains_choice_and_its_key_needs_it() {
    let together = load("domain: d\nall_or_nothing: true\nall_or_nothing_key: tenant\n").expect("loads");
    let stray = refused("domain: d\nall_or_nothing_key: tenant\n");

    assert_eq!(together.all_or_nothing.get("d").and_then(|a| a.key.as_deref()), Some("tenant"));
    assert_eq!(stray, "limits.yaml: d: all_or_nothing_key: given without all_or_nothing: true");
}

#[test]
fn the_shipped_example_loads_as_envoyproxy_ratelimit_would_read_it() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ratelimit");

    let config = RlsConfig::load_dir(&dir, false).expect("examples/ratelimit loads");
    let named: Vec<&str> = config.rules().iter().filter_map(|r| r.name.as_deref()).collect();

    assert_eq!(named, ["per-user", "per-address", "logins", "free-tenant", "paid-tenant"]);
    assert!(config.rules().iter().all(|r| r.algorithm == RuleAlgorithm::FixedWindow), "no Sluice extension in it");
    assert!(config.all_or_nothing.is_empty());
}

#[test]
fn a_rules_metadata_is_kept_as_written_detailed_metric_or_not_and_a_node_without_a_rule_has_none_to_return() {
    let config = load(
        "domain: shop
descriptors:
  - key: a
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: {service: {name: one, weight: 2}, tags: [x, y], enabled: true}
  - key: b
    metadata: {lost: yes}
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
",
    )
    .expect("loads");
    let metadata: Vec<Option<serde_json::Value>> =
        config.rules().iter().map(|r| r.metadata.as_ref().map(|m| serde_json::Value::Object((**m).clone()))).collect();

    assert_eq!(
        metadata,
        [
            Some(serde_json::json!({"service": {"name": "one", "weight": 2.0}, "tags": ["x", "y"], "enabled": true})),
            None
        ],
        "a number is a double, as a protobuf Struct holds it"
    );
}

#[test]
fn metadata_that_cannot_be_returned_as_a_struct_is_refused_naming_the_descriptor() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: a\n    metadata: 5\n",
            "limits.yaml: d.a: metadata: must be a mapping, not a number",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    metadata: {x: {7: y}}\n",
            "limits.yaml: d.a: metadata: a key is a number, not a string",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    metadata: {x: !tag y}\n",
            "limits.yaml: d.a: metadata: a tagged value",
        ),
    ];
    for (yaml, expected) in cases {
        let error = refused(yaml);
        assert!(error.starts_with(expected), "{yaml:?}\n  gave: {error}\n  wanted: {expected}");
    }
}

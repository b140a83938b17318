//! The README says what the code lists, and a test holds each copy to the code: the
//! metrics (names and scope) to `Counter::ALL` and `PluginCounter::ALL`, the reasons the
//! service cannot decide to `Reason::ALL`, the algorithms to `Algorithm::ALL`, the
//! configuration's defaults to the schema (which takes them from the constants), and
//! every relative link to a file that exists. The request path's stages and the layer
//! lists are held in `layers.rs`, beside the tables they mirror.

use shared_store::Algorithm;
use sluice::config;
use sluice::host::{Counter, PluginCounter, Reason, Scope};
use sluice::series::Series;
use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// The rows of the first table after the line `after` (cells trimmed, the header and
/// its rule skipped).
fn table(text: &str, after: &str) -> Vec<Vec<String>> {
    text.lines()
        .skip_while(|line| !line.starts_with(after))
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| line.trim_matches('|').split(" | ").map(|cell| cell.trim().to_owned()).collect())
        .collect()
}

/// The names in backticks in a cell.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// How the README names a policy counter's scope.
fn policy_scope(scope: Scope) -> &'static str {
    match scope {
        Scope::Every => "every policy",
        Scope::Global => "global policies",
        Scope::Concurrency => "concurrency policies",
        Scope::ResponseCost => "policies whose cost the response reports",
    }
}

/// How the README names a plugin counter's scope.
fn plugin_scope(scope: Scope) -> &'static str {
    match scope {
        Scope::Every => "every configuration",
        Scope::Global => "configurations with global policies",
        Scope::Concurrency => "configurations with concurrency policies",
        Scope::ResponseCost => "configurations with costs the response reports",
    }
}

/// A counter's series as the tables write it: `sluice_<family>` and its label, if any
/// (`policy` is every row's).
fn written(series: Series) -> String {
    match series.label {
        Some((key, value)) => format!("sluice_{}{{{key}=\"{value}\"}}", series.family),
        None => format!("sluice_{}", series.family),
    }
}

/// Every counter a metrics table names, with the series and the scope its row gives it
/// (`degraded.<reason>` stands for every reason's counter, `sluice_degraded_total{reason}`
/// for their series).
fn documented(rows: &[Vec<String>]) -> Vec<(String, String, String)> {
    let mut named = Vec::new();
    for row in rows {
        let (names, series, scope) = (ticked(&row[0]), ticked(&row[1]), row[2].clone());
        if names == ["degraded.<reason>"] {
            assert_eq!(series, ["sluice_degraded_total{reason}"], "{row:?}");
            named.extend(
                Reason::ALL.iter().map(|r| (r.metric_name().to_owned(), written(r.counter().series()), scope.clone())),
            );
            continue;
        }
        assert_eq!(names.len(), series.len(), "a series per counter: {row:?}");
        named.extend(names.into_iter().zip(series).map(|(name, series)| (name, series, scope.clone())));
    }
    named.sort();
    named
}

#[test]
fn the_metrics_tables_are_every_counter_with_its_series_and_scope() {
    let readme = readme();
    let policy = table(&readme, "Each counter is defined only for the policies");
    let plugin = table(&readme, "Per plugin, no `policy` label");
    let mut counters: Vec<(String, String, String)> = Counter::ALL
        .iter()
        .map(|c| (c.name().to_owned(), written(c.series()), policy_scope(c.scope()).to_owned()))
        .collect();
    let mut plugins: Vec<(String, String, String)> = PluginCounter::ALL
        .iter()
        .map(|c| (c.name().to_owned(), written(c.series()), plugin_scope(c.scope()).to_owned()))
        .collect();
    counters.sort();
    plugins.sort();

    assert_eq!(documented(&policy), counters);
    assert_eq!(documented(&plugin), plugins);
    for row in policy.iter().chain(&plugin) {
        let gauge = ticked(&row[0]).iter().any(|name| {
            Counter::ALL.iter().any(|c| c.name() == name && c.is_gauge())
                || PluginCounter::ALL.iter().any(|c| c.name() == name && c.is_gauge())
        });
        assert_eq!(row[0].contains("(gauge)"), gauge, "{row:?}");
    }
}

#[test]
fn the_reasons_table_is_every_reason_in_order() {
    let rows = table(&readme(), "| reason | when |");
    let documented: Vec<String> = rows.iter().flat_map(|row| ticked(&row[0])).collect();
    let reasons: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();

    assert_eq!(documented, reasons);
}

#[test]
fn the_policy_table_offers_every_algorithm_by_its_name() {
    let rows = table(&readme(), "### A policy");
    let algorithm = rows.iter().find(|row| row[0] == "`algorithm`").unwrap();
    let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();

    assert_eq!(ticked(&algorithm[2]), names);
}

/// The schema property behind a README row: the table (the line it follows), the field,
/// and the property's place in the schema.
const DEFAULTS: &[(&str, &str, &str)] = &[
    ("### Top level", "`stat_prefix`", "/properties/stat_prefix"),
    ("### A policy", "`algorithm`", "/$defs/RawPolicy/properties/algorithm"),
    ("### A policy", "`on_missing_key`", "/$defs/RawPolicy/properties/on_missing_key"),
    ("### A policy", "`shadow`", "/$defs/RawPolicy/properties/shadow"),
    ("### A policy", "`version`", "/$defs/RawPolicy/properties/version"),
    ("### A policy", "`slots`", "/$defs/RawPolicy/properties/slots"),
    ("### Response", "`status`", "/$defs/RawResponse/properties/status"),
    ("### Shaping", "`max_paused`", "/$defs/RawShaping/properties/max_paused"),
    ("### Shaping", "`tick_ms`", "/$defs/RawShaping/properties/tick_ms"),
    ("### `counter_service`", "`timeout`", "/$defs/RawCounterService/properties/timeout"),
    ("| `lease` field |", "`duration`", "/$defs/RawLease/properties/duration"),
    ("| `lease` field |", "`max_waiting`", "/$defs/RawLease/properties/max_waiting"),
    ("| `lease` field |", "`cold_below`", "/$defs/RawLease/properties/cold_below"),
];

#[test]
fn the_defaults_the_readme_gives_are_the_schemas_which_the_constants_give() {
    let (readme, schema) = (readme(), config::json_schema());
    for (after, field, pointer) in DEFAULTS {
        let row = table(&readme, after).into_iter().find(|row| row[0] == *field);
        let row = row.unwrap_or_else(|| panic!("{field} is not in the table after {after:?}"));
        let default = match schema.pointer(&format!("{pointer}/default")) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => panic!("{pointer} has no default"),
        };

        let stated = ticked(&row[1]).first().map(|d| d.trim_matches('"').to_owned());
        assert_eq!(stated, Some(default), "{field}: {row:?}");
    }
    // The failure rule's status and the circuit breaker are written as objects.
    let rows = table(&readme, "### A policy");
    let on_failure = &rows.iter().find(|row| row[0] == "`on_failure`").unwrap()[1];
    assert!(on_failure.contains(&format!("\"status\": {}", config::DEFAULT_FAILURE_STATUS)), "{on_failure}");
    let rows = table(&readme, "### `counter_service`");
    let breaker = &rows.iter().find(|row| row[0] == "`circuit_breaker`").unwrap()[1];
    let (failures, cooldown) = (config::bounds::DEFAULT_BREAKER_FAILURES, config::bounds::DEFAULT_BREAKER_COOLDOWN);
    assert!(breaker.contains(&format!("\"failures\": {failures}, \"cooldown\": \"{cooldown}\"")), "{breaker}");
}

#[test]
fn every_relative_link_of_the_readme_is_to_a_file_that_exists() {
    let readme = readme();
    let mut links = 0;
    for target in readme.split("](").skip(1).filter_map(|rest| rest.split_once(')').map(|(target, _)| target)) {
        if target.starts_with("http") || target.starts_with('#') {
            continue;
        }
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(target.split('#').next().unwrap_or(target));
        assert!(file.exists(), "README.md links {target}, which does not exist");
        links += 1;
    }
    assert!(links >= 10, "only {links} relative links");
}

#[test]
fn the_key_parts_paragraph_names_every_key_part_the_schema_takes() {
    let readme = readme();
    let paragraph = readme.split("**Key parts.**").nth(1).and_then(|rest| rest.split("\n\n").next()).unwrap();
    let schema = config::json_schema();
    let kinds = schema.pointer("/$defs/RawKeyPart/oneOf").and_then(|v| v.as_array()).unwrap();
    for kind in kinds {
        let name = kind["const"].as_str().or_else(|| kind["required"][0].as_str()).unwrap();
        assert!(paragraph.contains(&format!("\"{name}\"")), "the README's key parts do not show {name:?}");
    }
    assert!(kinds.len() >= 9, "{kinds:?}");
}

//! The README says what the service has: its flags table equals what the command line
//! defines (name, variable, default), and the metrics it lists are exactly the ones
//! `/metrics` serves. A flag or a metric added, renamed or removed without its line in
//! the README fails here.

use clap::CommandFactory;
use sluice_counter::config::Config;
use sluice_counter::metrics::Metrics;
use sluice_counter::store::{CounterStore, MemoryConfig, MemoryCounters};
use sluice_protocol::ErrorCode;

const README: &str = include_str!("../../README.md");

/// The flags table: `(flag, variable, default)` per row.
fn documented_flags() -> Vec<(String, String, String)> {
    let unquote = |cell: &str| cell.trim().trim_matches('`').to_owned();
    README
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').collect();
            match cells.as_slice() {
                [_, flag, variable, default, ..] => Some((unquote(flag), unquote(variable), unquote(default))),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn the_readmes_flags_table_is_exactly_what_the_command_line_defines() {
    let command = Config::command();
    let defined: Vec<(String, String, String)> = command
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            let env = arg.get_env().map_or_else(String::new, |e| e.to_string_lossy().into_owned());
            let default: Vec<String> =
                arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let default = if default.is_empty() { "none".to_owned() } else { default.join(",") };
            Some((format!("--{long}"), env, default))
        })
        .filter(|(long, ..)| long != "--help" && long != "--version")
        .collect();

    let documented = documented_flags();

    assert!(documented.len() >= 20, "the table was found: {documented:?}");
    for flag in &defined {
        assert!(documented.contains(flag), "{flag:?} is defined but not in the README's table as such");
    }
    for flag in &documented {
        assert!(defined.contains(flag), "{flag:?} is in the README's table but not defined so");
    }
}

/// Every `sluice_counter_…` name the README mentions, with `_total` and histogram suffixes
/// as written.
fn documented_metrics() -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for word in README.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("sluice_counter_") && word.len() > "sluice_counter_".len() {
            names.insert(word.to_owned());
        }
    }
    names
}

#[test]
fn the_metrics_the_readme_lists_are_exactly_the_ones_the_service_serves() {
    let store = CounterStore::Memory(MemoryCounters::new(MemoryConfig::default()));
    let metrics = Metrics::new("memory");
    // The RLS rule families have a series per rule: one hit over (in shadow mode) and
    // one near the limit make each family appear.
    metrics.rls().hits("shop.user", 1, true, true, false);
    metrics.rls().hits("shop.user", 1, false, false, true);
    // So do the per-policy decisions: a series per policy named.
    metrics.policy_decision(Some("per-route"), true);
    let text = metrics.render(&store);
    // Families as exposed (a histogram is named without its `_bucket`/`_sum`/`_count`).
    let served: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split_once(' ').map(|(name, _)| name.to_owned()))
        .collect();
    let redis_only = [
        "sluice_counter_redis_connections",
        "sluice_counter_redis_connects_total",
        "sluice_counter_redis_script_reloads_total",
    ];

    let documented = documented_metrics();

    assert!(served.len() >= 20, "{served:?}");
    for name in &served {
        assert!(documented.contains(name), "{name} is served but the README does not list it");
    }
    for name in &documented {
        assert!(
            served.contains(name) || redis_only.contains(&name.as_str()),
            "the README lists {name}, which the service does not serve"
        );
    }
}

#[test]
fn the_readmes_error_table_gives_each_code_the_status_it_is_answered_with_and_every_code_is_documented() {
    let rows: Vec<(u16, Vec<String>)> = README
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [_, status, codes, ..] = cells.as_slice() else { return None };
            let status: u16 = status.parse().ok()?;
            let codes = codes.split('/').map(|c| c.trim().trim_matches('`').to_owned()).collect();
            Some((status, codes))
        })
        .collect();

    assert!(rows.len() >= 20, "the table was found: {rows:?}");
    for (status, codes) in &rows {
        for name in codes {
            let code = ErrorCode::from_name(name).unwrap_or_else(|| panic!("the README's {name} is not a code"));
            assert_eq!(code.status(), *status, "{name}");
        }
    }
    for code in ErrorCode::ALL {
        assert!(README.contains(&format!("`{}`", code.name())), "{code} is answered but the README never names it");
    }
}

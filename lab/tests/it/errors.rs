//! A malformed scenario gets an error naming its line and field, and nothing is written.

use super::{lab_dir, sluice_lab};
use sluice_lab::Scenario;

const GOOD: &str = "name: x\nduration: 5s\nfleet:\n  regions:\n    - {name: eu, proxies: 1}\ncallers:\n  - name: app\n    rate:\n      - {at: 0s, rps: 5}\n";

fn refused(text: &str) -> sluice_lab::ScenarioError {
    match Scenario::parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

#[test]
fn the_good_scenario_these_tests_break_is_accepted() {
    assert!(Scenario::parse(GOOD).is_ok());
}

#[test]
fn an_unknown_field_is_named_with_its_line() {
    let error = refused(&GOOD.replace("    rate:", "    rat: 1\n    rate:"));
    assert_eq!(error.line, Some(8), "{error}");
    assert!(error.to_string().contains("unknown field `rat`"), "{error}");
    assert_eq!(error.field, "callers[0].rat");
}

#[test]
fn a_value_of_the_wrong_type_names_its_field_and_line() {
    let error = refused(&GOOD.replace("rps: 5", "rps: lots"));
    assert_eq!((error.line, error.field.as_str()), (Some(9), "callers[0].rate[0].rps"), "{error}");
}

#[test]
fn a_duration_that_is_not_one_says_what_a_duration_looks_like() {
    let error = refused(&GOOD.replace("duration: 5s", "duration: soon"));
    assert_eq!((error.line, error.field.as_str()), (Some(2), "duration"), "{error}");
    assert!(error.message.contains("\"250ms\""), "{error}");
}

#[test]
fn a_number_out_of_range_found_after_parsing_still_names_its_line() {
    let error = refused(&GOOD.replace("rps: 5", "rps: -5"));
    assert_eq!((error.line, error.field.as_str()), (Some(9), "callers[0].rate[0].rps"), "{error}");
}

#[test]
fn a_region_that_names_nothing_is_refused_at_its_line() {
    let text = format!("{GOOD}faults:\n  - {{kind: partition, at: 1s, for: 1s, region: mars}}\n");
    let error = refused(&text);
    assert_eq!((error.line, error.field.as_str()), (Some(11), "faults[0].region"), "{error}");
    assert!(error.message.contains("mars"));
}

#[test]
fn rate_points_out_of_order_are_refused() {
    let text = GOOD.replace("      - {at: 0s, rps: 5}\n", "      - {at: 2s, rps: 5}\n      - {at: 1s, rps: 5}\n");
    let error = refused(&text);
    assert_eq!((error.line, error.field.as_str()), (Some(10), "callers[0].rate[1].at"), "{error}");
}

#[test]
fn an_unknown_fault_kind_is_refused() {
    let error = refused(&format!("{GOOD}faults:\n  - {{kind: meteor, at: 1s}}\n"));
    assert!(error.to_string().contains("meteor"), "{error}");
    assert_eq!(error.line, Some(11), "{error}");
}

#[test]
fn the_binary_refuses_a_malformed_scenario_naming_line_and_field_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let scenario = dir.path().join("bad.yaml");
    std::fs::write(&scenario, GOOD.replace("rps: 5", "rps: lots")).expect("written");
    let out = dir.path().join("report");
    let config = lab_dir().join("configs/bucket-reject.json");
    let (succeeded, stderr) = sluice_lab("run", &scenario, &config, &out, &[]);
    assert!(!succeeded);
    assert!(stderr.contains("line 9") && stderr.contains("callers[0].rate[0].rps"), "{stderr}");
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn the_binary_refuses_a_configuration_the_filter_refuses_naming_the_field_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let scenario = dir.path().join("good.yaml");
    std::fs::write(&scenario, GOOD).expect("written");
    let config = dir.path().join("bad.json");
    std::fs::write(&config, r#"{"policies":[{"name":"p","key":["client_address"],"rate":"10/fortnight","burst":1}]}"#)
        .expect("written");
    let out = dir.path().join("report");
    let (succeeded, stderr) = sluice_lab("run", &scenario, &config, &out, &[]);
    assert!(!succeeded);
    assert!(stderr.contains("bad.json") && stderr.contains("rate"), "{stderr}");
    assert!(!out.exists(), "nothing is written");
}

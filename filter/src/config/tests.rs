//! Unit tests of the configuration as a whole: the documented defaults, the forms a
//! value takes once validated, and that every issue is reported, not just the first.

use super::*;
use shared_store::{Limit, Nanos, Rate};

fn config(json: &str) -> Config {
    Config::from_json(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

fn error(json: &str) -> String {
    Config::from_json(json.as_bytes()).unwrap_err().to_string()
}

#[test]
fn a_minimal_policy_gets_the_documented_defaults() {
    let config = config(r#"{"policies":[{"name":"p","key":["client_address"],"rate":"100/minute"}]}"#);

    let policy = &config.policies[0];
    assert_eq!(policy.limit, Limit::token_bucket(Rate::new(100, Nanos::from_secs(60)).unwrap(), 100).unwrap());
    assert_eq!(policy.on_missing_key, MissingKey::Shared);
    assert_eq!(policy.on_failure, FailureOutcome::Deny(503));
    assert_eq!(policy.slots.get(), DEFAULT_SLOTS);
    assert_eq!(policy.cost, Cost::Constant(1));
    assert!(!policy.shadow);
    assert_eq!(config.response.status, 429);
    assert_eq!(config.response.on_rejected, HeaderSets { retry_after: true, ratelimit: true, legacy: false });
    assert_eq!(config.response.on_allowed, HeaderSets::default());
    assert_eq!(config.shaping, Shaping { max_paused: DEFAULT_MAX_PAUSED, tick_ms: DEFAULT_TICK_MS });
    assert_eq!(config.stat_prefix, "sluice");
}

#[test]
fn a_body_without_content_type_is_sent_as_plain_text() {
    let config =
        config(r#"{"policies":[{"name":"p","key":["path"],"rate":"1/second"}],"response":{"body":"slow down"}}"#);

    assert_eq!(config.response.headers, vec![("content-type".to_owned(), "text/plain; charset=utf-8".to_owned())]);
}

#[test]
fn a_policer_is_a_leaky_bucket_that_never_waits() {
    let config = config(
        r#"{"policies":[{"name":"p","key":["path"],"algorithm":"leaky_bucket","rate":"5/second","queue":5,"overflow":"reject"}]}"#,
    );

    assert!(matches!(config.policies[0].limit, Limit::LeakyBucket { max_wait: Nanos::ZERO, .. }));
}

#[test]
fn every_semantic_problem_is_reported_not_just_the_first() {
    let message = error(r#"{"policies":[{"name":"a b","key":[],"rate":"0/second"}],"response":{"status":99}}"#);

    assert_eq!(message.lines().count(), 4, "{message}");
    assert!(message.contains("policies[0].name: "));
    assert!(message.contains("policies[0].key: "));
    assert!(message.contains("policies[0].rate: must be at least 1"));
    assert!(message.contains("response.status: "));
}

#[test]
fn a_refill_time_beyond_the_clock_is_rejected() {
    let message = error(r#"{"policies":[{"name":"p","key":["path"],"rate":"1/day","burst":1000000000000}]}"#);

    assert_eq!(message, "policies[0].burst: takes longer than 584 years to refill at this rate");
}

#[test]
fn the_schema_forbids_unknown_fields_everywhere() {
    let schema = json_schema().to_string();

    assert!(schema.contains("\"additionalProperties\":false"));
    assert!(!schema.contains("\"additionalProperties\":true"));
}

/// The reason `core`'s float formatting (`flt2dec`, about 18 KB of `sluice.wasm`) stays
/// in the release module: serde names the value it refused, and a float is printed as one.
#[test]
fn a_fraction_where_a_whole_number_belongs_is_refused_naming_the_field_and_the_value() {
    let message = error(r#"{"policies":[{"name":"p","key":[{"header":"x-user"}],"rate":"10/second","burst":1.5}]}"#);

    assert!(message.contains("policies[0].burst"), "{message}");
    assert!(message.contains("floating point `1.5`"), "{message}");
}

#[test]
fn a_lease_checks_keys_below_four_units_per_life_unless_the_capacity_is_smaller() {
    let lease = |burst: u64| {
        let json = format!(
            r#"{{"counter_service":{{"cluster":"c","hash_key_env":"K"}},"policies":[{{"name":"p","key":["client_address"],
                "rate":"1/second","burst":{burst},"global":{{"strategy":"lease"}}}}]}}"#
        );
        match config(&json).policies[0].global.map(|g| g.strategy) {
            Some(Strategy::Lease(lease)) => lease.cold_below,
            other => panic!("{other:?}"),
        }
    };

    assert_eq!(lease(100), bounds::DEFAULT_COLD_BELOW);
    assert_eq!(lease(2), 2, "at most the capacity");
}

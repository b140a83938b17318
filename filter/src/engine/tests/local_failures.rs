//! Local policies when shared data fails or changes: store errors and CAS exhaustion
//! take the failure rule, the hash secret, table sizes, carried-over buckets, hostile
//! header bytes.
use super::local::*;
use crate::engine::*;
use crate::host::Counter;
use crate::testing::{FakeRequest, RecordedMetrics};
use shared_store::{Cas, StoreError, Swap};
use shared_store::{Entry, ManualClock, MemoryStore};
use shared_store::{HashKey, Limiter, Nanos, Store};
use std::cell::Cell;

/// A store whose writes fail or conflict, for failure outcomes.
struct BrokenStore {
    conflict: bool,
    inner: MemoryStore,
    sets: Cell<u32>,
}

impl Store for BrokenStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        self.sets.set(self.sets.get() + 1);
        if key.ends_with("anchor") {
            return self.inner.set(key, value, cas);
        }
        if self.conflict { Ok(Swap::Conflict) } else { Err(StoreError { operation: "set", status: Some(10) }) }
    }
}

fn broken(conflict: bool) -> Limiter<BrokenStore, ManualClock> {
    Limiter::new(
        BrokenStore { conflict, inner: MemoryStore::new(), sets: Cell::new(0) },
        ManualClock::at(Nanos::from_secs(1)),
    )
}

#[test]
fn a_store_error_denies_with_the_default_failure_status() {
    let engine = engine(PER_KEY);
    let mut metrics = RecordedMetrics::default();

    let outcome =
        decide(&engine, &FakeRequest::get("/").with_header("x-api-key", "a"), &broken(false), true, &mut metrics);

    assert_eq!(rejected(&outcome).status, 503);
    assert_eq!(metrics.get(0, Counter::StoreErrors), 1);
    assert_eq!(metrics.get(0, Counter::FailureDenied), 1);
    assert_eq!(metrics.get(0, Counter::Rejected), 1);
}

#[test]
fn exhausted_cas_attempts_follow_the_configured_allow_outcome_and_are_counted() {
    let engine = engine(
        r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/second","on_failure":{"action":"allow"}}]}"#,
    );
    let mut metrics = RecordedMetrics::default();

    let outcome = decide(&engine, &FakeRequest::get("/"), &broken(true), true, &mut metrics);

    assert!(is_continue(&outcome));
    assert_eq!(metrics.get(0, Counter::CasExhausted), 1);
    assert_eq!(metrics.get(0, Counter::CasConflicts), i64::from(shared_store::DEFAULT_MAX_ATTEMPTS));
    assert_eq!(metrics.get(0, Counter::FailureAllowed), 1);
    assert_eq!(metrics.get(0, Counter::Allowed), 1);
}

#[test]
fn any_deny_among_the_failing_policies_denies() {
    let engine = engine(
        r#"{"policies":[
      {"name":"open","key":[{"constant":"x"}],"rate":"1/second","on_failure":{"action":"allow"}},
      {"name":"closed","key":[{"constant":"y"}],"rate":"1/second","on_failure":{"action":"deny","status":429}}]}"#,
    );
    let mut metrics = RecordedMetrics::default();

    let outcome = decide(&engine, &FakeRequest::get("/"), &broken(true), true, &mut metrics);

    assert_eq!(rejected(&outcome).status, 429);
}

#[test]
fn workers_racing_to_create_the_secret_agree_on_one() {
    let store = MemoryStore::new();

    let first = establish_secret(&store, "p/", [1; 16]).unwrap();
    let second = establish_secret(&store, "p/", [2; 16]).unwrap();

    assert_eq!(first, second);
    assert_eq!(first, HashKey::new([1; 16]));
}

#[test]
fn a_damaged_secret_is_replaced() {
    let store = MemoryStore::new();
    let _ = store.set("p/secret", b"short", None).unwrap();

    let secret = establish_secret(&store, "p/", [3; 16]).unwrap();

    assert_eq!(secret, HashKey::new([3; 16]));
}

#[test]
fn a_table_cannot_change_size_without_a_new_version() {
    let store = MemoryStore::new();
    let small = engine(r#"{"policies":[{"name":"k","key":["path"],"rate":"1/second","slots":16}]}"#);
    let large = engine(r#"{"policies":[{"name":"k","key":["path"],"rate":"1/second","slots":32}]}"#);
    let bumped = engine(r#"{"policies":[{"name":"k","key":["path"],"rate":"1/second","slots":32,"version":1}]}"#);

    small.claim_tables(&store).unwrap();
    let error = large.claim_tables(&store).unwrap_err().to_string();

    assert!(error.starts_with("policies[0].slots: "), "{error}");
    assert!(small.claim_tables(&store).is_ok());
    assert!(bumped.claim_tables(&store).is_ok());
}

#[test]
fn plugin_identities_never_share_a_prefix() {
    assert_ne!(plugin_prefix(b"a/b", b"c"), plugin_prefix(b"a", b"b/c"));
    assert_ne!(plugin_prefix(b"a%2F", b""), plugin_prefix(b"a/", b""));
    assert_eq!(plugin_prefix(b"rl", b"main"), "sluice/rl/main/");
    assert_eq!(plugin_prefix(&[0xff], b""), "sluice/%FF//");
}

#[test]
fn keys_in_shared_data_carry_no_raw_identity() {
    let engine = engine(PER_KEY);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    decide(
        &engine,
        &FakeRequest::get("/").with_header("x-api-key", "secret-api-key-123"),
        &limiter,
        true,
        &mut metrics,
    );

    for (key, value) in limiter.store().entries() {
        assert!(!key.contains("secret-api-key"), "{key}");
        assert!(!value.windows(10).any(|w| w == b"secret-api"), "{key}");
    }
}

#[test]
fn cache_control_is_made_private_without_losing_other_directives() {
    assert_eq!(private_cache_control(None).as_deref(), Some("private"));
    assert_eq!(private_cache_control(Some(b"public, max-age=60")).as_deref(), Some("private, max-age=60"));
    assert_eq!(private_cache_control(Some(b"no-store")), None);
    assert_eq!(private_cache_control(Some(b"private, max-age=5")), None);
    assert_eq!(private_cache_control(Some(b"max-age=5, s-maxage=60")).as_deref(), Some("private, max-age=5"));
}

#[test]
fn a_changed_burst_carries_buckets_over_instead_of_refilling_them() {
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let before = engine(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":10}]}"#);
    let raised = engine(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":20}]}"#);
    for _ in 0..10 {
        decide(&before, &FakeRequest::get("/"), &limiter, true, &mut metrics);
    }

    let admitted =
        (0..30).filter(|_| is_continue(&decide(&raised, &FakeRequest::get("/"), &limiter, true, &mut metrics))).count();

    // The empty bucket stays empty: a raise is no reason to hand out a fresh burst.
    assert_eq!(admitted, 0);
}

#[test]
fn a_lowered_burst_clamps_existing_buckets() {
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let before = engine(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":10}]}"#);
    let lowered = engine(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":3}]}"#);
    decide(&before, &FakeRequest::get("/"), &limiter, true, &mut metrics);

    let admitted = (0..30)
        .filter(|_| is_continue(&decide(&lowered, &FakeRequest::get("/"), &limiter, true, &mut metrics)))
        .count();

    assert_eq!(admitted, 3);
}

#[test]
fn a_version_bump_starts_fresh_buckets() {
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let v0 = engine(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":2}]}"#);
    let v1 = engine(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":2,"version":1}]}"#);
    for _ in 0..2 {
        decide(&v0, &FakeRequest::get("/"), &limiter, true, &mut metrics);
    }

    let admitted =
        (0..5).filter(|_| is_continue(&decide(&v1, &FakeRequest::get("/"), &limiter, true, &mut metrics))).count();

    assert_eq!(admitted, 2);
}

#[test]
fn hostile_header_bytes_get_a_decision() {
    let engine = engine(
        r#"{"policies":[{"name":"k","match":{"headers":[{"name":"x-t","equals":"a"}]},
        "key":[{"header":"x-api-key"},{"query_parameter":"u"},"authority","client_address"],"rate":"1/second",
        "cost":{"header":"x-cost","max":1}}]}"#,
    );
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let request = FakeRequest::get("/?u=\u{0}")
        .with_header("x-t", "a")
        .with_header("x-api-key", vec![0xff; 65536])
        .with_header("x-cost", [0xc3, 0x28])
        .with_header(":authority", [0xfe, b'A'])
        .with_property(&["source", "address"], [0xff, 0x00]);

    let outcome = decide(&engine, &request, &limiter, true, &mut metrics);

    assert!(is_continue(&outcome));
}

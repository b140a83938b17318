//! Local policies through the engine: buckets per key, all-or-nothing across policies,
//! shadows, missing keys, costs, headers and shaping.
use crate::config::Config;
use crate::config::MissingKey;
use crate::engine::*;
use crate::host::Counter;
use crate::testing::{FakeCallouts, FakeRequest, RecordedMetrics};
use shared_store::{Clock, HashKey, Limiter, Nanos, Store};
use shared_store::{ManualClock, MemoryStore};

pub(super) const SECRET: HashKey = HashKey::new([7; 16]);

pub(super) fn engine(json: &str) -> Engine {
    Engine::new(Config::from_json(json.as_bytes()).unwrap(), "sluice/test/root/", SECRET, |_| None).unwrap()
}

/// Decides a request with local policies only and records its fate as the glue would.
pub(super) fn decide_tallied<S: Store, C: Clock>(
    engine: &Engine,
    request: &FakeRequest,
    limiter: &Limiter<S, C>,
    room: bool,
    metrics: &mut RecordedMetrics,
) -> (Outcome, Tally) {
    let Begun::Decided(Decided { outcome, tally, .. }) =
        engine.begin(request, limiter, &mut FakeCallouts::default(), room, metrics)
    else {
        panic!("a local decision never waits")
    };
    let disposition = match &outcome {
        Outcome::Continue { .. } => Disposition::Allowed,
        Outcome::Reject(_) => Disposition::Rejected,
        Outcome::Delay { .. } => Disposition::Queued,
    };
    engine.record(&tally, disposition, metrics);
    (outcome, tally)
}

pub(super) fn decide<S: Store, C: Clock>(
    engine: &Engine,
    request: &FakeRequest,
    limiter: &Limiter<S, C>,
    room: bool,
    metrics: &mut RecordedMetrics,
) -> Outcome {
    decide_tallied(engine, request, limiter, room, metrics).0
}

pub(super) fn limiter() -> Limiter<MemoryStore, ManualClock> {
    Limiter::new(MemoryStore::new(), ManualClock::at(Nanos::from_secs(1000)))
}

pub(super) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

pub(super) fn rejected(outcome: &Outcome) -> &LocalResponse {
    match outcome {
        Outcome::Reject(response) => response,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

pub(super) fn is_continue(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Continue { .. })
}

pub(super) const PER_KEY: &str = r#"{"policies":[{"name":"per-key","key":[{"header":"x-api-key"}],"rate":"2/second","burst":3}],
  "response":{"headers_on_rejected":["retry_after","ratelimit","x_ratelimit"],"headers_on_allowed":["ratelimit"]}}"#;

#[test]
fn a_token_bucket_admits_its_burst_then_rejects_with_exact_headers() {
    let engine = engine(PER_KEY);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let request = FakeRequest::get("/").with_header("x-api-key", "alice");

    let outcomes: Vec<Outcome> = (0..4).map(|_| decide(&engine, &request, &limiter, true, &mut metrics)).collect();

    assert!(outcomes[..3].iter().all(is_continue));
    let response = rejected(&outcomes[3]);
    assert_eq!(response.status, 429);
    // 3 spent at 2/second: the next token arrives in 500 ms, rounded up to 1 s.
    assert_eq!(header(&response.headers, "retry-after"), Some("1"));
    assert_eq!(header(&response.headers, "ratelimit-policy"), Some("\"per-key\";q=3;w=2"));
    assert_eq!(header(&response.headers, "ratelimit"), Some("\"per-key\";r=0;t=1"));
    assert_eq!(header(&response.headers, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&response.headers, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&response.headers, "cache-control"), Some("private"));
    let Outcome::Continue { headers, .. } = &outcomes[0] else { unreachable!() };
    assert_eq!(header(headers, "ratelimit"), Some("\"per-key\";r=2;t=1"));
    assert_eq!(metrics.get(0, Counter::Offered), 4);
    assert_eq!(metrics.get(0, Counter::Allowed), 3);
    assert_eq!(metrics.get(0, Counter::Rejected), 1);
    assert_eq!(metrics.get(0, Counter::OverLimit), 1);
}

#[test]
fn a_caller_who_waits_the_exact_retry_after_is_admitted() {
    let engine = engine(PER_KEY);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let request = FakeRequest::get("/").with_header("x-api-key", "alice");
    for _ in 0..3 {
        decide(&engine, &request, &limiter, true, &mut metrics);
    }

    limiter.clock().advance(Nanos::from_millis(499));
    let early = decide(&engine, &request, &limiter, true, &mut metrics);
    limiter.clock().advance(Nanos::from_millis(1));
    let on_time = decide(&engine, &request, &limiter, true, &mut metrics);

    assert!(matches!(early, Outcome::Reject(_)));
    assert!(is_continue(&on_time));
}

#[test]
fn different_keys_have_different_buckets() {
    let engine = engine(PER_KEY);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    for _ in 0..3 {
        decide(&engine, &FakeRequest::get("/").with_header("x-api-key", "alice"), &limiter, true, &mut metrics);
    }

    let bob = decide(&engine, &FakeRequest::get("/").with_header("x-api-key", "bob"), &limiter, true, &mut metrics);

    assert!(is_continue(&bob));
}

#[test]
fn a_rotating_forwarded_for_header_grants_nothing() {
    let engine = engine(r#"{"policies":[{"name":"ip","key":["client_address"],"rate":"1/minute","burst":2}]}"#);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let admitted = (0..50)
        .filter(|i| {
            let request = FakeRequest::get("/").with_header("x-forwarded-for", format!("10.0.0.{i}"));
            is_continue(&decide(&engine, &request, &limiter, true, &mut metrics))
        })
        .count();

    assert_eq!(admitted, 2);
}

pub(super) const LAYERED: &str = r#"{"policies":[
  {"name":"tenant","key":[{"header":"x-tenant"}],"rate":"1/minute","burst":10},
  {"name":"operation","match":{"path_prefix":"/reports"},"key":[{"header":"x-tenant"},"path"],"rate":"1/minute","burst":2}
]}"#;

#[test]
fn a_request_rejected_by_one_policy_spends_nothing_in_the_others() {
    let engine = engine(LAYERED);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let report = FakeRequest::get("/reports/x").with_header("x-tenant", "t1");
    let other = FakeRequest::get("/items").with_header("x-tenant", "t1");

    let reports: Vec<bool> =
        (0..5).map(|_| is_continue(&decide(&engine, &report, &limiter, true, &mut metrics))).collect();
    let others = (0..20).filter(|_| is_continue(&decide(&engine, &other, &limiter, true, &mut metrics))).count();

    assert_eq!(reports, [true, true, false, false, false]);
    // The tenant bucket (10) lost only the two admitted reports.
    assert_eq!(others, 8);
    assert_eq!(metrics.get(1, Counter::OverLimit), 3);
    assert_eq!(metrics.get(0, Counter::OverLimit), 12);
}

#[test]
fn shadow_policies_count_but_never_reject_or_change_enforcement() {
    let engine = engine(
        r#"{"policies":[
      {"name":"enforced","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":5},
      {"name":"candidate","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":2,"shadow":true}]}"#,
    );
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let request = FakeRequest::get("/").with_header("x-api-key", "k");

    let admitted = (0..8).filter(|_| is_continue(&decide(&engine, &request, &limiter, true, &mut metrics))).count();

    assert_eq!(admitted, 5);
    assert_eq!(metrics.get(1, Counter::ShadowRejected), 3);
    assert_eq!(metrics.get(1, Counter::Offered), 8);
    assert_eq!(metrics.get(1, Counter::Allowed), 5);
    assert_eq!(metrics.get(1, Counter::Rejected), 3);
}

pub(super) fn missing_key_engine(behaviour: &str) -> Engine {
    engine(&format!(
        r#"{{"policies":[{{"name":"k","key":[{{"header":"x-api-key"}}],"rate":"1/minute","burst":2,"on_missing_key":"{behaviour}"}}]}}"#
    ))
}

#[test]
fn requests_missing_the_key_share_one_bucket_by_default() {
    let engine = engine(r#"{"policies":[{"name":"k","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":2}]}"#);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let admitted =
        (0..5).filter(|_| is_continue(&decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics))).count();

    assert_eq!(admitted, 2);
    assert_eq!(metrics.get(0, Counter::MissingKey), 5);
    assert_eq!(engine.policies().next().unwrap().on_missing_key, MissingKey::Shared);
}

#[test]
fn requests_missing_the_key_skip_the_policy_when_configured() {
    let engine = missing_key_engine("skip");
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let admitted =
        (0..5).filter(|_| is_continue(&decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics))).count();

    assert_eq!(admitted, 5);
    assert_eq!(metrics.get(0, Counter::Offered), 0);
}

#[test]
fn requests_missing_the_key_are_rejected_when_configured() {
    let engine = missing_key_engine("reject");
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let outcome = decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);

    let response = rejected(&outcome);
    assert_eq!(response.status, 429);
    assert_eq!(header(&response.headers, "retry-after"), None);
    assert_eq!(metrics.get(0, Counter::Rejected), 1);
}

#[test]
fn header_costs_are_clamped_to_their_bounds() {
    let engine = engine(
        r#"{"policies":[{"name":"c","key":[{"constant":"all"}],"rate":"1/minute","burst":10,
        "cost":{"header":"x-cost","min":2,"max":5,"default":3}}]}"#,
    );
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let spend = |cost: Option<&str>, metrics: &mut RecordedMetrics| {
        let mut request = FakeRequest::get("/");
        if let Some(cost) = cost {
            request = request.with_header("x-cost", cost);
        }
        decide(&engine, &request, &limiter, true, metrics)
    };

    // 5 (clamped from 100) + 2 (clamped from 0) + 3 (default, unparsable) = 10.
    assert!(is_continue(&spend(Some("100"), &mut metrics)));
    assert!(is_continue(&spend(Some("0"), &mut metrics)));
    assert!(is_continue(&spend(Some("lots"), &mut metrics)));
    assert!(matches!(spend(None, &mut metrics), Outcome::Reject(_)));
}

#[test]
fn the_strictest_policy_decides_the_allowed_headers() {
    let engine = engine(
        r#"{"policies":[
      {"name":"loose","key":[{"constant":"a"}],"rate":"100/second","burst":100},
      {"name":"tight","key":[{"constant":"b"}],"rate":"1/second","burst":3}],
      "response":{"headers_on_allowed":["ratelimit","x_ratelimit"]}}"#,
    );
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let Outcome::Continue { headers, .. } = decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics)
    else {
        panic!("expected an admission")
    };

    assert_eq!(header(&headers, "ratelimit"), Some("\"tight\";r=2;t=1"));
    assert_eq!(header(&headers, "ratelimit-policy"), Some("\"tight\";q=3;w=3"));
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("2"));
}

#[test]
fn the_policy_with_the_longest_wait_decides_the_rejection_headers() {
    let engine = engine(
        r#"{"policies":[
      {"name":"minute","key":[{"constant":"a"}],"rate":"1/minute","burst":1},
      {"name":"second","key":[{"constant":"b"}],"rate":"1/second","burst":1}]}"#,
    );
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);

    let outcome = decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);

    let response = rejected(&outcome);
    assert_eq!(header(&response.headers, "retry-after"), Some("60"));
    assert_eq!(header(&response.headers, "ratelimit"), Some("\"minute\";r=0;t=60"));
}

pub(super) const SHAPED: &str = r#"{"policies":[{"name":"shaper","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
  "rate":"2/second","queue":3,"max_wait":"1s"}]}"#;

#[test]
fn a_shaping_policy_delays_requests_at_its_rate_and_bounds_the_queue() {
    let engine = engine(SHAPED);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let outcomes: Vec<Outcome> =
        (0..4).map(|_| decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics)).collect();

    assert!(is_continue(&outcomes[0]));
    let delays: Vec<Nanos> = outcomes[1..3]
        .iter()
        .map(|o| match o {
            Outcome::Delay { delay, .. } => *delay,
            other => panic!("expected a delay, got {other:?}"),
        })
        .collect();
    assert_eq!(delays, [Nanos::from_millis(500), Nanos::from_millis(1000)]);
    assert!(matches!(outcomes[3], Outcome::Reject(_)));
    assert_eq!(metrics.get(0, Counter::Queued), 2);
    assert_eq!(
        metrics.get(0, Counter::Offered),
        metrics.get(0, Counter::Allowed) + metrics.get(0, Counter::Rejected) + metrics.get(0, Counter::Queued)
    );
}

#[test]
fn released_and_abandoned_requests_keep_the_accounting_identity() {
    let engine = engine(SHAPED);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);
    let delayed: Vec<Tally> = (0..2)
        .map(|_| match decide_tallied(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics) {
            (Outcome::Delay { .. }, tally) => tally,
            (other, _) => panic!("expected a delay, got {other:?}"),
        })
        .collect();

    engine.release(&delayed[0], &mut metrics);
    engine.abandon(&delayed[1], &mut metrics);

    assert_eq!(metrics.get(0, Counter::Queued), 0);
    assert_eq!(metrics.get(0, Counter::Allowed), 3);
    assert_eq!(metrics.get(0, Counter::Abandoned), 1);
    assert_eq!(metrics.get(0, Counter::Offered), 3);
}

#[test]
fn a_delayed_request_is_rejected_when_no_more_can_be_paused() {
    let engine = engine(SHAPED);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);

    let outcome = decide(&engine, &FakeRequest::get("/"), &limiter, false, &mut metrics);

    assert!(matches!(outcome, Outcome::Reject(_)));
    assert_eq!(metrics.get(0, Counter::Queued), 0);
}

#[test]
fn a_policer_rejects_what_a_shaper_would_delay() {
    let engine = engine(
        r#"{"policies":[{"name":"p","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
        "rate":"2/second","queue":3,"overflow":"reject"}]}"#,
    );
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let first = decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);
    let second = decide(&engine, &FakeRequest::get("/"), &limiter, true, &mut metrics);

    assert!(is_continue(&first));
    assert_eq!(header(&rejected(&second).headers, "retry-after"), Some("1"));
}

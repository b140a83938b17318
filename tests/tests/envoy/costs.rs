//! Costs the response reports, in Envoy, in front of a language-model-like upstream: a
//! per-user token budget held under an oracle of the usage the upstream really returned,
//! event streams passed through as they are written, and answers cut short counted.

use super::*;
use sluice::host::{Counter as Metric, PluginCounter};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::wait;
use sluice_tests::counter::{self, Counter};
use sluice_tests::envoy::cluster;
use sluice_tests::h2::TrailersUpstream;
use sluice_tests::llm::{self, LlmUpstream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Tokens per second, burst, estimate and max of [`TOKENS`].
const RATE: u64 = 2;
const BURST: u64 = 1000;
const ESTIMATE: u64 = 50;
const MAX: u64 = 500;
const TOKENS: &str = r#"{"policies": [{"name": "tokens", "key": [{"header": "x-user"}], "rate": "120/minute",
  "burst": 1000, "cost": {"response_json": "usage.total_tokens", "estimate": 50, "max": 500, "on_unknown": 500}}]}"#;

/// [`TOKENS`] made global, in lease mode, with the lease's debt bound at the capacity.
const MAX_DEBT: u64 = 1000;
const GLOBAL_TOKENS: &str = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
    "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "2s"},
  "policies": [{"name": "tokens", "key": [{"header": "x-user"}], "rate": "120/minute", "burst": 1000,
    "cost": {"response_json": "usage.total_tokens", "estimate": 50, "max": 500, "on_unknown": 500},
    "global": {"strategy": "lease", "lease": {"size": 200, "max_debt": 1000}}}]}"#;
/// [`TOKENS`] made global, in check mode: the service spends each estimate, and the
/// proxy settles it there once the answer says.
const CHECKED_TOKENS: &str = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
    "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "2s"},
  "policies": [{"name": "tokens", "key": [{"header": "x-user"}], "rate": "120/minute", "burst": 1000,
    "cost": {"response_json": "usage.total_tokens", "estimate": 50, "max": 500, "on_unknown": 500},
    "global": {"strategy": "check"}}]}"#;
const HASH_KEY: &str = "costs-hash-key-0123456789abcdef";
const TOKEN: &str = "costs-token-42";

fn envoy(upstream: &LlmUpstream, workers: usize) -> Envoy {
    Envoy::builder()
        .workers(workers)
        .cluster(cluster("llm", upstream.addr(), false))
        .route_to("llm")
        .sluice(sluice(TOKENS))
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A proxy of a fleet on one global token budget kept by `service`, in lease mode.
fn global_envoy(upstream: &LlmUpstream, service: &Counter) -> Envoy {
    fleet_envoy(GLOBAL_TOKENS, upstream, service)
}

/// A proxy of a fleet on one global token budget kept by `service`, configured `config`.
fn fleet_envoy(config: &str, upstream: &LlmUpstream, service: &Counter) -> Envoy {
    let filter = sluice(config).env("SLUICE_HASH_KEY", HASH_KEY).env("SLUICE_COUNTER_TOKEN", TOKEN);
    Envoy::builder()
        .workers(2)
        .cluster(cluster("llm", upstream.addr(), false))
        .cluster(cluster("sluice-counter", service.addr(), true))
        .route_to("llm")
        .sluice(filter)
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn completion(query: &str) -> Request {
    Request::post(format!("/v1/chat/completions?{query}"), "{}").header("x-user", "alice")
}

/// `callers` callers on threads of their own send `requests` completions each, of 300 –
/// 500 tokens, half of them streamed, caller `c`'s `i`-th through proxy `(c + i)` of the
/// fleet (round robin). Returns how many were rejected, and the seconds it all took.
fn load(fleet: &Arc<Vec<Envoy>>, callers: usize, requests: usize) -> (usize, u64) {
    let started = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|c| {
            let fleet = Arc::clone(fleet);
            thread::spawn(move || {
                (0..requests)
                    .filter(|i| {
                        let tokens = 300 + (c * requests + i) * 37 % 201;
                        let stream = u8::from(i % 2 == 0);
                        let envoy = &fleet[(c + i) % fleet.len()];
                        send(envoy, &completion(&format!("tokens={tokens}&stream={stream}"))).status == 429
                    })
                    .count()
            })
        })
        .collect();
    let rejected = threads.into_iter().map(|t| t.join().unwrap()).sum();
    (rejected, started.elapsed().as_secs())
}

#[test]
fn a_token_budget_holds_across_two_workers_under_an_oracle_of_the_usage_returned() {
    const CALLERS: usize = 4;
    const REQUESTS: usize = 30;
    let upstream = LlmUpstream::start();
    let fleet = Arc::new(vec![envoy(&upstream, 2)]);
    let envoy = &fleet[0];

    let (rejected, elapsed) = load(&fleet, CALLERS, REQUESTS);

    let served = upstream.served();
    let admitted: u64 = served.iter().map(|s| s.tokens).sum();
    // Every caller's request in flight when the bucket went below empty may overshoot by
    // max − estimate; nothing is forgiven with fewer than 64 in flight.
    let bound = BURST + RATE * (elapsed + 1) + CALLERS as u64 * (MAX - ESTIMATE);
    assert!(admitted <= bound, "admitted {admitted} tokens, bound {bound}");
    assert!(rejected > 0, "the budget never bound");
    assert_eq!(served.len() + rejected, CALLERS * REQUESTS);
    assert_eq!(envoy.metric("tokens", Metric::CostForgiven), 0);
    assert_eq!(envoy.metric("tokens", Metric::CostUnknown), 0);
    let over_estimates: u64 = served.iter().map(|s| s.tokens - ESTIMATE).sum();
    assert_eq!(envoy.metric("tokens", Metric::CostCharged), over_estimates, "each answer charged exactly once");
    assert_eq!(envoy.metric("tokens", Metric::Allowed), served.len() as u64);
    // The units admitted, from the metrics alone, are the tokens the upstream reported.
    let units = envoy.metric("tokens", Metric::CostEstimated) + envoy.metric("tokens", Metric::CostCharged)
        - envoy.metric("tokens", Metric::CostCredited);
    assert_eq!(units, admitted);
}

#[test]
fn a_global_token_budget_in_lease_mode_holds_across_two_proxies_and_their_debt_is_charged_once() {
    const CALLERS: usize = 4;
    const REQUESTS: usize = 24;
    let upstream = LlmUpstream::start();
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let fleet = Arc::new(vec![global_envoy(&upstream, &service), global_envoy(&upstream, &service)]);

    let (rejected, elapsed) = load(&fleet, CALLERS, REQUESTS);

    let served = upstream.served();
    let admitted: u64 = served.iter().map(|s| s.tokens).sum();
    let sum = |counter: Metric| fleet.iter().map(|e| e.metric("tokens", counter)).sum::<u64>();
    // What a lease could not cover is owed and charged: the global counter may end up to
    // max_debt below empty; anything beyond that was forgiven, and counted.
    let forgiven = sum(Metric::CostForgiven) + service.metric("sluice_counter_forgiven_tokens_total");
    let bound = BURST + RATE * (elapsed + 1) + MAX_DEBT + forgiven;
    // The figures the filter README quotes (`--nocapture`).
    eprintln!("lease mode: admitted {admitted} tokens, bound {bound}, forgiven {forgiven}, {} answers", served.len());
    assert!(admitted <= bound, "admitted {admitted} tokens, bound {bound}");
    // A grant pays the debt first: only the excess of requests in flight together can
    // pass a record's max_debt, each at most max − estimate.
    assert!(forgiven <= 2 * CALLERS as u64 * (MAX - ESTIMATE), "forgiven {forgiven}");
    assert!(rejected > 0, "the budget never bound");
    assert_eq!(served.len() + rejected, CALLERS * REQUESTS);
    assert_eq!(sum(Metric::CostUnknown), 0);
    let over_estimates: u64 = served.iter().map(|s| s.tokens - ESTIMATE).sum();
    assert_eq!(
        sum(Metric::CostCharged) + sum(Metric::CostForgiven),
        over_estimates,
        "each answer settled exactly once"
    );
    // The debt reaches the service, once: charged (what the proxies count as reconciled
    // is what the service charged), or paid from a later grant (repaid).
    wait::until(Duration::from_secs(20), "the debt to be charged to the service", || {
        let charged = service.metric("sluice_counter_charged_tokens_total");
        sum(Metric::LeaseReconciled) + sum(Metric::LeaseRepaid) > 0 && charged == sum(Metric::LeaseReconciled)
    });
}

#[test]
fn a_global_token_budget_in_check_mode_holds_across_two_proxies_and_each_answer_is_settled_at_the_service_once() {
    const CALLERS: usize = 4;
    const REQUESTS: usize = 24;
    let upstream = LlmUpstream::start();
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let fleet: Arc<Vec<Envoy>> = Arc::new((0..2).map(|_| fleet_envoy(CHECKED_TOKENS, &upstream, &service)).collect());

    let (rejected, elapsed) = load(&fleet, CALLERS, REQUESTS);

    let served = upstream.served();
    let admitted: u64 = served.iter().map(|s| s.tokens).sum();
    let sum = |counter: Metric| fleet.iter().map(|e| e.metric("tokens", counter)).sum::<u64>();
    let over_estimates: u64 = served.iter().map(|s| s.tokens - ESTIMATE).sum();
    // The root contexts send the settlements after the answers: wait until each is in.
    wait::until(Duration::from_secs(20), "every answer to be settled at the service", || {
        sum(Metric::CostCharged) + sum(Metric::CostForgiven) == over_estimates
    });
    // The service's counter went at most its capacity below empty (max_debt); what did
    // not fit was forgiven there, and counted on both sides.
    let forgiven = sum(Metric::CostForgiven);
    let bound = BURST + RATE * (elapsed + 1) + BURST + forgiven;
    eprintln!("check mode: admitted {admitted} tokens, bound {bound}, forgiven {forgiven}, {} answers", served.len());
    assert!(admitted <= bound, "admitted {admitted} tokens, bound {bound}");
    // Only requests admitted before the debt was charged can be forgiven: one in flight
    // and one being settled per caller, each at most max − estimate over.
    assert!(forgiven <= 2 * CALLERS as u64 * (MAX - ESTIMATE), "forgiven {forgiven}");
    assert!(rejected > 0, "the budget never bound");
    assert_eq!(served.len() + rejected, CALLERS * REQUESTS);
    assert_eq!(sum(Metric::CostUnknown), 0);
    assert_eq!(
        service.metric("sluice_counter_charged_tokens_total"),
        sum(Metric::CostCharged),
        "each charge applied once"
    );
    assert_eq!(service.metric("sluice_counter_forgiven_tokens_total"), forgiven);
}

/// One caller with a budget that never binds, in check mode, whose answers all cost
/// more than their estimate of 10.
const BUSY_CALLER: &str = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
    "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "2s"},
  "policies": [{"name": "tokens", "key": [{"header": "x-user"}], "rate": "1000000000/second", "burst": 1000000000,
    "cost": {"response_json": "usage.total_tokens", "estimate": 10, "max": 500, "on_unknown": 500},
    "global": {"strategy": "check"}}]}"#;

#[test]
fn every_settlement_of_one_busy_caller_in_check_mode_is_applied_at_the_service_and_none_forgiven() {
    // More settlements of one caller than the memory store once remembered ids for in
    // one shard (1 563, then refused `503 store_full` and in the end forgiven).
    const THREADS: usize = 16;
    const REQUESTS: usize = 150;
    let upstream = LlmUpstream::start();
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy = Arc::new(fleet_envoy(BUSY_CALLER, &upstream, &service));

    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let envoy = Arc::clone(&envoy);
            thread::spawn(move || {
                (0..REQUESTS).filter(|_| send(&envoy, &completion("tokens=42")).status == 200).count()
            })
        })
        .collect();
    let served: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();

    assert_eq!(served, THREADS * REQUESTS, "a budget that never binds");
    let excess = (42 - 10) * served as u64;
    wait::until(Duration::from_secs(30), "every answer to be settled at the service", || {
        envoy.metric("tokens", Metric::CostCharged) + envoy.metric("tokens", Metric::CostForgiven) == excess
    });
    assert_eq!(envoy.metric("tokens", Metric::CostForgiven), 0);
    assert_eq!(service.metric("sluice_counter_charged_tokens_total"), excess, "each applied once");
    let callouts = envoy.plugin_metric(PluginCounter::Callouts).unwrap_or(0);
    eprintln!("one busy caller: {served} requests, {callouts} callouts (checks and settlements)");
}

#[test]
fn a_check_mode_answer_below_the_estimate_is_credited_back_at_the_service() {
    let upstream = LlmUpstream::start();
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy = fleet_envoy(CHECKED_TOKENS, &upstream, &service);

    let response = send(&envoy, &completion("tokens=8"));

    assert_eq!(response.text(), llm::document(8));
    wait::until(Duration::from_secs(10), "the credit to reach the service", || {
        envoy.metric("tokens", Metric::CostCredited) == ESTIMATE - 8
    });
    assert_eq!(service.metric("sluice_counter_credited_tokens_total"), ESTIMATE - 8);
    assert_eq!(envoy.metric("tokens", Metric::CostForgiven), 0);
}

#[test]
fn a_check_mode_settlement_the_service_cannot_take_is_sent_again_until_it_is_applied_once() {
    let redis = RedisServer::start();
    let mut service = Counter::start(counter::with_token(counter::redis(&redis.url()), TOKEN));
    let upstream = LlmUpstream::start();
    let envoy = fleet_envoy(CHECKED_TOKENS, &upstream, &service);
    let mut body = Vec::new();

    // The check admits the estimate; the service dies while the answer streams, so the
    // settlement at its end finds nobody.
    let response = envoy
        .connect()
        .send_streaming(&completion("tokens=300&stream=1&lockstep=1"), |chunk| {
            if body.is_empty() {
                service.kill();
            }
            body.extend_from_slice(chunk);
            upstream.acknowledge(body.windows(2).filter(|w| w == b"\n\n").count());
        })
        .unwrap();
    assert_eq!(response.status, 200);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(envoy.metric("tokens", Metric::CostCharged), 0, "nothing could be charged while the service was down");
    service.restart();

    wait::until(Duration::from_secs(20), "the settlement to reach the restarted service", || {
        envoy.metric("tokens", Metric::CostCharged) == 300 - ESTIMATE
    });
    assert_eq!(service.metric("sluice_counter_charged_tokens_total"), 300 - ESTIMATE, "applied once");
    assert_eq!(envoy.metric("tokens", Metric::CostForgiven), 0);
}

#[test]
fn every_event_of_a_stream_reaches_the_client_before_the_next_is_written() {
    let upstream = LlmUpstream::start();
    let envoy = envoy(&upstream, 1);
    let mut body = Vec::new();

    let response = envoy
        .connect()
        .send_streaming(&completion("tokens=70&stream=1&lockstep=1"), |chunk| {
            body.extend_from_slice(chunk);
            // Let the upstream write the next event once this one has arrived whole.
            upstream.acknowledge(body.windows(2).filter(|w| w == b"\n\n").count());
        })
        .unwrap();

    assert_eq!(response.status, 200);
    assert!(!upstream.stalled(), "an event was held back until the stream went on");
    assert_eq!(response.text(), llm::events(70).concat(), "every event unchanged and in order");
    assert_eq!(envoy.metric("tokens", Metric::CostCharged), 70 - ESTIMATE, "the usage in the last event");
}

#[test]
fn a_json_answer_below_the_estimate_gives_the_rest_back() {
    let upstream = LlmUpstream::start();
    let envoy = envoy(&upstream, 1);

    let response = send(&envoy, &completion("tokens=8"));

    assert_eq!(response.text(), llm::document(8));
    assert_eq!(envoy.metric("tokens", Metric::CostCredited), ESTIMATE - 8);
}

#[test]
fn a_json_answer_that_ends_with_http2_trailers_is_settled_to_its_usage_not_taken_for_one_cut_short() {
    let upstream = TrailersUpstream::start();
    let envoy = Envoy::builder()
        .workers(1)
        .cluster(cluster("llm", upstream.addr(), true))
        .route_to("llm")
        .sluice(sluice(TOKENS))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));

    let response = send(&envoy, &completion("tokens=8"));

    assert_eq!((response.status, response.text()), (200, llm::document(8)), "the answer passes unchanged");
    assert_eq!(upstream.served(), 1, "the upstream ended its answer with trailers");
    wait::until(Duration::from_secs(10), "the answer to be settled", || {
        envoy.metric("tokens", Metric::CostCredited) + envoy.metric("tokens", Metric::CostCharged) > 0
    });
    assert_eq!(envoy.metric("tokens", Metric::CostUnknown), 0, "the trailers ended the body: it was read whole");
    assert_eq!(envoy.metric("tokens", Metric::CostCredited), ESTIMATE - 8);
}

#[test]
fn every_answer_that_reports_no_usable_cost_costs_on_unknown_and_is_counted_once() {
    let upstream = LlmUpstream::start();
    let envoy = envoy(&upstream, 1);
    // A caller of its own each, so that no budget runs out.
    let ask = |n: usize, query: &str| {
        Request::post(format!("/v1/chat/completions?{query}"), "{}").header("x-user", format!("caller-{n}"))
    };

    for (n, body) in ["none", "garbage", "huge"].into_iter().enumerate() {
        let response = send(&envoy, &ask(n, &format!("tokens=70&body={body}")));
        assert_eq!(response.status, 200, "{body}");
        assert_eq!(response.text(), llm::answer(70, body), "{body}: the answer passes unchanged");
        assert_eq!(envoy.metric("tokens", Metric::CostUnknown), n as u64 + 1, "{body}");
    }
    let reset = envoy.connect().send(&ask(3, "tokens=70&cut=1"));
    wait::until(Duration::from_secs(10), "the reset answer to be settled", || {
        envoy.metric("tokens", Metric::CostUnknown) == 4
    });

    assert!(reset.map_or(true, |r| r.status >= 500 || r.text() != llm::document(70)), "the client sees the reset");
    assert_eq!(envoy.metric("tokens", Metric::CostCharged), 4 * (MAX - ESTIMATE), "on_unknown: 500, four times");
    assert_eq!(envoy.metric("tokens", Metric::CostCredited), 0);
}

#[test]
fn a_stream_cut_before_its_usage_costs_the_configured_on_unknown_and_is_counted() {
    let upstream = LlmUpstream::start();
    let envoy = envoy(&upstream, 1);

    let cut = envoy.connect().send(&completion("tokens=70&stream=1&cut=1"));

    assert!(cut.is_err(), "the client sees the stream break off: {cut:?}");
    wait::until(Duration::from_secs(10), "the cut stream to be settled", || {
        envoy.metric("tokens", Metric::CostUnknown) == 1
    });
    assert_eq!(envoy.metric("tokens", Metric::CostCharged), MAX - ESTIMATE, "on_unknown: 500");
    assert!(upstream.served().is_empty());
}

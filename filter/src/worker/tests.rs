//! The worker through its port, natively: what only Envoy or wasm-host reached before
//! (the fallback ladder when the host refuses a reply, the tick, a full refill queue, a
//! stream gone before the root acts on it).

use super::*;
use crate::config::Config;
use crate::host::{Call, Callouts, Counter, DispatchError, HostFailure, Scope};
use crate::testing::{FakeRequest, RecordedMetrics};
use shared_store::{HashKey, ManualClock, MemoryStore, Nanos};

/// A host that records what the worker asked and refuses what it is told to.
#[derive(Default)]
struct FakePort {
    actions: Vec<String>,
    refuse: Vec<&'static str>,
    /// The token of the last call it sent.
    next_token: u32,
    sent: Vec<String>,
    /// Each call's body, beside its path in `sent`.
    bodies: Vec<String>,
    /// Each reply's `retry-after` header, if it had one.
    retry_after: Vec<Option<String>>,
}

impl FakePort {
    fn refusing(refuse: &[&'static str]) -> Self {
        Self { refuse: refuse.to_vec(), ..Self::default() }
    }

    fn act(&mut self, action: &'static str, detail: String) -> Result<(), HostFailure> {
        self.actions.push(format!("{action}{detail}"));
        if self.refuse.contains(&action) { Err(HostFailure { status: 1 }) } else { Ok(()) }
    }
}

thread_local! {
    /// The host's callout tokens, unique across a test's ports as a proxy's are.
    static TOKENS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Callouts for FakePort {
    fn dispatch(&mut self, call: &Call<'_>) -> Result<u32, DispatchError> {
        self.next_token = TOKENS.with(|t| {
            t.set(t.get() + 1);
            t.get()
        });
        let path = call.headers.iter().find(|(n, _)| *n == ":path").map_or("", |(_, v)| *v);
        self.sent.push(path.to_owned());
        self.bodies.push(String::from_utf8_lossy(call.body).into_owned());
        Ok(self.next_token)
    }
}

impl Port for FakePort {
    fn enter(&mut self, id: u32) -> Result<(), HostFailure> {
        self.act("enter", format!(" {id}"))
    }
    fn resume(&mut self) -> Result<(), HostFailure> {
        self.act("resume", String::new())
    }
    fn reply(&mut self, status: u16, headers: &[(String, String)], _: &[u8]) -> Result<(), HostFailure> {
        self.retry_after.push(headers.iter().find(|(n, _)| n == "retry-after").map(|(_, v)| v.clone()));
        self.act("reply", format!(" {status}"))
    }
    fn close(&mut self) -> Result<(), HostFailure> {
        self.act("close", String::new())
    }
    fn wake(&mut self, queue: u32) -> Result<(), HostFailure> {
        self.act("wake", format!(" {queue}"))
    }
}

type TestWorker = Worker<MemoryStore, ManualClock, RecordedMetrics>;

fn worker(json: &str) -> TestWorker {
    let engine = Engine::new(Config::from_json(json.as_bytes()).unwrap(), "sluice/w/", HashKey::new([3; 16]), |_| {
        Some("0123456789abcdef0123456789abcdef".to_owned())
    })
    .unwrap();
    let limiter = Limiter::new(MemoryStore::new(), ManualClock::at(Nanos::from_secs(100)));
    Worker::new(engine, limiter, RecordedMetrics::default(), Some(7))
}

const ONE: &str = r#"{"policies": [{"name": "one", "key": [{"header": "x-user"}], "rate": "1/minute", "burst": 1}]}"#;

fn user(name: &str) -> FakeRequest {
    FakeRequest::get("/").with_header("x-user", name)
}

fn counted(w: &TestWorker, counter: Counter) -> i64 {
    w.metrics().unwrap().get(0, counter)
}

#[test]
fn a_rejection_the_host_refuses_is_sent_bare_then_reset_then_forwarded_and_always_counted() {
    let cases: [(&[&'static str], Flow, Counter); 4] = [
        (&[], Flow::Pause, Counter::Rejected),
        (&["reply"], Flow::Pause, Counter::Rejected),
        (&["reply", "close"], Flow::Continue, Counter::Allowed),
        (&["reply", "close", "resume"], Flow::Continue, Counter::Allowed),
    ];
    for (refused, flow, counter) in cases {
        let w = worker(ONE);
        let mut port = FakePort::default();
        assert_eq!(w.on_request_headers(1, &user("a"), &mut port), Flow::Continue);
        let mut port = FakePort::refusing(refused);
        assert_eq!(w.on_request_headers(2, &user("a"), &mut port), flow, "refused {refused:?}");
        // A refused reply is tried again bare, then the stream is reset.
        let refused_reply = refused.contains(&"reply");
        let replies = port.actions.iter().filter(|a| *a == "reply 429").count();
        assert_eq!(replies, if refused_reply { 2 } else { 1 }, "{:?}", port.actions);
        assert_eq!(port.actions.iter().any(|a| a == "close"), refused_reply, "{:?}", port.actions);
        assert_eq!(counted(&w, counter), if counter == Counter::Allowed { 2 } else { 1 });
        assert_eq!(counted(&w, Counter::Offered), 2);
        let failures = w.metrics().unwrap().plugin(PluginCounter::ReplyFailures);
        assert_eq!(failures, i64::from(!refused.is_empty()));
    }
}

const SHAPED: &str = r#"{"policies": [{"name": "shaped", "key": [{"constant": "x"}], "algorithm": "leaky_bucket",
    "rate": "1/second", "queue": 3, "max_wait": "5s"}], "shaping": {"max_paused": 2}}"#;

#[test]
fn the_tick_releases_shaped_requests_when_due_and_a_gone_stream_counts_as_abandoned() {
    let w = worker(SHAPED);
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(1, &FakeRequest::get("/"), &mut port), Flow::Continue);
    assert_eq!(w.on_request_headers(2, &FakeRequest::get("/"), &mut port), Flow::Pause);
    assert_eq!(w.on_request_headers(3, &FakeRequest::get("/"), &mut port), Flow::Pause);
    assert_eq!(w.held(), (2, 0, 0));
    w.on_tick(&mut port);
    assert_eq!(w.held(), (2, 0, 0), "nothing is due yet");
    w.limiter.clock().advance(Nanos::from_secs(1));
    let mut port = FakePort::refusing(&[]);
    w.on_tick(&mut port);
    assert_eq!(port.actions, ["enter 2", "resume"]);
    w.limiter.clock().advance(Nanos::from_secs(1));
    let mut gone = FakePort::refusing(&["enter"]);
    w.on_tick(&mut gone);
    assert_eq!(w.held(), (0, 0, 0));
    let m = w.metrics().unwrap();
    assert_eq!((m.get(0, Counter::Allowed), m.get(0, Counter::Queued), m.get(0, Counter::Abandoned)), (3, 0, 1));
    assert_eq!(m.plugin(PluginCounter::ResumeFailures), 1);
    assert_eq!(m.waits, [(Wait::Queue, 1_000), (Wait::Queue, 2_000)], "each queued request's turn, once");
}

#[test]
fn a_delayed_request_is_rejected_when_the_paused_queue_is_full() {
    let w = worker(SHAPED);
    let mut port = FakePort::default();
    for id in 1..=3 {
        let _ = w.on_request_headers(id, &FakeRequest::get("/"), &mut port);
    }
    assert_eq!(w.on_request_headers(4, &FakeRequest::get("/"), &mut port), Flow::Pause);
    assert_eq!(port.actions.last().map(String::as_str), Some("reply 429"));
    assert_eq!(w.held(), (2, 0, 0));
}

const CHECKED: &str = r#"{"counter_service": {"cluster": "counter", "hash_key_env": "K", "timeout": "40ms"},
    "policies": [{"name": "global", "key": [{"header": "x-user"}], "rate": "5/second", "burst": 5,
    "global": {"strategy": "check"}, "on_failure": {"action": "deny", "status": 503}}]}"#;

#[test]
fn the_tick_times_out_a_check_past_its_deadline_and_a_late_answer_changes_nothing() {
    let w = worker(CHECKED);
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(1, &user("a"), &mut port), Flow::Pause);
    assert_eq!(port.sent, ["/v1/check"]);
    assert_eq!(w.held(), (0, 1, 0));
    w.on_tick(&mut port);
    assert_eq!(w.held(), (0, 1, 0), "its deadline has not passed");
    w.limiter.clock().advance(Nanos::from_millis(40));
    let mut port = FakePort::default();
    w.on_tick(&mut port);
    assert_eq!(port.actions, ["enter 1", "reply 503"]);
    assert_eq!(w.held(), (0, 0, 0));
    w.on_check_answer(1, &CalloutAnswer::TimedOut, &mut port);
    assert_eq!(port.actions.len(), 2, "the late answer found nothing to decide");
    assert_eq!((counted(&w, Counter::Offered), counted(&w, Counter::Rejected)), (1, 1));
    assert_eq!(w.metrics().unwrap().waits, [(Wait::Service, 40)], "its wait for the service, once");
}

const LEASED: &str = r#"{"counter_service": {"cluster": "counter", "hash_key_env": "K", "timeout": "100ms"},
    "policies": [{"name": "leased", "key": [{"header": "x-user"}], "rate": "100/second", "burst": 100,
    "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "duration": "2s", "low_water": 3, "max_waiting": 1}},
    "on_failure": {"action": "allow"}}]}"#;

#[test]
fn a_request_beyond_max_waiting_takes_the_failure_rule_at_once_and_the_wake_sends_the_refill() {
    let w = worker(LEASED);
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(1, &user("a"), &mut port), Flow::Pause, "it waits for the refill it elected");
    assert_eq!(port.actions, ["wake 7"]);
    w.on_wake(&mut port);
    assert_eq!(port.sent, ["/v1/lease"]);
    assert_eq!(w.on_request_headers(2, &user("a"), &mut port), Flow::Continue, "no room to wait: fail open");
    assert_eq!(w.held(), (0, 0, 1));
    let m = w.metrics().unwrap();
    assert_eq!(m.get(0, Counter::DegradedLeaseQueueFull), 1);
    assert_eq!(m.get(0, Counter::Allowed), 1);
}

#[test]
fn a_lease_configuration_ticks_every_ten_milliseconds_and_defines_its_global_counters() {
    let leased = worker(LEASED);
    assert_eq!(tick_period(&leased.engine), Some(LEASE_TICK_MS));
    assert_eq!(tick_period(&worker(CHECKED).engine), Some(10), "a quarter of the 40 ms deadline");
    assert_eq!(tick_period(&worker(ONE).engine), None);
    let (policies, plugin) = metric_names(&worker(ONE).engine);
    let defined = |names: &[Option<MetricName>], name: &str| names.iter().flatten().any(|m| m.name == name);
    assert!(defined(&policies[0], "policy=.=one;.;outcome=.=allowed;.;sluice_requests_total"));
    assert!(
        !defined(&policies[0], "policy=.=one;.;sluice_lease_granted_tokens_total"),
        "a local policy has no lease counters"
    );
    assert!(!defined(&plugin, "sluice_counter_service_callouts_total"), "no service, no service counters");
    let (policies, plugin) = metric_names(&leased.engine);
    assert!(defined(&policies[0], "policy=.=leased;.;sluice_lease_granted_tokens_total"));
    assert!(defined(&plugin, "sluice_counter_service_callouts_total"));
}

#[test]
fn a_local_policy_defines_every_counter_of_its_scope_and_no_counter_only_a_global_policy_moves() {
    let (local, _) = metric_names(&worker(ONE).engine);
    let (leased, _) = metric_names(&worker(LEASED).engine);
    let defined = |names: &[Option<MetricName>], counter: Counter| {
        names
            .get(counter.index())
            .is_some_and(|name| name.as_ref().is_some_and(|m| m.name.ends_with(counter.series().family)))
    };

    for &counter in Counter::ALL {
        let scope = counter.scope();
        assert_eq!(defined(&local[0], counter), scope == Scope::Every, "{counter:?} of a local policy");
        assert_eq!(
            defined(&leased[0], counter),
            matches!(scope, Scope::Every | Scope::Global),
            "{counter:?} of a global policy"
        );
    }
    assert!(!defined(&local[0], Counter::OverrideClamped), "an operator's override is the counter service's");
}

mod check_batches;
mod check_costs;
mod check_refunds;
mod concurrency;
mod costs;

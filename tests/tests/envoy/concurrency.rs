//! Concurrency policies in Envoy: the requests in flight that the upstream itself sees
//! never exceed the limit across four workers; a stream the client resets gives its slot
//! back; and the slots of a VM killed while holding them come back within the stated
//! bound (`shared_store::STALE_AFTER`), while its replacement decides.

use sluice::host::Counter;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use sluice_artifacts::SLUICE_CRASHABLE_WASM;
use sluice_tests::envoy::cluster;
use sluice_tests::http::Connection;
use sluice_tests::slow::SlowUpstream;

use super::*;

fn config(limit: u64) -> String {
    format!(
        r#"{{"policies":[{{"name":"in-flight","key":[{{"constant":"all"}}],"algorithm":"concurrency","limit":{limit}}}],
            "response":{{"headers_on_rejected":["retry_after","ratelimit"]}}}}"#
    )
}

/// Envoy with `workers` workers and `filter`, routing to `upstream`.
fn envoy(workers: usize, filter: sluice_tests::envoy::SluiceFilter, upstream: &SlowUpstream) -> Envoy {
    Envoy::builder()
        .workers(workers)
        .sluice(filter)
        .cluster(cluster("slow", upstream.addr(), false))
        .route_to("slow")
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Opens a connection and sends a request held by the upstream, without reading the
/// answer: the caller keeps (or drops) the connection.
fn hold(addr: SocketAddr) -> Connection {
    let mut connection = Connection::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
    connection.write(&Request::get("/hold").encode()).unwrap_or_else(|e| panic!("write: {e}"));
    connection
}

/// Sends requests the upstream answers at once until one is forwarded or `within`
/// passes: when one was, and the statuses seen before (0: no answer).
fn until_admitted(envoy: &Envoy, within: Duration, every: Duration) -> (Option<Instant>, Vec<u16>) {
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < within {
        let status =
            Connection::connect(envoy.addr()).and_then(|mut c| c.send(&Request::get("/fast"))).map_or(0, |r| r.status);
        if status == 200 {
            return (Some(Instant::now()), seen);
        }
        seen.push(status);
        thread::sleep(every);
    }
    (None, seen)
}

#[test]
fn requests_in_flight_never_exceed_the_limit_across_four_workers_under_a_slow_upstream() {
    const LIMIT: u64 = 3;
    const CLIENTS: usize = 16;
    const EACH: usize = 8;
    let upstream = SlowUpstream::start(Duration::from_millis(200));
    let envoy = envoy(4, sluice(&config(LIMIT)), &upstream);
    let addr = envoy.addr();

    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            thread::spawn(move || {
                (0..EACH)
                    .map(|_| {
                        // A fresh connection each time, so requests land on every worker.
                        let response = sluice_tests::http::send(addr, &Request::get("/hold"));
                        (response.status, response.header("retry-after").map(str::to_owned))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let answers: Vec<(u16, Option<String>)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();

    let admitted = answers.iter().filter(|(s, _)| *s == 200).count();
    let rejected = answers.iter().filter(|(s, _)| *s == 429).count();
    eprintln!(
        "concurrency oracle: {admitted} admitted, {rejected} rejected, most held at once by the upstream {} (limit {LIMIT})",
        upstream.most_held()
    );
    assert!(upstream.most_held() <= LIMIT, "the upstream held {} at once, limit {LIMIT}", upstream.most_held());
    assert_eq!(upstream.most_held(), LIMIT, "the load should reach the limit");
    assert_eq!(admitted + rejected, CLIENTS * EACH, "every request is admitted or rejected: {answers:?}");
    assert!(rejected > 0 && admitted as u64 >= LIMIT);
    assert!(answers.iter().all(|(_, retry)| retry.is_none()), "no Retry-After on a concurrency rejection");
    let offered = envoy.metric("in-flight", Counter::Offered);
    assert_eq!(offered, (CLIENTS * EACH) as u64);
    assert_eq!(envoy.metric("in-flight", Counter::Allowed) + envoy.metric("in-flight", Counter::Rejected), offered);
    assert_eq!(envoy.metric("in-flight", Counter::OverLimit), rejected as u64);

    // Nothing leaked: the limit's worth of requests can be held again, and no more.
    let held: Vec<Connection> = (0..LIMIT).map(|_| hold(addr)).collect();
    assert!(upstream.wait_holding(LIMIT, Duration::from_secs(5)), "held {}", upstream.holding());
    assert_eq!(send(&envoy, &Request::get("/fast")).status, 429);
    drop(held);
}

#[test]
fn streams_the_client_resets_give_their_slots_back() {
    let upstream = SlowUpstream::start(Duration::from_secs(30));
    let envoy = envoy(4, sluice(&config(2)), &upstream);
    let held = [hold(envoy.addr()), hold(envoy.addr())];
    assert!(upstream.wait_holding(2, Duration::from_secs(5)), "held {}", upstream.holding());
    assert_eq!(send(&envoy, &Request::get("/fast")).status, 429, "both slots are taken");

    drop(held); // the client goes away: Envoy resets both streams
    let (admitted, before) = until_admitted(&envoy, Duration::from_secs(3), Duration::from_millis(20));

    // The slots' holder is alive and renews them: only their release can free them.
    assert!(admitted.is_some(), "still rejected 3 s after the client reset its streams: {before:?}");
    assert_eq!(upstream.holding(), 2, "the upstream still holds the reset requests: the slots came back at the reset");
}

#[test]
fn a_killed_vms_slots_come_back_within_the_stale_bound() {
    let upstream = SlowUpstream::start(Duration::from_secs(30));
    let filter = sluice(&config(2)).wasm(SLUICE_CRASHABLE_WASM).failure_policy("FAIL_RELOAD");
    let envoy = envoy(1, filter, &upstream);
    let _held = [hold(envoy.addr()), hold(envoy.addr())];
    assert!(upstream.wait_holding(2, Duration::from_secs(5)), "held {}", upstream.holding());
    assert_eq!(send(&envoy, &Request::get("/fast")).status, 429, "both slots are taken");

    // The VM dies with its two streams in flight: it will never release or renew them.
    let killed = Instant::now();
    let crash = Connection::connect(envoy.addr())
        .and_then(|mut c| c.send(&Request::get("/fast").header("x-sluice-test-crash", "1")));
    let bound = Duration::from_nanos(shared_store::STALE_AFTER.as_u64());
    let margin = Duration::from_secs(3);
    let (admitted, before) = until_admitted(&envoy, bound + margin, Duration::from_millis(100));
    let freed = admitted.map(|at| at.duration_since(killed));

    eprintln!(
        "killed VM: crash request answered {:?}; slots back {:?} after the kill (bound {bound:?}); before: {before:?}",
        crash.as_ref().map(|r| r.status),
        freed
    );
    assert!(envoy.log().contains("x-sluice-test-crash"), "the VM did not die:\n{}", envoy.log());
    assert!(before.contains(&429), "the replacement VM counted the dead VM's slots at first: {before:?}");
    let freed = freed.unwrap_or_else(|| panic!("not freed within {:?}: {before:?}", bound + margin));
    assert!(freed <= bound + margin, "freed after {freed:?}");
    assert_eq!(upstream.holding(), 2, "the dead VM's streams are still in flight upstream");
}

#[test]
fn streams_left_on_a_replaced_vm_keep_their_slots_until_they_end_then_give_them_back() {
    let upstream = SlowUpstream::start(Duration::from_secs(30));
    let envoy = Envoy::builder()
        .workers(2)
        .xds()
        .sluice(sluice(&config(2)))
        .cluster(cluster("slow", upstream.addr(), false))
        .route_to("slow")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let _held = [hold(envoy.addr()), hold(envoy.addr())];
    assert!(upstream.wait_holding(2, Duration::from_secs(5)), "held {}", upstream.holding());

    // Another VM configuration: Envoy starts new VMs; the old ones keep the open streams.
    let vms_created = || envoy.stats().get("wasm.envoy.wasm.runtime.v8.created").copied().unwrap_or(0);
    let before_push = vms_created();
    envoy.push_filter(&sluice(&config(2)).env("SLUICE_TEST_GENERATION", "2")).unwrap();
    assert!(vms_created() > before_push, "the update made no new VM");
    let at_once = send(&envoy, &Request::get("/fast")).status;
    // Past the stale bound: the old VMs still renew what their open streams hold.
    thread::sleep(Duration::from_nanos(shared_store::STALE_AFTER.as_u64()) + Duration::from_millis(1500));
    let later = send(&envoy, &Request::get("/fast")).status;
    upstream.release();
    let (admitted, before) = until_admitted(&envoy, Duration::from_secs(3), Duration::from_millis(20));

    assert_eq!((at_once, later), (429, 429), "the old VMs' streams still hold both slots");
    assert!(admitted.is_some(), "still rejected 3 s after the old streams ended: {before:?}");
}

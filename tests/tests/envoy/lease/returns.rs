//! Lease returns, in Envoy: a proxy whose caller went quiet gives its lease's rest back
//! to the service before it expires, and another proxy is granted it by its next refill.

use super::*;

#[test]
fn a_lease_returned_by_one_envoy_is_granted_to_another_by_its_next_refill() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    // A budget of 100 that does not come back within the test (100 an hour): only a
    // return can free what one proxy leased. Every key is leased from its first request
    // (`cold_below` 0), so B's requests are decided by refills, not checks.
    let lease = r#"{"size": 100, "duration": "4s", "low_water": 10, "cold_below": 0}"#;
    let config = config("100/hour", 100, lease, DENY, HEALTHY_TIMEOUT, "1s");
    let (a, b) = (
        envoy(&config, service.addr(), sluice_artifacts::SLUICE_WASM),
        envoy(&config, service.addr(), sluice_artifacts::SLUICE_WASM),
    );
    let acme = Request::get("/").header("x-tenant", "acme");

    // Proxy A's caller is busy for a moment: its grants grow to the whole budget.
    let mut connection = a.connect();
    let on_a: Vec<u16> = (0..30).map(|_| connection.send(&acme).unwrap().status).collect();
    let asked = Instant::now();
    let refused_on_b = send(&b, &acme).status;
    let leased_to_a = a.metric("tenant", Metric::LeaseGranted);

    // A's caller went quiet: once a quarter of its grant's life is left, A returns what
    // it will not spend.
    wait::until(Duration::from_secs(10), "proxy A to return its lease's rest", || {
        a.metric("tenant", Metric::LeaseReturned) > 0
    });
    // B asked once and was told the budget is empty: it asks again (a probe) once a lease
    // duration has passed since.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(asked.elapsed()) + Duration::from_millis(200));
    let refills_on_b = b.metric("tenant", Metric::LeaseRefills);
    let granted_on_b = send(&b, &acme).status;

    assert_eq!(on_a, [200; 30]);
    assert_eq!(refused_on_b, 429, "A held all of the budget ({leased_to_a} leased to it)");
    assert!(leased_to_a >= 90, "A's grants grew to the budget: {leased_to_a}");
    let returned = a.metric("tenant", Metric::LeaseReturned);
    assert_eq!(granted_on_b, 200, "B's next refill was granted what A returned ({returned})");
    assert_eq!(b.metric("tenant", Metric::LeaseRefills), refills_on_b + 1, "within one refill");
    assert!(returned + 30 <= leased_to_a, "A returned only what it had not spent");
    assert_eq!(
        service.metric("sluice_counter_credited_tokens_total"),
        returned,
        "the service credited what A returned"
    );
    for envoy in [&a, &b] {
        for reason in sluice::host::Reason::ALL {
            assert_eq!(envoy.metric("tenant", reason.counter()), 0, "{reason:?}");
        }
    }
}

//! Lease mode adapts to each key's demand, in Envoy: a key seen for the first time, or
//! one that went quiet, is checked at the service per request; one that turns busy is
//! leased, its requests then spent without callouts.

use super::*;

#[test]
fn a_key_is_checked_per_request_until_it_turns_busy_then_leased_and_checked_again_once_it_went_quiet() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let config =
        config("100/second", 100, r#"{"size": 10, "duration": "2s", "low_water": 2}"#, DENY, HEALTHY_TIMEOUT, "1s");
    let envoy = envoy(&config, service.addr(), sluice_artifacts::SLUICE_WASM);
    let acme = Request::get("/").header("x-tenant", "acme");
    let callouts = || envoy.plugin_metric(PluginCounter::Callouts).unwrap_or(0);

    // Its first three requests (one, two, three units over the last life) are checked;
    // the fourth makes it busy, and it is leased: the next five spend from that lease.
    let first: Vec<u16> = (0..4).map(|_| send(&envoy, &acme).status).collect();
    let (checked_first, callouts_first) = (envoy.metric("tenant", Metric::LeaseCheckedCold), callouts());
    let spent: Vec<u16> = (0..5).map(|_| send(&envoy, &acme).status).collect();
    let callouts_spent = callouts();
    // Two lease lives and more: nothing asked for over the last life.
    std::thread::sleep(Duration::from_millis(4200));
    let after_quiet: Vec<u16> = (0..4).map(|_| send(&envoy, &acme).status).collect();

    assert_eq!(first, [200; 4]);
    assert_eq!(checked_first, 3, "the first three requests of a new key were checked at the service");
    assert_eq!(callouts_first, 4, "three checks and one refill");
    assert_eq!(spent, [200; 5]);
    assert_eq!(callouts_spent, callouts_first, "spent from its lease");
    assert_eq!(after_quiet, [200; 4]);
    assert_eq!(envoy.metric("tenant", Metric::LeaseCheckedCold), 6, "a key that went quiet is cold again");
    assert_eq!(envoy.metric("tenant", Metric::LeaseRefills), 2, "and leased again once it turns busy");
    for reason in sluice::host::Reason::ALL {
        assert_eq!(envoy.metric("tenant", reason.counter()), 0, "{reason:?}");
    }
}

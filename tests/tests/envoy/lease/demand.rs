//! Lease mode adapts to each key's demand, in Envoy: a key that went quiet is checked at
//! the service per request, and one that turns busy again is leased, its requests then
//! spent without callouts.

use super::*;

#[test]
fn a_key_that_went_quiet_is_checked_per_request_and_leased_again_once_it_turns_busy() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let config =
        config("100/second", 100, r#"{"size": 10, "duration": "2s", "low_water": 2}"#, DENY, HEALTHY_TIMEOUT, "1s");
    let envoy = envoy(&config, service.addr(), sluice_artifacts::SLUICE_WASM);
    let acme = Request::get("/").header("x-tenant", "acme");
    assert_eq!(send(&envoy, &acme).status, 200, "a key seen for the first time is leased");
    // Two lease lives and more: its demand (one unit) is known, and it asked for no
    // refill within the last life.
    std::thread::sleep(Duration::from_millis(4200));

    // Its next three requests (one, two, three units over the last life) are checked;
    // the fourth makes it busy again, and it is leased.
    let statuses: Vec<u16> = (0..4).map(|_| send(&envoy, &acme).status).collect();
    let (checked, callouts) =
        (envoy.metric("tenant", Metric::LeaseCheckedCold), envoy.plugin_metric(PluginCounter::Callouts).unwrap_or(0));
    let leased: Vec<u16> = (0..5).map(|_| send(&envoy, &acme).status).collect();

    assert_eq!(statuses, [200; 4]);
    assert_eq!(checked, 3, "the three requests of a cold key were checked at the service");
    assert_eq!(leased, [200; 5]);
    assert_eq!(envoy.plugin_metric(PluginCounter::Callouts).unwrap_or(0), callouts, "spent from its lease");
    assert_eq!(envoy.metric("tenant", Metric::LeaseCheckedCold), 3);
    for reason in sluice::host::Reason::ALL {
        assert_eq!(envoy.metric("tenant", reason.counter()), 0, "{reason:?}");
    }
}

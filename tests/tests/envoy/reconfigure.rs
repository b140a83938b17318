//! Reconfiguration through xDS, as the filter README promises: changed numbers keep the
//! callers' state (no fresh bucket); a `version` bump starts fresh.

use super::*;

fn config(burst: u64, version: u64) -> String {
    format!(
        r#"{{"policies":[{{"name":"p","key":[{{"header":"x-k"}}],"rate":"1/hour","burst":{burst},"version":{version}}}]}}"#
    )
}

fn spend(envoy: &Envoy, n: usize) -> Vec<u16> {
    (0..n).map(|_| send(envoy, &Request::get("/").header("x-k", "caller")).status).collect()
}

#[test]
fn a_changed_burst_keeps_what_callers_have_left_and_a_version_bump_starts_fresh() {
    let envoy =
        Envoy::builder().workers(2).xds().sluice(sluice(&config(3, 0))).start().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spend(&envoy, 2), [200, 200]);

    envoy.push_filter(&sluice(&config(5, 0))).unwrap();
    let after_raise = spend(&envoy, 2);
    envoy.push_filter(&sluice(&config(5, 1))).unwrap();
    let after_bump = spend(&envoy, 6);

    assert_eq!(after_raise, [200, 429], "one token was left; a raise does not refill");
    assert_eq!(after_bump, [200, 200, 200, 200, 200, 429], "a new version is a fresh bucket of 5");
}

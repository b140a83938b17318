//! Configurations in Envoy: every example and the deployment bootstrap load; a bad
//! configuration stops Envoy at startup with Sluice's message naming the field.

use super::*;

#[test]
fn a_request_passes_through_sluice_in_envoy() {
    let envoy =
        Envoy::with_sluice(r#"{"policies":[{"name":"p","key":[{"header":"x-k"}],"rate":"1/minute","burst":2}]}"#, 2);

    let statuses: Vec<u16> = (0..3).map(|_| send(&envoy, &Request::get("/").header("x-k", "a")).status).collect();

    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(envoy.metric("p", "offered"), 3);
}

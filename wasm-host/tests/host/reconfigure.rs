//! Reconfiguration as an xDS update does it.

use wasm_host::{HostError, Response};

use crate::common::{forward, guest, ops, text};

#[test]
fn a_new_configuration_takes_new_streams_on_every_worker_and_keeps_shared_data() {
    let mut host = guest().plugin_configuration("generation=1").workers(2).build().unwrap();
    forward(host.worker(0), ops("shared-set").header("x-key", "k").header("x-value", "v"));
    let open = host.worker(1).request(ops("ids"));

    host.reconfigure("generation=2").unwrap();

    for index in 0..2 {
        let forwarded = forward(host.worker(index), ops("shared-get,ids").header("x-key", "k"));
        assert_eq!(text(&forwarded, "x-test-generation"), "2");
        assert_eq!(text(&forwarded, "x-shared-value"), "v");
        assert_ne!(text(&forwarded, "x-root-id"), "1");
    }
    // A stream opened before the update finishes on the old root context.
    let worker = host.worker(1);
    assert_eq!(text(&crate::common::forwarded(worker, open), "x-test-generation"), "1");
    worker.respond(open, Response::ok()).unwrap();
    worker.finish(open).unwrap();
}

#[test]
fn a_rejected_configuration_leaves_the_old_one_serving() {
    let mut host = guest().plugin_configuration("generation=1").workers(2).build().unwrap();

    let result = host.reconfigure("reject=limits[0].window: unknown unit");

    assert!(
        matches!(&result, Err(HostError::ConfigurationRejected { logs, .. }) if logs[0] == "limits[0].window: unknown unit"),
        "{result:?}"
    );
    for index in 0..2 {
        let forwarded = forward(host.worker(index), ops("ids"));
        assert_eq!(text(&forwarded, "x-test-generation"), "1");
        assert_eq!(text(&forwarded, "x-root-id"), "1");
    }
}

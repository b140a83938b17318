//! Properties with Envoy's names and encodings.

use wasm_host::{Clock, Request};

use crate::common::{forward, guest, host, ops, text};

#[test]
fn properties_have_envoys_names_and_encodings() {
    let mut host = guest()
        .plugin_name("sluice")
        .root_id("sluice_root")
        .vm_id("sluice_vm")
        .property(&["node", "id"], "node-7")
        .build()
        .unwrap();
    let request = Request::get("/a/b?x=1&y=2")
        .header("x-test-op", "props")
        .source("10.1.2.3:5555".parse().unwrap())
        .destination("127.0.0.1:10000".parse().unwrap());
    let now = host.clock().unwrap().realtime_nanos();

    let forwarded = forward(host.worker(0), request);

    let prop = |name: &str| text(&forwarded, &format!("x-prop-{name}"));
    assert_eq!(prop("source-address"), "10.1.2.3:5555");
    assert_eq!(prop("source-port"), "5555");
    assert_eq!(prop("destination-address"), "127.0.0.1:10000");
    assert_eq!(prop("destination-port"), "10000");
    assert_eq!(prop("plugin-name"), "sluice");
    assert_eq!(prop("plugin-root-id"), "sluice_root");
    assert_eq!(prop("plugin-vm-id"), "sluice_vm");
    assert_eq!(prop("request-path"), "/a/b?x=1&y=2");
    assert_eq!(prop("request-url-path"), "/a/b");
    assert_eq!(prop("request-query"), "x=1&y=2");
    assert_eq!(prop("request-method"), "GET");
    assert_eq!(prop("request-host"), "localhost");
    assert_eq!(prop("request-protocol"), "HTTP/1.1");
    assert_eq!(prop("request-header"), "props");
    assert_eq!(prop("request-time"), now.to_string());
    assert_eq!(prop("request-size"), "0");
    assert_eq!(prop("connection-id"), "1");
    assert_eq!(prop("mtls"), "00");
    assert_eq!(prop("node-id"), "node-7");
    assert_eq!(prop("missing"), "none");
}

#[test]
fn a_property_set_by_the_filter_reads_back_on_the_same_stream() {
    let mut host = host("");

    let forwarded = forward(host.worker(0), ops("set-prop").header("x-prop-value", "v1"));

    assert_eq!(text(&forwarded, "x-prop-roundtrip"), "v1");
}

#[test]
fn each_request_gets_its_own_connection_id() {
    let mut host = host("");
    let worker = host.worker(0);

    let first = forward(worker, ops("props"));
    let second = forward(worker, ops("props"));

    assert_ne!(text(&first, "x-prop-connection-id"), text(&second, "x-prop-connection-id"));
}

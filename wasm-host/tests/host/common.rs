//! Helpers shared by the tests: the test guest in a host, and reading what it forwarded.

use wasm_host::{Host, HostBuilder, Message, Outcome, Request, StreamId, Worker};

/// A host for the test guest with this plugin configuration.
pub fn guest() -> HostBuilder {
    Host::builder(sluice_artifacts::TEST_GUEST_WASM)
}

/// A host for the test guest, built.
pub fn host(configuration: &str) -> Host {
    guest().plugin_configuration(configuration).build().expect("the test guest starts")
}

/// A GET carrying the test guest's operations.
pub fn ops(operations: &str) -> Request {
    Request::get("/test").header("x-test-op", operations)
}

/// The request as the filter forwarded it.
pub fn forwarded(worker: &Worker, stream: StreamId) -> Message {
    match worker.outcome(stream).expect("the stream is open") {
        Outcome::Forwarded(message) => message.clone(),
        other => panic!("expected the request to be forwarded, got {other:?}"),
    }
}

/// Sends `request` and returns it as forwarded.
pub fn forward(worker: &mut Worker, request: Request) -> Message {
    let stream = worker.request(request);
    forwarded(worker, stream)
}

/// A header as text ("" if absent).
pub fn text(message: &Message, name: &str) -> String {
    message.headers.get(name).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()
}

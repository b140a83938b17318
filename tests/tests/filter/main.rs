//! `sluice.wasm` (release build) in wasm-host: the filter as Envoy runs it, one VM per
//! worker over one shared-data store, with a virtual clock.

mod accuracy;
mod behaviour;
mod budget;
mod concurrency;
mod configs;
mod costs;
mod global;
mod hostile;
mod lease;
mod memory;
mod shaping;

use sluice::host::{Counter, PluginCounter};
use sluice_artifacts::SLUICE_WASM;
use std::time::Duration;
use wasm_host::{Exchange, Host, HostBuilder, Request, Response};

/// The module under test: `sluice.wasm` as built from this tree, or the file named by
/// `SLUICE_WASM_UNDER_TEST` (to show that a test fails on an older build).
pub fn wasm() -> String {
    std::env::var("SLUICE_WASM_UNDER_TEST").unwrap_or_else(|_| SLUICE_WASM.to_owned())
}

/// A builder for a host running `sluice.wasm` with `config`, named as in envoy-config.
pub fn builder(config: &str) -> HostBuilder {
    Host::builder(wasm().as_str()).plugin_configuration(config).plugin_name("sluice").root_id("sluice").vm_id("sluice")
}

/// A one-worker host running `sluice.wasm` with `config`.
pub fn host(config: &str) -> Host {
    builder(config).build().unwrap_or_else(|e| panic!("the filter refused {config}: {e}"))
}

/// Sends `request` through worker 0 and answers it with `200` if it goes upstream.
pub fn send(host: &mut Host, request: Request) -> Exchange {
    host.worker(0).exchange(request, Response::ok()).unwrap()
}

/// The status the client saw.
pub fn status(host: &mut Host, request: Request) -> u16 {
    send(host, request).status().unwrap()
}

/// A counter of the guest's (`sluice.<policy>.<counter>`), named by the filter's own
/// [`Counter`]; 0 when never incremented.
pub fn metric(host: &Host, policy: &str, counter: Counter) -> u64 {
    host.metric(&sluice::series::policy_metric("sluice", policy, counter)).unwrap_or(0)
}

/// A plugin counter of the guest's (`sluice.<counter>`); `None` when not defined.
pub fn plugin_metric(host: &Host, counter: PluginCounter) -> Option<u64> {
    host.metric(&sluice::series::plugin_metric("sluice", counter))
}

/// Asserts `Offered = Allowed + Rejected + Queued` for a policy.
pub fn assert_accounting(host: &Host, policy: &str) {
    let offered = metric(host, policy, Counter::Offered);
    let sum = metric(host, policy, Counter::Allowed)
        + metric(host, policy, Counter::Rejected)
        + metric(host, policy, Counter::Queued);
    assert_eq!(offered, sum, "offered != allowed + rejected + queued for {policy}");
}

/// Seconds as a `Duration`.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Milliseconds as a `Duration`.
pub fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

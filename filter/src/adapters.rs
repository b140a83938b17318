//! The worker's traits on the proxy-wasm host: its port (the effective stream's host
//! calls and callouts), the request's facts, its metrics, and a callout's answer read
//! back. Each is a thin mapping onto [`abi`], which cannot panic.

use crate::abi;
use crate::engine::Engine;
use crate::engine::wire::MAX_ANSWER_BYTES;
use crate::host::{
    Call, CalloutAnswer, Callouts, Counter, DispatchError, HostFailure, Metrics, PluginCounter, RequestFacts,
    ResponseFacts, Wait,
};
use crate::worker::{MetricName, Port, metric_names, wait_names};
use std::time::Duration;
/// Metric ids per policy, in [`Counter::ALL`] order, per plugin, and per wait.
pub(crate) struct HostMetrics {
    policies: Vec<Vec<Option<u32>>>,
    plugin: Vec<Option<u32>>,
    waits: Vec<Option<u32>>,
}

impl HostMetrics {
    /// Defines the metrics the configuration can move.
    pub(crate) fn define(engine: &Engine) -> Self {
        let kind = |gauge| if gauge { abi::MetricKind::Gauge } else { abi::MetricKind::Counter };
        let define = |m: Option<MetricName>| m.and_then(|m| abi::define_metric(&m.name, kind(m.gauge)));
        let (policies, plugin) = metric_names(engine);
        let waits = wait_names(engine)
            .into_iter()
            .map(|m| m.and_then(|m| abi::define_metric(&m.name, abi::MetricKind::Histogram)))
            .collect();
        Self {
            policies: policies.into_iter().map(|p| p.into_iter().map(define).collect()).collect(),
            plugin: plugin.into_iter().map(define).collect(),
            waits,
        }
    }
}

impl Metrics for HostMetrics {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        if let Some(Some(id)) = self.policies.get(policy).and_then(|ids| ids.get(counter.index())) {
            abi::increment_metric(*id, delta);
        }
    }

    fn add_plugin(&mut self, counter: PluginCounter, delta: i64) {
        if let Some(Some(id)) = self.plugin.get(counter.index()) {
            abi::increment_metric(*id, delta);
        }
    }

    fn record_wait(&mut self, wait: Wait, ms: u64) {
        if let Some(Some(id)) = self.waits.get(wait.index()) {
            abi::record_metric(*id, ms);
        }
    }
}

/// Reads the current request through the host.
pub(crate) struct HostRequest;

impl RequestFacts for HostRequest {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::header(abi::REQUEST_HEADERS, name).map_err(failure)
    }

    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::property(path).map_err(failure)
    }
}

/// Reads the current response through the host.
pub(crate) struct HostResponse;

impl ResponseFacts for HostResponse {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::header(abi::RESPONSE_HEADERS, name).map_err(failure)
    }
}

/// The worker's port: host calls on the effective stream, and callouts through the
/// SDK, so that its dispatcher routes the answer to the calling context (it knows only
/// tokens it handed out).
///
/// The SDK's `dispatch_http_call` panics on a status other than OK, `BadArgument` and
/// `InternalFailure`; Envoy's `proxy_http_call` answers only those (and
/// `InvalidMemoryAccess` for pointers outside memory, which these are not), so that
/// panic is unreachable in Envoy. Everything else about the answer is read through
/// [`abi`], which cannot panic.
pub(crate) struct HostPort;

impl Callouts for HostPort {
    fn dispatch(&mut self, call: &Call<'_>) -> Result<u32, DispatchError> {
        let headers: Vec<(&str, &str)> = call.headers.to_vec();
        proxy_wasm::hostcalls::dispatch_http_call(
            call.cluster,
            headers,
            Some(call.body),
            Vec::new(),
            Duration::from_millis(u64::from(call.timeout_ms)),
        )
        .map_err(|status| DispatchError { status: status as u32 })
    }
}

/// Reads the answer to a callout: never the headers of a failed one (reading them then
/// is an error in Envoy, and a panic in the SDK's getters).
pub(crate) fn read_answer(num_headers: usize, body_size: usize) -> CalloutAnswer {
    if num_headers == 0 {
        return CalloutAnswer::Failed;
    }
    let status = abi::header(abi::CALL_RESPONSE_HEADERS, ":status")
        .ok()
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok().and_then(|s| s.parse().ok()));
    let Some(status) = status else { return CalloutAnswer::Failed };
    let body = if body_size == 0 {
        Vec::new()
    } else {
        abi::buffer(abi::CALL_RESPONSE_BODY, body_size.min(MAX_ANSWER_BYTES + 1)).unwrap_or_default()
    };
    CalloutAnswer::Response { status, body }
}

impl Port for HostPort {
    fn enter(&mut self, id: u32) -> Result<(), HostFailure> {
        abi::set_effective_context(id).map_err(failure)
    }

    fn resume(&mut self) -> Result<(), HostFailure> {
        abi::continue_request().map_err(failure)
    }

    fn reply(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) -> Result<(), HostFailure> {
        abi::send_local_response(status, headers, body).map_err(failure)
    }

    fn close(&mut self) -> Result<(), HostFailure> {
        abi::close_request().map_err(failure)
    }

    fn wake(&mut self, queue: u32) -> Result<(), HostFailure> {
        abi::enqueue(queue, b"w").map_err(failure)
    }
}

fn failure(status: abi::Status) -> HostFailure {
    HostFailure { status: status.0 }
}

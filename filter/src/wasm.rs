//! The proxy-wasm glue: callbacks that forward to the worker (`worker/`), which holds
//! the logic and its tests. The root context validates the configuration and builds the
//! worker; each HTTP context forwards its request's callbacks.
//!
//! Each Envoy worker runs its own VM, so everything here is single-threaded (`Rc`);
//! workers share only the host's shared data, through [`HostStore`].

use crate::abi::{self, HostLogger, HostStore, WasiClock};
use crate::config::Config;
use crate::engine::wire::MAX_ANSWER_BYTES;
use crate::engine::{Engine, anchor_key, establish_secret, plugin_prefix, private_cache_control};
use crate::host::{
    Call, CalloutAnswer, Callouts, Counter, DispatchError, HostFailure, Metrics, PluginCounter, RequestFacts,
};
use crate::worker::{Flow, Port, Worker, metric_names, tick_period};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use shared_store::Limiter;
use std::rc::Rc;
use std::time::Duration;

static LOGGER: HostLogger = HostLogger;

proxy_wasm::main! {{
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    // Defence in depth: there is no panic in this filter's own code (clippy forbids the
    // constructs), but if one ever happened, say why before the VM dies.
    std::panic::set_hook(Box::new(|info| abi::log(5, &format!("sluice: panic: {info}"))));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { worker: None }) });
}}

type HostWorker = Worker<HostStore, WasiClock, HostMetrics>;

/// Metric ids per policy, in [`Counter::ALL`] order, and per plugin.
struct HostMetrics {
    policies: Vec<Vec<Option<u32>>>,
    plugin: Vec<Option<u32>>,
}

impl HostMetrics {
    /// Defines the metrics the configuration can move.
    fn define(engine: &Engine) -> Self {
        let define = |m: Option<crate::worker::MetricName>| m.and_then(|m| abi::define_metric(&m.name, m.gauge));
        let (policies, plugin) = metric_names(engine);
        Self {
            policies: policies.into_iter().map(|p| p.into_iter().map(define).collect()).collect(),
            plugin: plugin.into_iter().map(define).collect(),
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
}

struct Root {
    worker: Option<Rc<HostWorker>>,
}

impl Root {
    fn configure() -> Result<HostWorker, String> {
        let bytes = abi::plugin_configuration()
            .map_err(|s| format!("cannot read the plugin configuration (host status {})", s.0))?;
        let config = Config::from_json(&bytes).map_err(|e| e.to_string())?;
        let plugin = abi::property(&["plugin_name"]).ok().flatten().unwrap_or_default();
        let root_id = abi::property(&["plugin_root_id"]).ok().flatten().unwrap_or_default();
        let prefix = plugin_prefix(&plugin, &root_id);
        let candidate = abi::random16().ok_or("the host gave no random bytes for the hash secret")?;
        let secret = establish_secret(&HostStore, &prefix, candidate).map_err(|e| e.to_string())?;
        let instance = abi::random16().ok_or("the host gave no random bytes for the worker's id")?;
        let instance = u64::from_le_bytes(std::array::from_fn(|i| instance.get(i).copied().unwrap_or(0)));
        let engine = Engine::new(config, &prefix, secret, |name| std::env::var(name).ok())
            .map_err(|e| e.to_string())?
            .with_instance(instance);
        engine.claim_tables(&HostStore).map_err(|e| e.to_string())?;
        // One queue per worker (a queue's notifications go to its last registrant), named
        // by the worker's random id.
        let wake =
            engine.has_lease().then(|| abi::register_queue(&format!("{prefix}wake/{instance:016x}")).ok()).flatten();
        if let Some(tick_ms) = tick_period(&engine) {
            abi::set_tick_period(tick_ms).map_err(|s| format!("cannot set the tick period (host status {})", s.0))?;
        }
        let metrics = HostMetrics::define(&engine);
        let limiter = Limiter::new(HostStore, WasiClock).with_anchor_key(anchor_key(&prefix));
        Ok(Worker::new(engine, limiter, metrics, wake))
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _: usize) {
        if let Some(worker) = &self.worker {
            worker.on_root_answer(token, &read_answer(num_headers, body_size), &mut HostPort);
        }
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _: usize) -> bool {
        true
    }

    fn on_configure(&mut self, _: usize) -> bool {
        if let Some(level) = abi::log_level() {
            log::set_max_level(match level {
                0 => log::LevelFilter::Trace,
                1 => log::LevelFilter::Debug,
                2 => log::LevelFilter::Info,
                3 => log::LevelFilter::Warn,
                _ => log::LevelFilter::Error,
            });
        }
        match Self::configure() {
            Ok(worker) => {
                self.worker = Some(Rc::new(worker));
                true
            }
            Err(message) => {
                log::error!("sluice: invalid configuration: {message}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(worker) = &self.worker {
            worker.on_tick(&mut HostPort);
        }
    }

    fn on_queue_ready(&mut self, queue: u32) {
        let Some(worker) = &self.worker else { return };
        if worker.wake_queue() != Some(queue) {
            return;
        }
        // Every wake asks the same thing: send the outbox. Drain them (bounded: the queue
        // only grows by one item per request callback).
        while abi::dequeue(queue).is_some() {}
        worker.on_wake(&mut HostPort);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter { id: context_id, worker: self.worker.clone() }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Reads the current request through the host.
struct HostRequest;

impl RequestFacts for HostRequest {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::header(abi::REQUEST_HEADERS, name).map_err(failure)
    }

    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::property(path).map_err(failure)
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
struct HostPort;

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
fn read_answer(num_headers: usize, body_size: usize) -> CalloutAnswer {
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

struct Filter {
    id: u32,
    worker: Option<Rc<HostWorker>>,
}

impl Context for Filter {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _: usize) {
        if let Some(worker) = &self.worker {
            worker.on_check_answer(self.id, &read_answer(num_headers, body_size), &mut HostPort);
        }
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(worker) = &self.worker else { return Action::Continue };
        match worker.on_request_headers(self.id, &HostRequest, &mut HostPort) {
            Flow::Continue => Action::Continue,
            Flow::Pause => Action::Pause,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(headers) = self.worker.as_ref().and_then(|w| w.take_response_headers(self.id)) else {
            return Action::Continue;
        };
        for (name, value) in &headers {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, name, value.as_bytes());
        }
        let existing = abi::header(abi::RESPONSE_HEADERS, "cache-control").ok().flatten();
        if let Some(value) = private_cache_control(existing.as_deref()) {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, "cache-control", value.as_bytes());
        }
        Action::Continue
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        // A stream that ends while held: forget it, and count it.
        if let Some(worker) = &self.worker {
            worker.on_stream_end(self.id);
        }
    }
}

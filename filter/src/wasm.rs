//! The proxy-wasm glue: callbacks that forward to the worker (`worker/`), which holds
//! the logic and its tests. The root context validates the configuration and builds the
//! worker; each HTTP context forwards its request's callbacks.
//!
//! Each Envoy worker runs its own VM, so everything here is single-threaded (`Rc`);
//! workers share only the host's shared data, through [`HostStore`].

use crate::abi::{self, HostLogger, HostStore, WasiClock};
use crate::adapters::{HostMetrics, HostPort, HostRequest, HostResponse, read_answer};
use crate::config::Config;
use crate::engine::{Engine, anchor_key, establish_secret, plugin_prefix, private_cache_control};
use crate::worker::{Flow, Worker, tick_period};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use shared_store::Limiter;
use std::rc::Rc;

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
        let wake = engine
            .sends_from_root()
            .then(|| abi::register_queue(&format!("{prefix}wake/{instance:016x}")).ok())
            .flatten();
        if let Some(tick_ms) = tick_period(&engine) {
            abi::set_tick_period(tick_ms).map_err(|s| format!("cannot set the tick period (host status {})", s.0))?;
        }
        let metrics = HostMetrics::define(&engine);
        // The worker's random id also names it as the holder of its concurrency slots.
        let limiter = Limiter::new(HostStore, WasiClock).with_anchor_key(anchor_key(&prefix)).with_holder(instance);
        Ok(Worker::new(engine, limiter, metrics, wake))
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _: usize) {
        if let Some(worker) = &self.worker {
            worker.on_root_answer(token, &read_answer(num_headers, body_size), &mut HostPort);
        }
    }

    fn on_done(&mut self) -> bool {
        // This root is going away: what it would still send is forgiven and counted, and
        // counts still held in the VM go to the proxy now.
        if let Some(worker) = &self.worker {
            worker.retire();
        }
        true
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
        #[cfg(feature = "test-crash-header")]
        #[allow(clippy::panic)]
        if abi::header(abi::REQUEST_HEADERS, "x-sluice-test-crash").ok().flatten().is_some() {
            panic!("x-sluice-test-crash: the test asked this VM to die");
        }
        match worker.on_request_headers(self.id, &HostRequest, &mut HostPort) {
            Flow::Continue => Action::Continue,
            Flow::Pause => Action::Pause,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        let Some(worker) = &self.worker else { return Action::Continue };
        worker.on_response_headers(self.id, &HostResponse, !end_of_stream);
        worker.after_response(&mut HostPort);
        let Some(headers) = worker.take_response_headers(self.id) else { return Action::Continue };
        for (name, value) in &headers {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, name, value.as_bytes());
        }
        let existing = abi::header(abi::RESPONSE_HEADERS, "cache-control").ok().flatten();
        if let Some(value) = private_cache_control(existing.as_deref()) {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, "cache-control", value.as_bytes());
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Read only when a policy's cost is in the body; the chunk passes on unchanged
        // and at once (a copy is read; nothing is buffered in the proxy).
        if let Some(worker) = self.worker.as_ref().filter(|w| w.reads_response_body(self.id)) {
            let chunk = abi::buffer(abi::RESPONSE_BODY, body_size).ok();
            worker.on_response_body(self.id, chunk.as_deref(), end_of_stream);
            worker.after_response(&mut HostPort);
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _: usize) -> Action {
        // The trailers end the body (its last chunk came without the end of the stream,
        // as an HTTP/2 or gRPC upstream sends it): settle what it reported.
        if let Some(worker) = self.worker.as_ref().filter(|w| w.reads_response_body(self.id)) {
            worker.on_response_trailers(self.id);
            worker.after_response(&mut HostPort);
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

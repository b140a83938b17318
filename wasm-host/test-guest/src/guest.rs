//! The guest's contexts: the root (configuration, ticks, queues, root callouts) and the
//! HTTP stream, whose request headers callback runs the request's [`Operation`]s in order
//! and whose later callbacks act on the later-phase ones. Test code: it may panic on
//! purpose (`panic` operations) and reports every host status it sees, so that the host's
//! tests can assert on them. What each family of operations does is in `guest/`.

mod batch;
mod bench;
mod callout;
mod headers;
mod properties;
mod runtime;
mod shared;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

use crate::config::{Bench, Config};
use crate::operation::{self, Operation};
use crate::raw;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(Root::new(id)) });
}}

thread_local! {
    /// Streams holding their request until the next tick.
    static PAUSED_REQUESTS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Streams holding their response until the next tick.
    static PAUSED_RESPONSES: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Streams whose `on_done` returned false; the next tick calls `proxy_done`.
    static DONE_LATER: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

struct Root {
    id: u32,
    config: Rc<Config>,
    ticks_metric: Option<u32>,
    panicked_once: bool,
}

impl Root {
    fn new(id: u32) -> Self {
        Self { id, config: Rc::new(Config::default()), ticks_metric: None, panicked_once: false }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        if self.config.bench == Some(Bench::Batch) {
            return batch::answered(token);
        }
        if let Ok(id) = hostcalls::define_metric(MetricType::Counter, "test_guest.root_callouts") {
            let _ = hostcalls::increment_metric(id, 1);
        }
        let status = if num_headers > 0 {
            self.get_http_call_response_header_bytes(":status").map(|s| String::from_utf8_lossy(&s).into_owned())
        } else {
            None
        };
        log::info!(
            "root {} callout {token} answered: headers={num_headers} body={body_size} status={}",
            self.id,
            status.unwrap_or_else(|| "none".to_owned())
        );
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, vm_configuration_size: usize) -> bool {
        let vm_config = self.get_vm_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&vm_config).into_owned();
        log::info!("vm start: root {} vm configuration ({vm_configuration_size} bytes): {text}", self.id);
        if text.contains("vm_start=reject") {
            log::warn!("refusing to start: the VM configuration says so");
            return false;
        }
        true
    }

    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = Config::parse(&String::from_utf8_lossy(&bytes));
        log::info!("configure: root {} got {plugin_configuration_size} bytes", self.id);
        if config.panic_on_configure {
            panic!("test guest panics in on_configure");
        }
        if let Some(reason) = &config.reject {
            log::error!("{reason}");
            return false;
        }
        if let Some(ms) = config.tick_ms {
            self.set_tick_period(Duration::from_millis(ms));
        }
        self.ticks_metric = hostcalls::define_metric(MetricType::Counter, "test_guest.ticks").ok();
        if config.bench == Some(Bench::Batch) {
            batch::register(self.id);
        }
        if config.queue {
            let queue = self.register_shared_queue("events");
            log::info!("root {} registered queue {queue}", self.id);
        }
        self.config = Rc::new(config);
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if batch::is_wake(queue_id) {
            return batch::on_wake(queue_id, &self.config);
        }
        loop {
            match self.dequeue_shared_queue(queue_id) {
                Ok(Some(item)) => {
                    log::info!("root {} dequeued {}", self.id, String::from_utf8_lossy(&item));
                    if let Ok(id) = hostcalls::define_metric(MetricType::Counter, "test_guest.dequeued") {
                        let _ = hostcalls::increment_metric(id, 1);
                    }
                }
                Ok(None) => {
                    log::info!("root {} found queue {queue_id} empty", self.id);
                    break;
                }
                Err(status) => {
                    log::warn!("root {} could not dequeue: {status:?}", self.id);
                    break;
                }
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(id) = self.ticks_metric {
            let _ = hostcalls::increment_metric(id, 1);
        }
        if self.config.tick_panic && !self.panicked_once {
            self.panicked_once = true;
            panic!("test guest panics in on_tick");
        }
        if let Some(cluster) = self.config.tick_callout.clone() {
            let headers = vec![(":method", "GET"), (":path", "/tick"), (":authority", "counter")];
            match self.dispatch_http_call(&cluster, headers, None, vec![], Duration::from_millis(500)) {
                Ok(token) => log::info!("root {} dispatched callout {token}", self.id),
                Err(status) => log::warn!("root {} could not dispatch: {status:?}", self.id),
            }
        }
        for id in PAUSED_REQUESTS.with(|p| p.borrow_mut().drain(..).collect::<Vec<_>>()) {
            if hostcalls::set_effective_context(id).is_ok() {
                let _ = hostcalls::resume_http_request();
            }
        }
        for id in PAUSED_RESPONSES.with(|p| p.borrow_mut().drain(..).collect::<Vec<_>>()) {
            if hostcalls::set_effective_context(id).is_ok() {
                let _ = hostcalls::resume_http_response();
            }
        }
        for id in DONE_LATER.with(|p| p.borrow_mut().drain(..).collect::<Vec<_>>()) {
            if hostcalls::set_effective_context(id).is_ok() {
                let _ = hostcalls::done();
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(HttpStream { id: context_id, root: self.id, config: Rc::clone(&self.config), ops: Vec::new() }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct HttpStream {
    id: u32,
    root: u32,
    config: Rc<Config>,
    /// The request's operations, in the order it named them (unknown names left out).
    ops: Vec<Operation>,
}

fn header_text(value: Option<Vec<u8>>) -> Option<String> {
    value.map(|v| String::from_utf8_lossy(&v).into_owned())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl HttpStream {
    fn has(&self, op: Operation) -> bool {
        self.ops.contains(&op)
    }

    fn put(&self, name: &str, value: impl AsRef<[u8]>) {
        self.add_http_request_header_bytes(name, value.as_ref());
    }

    fn request_header(&self, name: &str) -> Option<String> {
        header_text(self.get_http_request_header_bytes(name))
    }

    /// Runs one operation in `on_http_request_headers`: the action it asks the callback to
    /// return, or `None` to leave the action as the operations before it set it.
    fn run(&self, op: Operation) -> Option<Action> {
        match op {
            Operation::Props => self.properties(),
            Operation::Headers => self.headers(),
            Operation::SetAll => self.set_all_headers(),
            Operation::SharedGet => self.shared_get(),
            Operation::SharedSet => self.shared_set(),
            Operation::CasIncr => self.cas_incr(),
            Operation::SharedScript => self.shared_script(),
            Operation::Metrics => self.metrics(),
            Operation::Callout | Operation::CalloutDeny => return self.callout(false),
            Operation::CalloutNoAuthority => return self.callout(true),
            Operation::Local | Operation::LocalContinue => {
                let status = self.request_header("x-status").and_then(|s| s.parse().ok()).unwrap_or(403);
                let body = self.request_header("x-body").unwrap_or_else(|| "denied".to_owned());
                self.send_http_response(status, vec![("x-local", "yes"), ("x-local", "twice")], Some(body.as_bytes()));
                return Some(if op == Operation::Local { Action::Pause } else { Action::Continue });
            }
            Operation::Pause => {
                PAUSED_REQUESTS.with(|p| p.borrow_mut().push(self.id));
                return Some(Action::Pause);
            }
            Operation::HoldHeaders => return Some(Action::Pause),
            Operation::Reset => {
                self.reset_http_request();
                return Some(Action::Pause);
            }
            Operation::Panic => panic!("test guest panics on request {}", self.id),
            Operation::ContinueThenRead => {
                self.resume_http_request();
                let (status, _) = raw::header_value(0, ":path");
                log::info!("after continue, reading a request header gives status {status}");
            }
            Operation::Log => runtime::log_at_every_level(),
            Operation::Stdio => self.stdio(),
            Operation::Time => self.time(),
            Operation::Random => self.random(),
            Operation::Env => self.env(),
            Operation::SetProp => self.set_prop(),
            Operation::Config => self.configurations(),
            Operation::RawMisuse => self.raw_misuse(),
            Operation::Enqueue => self.enqueue(),
            Operation::HeaderSize => self.header_size(),
            Operation::Ids => self.ids(),
            // Later phases: the callback each names acts on it.
            Operation::Body
            | Operation::HoldBody
            | Operation::Trailers
            | Operation::RespHeaders
            | Operation::RespLocal
            | Operation::RespPause
            | Operation::RespTrailers
            | Operation::RespBody
            | Operation::LogPhase
            | Operation::DoneLater => {}
        }
        None
    }
}

impl Context for HttpStream {
    fn on_done(&mut self) -> bool {
        if self.has(Operation::DoneLater) {
            DONE_LATER.with(|d| d.borrow_mut().push(self.id));
            return false;
        }
        true
    }

    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, num_trailers: usize) {
        if self.config.bench == Some(Bench::Batch) {
            return batch::answered(token);
        }
        self.callout_answered(num_headers, body_size, num_trailers);
    }
}

impl HttpContext for HttpStream {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.config.bench == Some(Bench::Batch) {
            return batch::begin(self.id, &self.config);
        }
        if let Some(mode) = self.config.bench {
            return self.bench(mode);
        }
        let names = self.request_header("x-test-op").or_else(|| self.config.ops.clone()).unwrap_or_default();
        // An unknown name is left out: it does nothing, in this callback or a later one.
        self.ops = operation::parse_list(&names).filter_map(Result::ok).collect();
        if let Some(generation) = &self.config.generation {
            self.put("x-test-generation", generation);
        }
        let mut action = Action::Continue;
        for &op in &self.ops {
            if let Some(asked) = self.run(op) {
                action = asked;
            }
        }
        action
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.has(Operation::Body) {
            let body = self.get_http_request_body(0, body_size).unwrap_or_default();
            let mut changed = body.clone();
            changed.extend_from_slice(b"+seen");
            self.set_http_request_body(0, body_size, &changed);
            log::info!("request body of {body_size} bytes (end_of_stream={end_of_stream})");
        }
        if self.has(Operation::HoldBody) {
            PAUSED_REQUESTS.with(|p| p.borrow_mut().push(self.id));
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.has(Operation::Trailers) {
            self.add_http_request_trailer_bytes("x-trailer-seen", b"yes");
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.has(Operation::RespHeaders) {
            self.add_http_response_header_bytes("x-filter", b"1");
            self.set_http_response_header_bytes("x-replace", Some(b"new"));
            self.remove_http_response_header("x-remove-me");
            let status = self.get_http_response_header_bytes(":status").unwrap_or_default();
            self.add_http_response_header_bytes("x-seen-status", &status);
            let (request_status, _) = raw::header_value(0, ":path");
            self.add_http_response_header_bytes("x-request-header-status", request_status.to_string().as_bytes());
        }
        if self.has(Operation::RespLocal) {
            self.send_http_response(502, vec![("x-replaced", "yes")], Some(b"replaced"));
            return Action::Pause;
        }
        if self.has(Operation::RespPause) {
            PAUSED_RESPONSES.with(|p| p.borrow_mut().push(self.id));
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.has(Operation::RespTrailers) {
            self.set_http_response_trailer_bytes("grpc-status", Some(b"0"));
            self.add_http_response_trailer_bytes("x-trailer-filtered", b"yes");
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if self.has(Operation::RespBody) {
            let body = self.get_http_response_body(0, body_size).unwrap_or_default();
            let mut changed = body.clone();
            changed.extend_from_slice(b" [filtered]");
            self.set_http_response_body(0, body_size, &changed);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.has(Operation::LogPhase) {
            let path = header_text(self.get_http_request_header_bytes(":path")).unwrap_or_else(|| "none".to_owned());
            let status =
                header_text(self.get_http_response_header_bytes(":status")).unwrap_or_else(|| "none".to_owned());
            log::info!("on_log {}: path={path} status={status}", self.id);
        }
    }
}

impl Drop for HttpStream {
    fn drop(&mut self) {
        if self.has(Operation::LogPhase) {
            log::info!("deleted stream {}", self.id);
        }
    }
}

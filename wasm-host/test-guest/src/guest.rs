//! The guest itself. Test code: it may panic on purpose (`panic` operations) and reports
//! every host status it sees, so that the host's tests can assert on them.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MetricType};

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

/// Benchmark modes: the request callback makes only this host call, `calls` times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bench {
    Noop,
    GetHeader,
    GetProperty,
    Shared,
    Metric,
    Clock,
}

#[derive(Default, Clone)]
struct Config {
    reject: Option<String>,
    panic_on_configure: bool,
    tick_ms: Option<u64>,
    tick_callout: Option<String>,
    tick_panic: bool,
    generation: Option<String>,
    bench: Option<Bench>,
    calls: usize,
    queue: bool,
    ops: Option<String>,
}

impl Config {
    fn parse(text: &str) -> Self {
        let mut config = Self { calls: 1, ..Self::default() };
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            let value = value.trim().to_owned();
            match key.trim() {
                "reject" => config.reject = Some(value),
                "panic_on_configure" => config.panic_on_configure = value == "1",
                "tick_ms" => config.tick_ms = value.parse().ok(),
                "tick_callout" => config.tick_callout = Some(value),
                "tick_panic" => config.tick_panic = value == "1",
                "generation" => config.generation = Some(value),
                "bench" => {
                    config.bench = Some(match value.as_str() {
                        "get-header" => Bench::GetHeader,
                        "get-property" => Bench::GetProperty,
                        "shared" => Bench::Shared,
                        "metric" => Bench::Metric,
                        "clock" => Bench::Clock,
                        _ => Bench::Noop,
                    })
                }
                "calls" => config.calls = value.parse().unwrap_or(1),
                "ops" => config.ops = Some(value),
                "queue" => config.queue = value == "1",
                _ => {}
            }
        }
        config
    }
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
        if config.queue {
            let queue = self.register_shared_queue("events");
            log::info!("root {} registered queue {queue}", self.id);
        }
        self.config = Rc::new(config);
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
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
    ops: Vec<String>,
}

thread_local! {
    static BENCH_METRIC: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// The counter `bench=metric` increments, defined on first use.
fn bench_metric() -> Option<u32> {
    BENCH_METRIC.with(|cell| {
        if cell.get().is_none() {
            cell.set(hostcalls::define_metric(MetricType::Counter, "test_guest.bench").ok());
        }
        cell.get()
    })
}

fn header_text(value: Option<Vec<u8>>) -> Option<String> {
    value.map(|v| String::from_utf8_lossy(&v).into_owned())
}

fn int64(value: Option<Vec<u8>>) -> String {
    match value.and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok()) {
        Some(bytes) => i64::from_le_bytes(bytes).to_string(),
        None => "none".to_owned(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl HttpStream {
    fn has(&self, op: &str) -> bool {
        self.ops.iter().any(|o| o == op)
    }

    fn put(&self, name: &str, value: impl AsRef<[u8]>) {
        self.add_http_request_header_bytes(name, value.as_ref());
    }

    fn request_header(&self, name: &str) -> Option<String> {
        header_text(self.get_http_request_header_bytes(name))
    }

    fn bench(&self, mode: Bench) -> Action {
        if mode == Bench::Noop {
            return Action::Continue;
        }
        for _ in 0..self.config.calls {
            match mode {
                Bench::GetHeader => {
                    let _ = self.get_http_request_header_bytes("x-key");
                }
                Bench::GetProperty => {
                    let _ = self.get_property(vec!["source", "address"]);
                }
                Bench::Shared => {
                    let (value, cas) = self.get_shared_data("bench");
                    let _ = self.set_shared_data("bench", Some(&value.unwrap_or_default()), cas);
                }
                Bench::Metric => {
                    if let Some(id) = bench_metric() {
                        let _ = hostcalls::increment_metric(id, 1);
                    }
                }
                Bench::Clock => {
                    std::hint::black_box(std::time::Instant::now());
                }
                Bench::Noop => {}
            }
        }
        Action::Continue
    }

    fn properties(&self) {
        let strings = [
            ("source-address", vec!["source", "address"]),
            ("destination-address", vec!["destination", "address"]),
            ("plugin-name", vec!["plugin_name"]),
            ("plugin-root-id", vec!["plugin_root_id"]),
            ("plugin-vm-id", vec!["plugin_vm_id"]),
            ("request-path", vec!["request", "path"]),
            ("request-url-path", vec!["request", "url_path"]),
            ("request-query", vec!["request", "query"]),
            ("request-method", vec!["request", "method"]),
            ("request-host", vec!["request", "host"]),
            ("request-protocol", vec!["request", "protocol"]),
            ("request-header", vec!["request", "headers", "x-test-op"]),
            ("node-id", vec!["node", "id"]),
        ];
        for (name, path) in strings {
            let value = header_text(self.get_property(path)).unwrap_or_else(|| "none".to_owned());
            self.put(&format!("x-prop-{name}"), value);
        }
        let ints = [
            ("source-port", vec!["source", "port"]),
            ("destination-port", vec!["destination", "port"]),
            ("connection-id", vec!["connection", "id"]),
            ("request-time", vec!["request", "time"]),
            ("request-size", vec!["request", "size"]),
        ];
        for (name, path) in ints {
            self.put(&format!("x-prop-{name}"), int64(self.get_property(path)));
        }
        let mtls = self.get_property(vec!["connection", "mtls"]).map(|v| hex(&v)).unwrap_or_else(|| "none".to_owned());
        self.put("x-prop-mtls", mtls);
        let missing = self.get_property(vec!["does", "not", "exist"]).map_or("none", |_| "found");
        self.put("x-prop-missing", missing);
        let headers_map = self.get_property(vec!["request", "headers"]).map_or(0, |v| v.len());
        self.put("x-prop-request-headers-bytes", headers_map.to_string());
    }

    fn headers(&self) {
        let got = self.get_http_request_header_bytes("x-in").unwrap_or_else(|| b"absent".to_vec());
        self.put("x-got", got);
        self.set_http_request_header_bytes("x-replace", Some(b"new"));
        self.add_http_request_header_bytes("x-added", b"1");
        self.remove_http_request_header("x-remove");
        self.add_http_request_header_bytes("x-binary", &[0xff, 0xfe, 0x00, 0x41]);
        let missing = self.get_http_request_header_bytes("x-does-not-exist").map_or("absent", |_| "present");
        self.put("x-missing", missing);
        let count = self.get_http_request_headers_bytes().len();
        self.put("x-pair-count", count.to_string());
        let (status, size) = raw::header_map_size(0);
        self.put("x-header-size", format!("{status}:{size}"));
    }

    fn set_all_headers(&self) {
        let current = self.get_http_request_headers_bytes();
        let mut kept: Vec<(&str, &[u8])> =
            current.iter().filter(|(n, _)| n.starts_with(':')).map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        kept.push(("x-replaced-all", b"yes"));
        self.set_http_request_headers_bytes(kept);
    }

    fn shared(&self, op: &str) {
        let key = self.request_header("x-key").unwrap_or_else(|| "key".to_owned());
        match op {
            "shared-get" => match self.get_shared_data(&key) {
                (None, None) => self.put("x-shared-value", "missing"),
                (value, cas) => {
                    self.put("x-shared-value", value.unwrap_or_default());
                    self.put("x-shared-cas", cas.unwrap_or(0).to_string());
                }
            },
            "shared-set" => {
                let value = self.request_header("x-value").unwrap_or_default();
                let cas = self.request_header("x-cas").and_then(|c| c.parse::<u32>().ok()).filter(|c| *c != 0);
                let result = match self.set_shared_data(&key, Some(value.as_bytes()), cas) {
                    Ok(()) => "ok".to_owned(),
                    Err(status) => format!("{status:?}"),
                };
                self.put("x-shared-set", result);
            }
            _ => {
                // cas-incr: read, add one, write back with the token, retry on mismatch.
                let mut retries = 0u32;
                loop {
                    let (value, cas) = self.get_shared_data(&key);
                    let current: u64 =
                        value.and_then(|v| String::from_utf8(v).ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
                    let next = (current + 1).to_string();
                    match self.set_shared_data(&key, Some(next.as_bytes()), cas) {
                        Ok(()) => {
                            self.put("x-cas-value", next);
                            break;
                        }
                        Err(_) if retries < 10_000 => retries += 1,
                        Err(_) => {
                            self.put("x-cas-value", "gave-up");
                            break;
                        }
                    }
                }
                self.put("x-cas-retries", retries.to_string());
            }
        }
    }

    /// Runs the get / set steps of `x-shared-script` (separated by `;`) with the raw host
    /// calls, and reports each as `x-shared-step-<i>` (from 0): `get <key>` gives
    /// `<status> <cas> <value>` (just `<status>` unless OK), `set <key> <value> <cas>`
    /// gives `<status>`. `~` is the empty key or value; a cas is a number, or `@<i>` (the
    /// cas step `<i>` read) with an optional `+<n>`. With `x-shared-vm`, only the plugin
    /// whose `vm_id` it names runs the script (several plugins see the same request).
    fn shared_script(&self) {
        if let Some(vm) = self.request_header("x-shared-vm") {
            let own = header_text(self.get_property(vec!["plugin_vm_id"])).unwrap_or_default();
            if own != vm {
                return;
            }
        }
        let script = self.request_header("x-shared-script").unwrap_or_default();
        let mut read: Vec<u32> = Vec::new();
        for (index, step) in script.split(';').map(str::trim).filter(|s| !s.is_empty()).enumerate() {
            let words: Vec<&str> = step.split_whitespace().collect();
            let bytes = |word: &str| if word == "~" { Vec::new() } else { word.as_bytes().to_vec() };
            let report = match words.as_slice() {
                ["get", key] => {
                    let (status, value, cas) = raw::get_shared_data(&bytes(key));
                    read.push(if status == 0 { cas } else { 0 });
                    if status == 0 {
                        let value = if value.is_empty() {
                            "~".to_owned()
                        } else {
                            String::from_utf8_lossy(&value).into_owned()
                        };
                        format!("{status} {cas} {value}")
                    } else {
                        status.to_string()
                    }
                }
                ["set", key, value, cas] => {
                    read.push(0);
                    let cas = match cas.strip_prefix('@') {
                        Some(reference) => {
                            let (step, plus) = reference.split_once('+').unwrap_or((reference, "0"));
                            let base = step.parse::<usize>().ok().and_then(|i| read.get(i).copied()).unwrap_or(0);
                            base.wrapping_add(plus.parse().unwrap_or(0))
                        }
                        None => cas.parse().unwrap_or(0),
                    };
                    raw::set_shared_data(&bytes(key), &bytes(value), cas).to_string()
                }
                _ => {
                    read.push(0);
                    format!("bad step: {step}")
                }
            };
            self.put(&format!("x-shared-step-{index}"), report);
        }
    }

    fn metrics(&self) {
        let (Ok(counter), Ok(gauge), Ok(histogram)) = (
            hostcalls::define_metric(MetricType::Counter, "test_guest.requests"),
            hostcalls::define_metric(MetricType::Gauge, "test_guest.gauge"),
            hostcalls::define_metric(MetricType::Histogram, "test_guest.latency"),
        ) else {
            self.put("x-metrics", "define-failed");
            return;
        };
        let _ = hostcalls::increment_metric(counter, 1);
        let _ = hostcalls::increment_metric(gauge, 5);
        let _ = hostcalls::increment_metric(gauge, -2);
        let sample = self.request_header("x-hist").and_then(|v| v.parse().ok()).unwrap_or(42);
        let _ = hostcalls::record_metric(histogram, sample);
        self.put("x-counter", hostcalls::get_metric(counter).map_or("error".to_owned(), |v| v.to_string()));
        self.put("x-gauge", hostcalls::get_metric(gauge).map_or("error".to_owned(), |v| v.to_string()));
        let decrement = match hostcalls::increment_metric(counter, -1) {
            Ok(()) => "ok".to_owned(),
            Err(status) => format!("{status:?}"),
        };
        self.put("x-counter-decrement", decrement);
        let (status, _) = raw::get_metric(histogram);
        self.put("x-histogram-get", status.to_string());
    }

    fn callout(&self, without_authority: bool) -> Option<Action> {
        let cluster = self.request_header("x-cluster").unwrap_or_else(|| "upstream".to_owned());
        let path = self.request_header("x-callout-path").unwrap_or_else(|| "/check".to_owned());
        let timeout = self.request_header("x-timeout-ms").and_then(|t| t.parse().ok()).unwrap_or(1000);
        let extra = self.request_header("x-callout-header").unwrap_or_default();
        let body = self.request_header("x-callout-payload");
        let mut headers = vec![(":method", "POST"), (":path", path.as_str()), ("x-extra", extra.as_str())];
        if !without_authority {
            headers.push((":authority", "counter"));
        }
        let trailers = vec![("x-callout-trailer", "t")];
        match self.dispatch_http_call(
            &cluster,
            headers,
            body.as_deref().map(str::as_bytes),
            trailers,
            Duration::from_millis(timeout),
        ) {
            Ok(token) => {
                self.put("x-callout-token", token.to_string());
                Some(Action::Pause)
            }
            Err(status) => {
                self.put("x-dispatch-error", format!("{status:?}"));
                None
            }
        }
    }

    fn misc(&self, op: &str) {
        match op {
            "log" => {
                log::trace!("log at trace");
                log::debug!("log at debug");
                log::info!("log at info");
                log::warn!("log at warn");
                log::error!("log at error");
            }
            "stdio" => {
                println!("to stdout from {}", self.id);
                eprintln!("to stderr from {}", self.id);
            }
            "time" => {
                let proxy = self.get_current_time().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                let wasi = std::time::SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                self.put("x-time-proxy", proxy.to_string());
                self.put("x-time-wasi", wasi.to_string());
                self.put("x-time-monotonic", raw::monotonic_nanos().to_string());
                self.put("x-cputime-errno", raw::cputime_errno().to_string());
            }
            "random" => {
                self.put("x-random", hex(&raw::random16()));
                self.put("x-random-too-much", raw::random_too_much_errno().to_string());
            }
            "env" => self.put("x-env", std::env::var("TEST_ENV").unwrap_or_else(|_| "unset".to_owned())),
            "set-prop" => {
                let value = self.request_header("x-prop-value").unwrap_or_default();
                self.set_property(vec!["test", "prop"], Some(value.as_bytes()));
                let back = header_text(self.get_property(vec!["test", "prop"])).unwrap_or_else(|| "none".to_owned());
                self.put("x-prop-roundtrip", back);
            }
            "config" => {
                let plugin = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX);
                self.put("x-plugin-config", plugin.ok().flatten().map_or("none".to_owned(), |c| hex(&c)));
                let vm = hostcalls::get_buffer(BufferType::VmConfiguration, 0, usize::MAX);
                let vm = vm.ok().flatten().map_or("none".to_owned(), |c| String::from_utf8_lossy(&c).into_owned());
                self.put("x-vm-config", vm);
            }
            "raw-misuse" => {
                for (name, status) in raw::misuse() {
                    self.put(&format!("x-raw-{name}"), status.to_string());
                }
            }
            "enqueue" => {
                let result = match self.resolve_shared_queue("", "events") {
                    Some(queue) => {
                        let value = self.request_header("x-value").unwrap_or_default();
                        match self.enqueue_shared_queue(queue, Some(value.as_bytes())) {
                            Ok(()) => "ok".to_owned(),
                            Err(status) => format!("{status:?}"),
                        }
                    }
                    None => "not-found".to_owned(),
                };
                self.put("x-enqueue", result);
                let missing = self.resolve_shared_queue("", "no-such-queue").map_or("none", |_| "found");
                self.put("x-resolve-missing", missing);
            }
            "header-size" => {
                let (status, size) = raw::header_map_size(0);
                self.put("x-header-size", format!("{status}:{size}"));
            }
            "ids" => {
                self.put("x-context-id", self.id.to_string());
                self.put("x-root-id", self.root.to_string());
            }
            _ => {}
        }
    }
}

impl Context for HttpStream {
    fn on_done(&mut self) -> bool {
        self.on_done_later()
    }

    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, num_trailers: usize) {
        self.put("x-callout-headers", num_headers.to_string());
        self.put("x-callout-body-size", body_size.to_string());
        self.put("x-callout-trailers", num_trailers.to_string());
        let (code, message) = hostcalls::get_grpc_status().unwrap_or((99, None));
        self.put("x-callout-status-code", code.to_string());
        self.put("x-callout-status-message", message.unwrap_or_else(|| "none".to_owned()));
        let mut status = None;
        if num_headers > 0 {
            status = header_text(self.get_http_call_response_header_bytes(":status"));
            self.put("x-callout-status", status.clone().unwrap_or_default());
            let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
            self.put("x-callout-body", body);
            if let Some(value) = self.get_http_call_response_header_bytes("x-from-upstream") {
                self.put("x-callout-x-from-upstream", value);
            }
            // Every pair in order, one request header each: `x-callout-response-<i>: <name>: <value>`.
            for (index, (name, value)) in self.get_http_call_response_headers_bytes().into_iter().enumerate() {
                let mut pair = name.into_bytes();
                pair.extend_from_slice(b": ");
                pair.extend_from_slice(&value);
                self.put(&format!("x-callout-response-{index}"), pair);
            }
        } else {
            let (read_status, _) = raw::header_value(6, ":status");
            self.put("x-callout-read-status", read_status.to_string());
            let pairs = self.get_http_call_response_headers_bytes().len();
            self.put("x-callout-pairs", pairs.to_string());
            self.put("x-callout-body-read-status", raw::buffer_status(4).to_string());
        }
        if self.has("callout-deny") && status.as_deref() == Some("429") {
            self.send_http_response(429, vec![("x-denied-by", "callout")], Some(b"rate limited"));
        } else {
            self.resume_http_request();
        }
    }
}

impl HttpContext for HttpStream {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(mode) = self.config.bench {
            return self.bench(mode);
        }
        let ops = self.request_header("x-test-op").or_else(|| self.config.ops.clone()).unwrap_or_default();
        self.ops = ops.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
        if let Some(generation) = &self.config.generation {
            self.put("x-test-generation", generation);
        }
        let mut action = Action::Continue;
        for op in self.ops.clone() {
            match op.as_str() {
                "props" => self.properties(),
                "headers" => self.headers(),
                "set-all" => self.set_all_headers(),
                "shared-get" | "shared-set" | "cas-incr" => self.shared(&op),
                "shared-script" => self.shared_script(),
                "metrics" => self.metrics(),
                "callout" | "callout-deny" => {
                    if let Some(a) = self.callout(false) {
                        action = a;
                    }
                }
                "callout-no-authority" => {
                    if let Some(a) = self.callout(true) {
                        action = a;
                    }
                }
                "local" | "local-continue" => {
                    let status = self.request_header("x-status").and_then(|s| s.parse().ok()).unwrap_or(403);
                    let body = self.request_header("x-body").unwrap_or_else(|| "denied".to_owned());
                    self.send_http_response(
                        status,
                        vec![("x-local", "yes"), ("x-local", "twice")],
                        Some(body.as_bytes()),
                    );
                    action = if op == "local" { Action::Pause } else { Action::Continue };
                }
                "pause" => {
                    PAUSED_REQUESTS.with(|p| p.borrow_mut().push(self.id));
                    action = Action::Pause;
                }
                "hold-headers" => action = Action::Pause,
                "reset" => {
                    self.reset_http_request();
                    action = Action::Pause;
                }
                "panic" => panic!("test guest panics on request {}", self.id),
                "continue-then-read" => {
                    self.resume_http_request();
                    let (status, _) = raw::header_value(0, ":path");
                    log::info!("after continue, reading a request header gives status {status}");
                }
                other => self.misc(other),
            }
        }
        action
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.has("body") {
            let body = self.get_http_request_body(0, body_size).unwrap_or_default();
            let mut changed = body.clone();
            changed.extend_from_slice(b"+seen");
            self.set_http_request_body(0, body_size, &changed);
            log::info!("request body of {body_size} bytes (end_of_stream={end_of_stream})");
        }
        if self.has("hold-body") {
            PAUSED_REQUESTS.with(|p| p.borrow_mut().push(self.id));
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.has("trailers") {
            self.add_http_request_trailer_bytes("x-trailer-seen", b"yes");
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.has("resp-headers") {
            self.add_http_response_header_bytes("x-filter", b"1");
            self.set_http_response_header_bytes("x-replace", Some(b"new"));
            self.remove_http_response_header("x-remove-me");
            let status = self.get_http_response_header_bytes(":status").unwrap_or_default();
            self.add_http_response_header_bytes("x-seen-status", &status);
            let (request_status, _) = raw::header_value(0, ":path");
            self.add_http_response_header_bytes("x-request-header-status", request_status.to_string().as_bytes());
        }
        if self.has("resp-local") {
            self.send_http_response(502, vec![("x-replaced", "yes")], Some(b"replaced"));
            return Action::Pause;
        }
        if self.has("resp-pause") {
            PAUSED_RESPONSES.with(|p| p.borrow_mut().push(self.id));
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.has("resp-trailers") {
            self.set_http_response_trailer_bytes("grpc-status", Some(b"0"));
            self.add_http_response_trailer_bytes("x-trailer-filtered", b"yes");
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if self.has("resp-body") {
            let body = self.get_http_response_body(0, body_size).unwrap_or_default();
            let mut changed = body.clone();
            changed.extend_from_slice(b" [filtered]");
            self.set_http_response_body(0, body_size, &changed);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.has("log-phase") {
            let path = header_text(self.get_http_request_header_bytes(":path")).unwrap_or_else(|| "none".to_owned());
            let status =
                header_text(self.get_http_response_header_bytes(":status")).unwrap_or_else(|| "none".to_owned());
            log::info!("on_log {}: path={path} status={status}", self.id);
        }
    }
}

impl HttpStream {
    fn on_done_later(&self) -> bool {
        if self.has("done-later") {
            DONE_LATER.with(|d| d.borrow_mut().push(self.id));
            return false;
        }
        true
    }
}

impl Drop for HttpStream {
    fn drop(&mut self) {
        if self.has("log-phase") {
            log::info!("deleted stream {}", self.id);
        }
    }
}

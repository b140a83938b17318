//! `wasm-host serve`: an HTTP/1.1 reverse proxy on loopback that runs the plugin as
//! Envoy would, for trying a filter with `curl` and for measuring it under load.
//!
//! It is built like Envoy: N worker threads accept on one listening socket; each worker
//! owns one VM and an event loop (a single-threaded runtime), and runs the filter inline
//! on the thread that owns the connection. The real clock drives ticks and callout
//! timeouts.
//!
//! * Requests the filter forwards go to `--upstream`, or to a built-in echo upstream that
//!   answers `200` with the request it received (headers and body), so that `curl -i`
//!   shows what the filter forwarded. An upstream that cannot be reached yields Envoy's
//!   `503` (`upstream connect error ...`), which passes through the filter's response
//!   callbacks as Envoy's router reply does.
//! * Callouts to `--cluster NAME=ADDR` go to real HTTP/1.1 servers.
//! * Bounded: at most `max_connections` connections (more wait in the kernel's accept
//!   queue), request bodies over `max_request_bytes` get `413`, request heads over 64 KiB
//!   are refused, upstream responses are capped at 16 MiB and 30 s.
//! * Graceful shutdown: when `shutdown` completes, workers stop accepting, let the
//!   requests in progress finish (up to `drain_timeout`), then stop; the guest metrics
//!   are printed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{Notify, Semaphore, oneshot, watch};

use crate::clock::SystemClock;
use crate::headers::Headers;
use crate::host::{FailurePolicy, Host, HostError, MetricsHandle};
use crate::logs::LogLevel;
use crate::metrics::MetricValue;
use crate::request::{ClientResponse, Message, Outcome, Request, Response, StreamId};
use crate::worker::Worker;

/// Everything `serve` needs to run.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The plugin; `None` runs the proxy without any filter (a baseline for benchmarks).
    pub wasm: Option<PathBuf>,
    /// The plugin configuration.
    pub plugin_configuration: Vec<u8>,
    /// The VM configuration.
    pub vm_configuration: Vec<u8>,
    /// The `vm_id` (scopes shared data).
    pub vm_id: String,
    /// The `root_id`.
    pub root_id: String,
    /// The plugin name.
    pub plugin_name: String,
    /// Where to listen (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Worker threads, each with its own VM.
    pub workers: usize,
    /// Where forwarded requests go; `None` for the built-in echo upstream.
    pub upstream: Option<Upstream>,
    /// Cluster names for callouts, mapped to HTTP/1.1 servers.
    pub clusters: Vec<(String, SocketAddr)>,
    /// Environment variables of the VMs (Envoy's `vm_config.environment_variables`).
    pub env: Vec<(String, String)>,
    /// What a trap does.
    pub failure_policy: FailurePolicy,
    /// Log lines below this level are dropped.
    pub log_level: LogLevel,
    /// Most connections served at once.
    pub max_connections: usize,
    /// Largest request body accepted.
    pub max_request_bytes: usize,
    /// How long requests in progress may take to finish after the shutdown signal.
    pub drain_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            wasm: None,
            plugin_configuration: Vec::new(),
            vm_configuration: Vec::new(),
            vm_id: String::new(),
            root_id: String::new(),
            plugin_name: String::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            workers: 2,
            upstream: None,
            clusters: Vec::new(),
            env: Vec::new(),
            failure_policy: FailurePolicy::default(),
            log_level: LogLevel::Info,
            max_connections: 1024,
            max_request_bytes: 1024 * 1024,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// A plain-HTTP upstream.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    /// A path prefix put in front of every forwarded path (may be empty).
    pub base_path: String,
}

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The plugin could not be loaded or started.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A thread or an event loop could not be started.
    #[error("cannot start {what}")]
    Start {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The largest upstream response body `serve` buffers.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How long an upstream may take to answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest request head (request line and headers) accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `serve` until `shutdown` completes, blocking the calling thread. Calls
/// `on_listening` with the bound address once the workers accept connections.
///
/// # Errors
/// [`ServeError`] when the plugin cannot start or the socket cannot be bound.
pub fn run(
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    // The plugin starts first: a bad module or configuration fails before the socket opens.
    let host = config.wasm.as_deref().map(|wasm| build_host(&config, wasm)).transpose()?;
    let metrics = host.as_ref().map(Host::metrics_handle);
    let mut vms: Vec<Option<Worker>> = match host {
        Some(host) => host.into_workers().into_iter().map(Some).collect(),
        None => (0..config.workers.max(1)).map(|_| None).collect(),
    };
    let listener = std::net::TcpListener::bind(config.listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let local = listener.local_addr().map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let settings = Arc::new(Settings {
        upstream: config.upstream.clone(),
        max_request_bytes: config.max_request_bytes,
        drain_timeout: config.drain_timeout,
        local,
    });
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let (stop, stopped) = watch::channel(false);
    let mut threads = Vec::new();
    for (index, vm) in vms.drain(..).enumerate() {
        let listener =
            listener.try_clone().map_err(|source| ServeError::Start { what: format!("worker {index}"), source })?;
        let (settings, permits, stopped) = (Arc::clone(&settings), Arc::clone(&permits), stopped.clone());
        let thread = std::thread::Builder::new()
            .name(format!("wasm-host-worker-{index}"))
            .spawn(move || worker_thread(vm, listener, settings, permits, stopped))
            .map_err(|source| ServeError::Start { what: format!("worker thread {index}"), source })?;
        threads.push(thread);
    }
    drop(listener);
    let signals = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServeError::Start { what: "the signal handler".to_owned(), source })?;
    // Poll `shutdown` once before announcing the address, so that signal handlers are in
    // place by the time anyone can act on the announcement.
    let mut shutdown = std::pin::pin!(shutdown);
    let already = signals.block_on(async {
        tokio::select! {
            biased;
            () = &mut shutdown => true,
            () = std::future::ready(()) => false,
        }
    });
    on_listening(local);
    if !already {
        signals.block_on(shutdown);
    }
    let _ = stop.send(true);
    for thread in threads {
        let _ = thread.join();
    }
    if let Some(metrics) = metrics {
        print_metrics(&metrics);
    }
    Ok(())
}

fn build_host(config: &ServeConfig, wasm: &Path) -> Result<Host, HostError> {
    let mut builder = Host::builder(wasm)
        .plugin_configuration(config.plugin_configuration.clone())
        .vm_configuration(config.vm_configuration.clone())
        .vm_id(config.vm_id.clone())
        .root_id(config.root_id.clone())
        .plugin_name(config.plugin_name.clone())
        .workers(config.workers)
        .failure_policy(config.failure_policy)
        .clock(Arc::new(SystemClock::new()))
        .log_level(config.log_level)
        .capture_logs(false)
        .record_callouts(false)
        .random_seed(None)
        .log_printer(|record| eprintln!("{record}"))
        .serve_mode();
    for (name, addr) in &config.clusters {
        builder = builder.cluster(name.clone(), *addr);
    }
    for (name, value) in &config.env {
        builder = builder.env(name.clone(), value.clone());
    }
    builder.build()
}

fn print_metrics(metrics: &MetricsHandle) {
    for (name, value) in metrics.all() {
        let value = match value {
            MetricValue::Counter(v) | MetricValue::Gauge(v) => v.to_string(),
            MetricValue::Histogram(h) => format!("count={} sum={}", h.count, h.sum),
        };
        eprintln!("wasm-host serve: metric {name} = {value}");
    }
}

/// What every worker thread needs to know.
struct Settings {
    upstream: Option<Upstream>,
    max_request_bytes: usize,
    drain_timeout: Duration,
    local: SocketAddr,
}

/// One worker thread: an event loop that accepts connections, serves them, and drives
/// its VM.
fn worker_thread(
    worker: Option<Worker>,
    listener: std::net::TcpListener,
    settings: Arc<Settings>,
    permits: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        eprintln!("wasm-host serve: a worker could not start its event loop");
        return;
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
        let vm = worker.map(|mut worker| {
            let wake = Arc::new(Notify::new());
            worker.set_waker(Arc::clone(&wake));
            Rc::new(Vm {
                worker: RefCell::new(worker),
                waiters: RefCell::new(HashMap::new()),
                wake,
                armed: Cell::new(None),
            })
        });
        if let Some(vm) = &vm {
            tokio::task::spawn_local(drive(Rc::clone(vm)));
        }
        let front = Rc::new(Front { vm, client: Client::builder(TokioExecutor::new()).build_http(), settings });
        let open = Rc::new(Cell::new(0usize));
        let closed = Rc::new(Notify::new());
        let mut stop = stopped.clone();
        loop {
            let permit = tokio::select! {
                _ = stop.changed() => break,
                permit = Arc::clone(&permits).acquire_owned() => match permit { Ok(p) => p, Err(_) => break },
            };
            let (socket, peer) = tokio::select! {
                _ = stop.changed() => break,
                accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
            };
            let _ = socket.set_nodelay(true);
            open.set(open.get() + 1);
            let (front, open, closed, mut stop) =
                (Rc::clone(&front), Rc::clone(&open), Rc::clone(&closed), stopped.clone());
            tokio::task::spawn_local(async move {
                let service = hyper::service::service_fn(move |request| {
                    let front = Rc::clone(&front);
                    async move { handle(front, request, peer).await }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(socket), service);
                tokio::pin!(connection);
                tokio::select! {
                    _ = connection.as_mut() => {}
                    _ = stop.changed() => {
                        connection.as_mut().graceful_shutdown();
                        let _ = connection.await;
                    }
                }
                drop(permit);
                open.set(open.get().saturating_sub(1));
                closed.notify_one();
            });
        }
        drop(listener);
        let drain = async {
            while open.get() > 0 {
                closed.notified().await;
            }
        };
        let _ = tokio::time::timeout(front.settings.drain_timeout, drain).await;
    });
}

/// A worker's VM and the streams waiting for the filter to decide.
struct Vm {
    worker: RefCell<Worker>,
    waiters: RefCell<HashMap<StreamId, oneshot::Sender<()>>>,
    /// Wakes [`drive`]: a message arrived, or a deadline moved earlier.
    wake: Arc<Notify>,
    /// The deadline [`drive`] sleeps until (`None`: until woken).
    armed: Cell<Option<u64>>,
}

impl Vm {
    /// After the filter ran for a connection: wakes the streams it decided, and the
    /// driver if the filter set a timer (or a callout timeout) earlier than it sleeps.
    fn changed(&self) {
        let next = self.worker.try_borrow().ok().and_then(|worker| worker.next_deadline());
        if let Some(next) = next
            && self.armed.get().is_none_or(|armed| next < armed)
        {
            self.wake.notify_one();
        }
        self.wake_decided();
    }

    /// Wakes the streams whose fate the filter has decided.
    fn wake_decided(&self) {
        let Ok(worker) = self.worker.try_borrow() else { return };
        let mut waiters = self.waiters.borrow_mut();
        let decided: Vec<StreamId> = waiters
            .keys()
            .copied()
            .filter(|s| !matches!(worker.outcome(*s), Ok(Outcome::Paused | Outcome::ResponsePaused)))
            .collect();
        for stream in decided {
            if let Some(waiter) = waiters.remove(&stream) {
                let _ = waiter.send(());
            }
        }
    }

    /// Waits until the filter has decided what happens to `stream`.
    async fn decision(&self, stream: StreamId) -> Decision {
        loop {
            let waiting = {
                let worker = self.worker.borrow();
                match worker.outcome(stream) {
                    Ok(Outcome::Forwarded(message)) => return Decision::Forward(message.clone()),
                    Ok(Outcome::Responded(response)) => return Decision::Respond(response.clone()),
                    Ok(Outcome::Reset) | Err(_) => return Decision::Reset,
                    Ok(Outcome::Paused | Outcome::ResponsePaused) => {
                        let (tx, rx) = oneshot::channel();
                        self.waiters.borrow_mut().insert(stream, tx);
                        rx
                    }
                }
            };
            if waiting.await.is_err() {
                return Decision::Reset;
            }
        }
    }
}

/// What the filter decided about a stream.
enum Decision {
    Forward(Message),
    Respond(ClientResponse),
    Reset,
}

/// A worker's event loop for its VM: delivers callout completions and queue
/// notifications as they arrive, and fires ticks and timeouts on time.
async fn drive(vm: Rc<Vm>) {
    loop {
        let (deadline, next) = {
            let mut worker = vm.worker.borrow_mut();
            worker.handle_messages();
            worker.fire_due();
            let deadline = worker.next_deadline();
            (deadline, deadline.map(|at| Duration::from_nanos(at.saturating_sub(worker.clock_monotonic()))))
        };
        vm.armed.set(deadline);
        vm.wake_decided();
        match next {
            Some(wait) => {
                tokio::select! {
                    () = vm.wake.notified() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
            None => vm.wake.notified().await,
        }
    }
}

/// What every connection of a worker shares.
struct Front {
    vm: Option<Rc<Vm>>,
    client: Client<HttpConnector, Full<Bytes>>,
    settings: Arc<Settings>,
}

/// Finishes the stream on the filter when the handler ends, however it ends (the client
/// may go away while the filter holds the request).
struct FinishOnDrop {
    vm: Rc<Vm>,
    stream: StreamId,
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.vm.waiters.borrow_mut().remove(&self.stream);
        if let Ok(mut worker) = self.vm.worker.try_borrow_mut() {
            let _ = worker.finish(self.stream);
        }
        self.vm.changed();
    }
}

/// The error that makes hyper drop a connection: what a client sees for a reset stream.
#[derive(Debug)]
struct StreamReset;

impl std::fmt::Display for StreamReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the filter reset the stream")
    }
}

impl std::error::Error for StreamReset {}

type HttpResponse = hyper::Response<Full<Bytes>>;

async fn handle(
    front: Rc<Front>,
    request: hyper::Request<Incoming>,
    peer: SocketAddr,
) -> Result<HttpResponse, StreamReset> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, front.settings.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(to_http(&Headers::from_pairs([(":status", "413")]), b"request body too large\n")),
    };
    let local = front.settings.local;
    let mut headers = Headers::new();
    headers.add(":method", parts.method.as_str());
    headers.add(":scheme", "http");
    let authority = parts
        .headers
        .get(hyper::header::HOST)
        .map(|h| h.as_bytes().to_vec())
        .or_else(|| parts.uri.authority().map(|a| a.as_str().as_bytes().to_vec()))
        .unwrap_or_else(|| local.to_string().into_bytes());
    headers.add(":authority", authority);
    headers.add(":path", parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST {
            headers.add(name.as_str(), value.as_bytes());
        }
    }
    let mut request = Request::from_headers(headers).source(peer).destination(local);
    if !body.is_empty() {
        request = request.body(body.to_vec());
    }
    let Some(vm) = front.vm.clone() else {
        // No filter: straight to the upstream.
        let response = forward(&front, &request.message).await;
        return Ok(to_http(&response.message.headers, response.message.body_bytes()));
    };
    let stream = vm.worker.borrow_mut().request(request);
    let _finish = FinishOnDrop { vm: Rc::clone(&vm), stream };
    vm.changed();
    let message = match vm.decision(stream).await {
        Decision::Forward(message) => message,
        Decision::Respond(response) => return Ok(to_http(&response.headers, &response.body)),
        Decision::Reset => return Err(StreamReset),
    };
    let upstream = forward(&front, &message).await;
    let accepted = vm.worker.borrow_mut().respond(stream, upstream).is_ok();
    vm.changed();
    if !accepted {
        return Err(StreamReset);
    }
    match vm.decision(stream).await {
        Decision::Respond(response) => Ok(to_http(&response.headers, &response.body)),
        Decision::Forward(_) | Decision::Reset => Err(StreamReset),
    }
}

/// Sends a forwarded request to the upstream (or the echo upstream) and reads the
/// response; an unreachable upstream yields Envoy's router reply.
async fn forward(front: &Front, message: &Message) -> Response {
    let Some(upstream) = &front.settings.upstream else {
        return echo(message);
    };
    match send_upstream(front, upstream, message).await {
        Some(response) => response.upstream(upstream.addr),
        None => Response::new(503)
            .header("content-type", "text/plain")
            .body(&b"upstream connect error or disconnect/reset before headers. reset reason: connection failure"[..])
            .upstream(upstream.addr),
    }
}

async fn send_upstream(front: &Front, upstream: &Upstream, message: &Message) -> Option<Response> {
    let method = hyper::Method::from_bytes(message.headers.get(":method")?).ok()?;
    let path = String::from_utf8_lossy(message.headers.get(":path").unwrap_or(b"/")).into_owned();
    let uri: hyper::Uri = format!("http://{}{}{}", upstream.addr, upstream.base_path, path).parse().ok()?;
    let mut builder = hyper::Request::builder().method(method).uri(uri);
    if let Some(authority) = message.headers.get(":authority") {
        builder = builder.header(hyper::header::HOST, authority);
    }
    for (name, value) in message.headers.iter() {
        if name.first() == Some(&b':') || is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        builder = builder.header(name, value);
    }
    let request = builder.body(Full::new(Bytes::from(message.body_bytes().to_vec()))).ok()?;
    let response = tokio::time::timeout(UPSTREAM_TIMEOUT, front.client.request(request)).await.ok()?.ok()?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await.ok()?.to_bytes();
    let mut headers = Headers::from_pairs([(":status", parts.status.as_u16().to_string())]);
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name.as_str().as_bytes()) {
            headers.add(name.as_str(), value.as_bytes());
        }
    }
    let mut response = Response::from_headers(headers);
    if !body.is_empty() {
        response = response.body(body.to_vec());
    }
    Some(response)
}

/// The built-in upstream: `200` with the request as it arrived, so that a `curl` shows
/// what the filter forwarded.
fn echo(message: &Message) -> Response {
    let mut text = String::new();
    for (name, value) in message.headers.iter() {
        text.push_str(&String::from_utf8_lossy(name));
        text.push_str(": ");
        text.push_str(&String::from_utf8_lossy(value));
        text.push('\n');
    }
    if let Some(body) = &message.body {
        text.push('\n');
        text.push_str(&String::from_utf8_lossy(body));
        text.push('\n');
    }
    Response::ok().header("content-type", "text/plain").header("x-echo-upstream", "wasm-host").body(text.into_bytes())
}

fn is_hop_by_hop(name: &[u8]) -> bool {
    const HOP: [&[u8]; 7] =
        [b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade"];
    HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn to_http(headers: &Headers, body: &[u8]) -> HttpResponse {
    let status = headers.get_str(":status").and_then(|s| s.parse::<u16>().ok()).unwrap_or(502);
    let mut response = hyper::Response::new(Full::new(Bytes::from(body.to_vec())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    for (name, value) in headers.iter() {
        if name.first() == Some(&b':') || is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (hyper::header::HeaderName::from_bytes(name), hyper::header::HeaderValue::from_bytes(value))
        {
            response.headers_mut().append(name, value);
        }
    }
    response
}

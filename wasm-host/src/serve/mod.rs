//! `wasm-host serve`: an HTTP/1.1 reverse proxy on loopback that runs the plugin as
//! Envoy would, for trying a filter with `curl` and for measuring it under load.
//!
//! * N worker threads, each with its own VM; each accepted connection is assigned to one
//!   worker (round robin), as Envoy assigns connections to its workers.
//! * The real clock: ticks and callout timeouts fire on time.
//! * Requests the filter forwards go to `--upstream`, or to a built-in echo upstream
//!   that answers `200` with the request it received (method, path, headers, body).
//!   An upstream that cannot be reached yields Envoy's `503` (`upstream connect error
//!   ...`), which passes through the filter's response callbacks as Envoy's router
//!   reply does.
//! * Callouts to `--cluster NAME=ADDR` go to real HTTP/1.1 servers.
//! * Bounded: at most `max_connections` connections (more wait in the kernel's accept
//!   queue), request bodies over `max_request_bytes` get `413`, request heads over
//!   64 KiB are refused, upstream responses are capped at 16 MiB.
//! * Graceful shutdown: on the shutdown signal it stops accepting, lets requests in
//!   progress finish (up to `drain_timeout`), then stops the workers.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot, watch};

use crate::clock::SystemClock;
use crate::headers::Headers;
use crate::host::{FailurePolicy, Host, HostError};
use crate::logs::LogLevel;
use crate::metrics::MetricValue;
use crate::request::{ClientResponse, Message, Outcome, Request, Response, StreamId};
use crate::worker::{Inbox, Worker};

/// Everything `serve` needs to run.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The plugin; `None` runs the proxy without any filter (a baseline for benchmarks).
    pub wasm: Option<PathBuf>,
    /// The plugin configuration.
    pub plugin_configuration: Vec<u8>,
    /// The VM configuration.
    pub vm_configuration: Vec<u8>,
    /// `vm_id`, `root_id` and plugin `name`.
    pub vm_id: String,
    /// See `vm_id`.
    pub root_id: String,
    /// See `vm_id`.
    pub plugin_name: String,
    /// Where to listen (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Worker threads, each with its own VM.
    pub workers: usize,
    /// Where forwarded requests go; `None` for the built-in echo upstream.
    pub upstream: Option<Upstream>,
    /// Cluster names for callouts, mapped to HTTP/1.1 servers.
    pub clusters: Vec<(String, SocketAddr)>,
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
    /// A worker thread could not be started.
    #[error("cannot start worker thread {index}")]
    Thread {
        /// The worker.
        index: usize,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A command from the HTTP front end to a worker thread.
pub(crate) enum Command {
    Request { request: Request, reply: oneshot::Sender<Decision> },
    Respond { stream: StreamId, response: Response, reply: oneshot::Sender<Decision> },
    Finish { stream: StreamId },
    Shutdown,
}

/// What the filter decided about a stream, once it decided.
pub(crate) enum Decision {
    Forward { stream: StreamId, message: Message },
    Respond { stream: StreamId, response: ClientResponse },
    Reset { stream: StreamId },
}

/// The workers, each on its own thread.
struct Workers {
    metrics: crate::host::MetricsHandle,
    senders: Vec<Sender<Inbox>>,
    threads: Vec<JoinHandle<()>>,
    next: AtomicUsize,
}

impl Workers {
    fn start(config: &ServeConfig, wasm: &Path, handle: tokio::runtime::Handle) -> Result<Self, ServeError> {
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
            .io_runtime(handle)
            .serve_mode();
        for (name, addr) in &config.clusters {
            builder = builder.cluster(name.clone(), *addr);
        }
        let host = builder.build()?;
        let metrics = host.metrics_handle();
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        for worker in host.into_workers() {
            let index = worker.index();
            senders.push(worker.inbox_sender());
            let thread = std::thread::Builder::new()
                .name(format!("wasm-host-worker-{index}"))
                .spawn(move || worker_loop(worker))
                .map_err(|source| ServeError::Thread { index, source })?;
            threads.push(thread);
        }
        Ok(Self { metrics, senders, threads, next: AtomicUsize::new(0) })
    }

    fn pick(&self) -> Sender<Inbox> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len().max(1);
        self.senders.get(index).cloned().unwrap_or_else(|| std::sync::mpsc::channel().0)
    }

    fn stop(self) {
        for sender in &self.senders {
            let _ = sender.send(Inbox::Serve(Command::Shutdown));
        }
        for thread in self.threads {
            let _ = thread.join();
        }
        for (name, value) in self.metrics.all() {
            let value = match value {
                MetricValue::Counter(v) | MetricValue::Gauge(v) => v.to_string(),
                MetricValue::Histogram(h) => format!("count={} sum={}", h.count, h.sum),
            };
            eprintln!("wasm-host serve: metric {name} = {value}");
        }
    }
}

/// One worker thread: waits for commands, callout completions and timers, and answers
/// each waiting stream as soon as the filter has decided.
fn worker_loop(mut worker: Worker) {
    let mut waiters: HashMap<StreamId, oneshot::Sender<Decision>> = HashMap::new();
    loop {
        let timeout =
            worker.next_deadline().map(|at| Duration::from_nanos(at.saturating_sub(worker.clock_monotonic())));
        match worker.receive(timeout) {
            Ok(message) => match worker.handle_inbox(message) {
                Some(Command::Request { request, reply }) => {
                    let stream = worker.request(request);
                    waiters.insert(stream, reply);
                }
                Some(Command::Respond { stream, response, reply }) => {
                    if worker.respond(stream, response).is_ok() {
                        waiters.insert(stream, reply);
                    } else {
                        let _ = reply.send(Decision::Reset { stream });
                    }
                }
                Some(Command::Finish { stream }) => {
                    waiters.remove(&stream);
                    let _ = worker.finish(stream);
                }
                Some(Command::Shutdown) => return,
                None => {}
            },
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        worker.fire_due();
        let ready: Vec<(StreamId, Decision)> =
            waiters.keys().filter_map(|stream| decide(&worker, *stream).map(|d| (*stream, d))).collect();
        for (stream, decision) in ready {
            if let Some(reply) = waiters.remove(&stream) {
                let _ = reply.send(decision);
            }
        }
    }
}

/// The decision for a stream, if the filter has made one.
fn decide(worker: &Worker, stream: StreamId) -> Option<Decision> {
    match worker.outcome(stream) {
        Ok(Outcome::Forwarded(message)) => Some(Decision::Forward { stream, message: message.clone() }),
        Ok(Outcome::Responded(response)) => Some(Decision::Respond { stream, response: response.clone() }),
        Ok(Outcome::Reset) | Err(_) => Some(Decision::Reset { stream }),
        Ok(Outcome::Paused | Outcome::ResponsePaused) => None,
    }
}

/// Finishes the stream on its worker when the connection's handler ends, however it
/// ends (the client may go away while the filter holds the request).
struct FinishOnDrop {
    worker: Sender<Inbox>,
    stream: Option<StreamId>,
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            let _ = self.worker.send(Inbox::Serve(Command::Finish { stream }));
        }
    }
}

/// What the front end shares between connections.
struct Front {
    workers: Option<Workers>,
    upstream: Option<Upstream>,
    client: Client<HttpConnector, Full<Bytes>>,
    max_request_bytes: usize,
}

/// The largest upstream response body `serve` buffers.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How long an upstream may take to answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest request head (request line and headers) accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;

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

fn plain(status: u16, body: &str) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    response
}

/// Runs `serve` until `shutdown` completes. Calls `on_listening` with the bound address
/// once the socket is open (before any request is accepted).
///
/// # Errors
/// [`ServeError`] when the plugin cannot start or the socket cannot be bound.
pub async fn run(
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let workers = match &config.wasm {
        Some(wasm) => Some(Workers::start(&config, wasm, tokio::runtime::Handle::current())?),
        None => None,
    };
    let listener =
        TcpListener::bind(config.listen).await.map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let local = listener.local_addr().map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    on_listening(local);
    let client = Client::builder(TokioExecutor::new()).build_http();
    let front = Arc::new(Front {
        workers,
        upstream: config.upstream.clone(),
        client,
        max_request_bytes: config.max_request_bytes,
    });
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit { Ok(p) => p, Err(_) => break },
        };
        let (socket, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
        };
        let _ = socket.set_nodelay(true);
        let worker = front.workers.as_ref().map(Workers::pick);
        let front = Arc::clone(&front);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let front = Arc::clone(&front);
                let worker = worker.clone();
                async move { handle(front, worker, request, peer, local).await }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
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
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit: when all are back, every connection has closed.
    let all = u32::try_from(config.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(config.drain_timeout, permits.acquire_many(all)).await;
    if let Ok(front) = Arc::try_unwrap(front)
        && let Some(workers) = front.workers
    {
        tokio::task::spawn_blocking(move || workers.stop()).await.ok();
    }
    Ok(())
}

async fn handle(
    front: Arc<Front>,
    worker: Option<Sender<Inbox>>,
    request: hyper::Request<Incoming>,
    peer: SocketAddr,
    local: SocketAddr,
) -> Result<HttpResponse, StreamReset> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, front.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(plain(413, "request body too large\n")),
    };
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
    let Some(worker) = worker else {
        // No filter: straight to the upstream.
        let message = request.message.clone();
        let response = forward(&front, &message).await;
        return Ok(to_http(&response.message.headers, response.message.body.as_deref().unwrap_or_default()));
    };
    let mut guard = FinishOnDrop { worker: worker.clone(), stream: None };
    let (reply, decided) = oneshot::channel();
    if worker.send(Inbox::Serve(Command::Request { request, reply })).is_err() {
        return Ok(plain(503, "wasm-host is shutting down\n"));
    }
    let decision = decided.await.map_err(|_| StreamReset)?;
    let (stream, message) = match decision {
        Decision::Forward { stream, message } => (stream, message),
        Decision::Respond { stream, response } => {
            guard.stream = Some(stream);
            return Ok(to_http(&response.headers, &response.body));
        }
        Decision::Reset { stream } => {
            guard.stream = Some(stream);
            return Err(StreamReset);
        }
    };
    guard.stream = Some(stream);
    let upstream = forward(&front, &message).await;
    let (reply, decided) = oneshot::channel();
    if worker.send(Inbox::Serve(Command::Respond { stream, response: upstream, reply })).is_err() {
        return Ok(plain(503, "wasm-host is shutting down\n"));
    }
    match decided.await.map_err(|_| StreamReset)? {
        Decision::Respond { response, .. } => Ok(to_http(&response.headers, &response.body)),
        Decision::Forward { .. } | Decision::Reset { .. } => Err(StreamReset),
    }
}

/// Sends a forwarded request to the upstream (or the echo upstream) and reads the
/// response; an unreachable upstream yields Envoy's router reply.
async fn forward(front: &Front, message: &Message) -> Response {
    let Some(upstream) = &front.upstream else {
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

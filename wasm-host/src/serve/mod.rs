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
//!
//! This file has the configuration, the start and the shutdown, and each worker's accept
//! loop; `vm.rs` how a worker drives its VM; `exchange.rs` how one request goes through
//! the filter and to the upstream.

mod exchange;
mod vm;

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Notify, Semaphore, watch};

use crate::clock::SystemClock;
use crate::host::{FailurePolicy, Host, HostError, MetricsHandle};
use crate::logs::LogLevel;
use crate::metrics::MetricValue;
use crate::worker::Worker;
use exchange::{Front, handle};
use vm::{Vm, drive};

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
        let vm = worker.map(Vm::new);
        if let Some(vm) = &vm {
            tokio::task::spawn_local(drive(Rc::clone(vm)));
        }
        let drain_timeout = settings.drain_timeout;
        let front = Rc::new(Front::new(vm, settings));
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
        let _ = tokio::time::timeout(drain_timeout, drain).await;
    });
}

//! The second front door: Envoy's rate limit service protocol (RLS v3), so that Envoy's
//! own `envoy.filters.http.ratelimit` filter can use Sluice's counters without a wasm
//! module, configured by envoyproxy/ratelimit's YAML.
//!
//! * [`identity`] names the counter a descriptor counts in;
//! * [`config`] loads the YAML; [`matching`] finds a descriptor's rule in it;
//! * [`decide`] decides a request on the stores, each descriptor on its own, or
//!   [`together`] when its domain asks for all or nothing; [`headers`] and
//!   [`metadata`] add what the operator asked for to the answer;
//! * [`watch`] keeps the configuration in force and reloads its directory;
//! * [`grpc`] is the tonic service; [`serve`] runs it on its own listener.
//!
//! What matches envoyproxy/ratelimit and what differs on purpose is in
//! `counter-service/docs/rls.md`.

pub mod config;
pub mod decide;
pub mod grpc;
pub mod headers;
pub mod identity;
pub mod matching;
pub mod metadata;
pub mod together;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::app::App;
use crate::config::Config;

/// The RLS front door, serving.
#[derive(Debug)]
pub struct Front {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The configuration in force.
    pub loaded: Arc<watch::Loaded>,
    /// The server, until it stops.
    pub task: JoinHandle<anyhow::Result<()>>,
}

/// Starts the RLS front door when `config` asks for it (`--rls-config`): loads the
/// directory, binds `--rls-listen`, serves until `shutdown` completes. Must be called
/// within a Tokio runtime.
///
/// # Errors
/// When the directory does not load (the error names the file and the descriptor), the
/// header list names an unknown set, or the address cannot be bound.
pub fn start(
    app: Arc<App>,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<Front>> {
    let Some(dir) = &config.rls_config else { return Ok(None) };
    let headers: headers::ResponseHeaders =
        config.rls_response_headers.parse().map_err(|e| anyhow::anyhow!("--rls-response-headers: {e}"))?;
    let loaded = Arc::new(watch::Loaded::load(dir, config.rls_merge_domains).map_err(|e| {
        app.metrics().rls().config_load(false);
        anyhow::anyhow!("--rls-config: {e}")
    })?);
    app.metrics().rls().config_load(true);
    let std_listener = std::net::TcpListener::bind(config.rls_listen)
        .map_err(|e| anyhow::anyhow!("cannot listen for rls on {}: {e}", config.rls_listen))?;
    std_listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(std_listener)?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, dir = %dir.display(), "rls (envoy.service.ratelimit.v3) serving");
    let rls = grpc::Rls::new(app.clone(), loaded.clone(), headers)
        .with_dynamic_metadata(config.rls_response_dynamic_metadata);
    let reload = Duration::from_millis(config.rls_reload_ms);
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let task = tokio::spawn(serve(listener, rls, loaded.clone(), app, reload, grace, shutdown));
    Ok(Some(Front { addr, loaded, task }))
}

/// Serves `ShouldRateLimit` on `listener` (h2c gRPC) until `shutdown` completes, then
/// drains within `grace`, reloading the configuration's directory every `reload`
/// meanwhile.
///
/// Connections are accepted and served as the JSON API's are
/// ([`crate::server::accept_until`]): the same bound on connections, pings, idle
/// timeout and drain, on hyper's HTTP/2 server without tonic's router (which cost
/// about 8 % of a decision's CPU: docs/benchmarks.md, "RLS v3 again").
///
/// # Errors
/// Never at present: accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    rls: grpc::Rls,
    loaded: Arc<watch::Loaded>,
    app: Arc<App>,
    reload: Duration,
    grace: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let reloading = app.clone();
    let watcher = tokio::spawn(async move {
        let app = reloading;
        let mut ticks = tokio::time::interval(reload);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let loaded = loaded.clone();
            let app = app.clone();
            // Reading files blocks: off the runtime's workers.
            let _ = tokio::task::spawn_blocking(move || loaded.reload(app.metrics())).await;
        }
    });
    let (alive, streams_alive) = tokio::sync::watch::channel(());
    let http2 = Arc::new(crate::server::http2_builder(streams_alive));
    let service = rls.into_service();
    let serve = move |stream, draining, held| connection(stream, service.clone(), http2.clone(), draining, held);
    let stop = async move {
        shutdown.await;
        crate::server::Stop::Graceful
    };
    crate::server::accept_until(listener, &app, grace, alive, serve, stop).await;
    watcher.abort();
    Ok(())
}

/// Serves one accepted connection: HTTP/2 cleartext (gRPC), with the JSON API's pings,
/// stream bound, idle timeout and drain ([`crate::conn`]).
async fn connection(
    stream: tokio::net::TcpStream,
    service: grpc::RlsServer,
    http2: Arc<hyper::server::conn::http2::Builder<crate::conn::StreamExecutor>>,
    draining: tokio::sync::watch::Receiver<bool>,
    held: crate::server::Held,
) {
    let activity = Arc::new(crate::conn::Activity::default());
    let service = crate::conn::tracked(hyper_util::service::TowerToHyperService::new(service), &activity);
    let io = hyper_util::rt::TokioIo::new(stream);
    let idle = Some((activity, crate::conn::H2_IDLE_TIMEOUT));
    crate::conn::drive(http2.serve_connection(io, service), draining, idle).await;
    drop(held);
}

//! sluice-counter: what decides Sluice's global policies, the central counter service.
//!
//! The filter calls it over HTTP/1.1 or HTTP/2 cleartext + JSON (`POST /v1/check`,
//! `POST /v1/lease`, `POST /v1/charge`, `POST /v1/credit`) once per request for all of
//! that request's global policies (a lease, a charge or a credit when its mode calls for
//! one: a credit gives back what a check spent on an estimate and the response did not
//! use). The service is stateless in
//! front of its store: in memory by default (one process, no setup), or Redis
//! (standalone or Redis Cluster), where every decision is one atomic Lua script on the
//! node that owns the keys, timed by Redis' own clock.
//!
//! The protocol, the error codes and the numeric envelope are documented with examples
//! in `counter-service/README.md`. The request and response bodies, the limits and the
//! envelope are defined once, for this service and the filter, in `sluice-protocol`.
//!
//! # Layout
//!
//! From the bottom up (`tests/it/layers.rs` holds the modules to it: each imports only
//! from its own layer and those below, and none in a circle):
//!
//! * [`spec`] holds validated limits with what the Redis script runs.
//! * [`api`] holds strict parsing and the validation of requests into plans, and the
//!   API's errors; [`overrides`] holds operators' overrides and their validation.
//! * [`store`] holds [`store::MemoryCounters`] (shared-store's algorithms behind a
//!   sharded map) and [`store::RedisCounters`] (the same algorithms as one Lua script).
//! * [`call`] holds a validated request and the store's outcome; [`policies`] the
//!   policy names requests have given, which overrides are validated against.
//! * [`enforce`] applies the live overrides to a request before the store decides it.
//! * [`auth`] checks callers' bearer token, [`config`] reads flags and environment
//!   variables, [`metrics`] keeps the Prometheus metrics and renders them.
//! * [`app`] holds [`App`], what every request is served with, and builds the
//!   configured store.
//! * [`handle`] holds one decision request, shared by the HTTP routes and by
//!   [`App::handle_now`], the synchronous entry for deterministic simulations;
//!   [`batch`] several independent checks in one call (`POST /v1/checks`);
//!   [`admin`] holds the admin API's changes to overrides, audited and counted.
//! * [`routes`] holds the routes, bounds (body size, requests in flight) and error
//!   responses; [`conn`] holds one connection: HTTP/1.1 or h2c on the same port,
//!   timeouts, drain.
//! * [`server`] accepts connections and shuts down, gracefully or at once.
//! * [`cli`] is the binary's `override` subcommand: a client of the admin API.
//!
//! # Embedding and tests
//!
//! [`run`] serves on a listener the caller binds (port 0 in tests) until a shutdown
//! future completes, as mini-redis does; the binary is a thin wrapper around it.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = sluice_counter::config::Config::defaults();
//! sluice_counter::run(listener, config, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![deny(missing_docs)]

pub mod admin;
pub mod api;
pub mod app;
pub mod auth;
pub mod batch;
pub mod call;
pub mod cli;
pub mod config;
pub mod conn;
pub mod enforce;
pub mod handle;
pub mod metrics;
pub mod overrides;
pub mod policies;
pub mod rls;
pub mod routes;
pub mod server;
pub mod spec;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

pub use app::App;
pub use config::Config;

/// Builds the configured store and serves on `listener` until `shutdown` completes.
///
/// # Errors
/// When the token cannot be read, the store cannot be built (bad Redis URL) or the
/// listener fails.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let auth = config.auth().map_err(anyhow::Error::msg)?;
    let admin = config.admin(&auth, |name| std::env::var(name).ok()).map_err(anyhow::Error::msg)?;
    let store = app::build_store(&config).await?;
    let local = listener.local_addr().ok();
    if !auth.is_required() && local.is_some_and(|a| !a.ip().is_loopback()) {
        tracing::warn!(
            addr = ?local,
            "serving beyond loopback without a bearer token: anyone who can connect can spend any counter; \
             set --token-file"
        );
    }
    let app = Arc::new(App::new(store, &config, auth).with_admin(admin));
    tracing::info!(
        addr = ?local,
        store = app.store().name(),
        auth = app.auth_name(),
        admin = app.admin_enabled(),
        "sluice-counter serving"
    );
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let rls = rls::start(app.clone(), &config, until_true(stopped))?;
    let served = server::serve(
        listener,
        app,
        Duration::from_millis(config.shutdown_grace_ms),
        Duration::from_millis(config.sweep_interval_ms),
        async move {
            shutdown.await;
            let _ = stopping.send(true);
        },
    )
    .await;
    if let Some(front) = rls {
        front.task.await??;
    }
    served
}

/// Completes when `flag` turns true or its sender is gone.
async fn until_true(mut flag: tokio::sync::watch::Receiver<bool>) {
    let _ = flag.wait_for(|stop| *stop).await;
}

/// A service running in this process (tests, embedding).
#[derive(Debug)]
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state, to inspect the store and metrics.
    pub app: Arc<App>,
    /// The RLS front door, when `--rls-config` asked for it.
    pub rls: Option<rls::Front>,
    stop: Option<tokio::sync::oneshot::Sender<server::Stop>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    rls_stop: tokio::sync::watch::Sender<bool>,
}

impl Running {
    /// Starts a service on `listener` with `config`.
    ///
    /// # Errors
    /// When the token cannot be read, the store cannot be built or the listener has no
    /// address.
    pub async fn start(listener: TcpListener, config: Config) -> anyhow::Result<Self> {
        Self::start_with_env(listener, config, |name| std::env::var(name).ok()).await
    }

    /// [`Running::start`], reading the environment variables the configuration names
    /// (`--admin-token-env`, `--hash-key-env`) through `env` (tests give their own).
    ///
    /// # Errors
    /// As [`Running::start`], and when a variable named is missing or malformed.
    pub async fn start_with_env(
        listener: TcpListener,
        config: Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let auth = config.auth().map_err(anyhow::Error::msg)?;
        let admin = config.admin(&auth, env).map_err(anyhow::Error::msg)?;
        let store = app::build_store(&config).await?;
        Self::serve_app(listener, &config, App::new(store, &config, auth).with_admin(admin))
    }

    /// Starts a service on `listener` with `config`, serving `store` (built by the
    /// caller: a memory store on a test clock, say) instead of the configured one.
    ///
    /// # Errors
    /// When the token cannot be read or the listener has no address.
    pub fn start_with_store(listener: TcpListener, config: Config, store: store::CounterStore) -> anyhow::Result<Self> {
        let auth = config.auth().map_err(anyhow::Error::msg)?;
        Self::serve_app(listener, &config, App::new(store, &config, auth))
    }

    /// Serves `app` (built by the caller: with a test clock and an admin token, say) on
    /// `listener`, with `config`'s timings.
    ///
    /// # Errors
    /// When the listener has no address.
    pub fn serve_app(listener: TcpListener, config: &Config, app: App) -> anyhow::Result<Self> {
        let app = Arc::new(app);
        let addr = listener.local_addr()?;
        let (rls_stop, rls_stopped) = tokio::sync::watch::channel(false);
        let rls = rls::start(app.clone(), config, until_true(rls_stopped))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<server::Stop>();
        let task = tokio::spawn(server::serve_until(
            listener,
            app.clone(),
            Duration::from_millis(config.shutdown_grace_ms),
            Duration::from_millis(config.sweep_interval_ms),
            // A `Running` dropped without `stop` or `kill` shuts down gracefully.
            async move { stopped.await.unwrap_or(server::Stop::Graceful) },
        ));
        Ok(Self { addr, app, rls, stop: Some(stop), task, rls_stop })
    }

    /// Shuts down gracefully and waits for the server to finish.
    ///
    /// # Errors
    /// When the server failed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(server::Stop::Graceful);
        }
        self.stop_rls().await?;
        (&mut self.task).await?
    }

    async fn stop_rls(&mut self) -> anyhow::Result<()> {
        let _ = self.rls_stop.send(true);
        match self.rls.take() {
            Some(front) => front.task.await?,
            None => Ok(()),
        }
    }

    /// Stops the service abruptly, as a crash would: the listener and every connection
    /// are closed at once, requests in flight get no answer (a store write they had
    /// sent may still land, as it could in a crash), nothing is drained. When this
    /// returns, the address is free: a new service can be started on it (tokio binds
    /// listeners with `SO_REUSEADDR`, so the closed connections' `TIME_WAIT` does not
    /// hold the port).
    ///
    /// # Errors
    /// When the server had failed before it was killed.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(server::Stop::Kill);
        }
        if let Some(front) = self.rls.take() {
            front.task.abort();
        }
        (&mut self.task).await?
    }
}

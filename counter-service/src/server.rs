//! The HTTP server: routes, error responses, bounds, and graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::api::ApiError;
use crate::auth::Auth;
use crate::config::{Config, StoreKind};
use crate::conn;
use crate::handle::Route;
use crate::metrics::Metrics;
use crate::store::{CounterStore, CounterStoreError, MemoryCounters, RedisCounters};

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    store: CounterStore,
    metrics: Metrics,
    auth: Auth,
    max_entries: usize,
    max_body: usize,
    request_timeout: Duration,
    in_flight: Arc<Semaphore>,
    connections: Arc<Semaphore>,
    /// Seconds since start at which a store error was last logged (one line per second
    /// at most, so an outage does not flood the logs).
    last_error_log: AtomicU64,
    started: Instant,
}

impl App {
    /// An app serving `store` with `config`'s bounds, to the callers `auth` admits
    /// ([`Config::auth`] reads them from the configuration).
    pub fn new(store: CounterStore, config: &Config, auth: Auth) -> Self {
        Self {
            store,
            metrics: Metrics::default(),
            auth,
            max_entries: usize::from(config.max_entries),
            max_body: usize::try_from(config.max_body_bytes).unwrap_or(usize::MAX),
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            in_flight: Arc::new(Semaphore::new(usize::try_from(config.max_in_flight).unwrap_or(1024))),
            connections: Arc::new(Semaphore::new(usize::try_from(config.max_connections).unwrap_or(4096))),
            last_error_log: AtomicU64::new(u64::MAX),
            started: Instant::now(),
        }
    }

    /// The store.
    pub fn store(&self) -> &CounterStore {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// How callers are authenticated, for the startup log line: `bearer` or `none`.
    pub const fn auth_name(&self) -> &'static str {
        if self.auth.is_required() { "bearer" } else { "none" }
    }

    pub(crate) fn max_entries(&self) -> usize {
        self.max_entries
    }

    pub(crate) fn max_body(&self) -> usize {
        self.max_body
    }

    /// Whether a request with these `authorization` header values may proceed; a
    /// refusal is logged (at `debug`) and counted.
    pub(crate) fn authenticate<'a>(&self, values: impl Iterator<Item = &'a [u8]>) -> Result<(), ApiError> {
        self.auth.check_values(values).map_err(|refusal| {
            tracing::debug!(%refusal, "caller refused");
            self.metrics.unauthorized();
            ApiError { status: 401, code: "unauthorized", message: refusal.to_string() }
        })
    }

    /// One of the `--max-in-flight` permits, or `503 overloaded` (counted) at once.
    pub(crate) fn in_flight_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.in_flight.clone().try_acquire_owned().map_err(|_| {
            self.metrics.shed();
            ApiError {
                status: 503,
                code: "overloaded",
                message: "too many requests in flight; retry later or add instances".to_owned(),
            }
        })
    }

    pub(crate) fn log_store_error(&self, error: &CounterStoreError) {
        let now = self.started.elapsed().as_secs();
        let last = self.last_error_log.swap(now, Ordering::Relaxed);
        if last != now {
            tracing::warn!(store = self.store.name(), kind = error.kind(), %error, "store call failed");
        }
    }

    async fn timed<T>(&self, call: impl Future<Output = Result<T, CounterStoreError>>) -> Result<T, ApiError> {
        let start = Instant::now();
        let result = call.await;
        self.metrics.store_latency(start.elapsed());
        result.map_err(|error| {
            self.metrics.store_error(&error);
            self.log_store_error(&error);
            ApiError { status: 503, code: error.code(), message: error.to_string() }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

/// The router with every route and bound.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/lease", post(lease))
        .route("/v1/charge", post(charge))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), bound))
        // `bound` has read the body within --max-body-bytes already.
        .layer(DefaultBodyLimit::disable())
        .with_state(app)
}

/// Refuses callers without the configured token (except on the probes, which
/// orchestrators and scrapers call without one), reads the whole body within
/// `max_body` bytes and `request_timeout`, then sheds requests beyond `max_in_flight`
/// (except liveness and metrics, which must answer under overload), keeps the in-flight
/// gauge and counts statuses.
///
/// The permit is taken only once the request is whole: a caller that sends headers and
/// then a body slowly, or never, holds no permit while it does (it holds a connection,
/// or an HTTP/2 stream, bounded by `--max-connections` and the streams per connection,
/// until the request timeout answers it `408`).
async fn bound(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if matches!(path, "/healthz" | "/metrics") {
        return next.run(request).await;
    }
    // Before anything else: a refused caller costs a header comparison, no read.
    if path != "/readyz"
        && let Err(refused) =
            app.authenticate(request.headers().get_all(header::AUTHORIZATION).iter().map(|v| v.as_bytes()))
    {
        app.metrics.response(401);
        return unauthorized(refused);
    }
    let (parts, body) = request.into_parts();
    let read = {
        let _reading = app.metrics.reading();
        read_body(body, app.max_body, app.request_timeout).await
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(error) => {
            let timed_out = error.status == 408;
            let mut response = error.into_response();
            if timed_out && parts.version <= axum::http::Version::HTTP_11 {
                // The rest of the body may still come: this connection cannot carry
                // another request (RFC 9110 §15.5.9).
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            app.metrics.response(response.status().as_u16());
            return response;
        }
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    let response = match app.in_flight_permit() {
        Ok(permit) => {
            let _gauge = app.metrics.start();
            let response = next.run(request).await;
            drop(permit);
            response
        }
        Err(overloaded) => overloaded.into_response(),
    };
    app.metrics.response(response.status().as_u16());
    response
}

/// `401 unauthorized` with `WWW-Authenticate: Bearer` (RFC 6750 §3). The message says
/// which rule failed, never what was sent.
fn unauthorized(refused: ApiError) -> Response {
    let mut response = refused.into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"sluice-counter\""));
    response
}

/// How much of an oversized body is read and discarded before answering 413, so that a
/// client still sending it reads the answer instead of a reset connection. Beyond this
/// (or [`DRAIN_TIME`]) the connection is closed.
const DRAIN_BYTES: usize = 4 << 20;
/// The longest time spent discarding an oversized body.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Reads a whole body of at most `limit` bytes that arrives within `timeout`: `413
/// body_too_large` past the size (after discarding some of the rest, see
/// [`DRAIN_BYTES`]), `408 request_timeout` past the time.
async fn read_body(mut body: Body, limit: usize, timeout: Duration) -> Result<bytes::Bytes, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let too_large = || body_too_large_error(limit);
    let timed_out = || ApiError {
        status: 408,
        code: "request_timeout",
        message: format!(
            "the request body did not arrive within {} ms of its headers (--request-timeout-ms)",
            timeout.as_millis()
        ),
    };
    let unreadable =
        |e: axum::Error| ApiError::bad_request("body_unreadable", format!("the request body could not be read: {e}"));
    let mut buffer = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => return Err(timed_out()),
        };
        let Ok(data) = frame.map_err(unreadable)?.into_data() else { continue };
        if buffer.len() + data.len() > limit {
            let mut discarded = buffer.len() + data.len();
            let drain = async {
                while discarded <= DRAIN_BYTES {
                    match body.frame().await {
                        Some(Ok(frame)) => discarded += frame.data_ref().map_or(0, |d| d.len()),
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
            return Err(too_large());
        }
        buffer.extend_from_slice(&data);
    }
    Ok(buffer.freeze())
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => json_bytes(bytes),
        Err(e) => ApiError { status: 500, code: "internal", message: format!("cannot encode the response: {e}") }
            .into_response(),
    }
}

fn json_bytes(bytes: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(bytes));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `413 body_too_large`.
pub(crate) fn body_too_large_error(limit: usize) -> ApiError {
    ApiError { status: 413, code: "body_too_large", message: format!("the request body is larger than {limit} bytes") }
}

/// `404 not_found`.
pub(crate) fn not_found_error(path: &str) -> ApiError {
    ApiError { status: 404, code: "not_found", message: format!("no route for {path}") }
}

/// `405 method_not_allowed`.
pub(crate) fn method_not_allowed_error(method: &str, path: &str) -> ApiError {
    ApiError { status: 405, code: "method_not_allowed", message: format!("{method} is not allowed on {path}") }
}

/// A decision route over HTTP: what [`App::handle_now`] does, with the store awaited.
async fn decide(app: &App, route: Route, body: &[u8]) -> Result<Response, ApiError> {
    let call = app.prepare(route, body)?;
    let outcome = app.call_store(&call).await?;
    Ok(json_bytes(app.answer(&call, &outcome)?))
}

async fn check(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Check, &body).await
}

async fn lease(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Lease, &body).await
}

async fn charge(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Charge, &body).await
}

async fn healthz() -> Response {
    json(&serde_json::json!({ "status": "ok" }))
}

async fn readyz(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    app.timed(app.store.ping()).await?;
    Ok(json(&serde_json::json!({ "status": "ready", "store": app.store.name() })))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut response = Response::new(Body::from(app.metrics.render(&app.store)));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

async fn not_found(request: Request) -> ApiError {
    not_found_error(request.uri().path())
}

async fn method_not_allowed(request: Request) -> ApiError {
    method_not_allowed_error(request.method().as_str(), request.uri().path())
}

/// Builds the configured store and runs its startup checks (Redis: reachability and
/// the eviction policy; both only warn, so the service starts while Redis is down and
/// `/readyz` tells when it is usable).
///
/// # Errors
/// When the Redis URLs do not parse.
pub async fn build_store(config: &Config) -> anyhow::Result<CounterStore> {
    match config.store {
        StoreKind::Memory => Ok(CounterStore::Memory(MemoryCounters::new(config.memory()))),
        StoreKind::Redis | StoreKind::RedisCluster => {
            let redis = RedisCounters::new(config.redis()).map_err(|e| anyhow::anyhow!("redis store: {e}"))?;
            for check in redis.eviction_checks().await {
                match &check.policy {
                    Ok(policy) if check.evicts() => tracing::warn!(
                        node = %check.node,
                        policy = %policy,
                        "redis may evict limiter keys under memory pressure, which silently resets limits; \
                         set maxmemory-policy noeviction on a Redis dedicated to sluice"
                    ),
                    Ok(policy) => tracing::info!(node = %check.node, policy = %policy, "redis eviction policy"),
                    Err(reason) => {
                        tracing::warn!(node = %check.node, %reason, "cannot read redis maxmemory-policy")
                    }
                }
            }
            if let Err(e) = redis.ping().await {
                tracing::warn!(error = %e, "redis is not reachable yet; /readyz fails until it is");
            }
            Ok(CounterStore::Redis(Box::new(redis)))
        }
    }
}

/// How a server stops: gracefully (stop accepting, let requests in flight finish within
/// the grace, close) or at once, as a crash would (no drain: every connection and
/// stream dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Drain, within the grace.
    Graceful,
    /// Drop everything now.
    Kill,
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets
/// requests in flight finish (at most `grace`), and returns.
///
/// HTTP/1.1 and HTTP/2 cleartext with prior knowledge on the same listener (see
/// [`crate::conn`] for how a connection's protocol is recognized and the timeouts of
/// each), at most `max_connections` client connections (more are closed as soon as
/// they are accepted), `TCP_NODELAY` on every connection. Connections still open after
/// the grace are closed.
///
/// # Errors
/// Never at present: accept errors (such as running out of file descriptors) are
/// logged and retried.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    grace: Duration,
    sweep_every: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_until(listener, app, grace, sweep_every, async {
        shutdown.await;
        Stop::Graceful
    })
    .await
}

/// Aborts a task when dropped, so that the sweeper ends with the server, however the
/// server ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Releases a connection's slot and gauge when its task ends, aborted or not.
struct Held {
    app: Arc<App>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.app.metrics.connection(-1);
    }
}

/// [`serve`], stopped the way `stop` says when it completes.
///
/// # Errors
/// As [`serve`].
pub async fn serve_until(
    listener: TcpListener,
    app: Arc<App>,
    grace: Duration,
    sweep_every: Duration,
    stop: impl Future<Output = Stop> + Send + 'static,
) -> anyhow::Result<()> {
    let _sweeper = matches!(app.store, CounterStore::Memory(_)).then(|| {
        let weak = Arc::downgrade(&app);
        AbortOnDrop(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(sweep_every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(app) = weak.upgrade() else { break };
                if let CounterStore::Memory(memory) = &app.store {
                    let dropped = memory.sweep(None);
                    tracing::trace!(dropped, "swept idle keys");
                }
            }
        }))
    });
    let routes = router(app.clone());
    // Connections watch `drain`; HTTP/2 streams live while `alive` does.
    let (drain, draining) = tokio::sync::watch::channel(false);
    let (alive, streams_alive) = tokio::sync::watch::channel(());
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(conn::HEADER_READ_TIMEOUT);
    let mut http2 = hyper::server::conn::http2::Builder::new(conn::StreamExecutor::new(streams_alive));
    http2
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(conn::H2_PING_INTERVAL)
        .keep_alive_timeout(conn::H2_PING_TIMEOUT)
        .max_concurrent_streams(conn::H2_MAX_CONCURRENT_STREAMS);
    let builders = Arc::new((http1, http2));
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    let how = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = app.connections.clone().try_acquire_owned() else {
                    app.metrics.refused_connection();
                    continue;
                };
                let _ = stream.set_nodelay(true);
                app.metrics.connection(1);
                let held = Held { app: app.clone(), _permit: permit };
                connections.spawn(connection(stream, routes.clone(), builders.clone(), draining.clone(), held));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            how = &mut stop => break how,
        }
    };
    drop(listener);
    if how == Stop::Kill {
        tracing::warn!("killed: every connection dropped without a drain");
        connections.shutdown().await;
        drop(alive);
        return Ok(());
    }
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    let _ = drain.send(true);
    let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "requests still in flight after the shutdown grace; closing"
        );
        connections.shutdown().await;
    }
    drop(alive);
    Ok(())
}

type Builders = (hyper::server::conn::http1::Builder, hyper::server::conn::http2::Builder<conn::StreamExecutor>);

/// Serves one accepted connection in the protocol its first bytes say.
async fn connection(
    mut stream: tokio::net::TcpStream,
    routes: Router,
    builders: Arc<Builders>,
    mut draining: tokio::sync::watch::Receiver<bool>,
    held: Held,
) {
    let sniffed = tokio::select! {
        sniffed = tokio::time::timeout(conn::HEADER_READ_TIMEOUT, conn::sniff(&mut stream)) => sniffed,
        // Nothing was asked yet: a drain closes the connection at once.
        _ = draining.changed() => return,
    };
    let (protocol, prefix) = match sniffed {
        Ok(Ok(sniffed)) => sniffed,
        Ok(Err(error)) => {
            tracing::debug!(%error, "connection closed before a request");
            return;
        }
        Err(_) => {
            tracing::debug!("no request within the header read timeout; closing");
            return;
        }
    };
    let activity = Arc::new(conn::Activity::default());
    let service = {
        let tower = hyper_util::service::TowerToHyperService::new(routes);
        let activity = activity.clone();
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let open = activity.start();
            let response = hyper::service::Service::call(&tower, request);
            async move {
                let response = response.await;
                drop(open);
                response
            }
        })
    };
    let io = hyper_util::rt::TokioIo::new(conn::Prefixed::new(prefix, stream));
    let (http1, http2) = &*builders;
    match protocol {
        conn::Protocol::Http1 => conn::drive(http1.serve_connection(io, service), draining, None).await,
        conn::Protocol::Http2 => {
            let idle = Some((activity, conn::H2_IDLE_TIMEOUT));
            conn::drive(http2.serve_connection(io, service), draining, idle).await;
        }
    }
    drop(held);
}

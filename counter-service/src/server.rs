//! How the service listens: accepting connections within their bound, serving each in
//! its protocol, and stopping, gracefully or as a crash would.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::app::App;
use crate::conn;
use crate::routes::router;
use crate::store::CounterStore;

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
pub(crate) struct Held {
    app: Arc<App>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.app.metrics().connection(-1);
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
    let _sweeper = {
        let weak = Arc::downgrade(&app);
        AbortOnDrop(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(sweep_every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(app) = weak.upgrade() else { break };
                if let CounterStore::Memory(memory) = app.store() {
                    let dropped = memory.sweep(None);
                    tracing::trace!(dropped, "swept idle keys");
                }
                app.expire_overrides().await;
                app.sweep_overrides().await;
            }
        }))
    };
    let routes = router(app.clone());
    let (alive, streams_alive) = tokio::sync::watch::channel(());
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(conn::HEADER_READ_TIMEOUT);
    let builders = Arc::new((http1, http2_builder(streams_alive)));
    let serve = move |stream, draining, held| connection(stream, routes.clone(), builders.clone(), draining, held);
    accept_until(listener, &app, grace, alive, serve, stop).await;
    Ok(())
}

/// The HTTP/2 server both front doors use: streams on [`conn::StreamExecutor`] tasks
/// that end with `alive`'s sender, keep-alive pings, and a bound on concurrent streams.
pub(crate) fn http2_builder(
    alive: tokio::sync::watch::Receiver<()>,
) -> hyper::server::conn::http2::Builder<conn::StreamExecutor> {
    let mut http2 = hyper::server::conn::http2::Builder::new(conn::StreamExecutor::new(alive));
    http2
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(conn::H2_PING_INTERVAL)
        .keep_alive_timeout(conn::H2_PING_TIMEOUT)
        .max_concurrent_streams(conn::H2_MAX_CONCURRENT_STREAMS);
    http2
}

/// Accepts connections on `listener` until `stop` completes, each within the app's
/// bound on connections (`--max-connections`, shared by both front doors; more are
/// closed as soon as they are accepted), with `TCP_NODELAY`, served by `serve` on its
/// own task. Then stops accepting and, when the stop is graceful, tells the
/// connections to drain and waits for them at most `grace`; dropping `alive` at the
/// end ends every HTTP/2 stream still running.
pub(crate) async fn accept_until<F, Fut>(
    listener: TcpListener,
    app: &Arc<App>,
    grace: Duration,
    alive: tokio::sync::watch::Sender<()>,
    serve: F,
    stop: impl Future<Output = Stop> + Send + 'static,
) where
    F: Fn(tokio::net::TcpStream, tokio::sync::watch::Receiver<bool>, Held) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // Connections watch `drain`.
    let (drain, draining) = tokio::sync::watch::channel(false);
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
                let Some(permit) = app.connection_permit() else {
                    app.metrics().refused_connection();
                    continue;
                };
                let _ = stream.set_nodelay(true);
                app.metrics().connection(1);
                let held = Held { app: app.clone(), _permit: permit };
                connections.spawn(serve(stream, draining.clone(), held));
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
        return;
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
    let service = conn::tracked(hyper_util::service::TowerToHyperService::new(routes), &activity);
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

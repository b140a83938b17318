//! How one client connection is served: HTTP/1.1 or HTTP/2 cleartext on the same port,
//! its timeouts, and its part in a graceful drain.
//!
//! * **Which protocol.** A client with prior knowledge of HTTP/2 (Envoy with
//!   `http2_protocol_options`, `curl --http2-prior-knowledge`) starts with the 24-byte
//!   connection preface (RFC 9113 §3.4); anything else is HTTP/1.1. [`sniff`] reads
//!   until the bytes either leave the preface or complete it, so an HTTP/1.1 request is
//!   told apart at its first byte that differs (`G` of `GET`, `O` of `POST`) with no
//!   extra round trip; the bytes read are replayed to the protocol's parser. There is
//!   no `Upgrade: h2c` dance: a client that wants HTTP/2 without prior knowledge simply
//!   gets HTTP/1.1.
//! * **Timeouts.** The preface (or the first bytes of a request) must arrive within
//!   [`HEADER_READ_TIMEOUT`]. HTTP/1.1 then keeps hyper's header-read timeout: a request's
//!   headers within 30 s, which also closes keep-alive connections idle that long.
//!   HTTP/2 connections are meant to stay open and carry every worker's callouts, so
//!   their equivalent is an **idle timeout**: a connection with no request in progress
//!   for [`H2_IDLE_TIMEOUT`] is closed gracefully (`GOAWAY`, so a request racing it is
//!   either answered or known by the client to be unprocessed), which also bounds a
//!   peer that sends the preface and then nothing. Keep-alive pings every
//!   [`H2_PING_INTERVAL`], unanswered within [`H2_PING_TIMEOUT`], close connections to
//!   peers that vanished without a FIN.
//! * **Drain.** When the server drains, every connection is told to shut down
//!   gracefully: HTTP/1.1 finishes the request in flight and closes; HTTP/2 sends
//!   `GOAWAY` and finishes the streams it had accepted.
//! * **Kill.** Everything here is owned by tasks the server holds: aborting them drops
//!   the sockets with no drain, as a crash would. HTTP/2 streams run on their own tasks
//!   ([`StreamExecutor`]), which end when the server that spawned them is gone.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::watch;

/// The HTTP/2 connection preface a client with prior knowledge starts with.
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long a connection may take to send its first bytes (and, on HTTP/1.1, each
/// request's headers; this also closes keep-alive connections idle that long).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// An HTTP/2 connection with no request in progress for this long is closed (`GOAWAY`).
pub const H2_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an HTTP/2 connection is pinged.
pub const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
/// How long a ping may go unanswered before the connection is closed.
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams one HTTP/2 connection may have open at once (more wait on the client side).
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 256;

/// The protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 (or 1.0).
    Http1,
    /// HTTP/2 with prior knowledge.
    Http2,
}

/// Reads from `io` until its bytes differ from [`H2_PREFACE`] (HTTP/1.1) or complete it
/// (HTTP/2). Returns the protocol and the bytes read, which the caller must replay.
///
/// # Errors
/// When `io` fails, or closes before the protocol is known.
pub async fn sniff<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<(Protocol, Vec<u8>)> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let mut chunk = [0u8; H2_PREFACE.len()];
    loop {
        let want = chunk.get_mut(..H2_PREFACE.len() - seen.len()).unwrap_or_default();
        let read = io.read(want).await?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before sending a request"));
        }
        seen.extend_from_slice(chunk.get(..read).unwrap_or_default());
        if !H2_PREFACE.starts_with(&seen) {
            return Ok((Protocol::Http1, seen));
        }
        if seen.len() == H2_PREFACE.len() {
            return Ok((Protocol::Http2, seen));
        }
    }
}

/// An I/O stream that first yields `prefix` (bytes already read by [`sniff`]).
#[derive(Debug)]
pub struct Prefixed<T> {
    prefix: Vec<u8>,
    read: usize,
    inner: T,
}

impl<T> Prefixed<T> {
    /// `inner`, with `prefix` read first.
    pub const fn new(prefix: Vec<u8>, inner: T) -> Self {
        Self { prefix, read: 0, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(rest) = this.prefix.get(this.read..).filter(|rest| !rest.is_empty()) {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(rest.get(..n).unwrap_or_default());
            this.read += n;
            if this.read == this.prefix.len() {
                this.prefix = Vec::new();
                this.read = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Requests in progress on one connection, for the HTTP/2 idle timeout.
#[derive(Debug, Default)]
pub struct Activity {
    open: AtomicUsize,
    /// Bumped when a request starts or ends, so a quiet period is told from a busy one
    /// that happens to be idle when looked at.
    events: AtomicU64,
}

/// Marks a request in progress until dropped.
#[derive(Debug)]
pub struct InProgress(Arc<Activity>);

impl Activity {
    /// Marks a request as started.
    pub fn start(self: &Arc<Self>) -> InProgress {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.events.fetch_add(1, Ordering::AcqRel);
        InProgress(self.clone())
    }

    /// Completes once no request has been in progress, or started, for `timeout`
    /// (checked every `timeout`, so it completes between one and two timeouts after the
    /// last request ended).
    pub async fn idle_for(&self, timeout: Duration) {
        loop {
            let seen = self.events.load(Ordering::Acquire);
            tokio::time::sleep(timeout).await;
            if self.open.load(Ordering::Acquire) == 0 && self.events.load(Ordering::Acquire) == seen {
                return;
            }
        }
    }
}

/// `inner` as hyper serves it, each request marked in progress on `activity` until its
/// response is ready: what an HTTP/2 connection's idle timeout measures. Both front
/// doors wrap their service in it.
pub fn tracked<T, B>(
    inner: T,
    activity: &Arc<Activity>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = hyper::Response<B>,
    Error = T::Error,
    Future = impl Future<Output = Result<hyper::Response<B>, T::Error>> + Send + 'static,
> + Clone
+ Send
+ 'static
where
    T: hyper::service::Service<hyper::Request<hyper::body::Incoming>, Response = hyper::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    T::Future: Send + 'static,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body,
{
    let activity = activity.clone();
    hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let open = activity.start();
        let response = inner.call(request);
        async move {
            let response = response.await;
            drop(open);
            response
        }
    })
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.events.fetch_add(1, Ordering::AcqRel);
    }
}

/// Runs HTTP/2 streams on tokio tasks that end when the server that owns `alive`'s
/// sender is gone (killed, or finished after its drain), so a killed server leaves no
/// stream behind.
#[derive(Clone, Debug)]
pub struct StreamExecutor {
    alive: watch::Receiver<()>,
}

impl StreamExecutor {
    /// Streams live while `alive`'s sender does.
    pub const fn new(alive: watch::Receiver<()>) -> Self {
        Self { alive }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, stream: F) {
        let mut alive = self.alive.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stream => {}
                // Nothing is ever sent: this completes when the sender is dropped.
                _ = alive.changed() => {}
            }
        });
    }
}

/// Drives `connection` to its end, shutting it down gracefully when `draining` turns
/// true (or its sender goes away), or when `idle` (activity, timeout) says nothing has
/// happened for that long.
pub async fn drive<C>(connection: C, mut draining: watch::Receiver<bool>, idle: Option<(Arc<Activity>, Duration)>)
where
    C: hyper_util::server::graceful::GracefulConnection,
    C::Error: std::fmt::Display,
{
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    if *draining.borrow_and_update() {
        connection.as_mut().graceful_shutdown();
        closing = true;
    }
    let idle_for = async {
        match &idle {
            Some((activity, timeout)) => activity.idle_for(*timeout).await,
            None => std::future::pending().await,
        }
    };
    let mut idle_for = std::pin::pin!(idle_for);
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            _ = draining.changed(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = &mut idle_for, if !closing => {
                tracing::debug!("closing an idle HTTP/2 connection");
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn an_http1_request_is_told_apart_at_its_first_differing_byte() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"POST /v1/check HTTP/1.1\r\n").await.unwrap();

        let (protocol, seen) = sniff(&mut server).await.unwrap();

        assert_eq!(protocol, Protocol::Http1);
        assert!(seen.starts_with(b"PO"), "{seen:?}");
    }

    #[tokio::test]
    async fn the_preface_sent_in_pieces_is_http2() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let sender = tokio::spawn(async move {
            for piece in H2_PREFACE.chunks(5) {
                client.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
            client
        });

        let (protocol, seen) = sniff(&mut server).await.unwrap();

        assert_eq!((protocol, seen.as_slice()), (Protocol::Http2, H2_PREFACE.as_slice()));
        drop(sender.await);
    }

    #[tokio::test]
    async fn a_client_that_stalls_inside_the_preface_is_never_decided() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"PRI * HTTP").await.unwrap();

        let stalled = tokio::time::timeout(Duration::from_millis(200), sniff(&mut server)).await;

        assert!(stalled.is_err(), "the caller's timeout is what ends it");
    }

    #[tokio::test]
    async fn a_connection_closed_before_a_byte_is_an_error() {
        let (client, mut server) = tokio::io::duplex(1024);
        drop(client);

        assert_eq!(sniff(&mut server).await.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn the_sniffed_bytes_are_read_again_before_the_rest() {
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(b" world").await.unwrap();
        drop(client);
        let mut io = Prefixed::new(b"hello".to_vec(), server);

        let mut all = String::new();
        io.read_to_string(&mut all).await.unwrap();

        assert_eq!(all, "hello world");
    }

    async fn ok(_: hyper::Request<hyper::body::Incoming>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
        Ok(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
    }

    #[tokio::test]
    async fn an_http2_connection_idle_for_the_timeout_is_closed_after_its_last_answer() {
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let (_drain, draining) = watch::channel(false);
        let (_alive, alive) = watch::channel(());
        let activity = Arc::new(Activity::default());
        let tracked = activity.clone();
        let service = hyper::service::service_fn(move |request| {
            let open = tracked.start();
            async move {
                let response = ok(request).await;
                drop(open);
                response
            }
        });
        let mut http2 = hyper::server::conn::http2::Builder::new(StreamExecutor::new(alive));
        http2.timer(TokioTimer::new());
        let server = tokio::spawn(drive(
            http2.serve_connection(TokioIo::new(server_io), service),
            draining,
            Some((activity, Duration::from_millis(100))),
        ));
        let (mut sender, connection): (hyper::client::conn::http2::SendRequest<Full<Bytes>>, _) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client_io)).await.unwrap();
        let client = tokio::spawn(connection);

        let answer = sender.send_request(hyper::Request::new(Full::new(Bytes::new()))).await.unwrap();
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let closed = tokio::time::timeout(Duration::from_secs(5), server).await;

        assert_eq!(body.as_ref(), b"ok");
        assert!(closed.is_ok(), "the server side ended within a few idle timeouts");
        assert!(tokio::time::timeout(Duration::from_secs(5), client).await.is_ok(), "and the client saw GOAWAY");
    }

    #[tokio::test]
    async fn a_drain_closes_an_idle_http2_connection_at_once() {
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let (drain, draining) = watch::channel(false);
        let (_alive, alive) = watch::channel(());
        let mut http2 = hyper::server::conn::http2::Builder::new(StreamExecutor::new(alive));
        http2.timer(TokioTimer::new());
        let server = tokio::spawn(drive(
            http2.serve_connection(TokioIo::new(server_io), hyper::service::service_fn(ok)),
            draining,
            None,
        ));
        let (_sender, connection): (hyper::client::conn::http2::SendRequest<Full<Bytes>>, _) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client_io)).await.unwrap();
        let _client = tokio::spawn(connection);

        drain.send(true).unwrap();

        assert!(tokio::time::timeout(Duration::from_secs(5), server).await.is_ok());
    }
}

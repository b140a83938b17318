//! HTTP callouts (`proxy_http_call`) to named clusters.
//!
//! A guest names a cluster, as in Envoy's `dispatch_http_call("counter", ...)`. The host
//! maps each cluster name to either a real HTTP/1.1 server ([`Cluster::Http`], a socket
//! address, normally on loopback) or a script ([`Cluster::Scripted`]) that decides the
//! [`Answer`]: a response after a delay, a connection failure, or no answer at all.
//!
//! What Envoy does, and so does this host:
//! * an unknown cluster, a negative timeout, or headers without `:method`, `:path` and
//!   `:authority` make `proxy_http_call` return `BAD_ARGUMENT` at once, with no callback;
//! * otherwise the call gets a token and exactly one `proxy_on_http_call_response` on the
//!   root context that dispatched it, with the response's header, body and trailer
//!   counts; `:status` is one of the headers;
//! * a timeout of 0 means no timeout;
//! * a failed call (connection refused or reset, timeout) arrives as
//!   `proxy_on_http_call_response(token, 0, 0, 0)`; `proxy_get_status` then reports
//!   code 11 (`BrokenConnection`) and message `reset`.
//!
//! Envoy's async client runs its router, which turns a timeout into a `504` response
//! (`upstream request timeout`) and a refused connection into a `503` response
//! (`upstream connect error or disconnect/reset before headers...`). To test a filter
//! against that behaviour too, build the host with
//! [`crate::HostBuilder::callout_failures`]`(`[`CalloutFailures::RouterReplies`]`)`.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

use crate::headers::Headers;

/// A callout as the guest dispatched it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalloutRequest {
    /// The worker whose VM dispatched it.
    pub worker: usize,
    /// The cluster name the guest gave.
    pub cluster: String,
    /// Request headers, pseudo-headers included.
    pub headers: Headers,
    /// Request body.
    pub body: Vec<u8>,
    /// Request trailers.
    pub trailers: Headers,
    /// The guest's timeout; `None` for 0 (no timeout).
    pub timeout: Option<Duration>,
}

/// How a scripted cluster answers one callout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub(crate) kind: AnswerKind,
    pub(crate) delay: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AnswerKind {
    Respond(CalloutResponse),
    Fail,
    Never,
}

impl Answer {
    /// A response with this status and no headers or body, delivered at once.
    pub fn status(status: u16) -> Self {
        Self {
            kind: AnswerKind::Respond(CalloutResponse {
                headers: Headers::from_pairs([(":status", status.to_string())]),
                body: Vec::new(),
                trailers: Headers::new(),
            }),
            delay: Duration::ZERO,
        }
    }

    /// A connection failure (refused or reset before a response), delivered at once.
    pub fn reset() -> Self {
        Self { kind: AnswerKind::Fail, delay: Duration::ZERO }
    }

    /// No answer at all: only the guest's timeout (if it set one) ends the call.
    pub fn never() -> Self {
        Self { kind: AnswerKind::Never, delay: Duration::ZERO }
    }

    /// Adds a response header.
    #[must_use]
    pub fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        if let AnswerKind::Respond(response) = &mut self.kind {
            response.headers.add(name, value);
        }
        self
    }

    /// Sets the response body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        if let AnswerKind::Respond(response) = &mut self.kind {
            response.body = body.into();
        }
        self
    }

    /// Adds a response trailer.
    #[must_use]
    pub fn trailer(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        if let AnswerKind::Respond(response) = &mut self.kind {
            response.trailers.add(name, value);
        }
        self
    }

    /// Delivers the answer this long after dispatch (on the host's clock). If the guest's
    /// timeout is shorter, the timeout wins.
    #[must_use]
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// A scripted cluster's behaviour: called once per callout.
pub type Script = Arc<dyn Fn(&CalloutRequest) -> Answer + Send + Sync>;

/// What a cluster name stands for.
#[derive(Clone)]
pub enum Cluster {
    /// A real HTTP/1.1 server at this address.
    Http(SocketAddr),
    /// Answers computed by a script.
    Scripted(Script),
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(addr) => f.debug_tuple("Http").field(addr).finish(),
            Self::Scripted(_) => f.write_str("Scripted(..)"),
        }
    }
}

/// How a failed or timed-out callout reaches the guest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CalloutFailures {
    /// `proxy_on_http_call_response(token, 0, 0, 0)`, with `proxy_get_status` reporting
    /// `(11, "reset")`: the ABI's documented signal, and Envoy's on a stream reset.
    #[default]
    ZeroHeaders,
    /// What Envoy's router makes of them: a timeout becomes a `504` response with body
    /// `upstream request timeout`, a connection failure a `503` with body
    /// `upstream connect error or disconnect/reset before headers. reset reason:
    /// connection failure`.
    RouterReplies,
}

/// A callout's response as the guest reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CalloutResponse {
    pub(crate) headers: Headers,
    pub(crate) body: Vec<u8>,
    pub(crate) trailers: Headers,
}

/// Why a callout produced no response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CalloutFailure {
    Timeout,
    Connect,
    Reset,
}

impl CalloutFailure {
    /// The response Envoy's router would have produced instead, if any.
    pub(crate) fn router_reply(self) -> Option<CalloutResponse> {
        let (status, body): (u16, &[u8]) = match self {
            Self::Timeout => (504, b"upstream request timeout"),
            Self::Connect => {
                (503, b"upstream connect error or disconnect/reset before headers. reset reason: connection failure")
            }
            Self::Reset => return None,
        };
        Some(CalloutResponse {
            headers: Headers::from_pairs([
                (":status", status.to_string()),
                ("content-length", body.len().to_string()),
                ("content-type", "text/plain".to_owned()),
            ]),
            body: body.to_vec(),
            trailers: Headers::new(),
        })
    }
}

/// The largest callout response body the host buffers; a larger one fails the call, as
/// Envoy's `ExceedResponseBufferLimit` does.
pub(crate) const MAX_CALLOUT_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Sends one callout to a real HTTP/1.1 server and reads the whole response.
pub(crate) async fn send_http(addr: SocketAddr, request: CalloutRequest) -> Result<CalloutResponse, CalloutFailure> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|_| CalloutFailure::Connect)?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|_| CalloutFailure::Connect)?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let outgoing = build_request(&request).ok_or(CalloutFailure::Reset)?;
    let response = sender.send_request(outgoing).await.map_err(|_| CalloutFailure::Reset);
    let result = match response {
        Ok(response) => read_response(response).await,
        Err(failure) => Err(failure),
    };
    driver.abort();
    result
}

fn build_request(request: &CalloutRequest) -> Option<http::Request<Full<Bytes>>> {
    let method = http::Method::from_bytes(request.headers.get(":method")?).ok()?;
    let path = http::Uri::try_from(request.headers.get(":path")?).ok()?;
    let mut builder = http::Request::builder().method(method).uri(path);
    let authority = http::HeaderValue::from_bytes(request.headers.get(":authority")?).ok()?;
    builder = builder.header(http::header::HOST, authority);
    for (name, value) in request.headers.iter() {
        if name.first() == Some(&b':') || name.eq_ignore_ascii_case(b"host") {
            continue;
        }
        let name = http::HeaderName::from_bytes(name).ok()?;
        let value = http::HeaderValue::from_bytes(value).ok()?;
        builder = builder.header(name, value);
    }
    if !request.body.is_empty() {
        builder = builder.header(http::header::CONTENT_LENGTH, request.body.len());
    }
    builder.body(Full::new(Bytes::from(request.body.clone()))).ok()
}

async fn read_response(response: http::Response<hyper::body::Incoming>) -> Result<CalloutResponse, CalloutFailure> {
    let (parts, body) = response.into_parts();
    let mut headers = Headers::from_pairs([(":status", parts.status.as_u16().to_string())]);
    for (name, value) in &parts.headers {
        headers.add(name.as_str(), value.as_bytes());
    }
    let collected =
        Limited::new(body, MAX_CALLOUT_RESPONSE_BYTES).collect().await.map_err(|_| CalloutFailure::Reset)?;
    let trailers = collected
        .trailers()
        .map(|t| t.iter().map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())).collect())
        .unwrap_or_default();
    Ok(CalloutResponse { headers, body: collected.to_bytes().to_vec(), trailers })
}

//! HTTP callouts (`proxy_http_call`) to named clusters.
//!
//! A guest names a cluster, as in Envoy's `dispatch_http_call("counter", ...)`. The host
//! maps each cluster name to either a real HTTP/1.1 server ([`Cluster::Http`], a socket
//! address, normally on loopback) or a script ([`Cluster::Scripted`]) whose [`Answer`]
//! says what the upstream does on the wire: answer, refuse the connection, say nothing,
//! close it, send something that is not HTTP, or send a response head and then stall or
//! reset.
//!
//! # What the guest sees
//!
//! Envoy runs a callout through its async client and router, and the router answers for
//! an upstream that fails before a response head: the guest gets a *response* in most
//! failures. Measured in Envoy 1.40 (`tests/tests/envoy/callouts/` compares every row
//! with this host):
//!
//! | on the wire | the guest gets | `proxy_get_status` |
//! |---|---|---|
//! | a response (any status) | its headers (`x-envoy-upstream-service-time` added), body | unchanged |
//! | connection refused | `503`, body `upstream connect error or disconnect/reset before headers. reset reason: remote connection failure` | unchanged |
//! | no response head before the timeout | `504`, body `upstream request timeout` | unchanged |
//! | connection closed or reset before any byte of a response | `503`, `... reset reason: connection termination` | unchanged |
//! | not HTTP, or a bad or incomplete response head | `502`, `... reset reason: protocol error` | unchanged |
//! | a head, then the connection closed or reset, a bad chunk, or the timeout | `on_http_call_response(token, 0, 0, 0)` | `(11, "reset")` |
//!
//! The router's own replies have three headers: `:status`, `content-length` and
//! `content-type: text/plain`. After a `(0, 0, 0)` callback the response maps are gone:
//! reading a header is `BAD_ARGUMENT`, the pairs are empty, the body buffer is
//! `NOT_FOUND`. Envoy sets `proxy_get_status` only on such a reset: code 11
//! (`BrokenConnection`) with message `reset` during the callback; the message is cleared
//! after it, the code never is, so every later callout of that root context reports 11
//! (with no message) even when it succeeds.
//!
//! Also as in Envoy:
//! * an unknown cluster, a negative timeout, or headers without `:method`, `:path` and
//!   `:authority` make `proxy_http_call` return `BAD_ARGUMENT` at once, with no callback;
//! * otherwise the call gets a token and exactly one `proxy_on_http_call_response` on the
//!   root context that dispatched it; `:status` is the first header;
//! * a timeout of 0 means no timeout;
//! * a response keeps the upstream's headers in order, names lower-cased, values
//!   trimmed, except `keep-alive`; `x-envoy-upstream-service-time` (milliseconds to the
//!   response head) replaces the upstream's or comes last; response trailers are dropped
//!   (Envoy's HTTP/1 codec does not keep them unless the cluster enables them);
//! * the request is sent as Envoy's HTTP/1 codec sends it: `host` from `:authority`, the
//!   guest's headers in order, `content-length` (`0` for an empty body unless the method
//!   has none), `x-envoy-internal: true`, `x-envoy-expected-rq-timeout-ms` when there is a
//!   timeout; request trailers are dropped.
//!
//! A scripted cluster takes no connection; its answer is due at [`Answer::after`] on the
//! host's clock, and its response headers are the script's, plus
//! `x-envoy-upstream-service-time` (the delay).

mod http1;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::headers::Headers;

pub(crate) use http1::send;

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
    /// Request trailers (as the guest gave them; Envoy drops them on HTTP/1).
    pub trailers: Headers,
    /// The guest's timeout; `None` for 0 (no timeout).
    pub timeout: Option<Duration>,
}

/// What a scripted upstream does with one callout, on the wire, and when.
///
/// Each constructor is named after what happens on the wire; the module docs say what
/// the guest then sees. Everything happens [`Answer::after`] the dispatch (at once by
/// default); a guest timeout that falls earlier wins.
///
/// ```
/// use std::time::Duration;
/// use wasm_host::Answer;
///
/// let allowed = Answer::status(200).header("content-type", "application/json").body(r#"{"allow":true}"#);
/// let slow = Answer::status(200).after(Duration::from_millis(300)); // a 504 if the timeout is shorter
/// let cut = Answer::status(200).header("content-length", "10").body("part").then_reset(); // a reset
/// let down = Answer::refused(); // a 503 from Envoy's router
/// # let _ = (allowed, slow, cut, down);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    wire: Wire,
    delay: Duration,
}

/// What the upstream does.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Wire {
    /// It sends a response head and body, then does `then`.
    Respond { response: CalloutResponse, then: Then },
    /// Nothing listens: the connection is refused.
    Refused,
    /// It reads the request and never answers.
    Silent,
    /// It closes (or resets) the connection without sending a byte.
    Closes,
    /// It answers bytes that are not an HTTP response.
    NotHttp,
    /// Not decided yet: the driver answers later ([`Answer::deferred`]).
    Deferred,
}

/// What follows a response head and body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Nothing: the response is complete.
    Complete,
    /// The connection is reset before the response is complete.
    Reset,
    /// Nothing more ever arrives.
    Stall,
}

impl Answer {
    /// A whole response with this status; add headers and a body with the builders.
    pub fn status(status: u16) -> Self {
        let response = CalloutResponse {
            headers: Headers::from_pairs([(":status", status.to_string())]),
            body: Vec::new(),
            trailers: Headers::new(),
        };
        Self::on_wire(Wire::Respond { response, then: Then::Complete })
    }

    /// Nothing listens: the connection is refused (Envoy's router answers `503`).
    pub fn refused() -> Self {
        Self::on_wire(Wire::Refused)
    }

    /// The upstream reads the request and never answers: only the guest's timeout (if it
    /// set one) ends the call, with a `504`.
    pub fn never() -> Self {
        Self::on_wire(Wire::Silent)
    }

    /// The upstream closes or resets the connection before sending a byte (Envoy's
    /// router answers `503`, `connection termination`).
    pub fn closed() -> Self {
        Self::on_wire(Wire::Closes)
    }

    /// The upstream answers something that is not an HTTP response (Envoy's router
    /// answers `502`, `protocol error`).
    pub fn not_http() -> Self {
        Self::on_wire(Wire::NotHttp)
    }

    /// The answer is decided after the dispatch: the driver takes the call with
    /// [`crate::Worker::take_deferred`] and answers it with
    /// [`crate::Worker::answer_deferred`], whose delay then counts from the dispatch.
    /// Until then the call is in flight, and only the guest's timeout can end it. (A
    /// driver that steps several hosts in parallel decides their calls to one shared
    /// upstream afterwards, in a fixed order.)
    pub fn deferred() -> Self {
        Self::on_wire(Wire::Deferred)
    }

    fn on_wire(wire: Wire) -> Self {
        Self { wire, delay: Duration::ZERO }
    }

    fn response_mut(&mut self) -> Option<&mut CalloutResponse> {
        match &mut self.wire {
            Wire::Respond { response, .. } => Some(response),
            _ => None,
        }
    }

    /// Adds a response header (for a response; ignored otherwise).
    #[must_use]
    pub fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        if let Some(response) = self.response_mut() {
            response.headers.add(name, value);
        }
        self
    }

    /// Sets the response body (for a response; ignored otherwise). With
    /// [`Answer::then_reset`] or [`Answer::then_stall`], the part of the body sent first.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        if let Some(response) = self.response_mut() {
            response.body = body.into();
        }
        self
    }

    /// Adds a response trailer (for a response; ignored otherwise). Envoy drops HTTP/1
    /// response trailers, and so does this host with a real server; a scripted
    /// upstream's trailers reach the guest (an HTTP/2 upstream can send them; that case
    /// is not compared with Envoy).
    #[must_use]
    pub fn trailer(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        if let Some(response) = self.response_mut() {
            response.trailers.add(name, value);
        }
        self
    }

    /// The upstream sends the response head (and the body so far), then resets the
    /// connection: the guest gets `(0, 0, 0)` and status `(11, "reset")`.
    #[must_use]
    pub fn then_reset(mut self) -> Self {
        if let Wire::Respond { then, .. } = &mut self.wire {
            *then = Then::Reset;
        }
        self
    }

    /// The upstream sends the response head (and the body so far), then nothing more:
    /// at the guest's timeout the guest gets `(0, 0, 0)` and status `(11, "reset")`;
    /// without a timeout, the call never ends.
    #[must_use]
    pub fn then_stall(mut self) -> Self {
        if let Wire::Respond { then, .. } = &mut self.wire {
            *then = Then::Stall;
        }
        self
    }

    /// How the answer ends, and when (the delay).
    pub(crate) fn plan(self) -> (Duration, Plan) {
        let plan = match self.wire {
            Wire::Respond { response, then: Then::Complete } => {
                Plan::Ends(Ending::Response(response.with_service_time(self.delay)))
            }
            Wire::Respond { then: Then::Reset, .. } => Plan::Ends(Ending::Reset),
            Wire::Respond { then: Then::Stall, .. } => Plan::Stalls { head: true },
            Wire::Silent => Plan::Stalls { head: false },
            Wire::Refused => Plan::Ends(Ending::BeforeHead(Failure::Refused)),
            Wire::Closes => Plan::Ends(Ending::BeforeHead(Failure::Terminated)),
            Wire::NotHttp => Plan::Ends(Ending::BeforeHead(Failure::ProtocolError)),
            Wire::Deferred => Plan::Deferred,
        };
        (self.delay, plan)
    }

    /// Makes it happen this long after dispatch (on the host's clock): the response head
    /// arrives, the connection is refused or closed... If the guest's timeout is shorter,
    /// the timeout wins.
    #[must_use]
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// How a scripted answer plays out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// It ends this way once its delay has passed.
    Ends(Ending),
    /// It never ends; its response head arrives once its delay has passed, if `head`.
    Stalls { head: bool },
    /// The driver answers it later.
    Deferred,
}

/// A scripted cluster's behaviour: called once per callout.
pub type Script = Arc<dyn Fn(&CalloutRequest) -> Answer + Send + Sync>;

/// What a cluster name stands for.
#[derive(Clone)]
pub enum Cluster {
    /// A real HTTP/1.1 server at this address; what happens on its socket is classified
    /// as Envoy classifies it (see the module docs).
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

/// A callout's response as the guest reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CalloutResponse {
    pub(crate) headers: Headers,
    pub(crate) body: Vec<u8>,
    pub(crate) trailers: Headers,
}

impl CalloutResponse {
    /// Adds Envoy's router header, in place of the upstream's if it sent one.
    pub(crate) fn with_service_time(mut self, elapsed: Duration) -> Self {
        self.headers.replace("x-envoy-upstream-service-time", elapsed.as_millis().to_string());
        self
    }
}

/// How a callout ended, on the upstream's side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A whole response.
    Response(CalloutResponse),
    /// No response head: Envoy's router answers instead.
    BeforeHead(Failure),
    /// The stream was reset after the response head (or could not be sent).
    Reset,
}

/// Why no response head arrived (Envoy's stream reset reasons, and its timeout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection could not be made.
    Refused,
    /// The connection was closed or reset before any byte of a response.
    Terminated,
    /// Bytes arrived that are not a valid response head.
    ProtocolError,
    /// The guest's timeout passed.
    Timeout,
}

impl Failure {
    /// The local reply Envoy's router sends in place of the upstream's response.
    fn router_reply(self) -> CalloutResponse {
        const BEFORE_HEADERS: &str = "upstream connect error or disconnect/reset before headers. reset reason: ";
        let (status, body) = match self {
            Self::Refused => (503, format!("{BEFORE_HEADERS}remote connection failure")),
            Self::Terminated => (503, format!("{BEFORE_HEADERS}connection termination")),
            Self::ProtocolError => (502, format!("{BEFORE_HEADERS}protocol error")),
            Self::Timeout => (504, "upstream request timeout".to_owned()),
        };
        CalloutResponse {
            headers: Headers::from_pairs([
                (":status", status.to_string()),
                ("content-length", body.len().to_string()),
                ("content-type", "text/plain".to_owned()),
            ]),
            body: body.into_bytes(),
            trailers: Headers::new(),
        }
    }
}

impl Ending {
    /// What the guest gets: a response, or `None` for a reset (`(0, 0, 0)`).
    pub(crate) fn into_response(self) -> Option<CalloutResponse> {
        match self {
            Self::Response(response) => Some(response),
            Self::BeforeHead(failure) => Some(failure.router_reply()),
            Self::Reset => None,
        }
    }

    /// How a callout ends at its timeout: a `504` if no response head had arrived, a
    /// reset if one had.
    pub(crate) fn timed_out(head_arrived: bool) -> Self {
        if head_arrived { Self::Reset } else { Self::BeforeHead(Failure::Timeout) }
    }
}

/// The largest callout response body the host buffers; a larger one resets the call.
pub(crate) const MAX_CALLOUT_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

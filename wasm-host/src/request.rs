//! The HTTP exchange a test drives through a worker, and what the filter made of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::headers::Headers;

/// A downstream request: what a client sent to the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub(crate) message: Message,
    pub(crate) source: SocketAddr,
    pub(crate) destination: SocketAddr,
    pub(crate) protocol: &'static str,
}

/// The default client address of a [`Request`]: `127.0.0.1:50000`.
pub const DEFAULT_SOURCE: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 50000);

/// The default proxy (listener) address of a [`Request`]: `127.0.0.1:8080`.
pub const DEFAULT_DESTINATION: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);

impl Request {
    /// A request with `:method`, `:path`, `:scheme: http` and `:authority: localhost`,
    /// from [`DEFAULT_SOURCE`].
    pub fn new(method: &str, path: impl AsRef<[u8]>) -> Self {
        Self::from_headers(Headers::from_pairs([
            (b":method".as_slice(), method.as_bytes()),
            (b":path".as_slice(), path.as_ref()),
            (b":scheme".as_slice(), b"http".as_slice()),
            (b":authority".as_slice(), b"localhost".as_slice()),
        ]))
    }

    /// `GET path`.
    pub fn get(path: impl AsRef<[u8]>) -> Self {
        Self::new("GET", path)
    }

    /// `POST path` with a body.
    pub fn post(path: impl AsRef<[u8]>, body: impl Into<Vec<u8>>) -> Self {
        Self::new("POST", path).body(body)
    }

    /// A request with exactly these headers (pseudo-headers included), no body.
    pub fn from_headers(headers: Headers) -> Self {
        Self {
            message: Message { headers, body: None, trailers: None },
            source: DEFAULT_SOURCE,
            destination: DEFAULT_DESTINATION,
            protocol: "HTTP/1.1",
        }
    }

    /// Adds a header; the value may be any bytes.
    #[must_use]
    pub fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.message.headers.add(name, value);
        self
    }

    /// Sets the body; the filter sees it in `proxy_on_request_body`.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.message.body = Some(body.into());
        self
    }

    /// Adds a trailer; the filter sees trailers in `proxy_on_request_trailers`.
    #[must_use]
    pub fn trailer(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.message.trailers.get_or_insert_with(Headers::new).add(name, value);
        self
    }

    /// Sets the client address (the `source.address` and `source.port` properties).
    #[must_use]
    pub fn source(mut self, addr: SocketAddr) -> Self {
        self.source = addr;
        self
    }

    /// Sets the proxy's own address (the `destination.*` properties).
    #[must_use]
    pub fn destination(mut self, addr: SocketAddr) -> Self {
        self.destination = addr;
        self
    }

    /// The request's headers.
    pub fn headers(&self) -> &Headers {
        &self.message.headers
    }
}

/// An upstream response: what the server behind the proxy answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub(crate) message: Message,
    pub(crate) upstream: Option<SocketAddr>,
}

impl Response {
    /// A response with this `:status`, no body.
    pub fn new(status: u16) -> Self {
        Self {
            message: Message {
                headers: Headers::from_pairs([(":status", status.to_string())]),
                body: None,
                trailers: None,
            },
            upstream: None,
        }
    }

    /// A response with exactly these headers (`:status` included), no body.
    pub fn from_headers(headers: Headers) -> Self {
        Self { message: Message { headers, body: None, trailers: None }, upstream: None }
    }

    /// Sets the upstream's address (the `upstream.address` and `upstream.port`
    /// properties).
    #[must_use]
    pub fn upstream(mut self, addr: SocketAddr) -> Self {
        self.upstream = Some(addr);
        self
    }

    /// `200` with no body.
    pub fn ok() -> Self {
        Self::new(200)
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.message.headers.add(name, value);
        self
    }

    /// Sets the body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.message.body = Some(body.into());
        self
    }

    /// Adds a trailer.
    #[must_use]
    pub fn trailer(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.message.trailers.get_or_insert_with(Headers::new).add(name, value);
        self
    }
}

/// Headers, body and trailers of one direction of an exchange.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// Headers, pseudo-headers first.
    pub headers: Headers,
    /// The body, if there was one.
    pub body: Option<Vec<u8>>,
    /// Trailers, if there were any.
    pub trailers: Option<Headers>,
}

impl Message {
    /// The body, or an empty slice.
    pub fn body_bytes(&self) -> &[u8] {
        self.body.as_deref().unwrap_or_default()
    }
}

/// Identifies one HTTP stream on one worker: its proxy-wasm context id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u32);

impl StreamId {
    /// The proxy-wasm context id the guest sees for this stream.
    pub fn context_id(self) -> u32 {
        self.0
    }
}

/// Where the response a client received came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseSource {
    /// The upstream, through the filter's response callbacks.
    Upstream,
    /// The filter's `proxy_send_local_response`, with the details string it gave.
    Local {
        /// `status_code_details` as the guest passed it.
        details: String,
    },
    /// The host's failure policy after a trap (`FAIL_CLOSED`: 503).
    FailurePolicy,
}

/// The response a client received, after the filter's response callbacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientResponse {
    /// The `:status`.
    pub status: u16,
    /// Headers, `:status` included.
    pub headers: Headers,
    /// The body (empty if none).
    pub body: Vec<u8>,
    /// Trailers, if any.
    pub trailers: Option<Headers>,
    /// Who produced it.
    pub source: ResponseSource,
}

impl ClientResponse {
    /// Whether the filter answered locally (not the upstream, not the failure policy).
    pub fn is_local(&self) -> bool {
        matches!(self.source, ResponseSource::Local { .. })
    }

    /// The body as text (lossy).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Where a stream stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// The filter holds the request (it returned `Pause` and has not resumed it).
    Paused,
    /// The request went upstream with these headers and body, as the filter left them;
    /// pass the upstream's answer with [`crate::Worker::respond`].
    Forwarded(&'a Message),
    /// The filter holds the response.
    ResponsePaused,
    /// The client received this response.
    Responded(&'a ClientResponse),
    /// The filter reset the stream (`proxy_close_stream`): the client sees a reset.
    Reset,
}

impl<'a> Outcome<'a> {
    /// The forwarded request, if the stream is waiting for the upstream.
    pub fn forwarded(self) -> Option<&'a Message> {
        match self {
            Self::Forwarded(message) => Some(message),
            _ => None,
        }
    }

    /// The response the client received, if any.
    pub fn response(self) -> Option<&'a ClientResponse> {
        match self {
            Self::Responded(response) => Some(response),
            _ => None,
        }
    }

    /// The local response the filter sent, if that is what the client received.
    pub fn local_response(self) -> Option<&'a ClientResponse> {
        self.response().filter(|r| r.is_local())
    }

    /// Whether the filter holds the request.
    pub fn is_paused(self) -> bool {
        matches!(self, Self::Paused)
    }
}

/// A finished exchange as the client saw it; see [`crate::Worker::exchange`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// The request as it reached the upstream, if it did.
    pub forwarded: Option<Message>,
    /// The response the client received, `None` if the stream was reset.
    pub response: Option<ClientResponse>,
}

impl Exchange {
    /// The status the client received (`None` for a reset).
    pub fn status(&self) -> Option<u16> {
        self.response.as_ref().map(|r| r.status)
    }

    /// A header of the response the client received.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.response.as_ref().and_then(|r| r.headers.get(name))
    }

    /// A header of the response the client received, as text.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.response.as_ref().and_then(|r| r.headers.get_str(name))
    }
}

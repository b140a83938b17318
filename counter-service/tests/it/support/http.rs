//! How tests talk to a running service: a small JSON client over HTTP/1.1 or h2c.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Which HTTP the test client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 with keep-alive.
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (the client starts with the preface).
    H2c,
}

/// Both protocols, for tests that must give the same answers over each.
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Http1, Protocol::H2c];

/// A small JSON client over HTTP/1.1 or h2c, with optional extra headers on every
/// request (an `authorization` header, say).
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    protocol: Protocol,
    headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
}

impl Http {
    /// An HTTP/1.1 client.
    pub fn new(addr: std::net::SocketAddr) -> Self {
        Self::with(addr, Protocol::Http1)
    }

    pub fn with(addr: std::net::SocketAddr, protocol: Protocol) -> Self {
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_max_idle_per_host(256);
        if protocol == Protocol::H2c {
            builder.http2_only(true);
        }
        Self { client: builder.build_http(), base: format!("http://{addr}"), protocol, headers: Vec::new() }
    }

    /// The same client, sending `name: value` on every request.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((
            hyper::header::HeaderName::from_static(name),
            hyper::header::HeaderValue::from_str(value).expect("a header value"),
        ));
        self
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Sends a request; returns the status, the response headers and the body.
    pub async fn exchange(&self, method: &str, path: &str, body: impl Into<Bytes>) -> (u16, hyper::HeaderMap, Bytes) {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(body.into())).expect("a request");
        let response = self.client.request(request).await.expect("the service answers");
        let expected = match self.protocol {
            Protocol::Http1 => hyper::Version::HTTP_11,
            Protocol::H2c => hyper::Version::HTTP_2,
        };
        assert_eq!(response.version(), expected, "answered in the protocol asked for");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("a body").to_bytes();
        (status, headers, body)
    }

    pub async fn send(&self, method: &str, path: &str, body: impl Into<Bytes>) -> (u16, Bytes) {
        let (status, _, body) = self.exchange(method, path, body).await;
        (status, body)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, bytes) = self.send("POST", path, serde_json::to_vec(body).expect("json")).await;
        (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{status} {bytes:?}: {e}")))
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<Bytes>) -> (u16, Value) {
        let (status, bytes) = self.send("POST", path, body).await;
        (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{status} {bytes:?}: {e}")))
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let (status, bytes) = self.send("GET", path, Bytes::new()).await;
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }
}

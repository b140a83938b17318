//! How `serve` answers one client request: the filter decides (forward, reply or reset),
//! a forwarded request goes to the upstream (or the built-in echo upstream), and the
//! response goes back through the filter to the client.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::vm::{Decision, FinishOnDrop, Vm};
use super::{Settings, Upstream};
use crate::headers::Headers;
use crate::request::{Message, Request, Response};

/// The largest upstream response body `serve` buffers.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How long an upstream may take to answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// What every connection of a worker shares.
pub(super) struct Front {
    vm: Option<Rc<Vm>>,
    client: Client<HttpConnector, Full<Bytes>>,
    settings: Arc<Settings>,
}

impl Front {
    /// A worker's front: its VM (`None` runs no filter), an HTTP client for the upstream,
    /// and the settings.
    pub(super) fn new(vm: Option<Rc<Vm>>, settings: Arc<Settings>) -> Self {
        Self { vm, client: Client::builder(TokioExecutor::new()).build_http(), settings }
    }
}

/// The error that makes hyper drop a connection: what a client sees for a reset stream.
#[derive(Debug)]
pub(super) struct StreamReset;

impl std::fmt::Display for StreamReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the filter reset the stream")
    }
}

impl std::error::Error for StreamReset {}

pub(super) type HttpResponse = hyper::Response<Full<Bytes>>;

/// One request from a client: through the filter, to the upstream if the filter forwards
/// it, and the response back through the filter.
pub(super) async fn handle(
    front: Rc<Front>,
    request: hyper::Request<Incoming>,
    peer: SocketAddr,
) -> Result<HttpResponse, StreamReset> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, front.settings.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(to_http(&Headers::from_pairs([(":status", "413")]), b"request body too large\n")),
    };
    let local = front.settings.local;
    let mut headers = Headers::new();
    headers.add(":method", parts.method.as_str());
    headers.add(":scheme", "http");
    let authority = parts
        .headers
        .get(hyper::header::HOST)
        .map(|h| h.as_bytes().to_vec())
        .or_else(|| parts.uri.authority().map(|a| a.as_str().as_bytes().to_vec()))
        .unwrap_or_else(|| local.to_string().into_bytes());
    headers.add(":authority", authority);
    headers.add(":path", parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST {
            headers.add(name.as_str(), value.as_bytes());
        }
    }
    let mut request = Request::from_headers(headers).source(peer).destination(local);
    if !body.is_empty() {
        request = request.body(body.to_vec());
    }
    let Some(vm) = front.vm.clone() else {
        // No filter: straight to the upstream.
        let response = forward(&front, &request.message).await;
        return Ok(to_http(&response.message.headers, response.message.body_bytes()));
    };
    let stream = vm.worker.borrow_mut().request(request);
    let _finish = FinishOnDrop { vm: Rc::clone(&vm), stream };
    vm.changed();
    let message = match vm.decision(stream).await {
        Decision::Forward(message) => message,
        Decision::Respond(response) => return Ok(to_http(&response.headers, &response.body)),
        Decision::Reset => return Err(StreamReset),
    };
    let upstream = forward(&front, &message).await;
    let accepted = vm.worker.borrow_mut().respond(stream, upstream).is_ok();
    vm.changed();
    if !accepted {
        return Err(StreamReset);
    }
    match vm.decision(stream).await {
        Decision::Respond(response) => Ok(to_http(&response.headers, &response.body)),
        Decision::Forward(_) | Decision::Reset => Err(StreamReset),
    }
}

/// Sends a forwarded request to the upstream (or the echo upstream) and reads the
/// response; an unreachable upstream yields Envoy's router reply.
async fn forward(front: &Front, message: &Message) -> Response {
    let Some(upstream) = &front.settings.upstream else {
        return echo(message);
    };
    match send_upstream(front, upstream, message).await {
        Some(response) => response.upstream(upstream.addr),
        None => Response::new(503)
            .header("content-type", "text/plain")
            .body(&b"upstream connect error or disconnect/reset before headers. reset reason: connection failure"[..])
            .upstream(upstream.addr),
    }
}

async fn send_upstream(front: &Front, upstream: &Upstream, message: &Message) -> Option<Response> {
    let method = hyper::Method::from_bytes(message.headers.get(":method")?).ok()?;
    let path = String::from_utf8_lossy(message.headers.get(":path").unwrap_or(b"/")).into_owned();
    let uri: hyper::Uri = format!("http://{}{}{}", upstream.addr, upstream.base_path, path).parse().ok()?;
    let mut builder = hyper::Request::builder().method(method).uri(uri);
    if let Some(authority) = message.headers.get(":authority") {
        builder = builder.header(hyper::header::HOST, authority);
    }
    for (name, value) in message.headers.iter() {
        if name.first() == Some(&b':') || is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        builder = builder.header(name, value);
    }
    let request = builder.body(Full::new(Bytes::from(message.body_bytes().to_vec()))).ok()?;
    let response = tokio::time::timeout(UPSTREAM_TIMEOUT, front.client.request(request)).await.ok()?.ok()?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await.ok()?.to_bytes();
    let mut headers = Headers::from_pairs([(":status", parts.status.as_u16().to_string())]);
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name.as_str().as_bytes()) {
            headers.add(name.as_str(), value.as_bytes());
        }
    }
    let mut response = Response::from_headers(headers);
    if !body.is_empty() {
        response = response.body(body.to_vec());
    }
    Some(response)
}

/// The built-in upstream: `200` with the request as it arrived, so that a `curl` shows
/// what the filter forwarded.
fn echo(message: &Message) -> Response {
    let mut text = String::new();
    for (name, value) in message.headers.iter() {
        text.push_str(&String::from_utf8_lossy(name));
        text.push_str(": ");
        text.push_str(&String::from_utf8_lossy(value));
        text.push('\n');
    }
    if let Some(body) = &message.body {
        text.push('\n');
        text.push_str(&String::from_utf8_lossy(body));
        text.push('\n');
    }
    Response::ok().header("content-type", "text/plain").header("x-echo-upstream", "wasm-host").body(text.into_bytes())
}

fn is_hop_by_hop(name: &[u8]) -> bool {
    const HOP: [&[u8]; 7] =
        [b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade"];
    HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn to_http(headers: &Headers, body: &[u8]) -> HttpResponse {
    let status = headers.get_str(":status").and_then(|s| s.parse::<u16>().ok()).unwrap_or(502);
    let mut response = hyper::Response::new(Full::new(Bytes::from(body.to_vec())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    for (name, value) in headers.iter() {
        if name.first() == Some(&b':') || is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (hyper::header::HeaderName::from_bytes(name), hyper::header::HeaderValue::from_bytes(value))
        {
            response.headers_mut().append(name, value);
        }
    }
    response
}

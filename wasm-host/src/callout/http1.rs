//! The HTTP/1.1 client behind [`super::Cluster::Http`]: one connection per callout, the
//! request encoded as Envoy's HTTP/1 codec encodes it, and every socket event classified
//! as Envoy 1.40 classifies it (the table in [`super`]; the edge cases below were
//! measured with `tests/tests/envoy/callouts/`).
//!
//! It is written on `httparse` (hyper's parser) rather than on hyper's client: the guest
//! must see the response headers in wire order with duplicates where they were, and the
//! classification must know whether any byte of a response head had arrived.
//!
//! Before a response head, Envoy's codec calls these a protocol error (`502`): bytes that
//! do not parse as a response head, a head cut short by the close or a reset, more than
//! 100 headers, a header value with a control character, two `content-length` headers
//! (even equal ones), a `content-length` that is not a number, a `transfer-encoding`
//! other than exactly `chunked`, or one together with a `content-length`. Interim
//! responses (`1xx`) are skipped, except `101`, which is the response. After the head, a
//! bad chunk or the connection ending before the body does is a reset.

use std::net::SocketAddr;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{CalloutRequest, CalloutResponse, Ending, Failure, MAX_CALLOUT_RESPONSE_BYTES};
use crate::headers::Headers;

/// Envoy's default `max_headers_count`: a response head with more is a protocol error.
const MAX_HEADERS: usize = 100;
/// The largest response head read. Envoy accepted a 61 KiB header; its own limit was not
/// looked for, so this is only a guard against a server that never ends its head.
const MAX_HEAD_BYTES: usize = 1024 * 1024;
/// How much is read from the socket at once.
const READ_CHUNK: usize = 16 * 1024;

/// Sends `request` to `addr` and reads the whole response; `on_head` runs when the
/// response head has arrived (the host needs to know, for a timeout that falls later).
pub(crate) async fn send(addr: SocketAddr, request: &CalloutRequest, on_head: impl FnOnce()) -> Ending {
    let started = Instant::now();
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return Ending::BeforeHead(Failure::Refused);
    };
    let _ = stream.set_nodelay(true);
    if stream.write_all(&encode(request)).await.is_err() {
        return Ending::BeforeHead(Failure::Terminated);
    }
    let head_request = request.headers.get(":method") == Some(b"HEAD");
    let mut reader = Reader { stream, buf: Vec::new() };
    let head = match reader.head(head_request).await {
        Ok(head) => head,
        Err(failure) => return Ending::BeforeHead(failure),
    };
    on_head();
    let elapsed = started.elapsed();
    match reader.body(head.framing).await {
        Some(body) => Ending::Response(
            CalloutResponse { headers: head.headers, body, trailers: Headers::new() }.with_service_time(elapsed),
        ),
        None => Ending::Reset,
    }
}

/// The request as Envoy's HTTP/1 codec writes it: `host` from `:authority`, the guest's
/// headers in order (`content-length` set for a body, in place if the guest gave one), then
/// what the router adds, then `content-length: 0` for an empty body unless the method
/// has none. Trailers are dropped: a request with a body has a `content-length`, and
/// without a body Envoy sends the headers alone.
fn encode(request: &CalloutRequest) -> Vec<u8> {
    let headers = &request.headers;
    let method = headers.get(":method").unwrap_or(b"GET");
    let mut out = Vec::with_capacity(256 + request.body.len());
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(headers.get(":path").unwrap_or(b"/"));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut line = |name: &[u8], value: &[u8]| {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    };
    let body_length = (!request.body.is_empty()).then(|| request.body.len().to_string());
    for authority in headers.get_all(":authority") {
        line(b"host", authority);
    }
    let mut saw_length = false;
    for (name, value) in headers.iter().filter(|(name, _)| name.first() != Some(&b':')) {
        if name == b"content-length" {
            saw_length = true;
            line(name, body_length.as_deref().map_or(value, str::as_bytes));
        } else {
            line(name, value);
        }
    }
    if let Some(length) = body_length.as_deref().filter(|_| !saw_length) {
        line(b"content-length", length.as_bytes());
    }
    line(b"x-envoy-internal", b"true");
    if let Some(timeout) = request.timeout {
        line(b"x-envoy-expected-rq-timeout-ms", timeout.as_millis().to_string().as_bytes());
    }
    // Envoy's `requestShouldHaveNoBody`.
    let bodiless = [&b"GET"[..], b"HEAD", b"DELETE", b"TRACE", b"CONNECT"].contains(&method);
    if request.body.is_empty() && !saw_length && !bodiless {
        line(b"content-length", b"0");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&request.body);
    out
}

/// A response head, as the guest will read it.
struct Head {
    headers: Headers,
    framing: Framing,
}

/// How the body's end is found.
#[derive(Clone, Copy, Debug)]
enum Framing {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

struct Reader {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Reader {
    /// Reads more bytes; 0 at the end of the stream or on an error (a reset).
    async fn fill(&mut self) -> usize {
        let start = self.buf.len();
        self.buf.resize(start + READ_CHUNK, 0);
        let read = self.stream.read(self.buf.get_mut(start..).unwrap_or_default()).await.unwrap_or(0);
        self.buf.truncate(start + read);
        read
    }

    async fn head(&mut self, head_request: bool) -> Result<Head, Failure> {
        loop {
            if !self.buf.is_empty() {
                // One slot more than Envoy allows, so that one header too many fails.
                let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS + 1];
                let mut response = httparse::Response::new(&mut slots);
                match response.parse(&self.buf) {
                    Ok(httparse::Status::Complete(length)) => {
                        let status = response.code.unwrap_or_default();
                        let interim = (100..200).contains(&status) && status != 101;
                        let head = (!interim).then(|| parse_head(status, response.headers, head_request));
                        self.buf.drain(..length);
                        match head {
                            Some(head) => return head,
                            None => continue,
                        }
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() <= MAX_HEAD_BYTES => {}
                    Ok(httparse::Status::Partial) | Err(_) => return Err(Failure::ProtocolError),
                }
            }
            if self.fill().await == 0 {
                return Err(if self.buf.is_empty() { Failure::Terminated } else { Failure::ProtocolError });
            }
        }
    }

    /// The whole body; `None` when the stream ends or breaks before it does.
    async fn body(&mut self, framing: Framing) -> Option<Vec<u8>> {
        match framing {
            Framing::None => Some(Vec::new()),
            Framing::Length(length) => {
                if length > MAX_CALLOUT_RESPONSE_BYTES {
                    return None;
                }
                while self.buf.len() < length {
                    if self.fill().await == 0 {
                        return None;
                    }
                }
                self.buf.truncate(length);
                Some(std::mem::take(&mut self.buf))
            }
            Framing::UntilClose => {
                while self.fill().await > 0 {
                    if self.buf.len() > MAX_CALLOUT_RESPONSE_BYTES {
                        return None;
                    }
                }
                Some(std::mem::take(&mut self.buf))
            }
            Framing::Chunked => self.chunked().await,
        }
    }

    async fn chunked(&mut self) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let size = loop {
                match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.buf.drain(..used);
                        break usize::try_from(size).ok()?;
                    }
                    Ok(httparse::Status::Partial) => {
                        if self.fill().await == 0 {
                            return None;
                        }
                    }
                    Err(_) => return None,
                }
            };
            if size == 0 {
                // Trailers (dropped, as Envoy's HTTP/1 codec drops them), then an empty line.
                while !self.take_line().await?.is_empty() {}
                return Some(body);
            }
            if body.len() + size > MAX_CALLOUT_RESPONSE_BYTES {
                return None;
            }
            while self.buf.len() < size {
                if self.fill().await == 0 {
                    return None;
                }
            }
            body.extend(self.buf.drain(..size));
            if !self.take_line().await?.is_empty() {
                return None;
            }
        }
    }

    /// The next line, without its line ending.
    async fn take_line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Some(line);
            }
            if self.fill().await == 0 {
                return None;
            }
        }
    }
}

/// The head as the guest will read it, or why Envoy's codec refuses it.
fn parse_head(status: u16, parsed: &[httparse::Header<'_>], head_request: bool) -> Result<Head, Failure> {
    let mut headers = Headers::from_pairs([(":status", status.to_string())]);
    let mut length = None;
    let mut chunked = false;
    for header in parsed {
        let name = header.name.to_ascii_lowercase();
        let value = header.value.trim_ascii();
        match name.as_str() {
            "content-length" => {
                let digits = !value.is_empty() && value.iter().all(u8::is_ascii_digit);
                let parsed = std::str::from_utf8(value).ok().filter(|_| digits).and_then(|v| v.parse().ok());
                if length.is_some() || parsed.is_none() {
                    return Err(Failure::ProtocolError);
                }
                length = parsed;
            }
            "transfer-encoding" => {
                if chunked || !value.eq_ignore_ascii_case(b"chunked") {
                    return Err(Failure::ProtocolError);
                }
                chunked = true;
            }
            // Envoy's codec drops it; every other header reaches the guest.
            "keep-alive" => continue,
            _ => {}
        }
        headers.add(name, value);
    }
    if chunked && length.is_some() {
        return Err(Failure::ProtocolError);
    }
    let framing = match length {
        _ if head_request || status < 200 || status == 204 || status == 304 => Framing::None,
        _ if chunked => Framing::Chunked,
        Some(length) => Framing::Length(length),
        None => Framing::UntilClose,
    };
    Ok(Head { headers, framing })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request(headers: &[(&str, &str)], body: &str, timeout: Option<Duration>) -> CalloutRequest {
        CalloutRequest {
            worker: 0,
            cluster: "c".to_owned(),
            headers: Headers::from_pairs(headers.iter().copied()),
            body: body.as_bytes().to_vec(),
            trailers: Headers::from_pairs([("x-t", "t")]),
            timeout,
        }
    }

    #[test]
    fn a_request_with_a_body_is_encoded_as_envoy_encodes_it() {
        let request = request(
            &[(":method", "POST"), (":path", "/check"), ("x-extra", "extra"), (":authority", "counter")],
            "question",
            Some(Duration::from_millis(3000)),
        );

        let encoded = String::from_utf8(encode(&request)).unwrap();

        assert_eq!(
            encoded,
            "POST /check HTTP/1.1\r\nhost: counter\r\nx-extra: extra\r\ncontent-length: 8\r\nx-envoy-internal: true\r\n\
             x-envoy-expected-rq-timeout-ms: 3000\r\n\r\nquestion"
        );
    }

    #[test]
    fn an_empty_body_gets_a_zero_length_unless_the_method_has_no_body() {
        let post = request(&[(":method", "POST"), (":path", "/"), (":authority", "a")], "", None);
        let get = request(&[(":method", "GET"), (":path", "/"), (":authority", "a")], "", None);

        let post = String::from_utf8(encode(&post)).unwrap();
        let get = String::from_utf8(encode(&get)).unwrap();

        assert_eq!(post, "POST / HTTP/1.1\r\nhost: a\r\nx-envoy-internal: true\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(get, "GET / HTTP/1.1\r\nhost: a\r\nx-envoy-internal: true\r\n\r\n");
    }

    fn head(raw: &str) -> Result<Head, Failure> {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS + 1];
        let mut response = httparse::Response::new(&mut slots);
        match response.parse(raw.as_bytes()) {
            Ok(httparse::Status::Complete(_)) => parse_head(response.code.unwrap_or_default(), response.headers, false),
            _ => Err(Failure::ProtocolError),
        }
    }

    #[test]
    fn framing_headers_envoy_refuses_are_protocol_errors() {
        for raw in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(head(raw).err(), Some(Failure::ProtocolError), "{raw}");
        }
    }

    #[test]
    fn headers_keep_their_order_and_lose_keep_alive() {
        let head =
            head("HTTP/1.1 200 OK\r\nX-Dup: 1\r\nKeep-Alive: 5\r\nx-other:  padded \r\nx-dup: 2\r\n\r\n").unwrap();

        let pairs = head.headers.to_string_pairs();

        let expected = [(":status", "200"), ("x-dup", "1"), ("x-other", "padded"), ("x-dup", "2")];
        assert_eq!(pairs, expected.map(|(n, v)| (n.to_owned(), v.to_owned())));
        assert!(matches!(head.framing, Framing::UntilClose));
    }
}

//! A blocking HTTP/1.1 client for tests: keep-alive connections, header values as bytes,
//! and raw requests, so a test can send exactly the bytes it means (non-UTF-8 values,
//! odd paths) and read exactly what came back.
//!
//! Responses are parsed by `httparse` (hyper's parser); framing is `content-length`,
//! `chunked`, or close-delimited. Every read has a deadline ([`READ_TIMEOUT`]), so a
//! test against a hung server fails instead of hanging.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long one response may take to arrive before the read fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The most response headers parsed.
const MAX_HEADERS: usize = 128;

/// A request to send.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Method, such as `GET`.
    pub method: String,
    /// Request target (path and query), as bytes.
    pub path: Vec<u8>,
    /// Headers in order, values as bytes. `host` is added when absent.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body (sent with `content-length` when not empty).
    pub body: Vec<u8>,
}

impl Request {
    /// A `GET` of `path`.
    pub fn get(path: impl AsRef<[u8]>) -> Self {
        Self { method: "GET".to_owned(), path: path.as_ref().to_vec(), ..Self::default() }
    }

    /// A `POST` of `body` to `path`.
    pub fn post(path: impl AsRef<[u8]>, body: impl Into<Vec<u8>>) -> Self {
        Self { method: "POST".to_owned(), path: path.as_ref().to_vec(), body: body.into(), ..Self::default() }
    }

    /// A request with another method.
    #[must_use]
    pub fn method(mut self, method: &str) -> Self {
        method.clone_into(&mut self.method);
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// The bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.body.len());
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(&self.path);
        out.extend_from_slice(b" HTTP/1.1\r\n");
        if !self.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
            out.extend_from_slice(b"host: sluice.test\r\n");
        }
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() {
            out.extend_from_slice(format!("content-length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// A response as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers in order, names lower-cased, values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header, if it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_bytes(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first value of a header.
    pub fn header_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One keep-alive connection.
#[derive(Debug)]
pub struct Connection {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Connection {
    /// Connects to `addr`.
    ///
    /// # Errors
    /// When the connection cannot be made.
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_write_timeout(Some(READ_TIMEOUT))?;
        Ok(Self { reader: BufReader::new(stream), addr })
    }

    /// The address connected to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends `request` and reads its response.
    ///
    /// # Errors
    /// On I/O errors, a timeout, or a malformed response.
    pub fn send(&mut self, request: &Request) -> io::Result<Response> {
        self.send_raw(&request.encode(), request.method == "HEAD")
    }

    /// Writes `bytes` as they are and reads one response.
    ///
    /// # Errors
    /// On I/O errors, a timeout, or a malformed response.
    pub fn send_raw(&mut self, bytes: &[u8], head: bool) -> io::Result<Response> {
        self.reader.get_mut().write_all(bytes)?;
        read_response(&mut self.reader, head, &mut |_| {})
    }

    /// Sends `request` and reads its response, handing each chunk of a chunked body to
    /// `on_chunk` as soon as it has arrived (before the next is read).
    ///
    /// # Errors
    /// On I/O errors, a timeout, or a malformed response.
    pub fn send_streaming(&mut self, request: &Request, mut on_chunk: impl FnMut(&[u8])) -> io::Result<Response> {
        self.reader.get_mut().write_all(&request.encode())?;
        read_response(&mut self.reader, false, &mut on_chunk)
    }

    /// Writes `bytes` and does not wait for an answer (for requests a test abandons).
    ///
    /// # Errors
    /// On I/O errors.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// Reads one response (after [`Connection::write`]).
    ///
    /// # Errors
    /// On I/O errors, a timeout, or a malformed response.
    pub fn read(&mut self) -> io::Result<Response> {
        read_response(&mut self.reader, false, &mut |_| {})
    }

    /// Sets how long a read may wait.
    ///
    /// # Errors
    /// When the socket refuses the option.
    pub fn set_read_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(Some(timeout))
    }
}

/// Sends one request on a fresh connection.
///
/// # Panics
/// When the request fails: in a test, that is the failure.
pub fn send(addr: SocketAddr, request: &Request) -> Response {
    Connection::connect(addr)
        .and_then(|mut c| c.send(request))
        .unwrap_or_else(|e| panic!("request to {addr} failed: {e}"))
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// Reads a response head and its body from `reader`; each chunk of a chunked body also
/// goes to `on_chunk` as it arrives.
fn read_response(
    reader: &mut BufReader<TcpStream>,
    head: bool,
    on_chunk: &mut dyn FnMut(&[u8]),
) -> io::Result<Response> {
    let mut raw = Vec::with_capacity(512);
    loop {
        let before = raw.len();
        let read = reader.read_until(b'\n', &mut raw)?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before a response"));
        }
        if raw.len() > 1 << 20 {
            return Err(invalid("response head larger than 1 MiB"));
        }
        let line = raw.get(before..).unwrap_or_default();
        if line == b"\r\n" || line == b"\n" {
            break;
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    match parsed.parse(&raw) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("incomplete response head")),
        Err(e) => return Err(invalid(format!("malformed response head: {e}"))),
    }
    let status = parsed.code.ok_or_else(|| invalid("no status code"))?;
    let headers: Vec<(String, Vec<u8>)> =
        parsed.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect();
    let find = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
    let mut body = Vec::new();
    let bodiless = head || status == 204 || status == 304 || (100..200).contains(&status);
    if bodiless {
    } else if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked")) {
        read_chunked(reader, &mut body, on_chunk)?;
    } else if let Some(length) = find("content-length") {
        let length: usize = std::str::from_utf8(length)
            .ok()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| invalid("bad content-length"))?;
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(Response { status, headers, body })
}

fn read_chunked(
    reader: &mut BufReader<TcpStream>,
    body: &mut Vec<u8>,
    on_chunk: &mut dyn FnMut(&[u8]),
) -> io::Result<()> {
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| invalid(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let mut trailer = String::new();
                reader.read_line(&mut trailer)?;
                if trailer.trim().is_empty() {
                    return Ok(());
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(body.get_mut(start..).unwrap_or_default())?;
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf)?;
        on_chunk(body.get(start..).unwrap_or_default());
    }
}

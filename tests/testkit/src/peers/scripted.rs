//! A loopback peer that does exactly what a test scripts on the wire: answer, answer
//! late, say nothing, close or reset the connection, send something that is not HTTP, or
//! send a response head and then stall or reset.
//!
//! A [`Peer`] listens on a port the OS picks. On every connection it reads a request
//! (head, and a `content-length` or chunked body), then plays its [`Step`]s in order,
//! then waits for the next request on the same connection: after the last step the
//! connection stays open until the client closes it or [`HOLD_LIMIT`] passes. Everything
//! is bounded: it stops when dropped, and no connection is held longer than a step's wait
//! or [`HOLD_LIMIT`], so a failing test never leaves a thread behind that waits for ever.

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::accept::AcceptLoop;
use super::http::read_request;

/// The longest a connection is held open after the last step, or waits for a request.
pub const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// One thing a peer does on a connection, after it has read the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Writes these bytes.
    Write(Vec<u8>),
    /// Waits this long (or until the client closes the connection).
    Wait(Duration),
    /// Closes the connection (FIN).
    Close,
    /// Resets the connection (RST: `SO_LINGER` 0, then close).
    Reset,
}

impl Step {
    /// Writes `text`.
    pub fn write(text: impl AsRef<[u8]>) -> Self {
        Self::Write(text.as_ref().to_vec())
    }
}

/// A running peer (see the module docs).
#[derive(Debug)]
pub struct Peer {
    accept: AcceptLoop,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Peer {
    /// Starts a peer that plays `steps` on every request.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(steps: Vec<Step>) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let accept = AcceptLoop::start("a scripted peer", move |stream, stop| serve(stream, &steps, &seen, stop));
        Self { accept, requests }
    }

    /// A peer that reads every request and never answers (it holds the connection open
    /// for [`HOLD_LIMIT`]).
    pub fn silent() -> Self {
        Self::start(vec![Step::Wait(HOLD_LIMIT)])
    }

    /// A peer that answers every request `status` with `body`, keeping the connection.
    pub fn answering(status: u16, content_type: &str, body: &str) -> Self {
        let response = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        Self::start(vec![Step::Write(response.into_bytes())])
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.accept.addr()
    }

    /// The requests read so far, as bytes (head and body).
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The requests read so far, as text (invalid UTF-8 replaced).
    pub fn requests_as_text(&self) -> Vec<String> {
        self.requests().iter().map(|r| String::from_utf8_lossy(r).into_owned()).collect()
    }
}

fn serve(stream: TcpStream, steps: &[Step], requests: &Mutex<Vec<Vec<u8>>>, stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    // Keep-alive: a client (Envoy's connection pool) may send the next request on the
    // same connection; waiting for it is also how the connection is held open.
    while !stop.load(Ordering::Relaxed) {
        let _ = reader.get_ref().set_read_timeout(Some(HOLD_LIMIT));
        let Ok(request) = read_request(&mut reader) else { return };
        requests.lock().unwrap_or_else(PoisonError::into_inner).push(request.bytes);
        for step in steps {
            match step {
                Step::Write(bytes) => {
                    if writer.write_all(bytes).and_then(|()| writer.flush()).is_err() {
                        return;
                    }
                }
                Step::Wait(duration) => {
                    if !hold(&mut reader, *duration, stop) {
                        return;
                    }
                }
                Step::Close => {
                    let _ = writer.shutdown(Shutdown::Both);
                    return;
                }
                Step::Reset => {
                    let _ = socket2::SockRef::from(&writer).set_linger(Some(Duration::ZERO));
                    return;
                }
            }
        }
    }
}

/// Keeps the connection open for `duration`; false if the client closed it first.
fn hold(reader: &mut BufReader<TcpStream>, duration: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + duration;
    let mut scratch = [0u8; 1024];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stop.load(Ordering::Relaxed) {
            return true;
        }
        let _ = reader.get_ref().set_read_timeout(Some(left.min(Duration::from_millis(100))));
        match reader.read(&mut scratch) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(peer: &Peer, request: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(peer.addr()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a read timeout");
        stream.write_all(request).expect("send");
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        reply
    }

    #[test]
    fn a_peer_plays_its_steps_after_each_request_and_records_it() {
        let peer = Peer::start(vec![Step::write("HTTP/1.1 204 No Content\r\n\r\n"), Step::Close]);

        let reply = exchange(&peer, b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n");

        assert_eq!(reply, b"HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(peer.requests_as_text(), ["GET /a HTTP/1.1\r\nhost: x\r\n\r\n"]);
    }

    #[test]
    fn an_answering_peer_keeps_the_connection_for_the_next_request() {
        let peer = Peer::answering(500, "text/plain", "boom");
        let expected = b"HTTP/1.1 500 X\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\r\nboom";
        let mut stream = TcpStream::connect(peer.addr()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a read timeout");

        for _ in 0..2 {
            stream.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("send");
            let mut reply = vec![0u8; expected.len()];
            stream.read_exact(&mut reply).expect("the answer");

            assert_eq!(reply, expected);
        }
        assert_eq!(peer.requests().len(), 2);
    }

    #[test]
    fn a_silent_peer_reads_and_never_answers_until_it_is_dropped() {
        let peer = Peer::silent();
        let mut stream = TcpStream::connect(peer.addr()).expect("connect");
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("send");
        stream.set_read_timeout(Some(Duration::from_millis(300))).expect("a read timeout");

        let mut byte = [0u8; 1];
        let waited = stream.read(&mut byte).map_err(|e| e.kind());

        assert!(matches!(waited, Err(io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)), "{waited:?}");
        drop(peer);
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a read timeout");
        assert_eq!(stream.read(&mut byte).ok(), Some(0), "the connection closes once the peer is dropped");
    }
}

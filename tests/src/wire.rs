//! Loopback servers that do exactly one thing on the wire, for the callout tests: answer,
//! answer late, say nothing, close or reset the connection, send something that is not
//! HTTP, or send a response head and then stall or reset.
//!
//! A [`WireServer`] listens on a port the OS picks. On every connection it reads a
//! request (head, and a `content-length` or chunked body), then plays its [`Step`]s in
//! order, then waits for the next request on the same connection: after the last step the
//! connection stays open until the client closes it or [`HOLD_LIMIT`] passes. Everything is bounded: a server accepts for at most
//! [`LIFETIME`] and stops when dropped, so a failing test never leaves a thread behind
//! that waits for ever. [`refused`] gives an address where nothing listens.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// The longest a connection is held open after the last step, or waits for a request.
pub const HOLD_LIMIT: Duration = Duration::from_secs(10);
/// The longest a server accepts connections.
pub const LIFETIME: Duration = Duration::from_secs(120);
/// How often the accept loop looks at the stop flag and the lifetime.
const POLL: Duration = Duration::from_millis(5);

/// One thing a server does on a connection, after it has read the request.
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

/// A running server (see the module docs).
#[derive(Debug)]
pub struct WireServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl WireServer {
    /// Starts a server that plays `steps` on every connection.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(steps: Vec<Step>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("the server's address");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (stop_, requests_) = (Arc::clone(&stop), Arc::clone(&requests));
        thread::spawn(move || {
            let started = Instant::now();
            while !stop_.load(Ordering::Relaxed) && started.elapsed() < LIFETIME {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (steps, requests, stop) = (steps.clone(), Arc::clone(&requests_), Arc::clone(&stop_));
                        thread::spawn(move || serve(stream, &steps, &requests, &stop));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL),
                    Err(_) => thread::sleep(POLL),
                }
            }
        });
        Self { addr, stop, requests }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The requests read so far, as bytes (head and body).
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for WireServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A loopback address where nothing listens: connecting to it is refused.
///
/// # Panics
/// When no loopback port can be bound.
pub fn refused() -> SocketAddr {
    // The port was free a moment ago and is closed again: nothing listens on it.
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind a loopback port")
}

fn serve(stream: TcpStream, steps: &[Step], requests: &Mutex<Vec<Vec<u8>>>, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    // Keep-alive: a client (Envoy's connection pool) may send the next request on the
    // same connection; waiting for it is also how the connection is held open.
    while !stop.load(Ordering::Relaxed) {
        let _ = reader.get_ref().set_read_timeout(Some(HOLD_LIMIT));
        let Ok(request) = read_request(&mut reader) else { return };
        requests.lock().unwrap_or_else(PoisonError::into_inner).push(request);
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

/// Reads a request head and its body (`content-length` or chunked, trailers included).
fn read_request(reader: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut request = Vec::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        request.extend_from_slice(&line);
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        if text.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = text.split_once(':') {
            match name.trim() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "transfer-encoding" => chunked = value.contains("chunked"),
                _ => {}
            }
        }
    }
    if chunked {
        loop {
            let mut size_line = Vec::new();
            reader.read_until(b'\n', &mut size_line)?;
            request.extend_from_slice(&size_line);
            let size_text = String::from_utf8_lossy(&size_line);
            let size = usize::from_str_radix(size_text.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
            if size == 0 {
                // Trailers, then the blank line.
                loop {
                    let mut trailer = Vec::new();
                    if reader.read_until(b'\n', &mut trailer)? == 0 {
                        return Ok(request);
                    }
                    request.extend_from_slice(&trailer);
                    if trailer.trim_ascii().is_empty() {
                        return Ok(request);
                    }
                }
            }
            let mut chunk = vec![0u8; size + 2];
            reader.read_exact(&mut chunk)?;
            request.extend_from_slice(&chunk);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    request.extend_from_slice(&body);
    Ok(request)
}

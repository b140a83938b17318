//! An HTTP/1.1 upstream that answers every request with `200` and, as the body, the
//! request's head exactly as it arrived: a test behind Envoy reads the headers the filter
//! added to the request it forwarded. Keep-alive; one thread per connection; it stops
//! when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// A running echo upstream.
#[derive(Debug)]
pub struct Echo {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Echo {
    /// Starts one.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port for the echo upstream");
        let addr = listener.local_addr().expect("the echo upstream's address");
        let stop = Arc::new(AtomicBool::new(false));
        let stop_ = Arc::clone(&stop);
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(stream) = stream {
                    thread::spawn(move || serve(stream));
                }
            }
        });
        Self { addr, stop }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// The request headers in an echoed body, in order, names lower-cased.
pub fn headers(body: &[u8]) -> Vec<(String, Vec<u8>)> {
    body.split(|b| *b == b'\n')
        .skip(1)
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|b| *b == b':')?;
            let (name, value) = line.split_at(colon);
            let value = value.get(1..).unwrap_or_default().trim_ascii();
            Some((String::from_utf8_lossy(name).to_ascii_lowercase(), value.to_vec()))
        })
        .collect()
}

fn serve(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = Vec::new();
        let mut length = 0usize;
        loop {
            let mut line = Vec::new();
            if reader.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim_ascii().is_empty() {
                break;
            }
            let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
            if let Some(value) = text.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            head.extend_from_slice(&line);
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let mut response =
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n", head.len())
                .into_bytes();
        response.extend_from_slice(&head);
        if writer.write_all(&response).is_err() {
            return;
        }
    }
}

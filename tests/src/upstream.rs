//! A small HTTP/1.1 upstream for tests: it listens on a port the OS picks, answers every
//! request with `200`, a fixed set of headers and a body that names the request's path,
//! and counts what it served. Keep-alive; one thread per connection; it stops when
//! dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

/// A running upstream.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    served: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    /// Starts an upstream that adds `headers` to every response.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(headers: &[(&str, &str)]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port for the upstream");
        let addr = listener.local_addr().expect("the upstream's address");
        let served = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let head: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
        let (served_, stop_) = (served.clone(), stop.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (head, served) = (head.clone(), served_.clone());
                thread::spawn(move || serve(stream, &head, &served));
            }
        });
        Self { addr, served, stop }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve(stream: TcpStream, head: &str, served: &AtomicU64) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        served.fetch_add(1, Ordering::Relaxed);
        let body = format!("upstream saw {path}\n");
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{head}\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

//! A small HTTP/1.1 upstream for tests: it listens on a port the OS picks, answers every
//! request with `200`, a fixed set of headers and a body that names the request's path,
//! and counts what it served. Keep-alive; one thread per connection; it stops when
//! dropped (`sluice_testkit::peers::AcceptLoop`).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_testkit::peers::{AcceptLoop, read_request};

/// A running upstream.
#[derive(Debug)]
pub struct Upstream {
    accept: AcceptLoop,
    served: Arc<AtomicU64>,
}

impl Upstream {
    /// Starts an upstream that adds `headers` to every response.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(headers: &[(&str, &str)]) -> Self {
        let served = Arc::new(AtomicU64::new(0));
        let head: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
        let counted = Arc::clone(&served);
        let accept = AcceptLoop::start("the upstream", move |stream, _| serve(stream, &head, &counted));
        Self { accept, served }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.accept.addr()
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

fn serve(stream: TcpStream, head: &str, served: &AtomicU64) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    while let Ok(request) = read_request(&mut reader) {
        served.fetch_add(1, Ordering::Relaxed);
        let body = format!("upstream saw {}\n", request.path());
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{head}\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

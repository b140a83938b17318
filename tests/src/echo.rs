//! An HTTP/1.1 upstream that answers every request with `200` and, as the body, the
//! request's head exactly as it arrived: a test behind Envoy reads the headers the filter
//! added to the request it forwarded. Keep-alive; one thread per connection; it stops
//! when dropped (`sluice_testkit::peers::AcceptLoop`).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use sluice_testkit::peers::{AcceptLoop, read_request};

/// A running echo upstream.
#[derive(Debug)]
pub struct Echo {
    accept: AcceptLoop,
}

impl Echo {
    /// Starts one.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start() -> Self {
        Self { accept: AcceptLoop::start("the echo upstream", |stream, _| serve(stream)) }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.accept.addr()
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
    while let Ok(request) = read_request(&mut reader) {
        let head = request.head();
        let mut response =
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n", head.len())
                .into_bytes();
        response.extend_from_slice(head);
        if writer.write_all(&response).is_err() {
            return;
        }
    }
}

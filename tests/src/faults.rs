//! Loopback peers that misbehave the way a counter service can: one that accepts and
//! never answers, one that answers a fixed status and body, and a port nothing listens
//! on. Each binds a port the OS picks and stops when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

/// A peer that answers every request the same way (or not at all).
#[derive(Debug)]
pub struct Peer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
}

/// What a [`Peer`] does with a request.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Reads it and never answers (the connection stays open).
    Silent,
    /// Answers this raw HTTP/1.1 response.
    Answer(Vec<u8>),
    /// Answers this raw HTTP/1.1 response after this long.
    AnswerAfter(Duration, Vec<u8>),
}

impl Peer {
    /// Starts a peer.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let (stop, requests) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (stop_, requests_) = (stop.clone(), requests.clone());
        thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                if stop_.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (behaviour, requests) = (behaviour.clone(), requests_.clone());
                let stop = stop_.clone();
                match behaviour {
                    Behaviour::Silent => {
                        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
                        held.push(stream);
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                    Behaviour::Answer(bytes) => {
                        thread::spawn(move || answer(stream, &bytes, Duration::ZERO, &requests, &stop));
                    }
                    Behaviour::AnswerAfter(delay, bytes) => {
                        thread::spawn(move || answer(stream, &bytes, delay, &requests, &stop));
                    }
                }
            }
        });
        Self { addr, stop, requests }
    }

    /// A peer that answers `status` with `body`.
    pub fn answering(status: u16, content_type: &str, body: &str) -> Self {
        let response = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        Self::start(Behaviour::Answer(response.into_bytes()))
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections (silent) or requests (answering) seen so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn answer(stream: TcpStream, bytes: &[u8], delay: Duration, requests: &AtomicU64, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    while !stop.load(Ordering::Relaxed) {
        let mut length = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim().is_empty() && !first {
                break;
            }
            first = false;
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
        requests.fetch_add(1, Ordering::Relaxed);
        thread::sleep(delay);
        if writer.write_all(bytes).is_err() {
            return;
        }
    }
}

/// A loopback address nothing listens on: a port the OS picked, released at once.
///
/// # Panics
/// When no loopback port can be bound.
pub fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address")
}

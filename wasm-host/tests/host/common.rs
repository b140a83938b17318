//! Helpers shared by the tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use wasm_host::{Host, HostBuilder, Message, Outcome, Request, StreamId, Worker};

/// A host for the test guest with this plugin configuration.
pub fn guest() -> HostBuilder {
    Host::builder(sluice_artifacts::TEST_GUEST_WASM)
}

/// A host for the test guest, built.
pub fn host(configuration: &str) -> Host {
    guest().plugin_configuration(configuration).build().expect("the test guest starts")
}

/// A GET carrying the test guest's operations.
pub fn ops(operations: &str) -> Request {
    Request::get("/test").header("x-test-op", operations)
}

/// The request as the filter forwarded it.
pub fn forwarded(worker: &Worker, stream: StreamId) -> Message {
    match worker.outcome(stream).expect("the stream is open") {
        Outcome::Forwarded(message) => message.clone(),
        other => panic!("expected the request to be forwarded, got {other:?}"),
    }
}

/// Sends `request` and returns it as forwarded.
pub fn forward(worker: &mut Worker, request: Request) -> Message {
    let stream = worker.request(request);
    forwarded(worker, stream)
}

/// A header as text ("" if absent).
pub fn text(message: &Message, name: &str) -> String {
    message.headers.get(name).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()
}

/// How a test HTTP server answers.
#[derive(Clone)]
pub enum Behaviour {
    /// Answer with these raw bytes, then close the connection.
    Respond(&'static str),
    /// Answer with these raw bytes, then hold the connection open.
    RespondAndHold(&'static str),
    /// Read the request, then hold the connection open without answering.
    Hold,
}

/// A minimal HTTP/1.1 server on loopback, one thread; records each request head.
pub struct TestServer {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl TestServer {
    pub fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let head = read_request(&mut stream);
                seen.lock().unwrap().push(head);
                match &behaviour {
                    Behaviour::Respond(response) => {
                        let _ = stream.write_all(response.as_bytes());
                    }
                    Behaviour::RespondAndHold(response) => {
                        let _ = stream.write_all(response.as_bytes());
                        held.push(stream);
                    }
                    Behaviour::Hold => held.push(stream),
                }
            }
        });
        Self { addr, requests }
    }
}

/// Reads one request (head and `content-length` body) and returns its head and body.
fn read_request(stream: &mut TcpStream) -> String {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the socket"));
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    head.push_str("\r\n");
    head.push_str(&String::from_utf8_lossy(&body));
    head
}

/// A loopback address where nothing listens.
pub fn refused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address")
}

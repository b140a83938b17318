//! A language-model-like upstream for tests: it answers each request with the token usage
//! the request asks for, as a JSON document or as a stream of server-sent events whose
//! last event carries the usage (OpenAI's `stream_options.include_usage`), and records
//! what it reported to whom, so that a test can replay the usage that really went out
//! through an oracle.
//!
//! The request says what to answer in its query: `tokens=N` (the usage), `stream=1` (an
//! event stream of [`EVENTS`] content events, the usage event and `[DONE]`, each written
//! as one chunk), `lockstep=1` (with `stream=1`: each event is written only after the test
//! has called [`LlmUpstream::acknowledge`] for the previous one, so an answer held back by
//! the proxy stalls the stream, which [`LlmUpstream::stalled`] reports), `cut=1` (with
//! `stream=1`: the connection is closed after half the content events, before the usage;
//! without it, after half the JSON document; such an answer is not recorded as served),
//! `body=none` (a JSON document without usage), `body=garbage` (an answer that is not
//! JSON), `body=huge` (a JSON document whose usage comes after [`HUGE_PADDING`] bytes of
//! content: larger than the filter reads).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use sluice_testkit::peers::{AcceptLoop, Received, read_request};

/// Content events before the usage event in a streamed answer.
pub const EVENTS: usize = 4;
/// The content before the usage of a `body=huge` document, in bytes.
pub const HUGE_PADDING: usize = 300 * 1024;
/// How long a lockstep stream waits for the test to acknowledge an event.
const LOCKSTEP_WAIT: Duration = Duration::from_secs(10);

/// One answer the upstream finished writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The request's `x-user` header (empty if none).
    pub user: String,
    /// The usage it reported.
    pub tokens: u64,
}

#[derive(Debug, Default)]
struct State {
    served: Vec<Served>,
    acknowledged: usize,
    stalled: bool,
}

/// A running upstream (see the module docs).
#[derive(Debug)]
pub struct LlmUpstream {
    accept: AcceptLoop,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl LlmUpstream {
    /// Starts the upstream on a loopback port the OS picks.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start() -> Self {
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let shared = Arc::clone(&state);
        let accept = AcceptLoop::start("the LLM upstream", move |stream, _| serve(stream, &shared));
        Self { accept, state }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.accept.addr()
    }

    /// The answers written in full so far.
    pub fn served(&self) -> Vec<Served> {
        self.lock().served.clone()
    }

    /// The test has seen lockstep event `n` (1-based): the upstream may write the next.
    pub fn acknowledge(&self, n: usize) {
        self.lock().acknowledged = n;
        self.state.1.notify_all();
    }

    /// Whether a lockstep stream waited in vain for an acknowledgement.
    pub fn stalled(&self) -> bool {
        self.lock().stalled
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a request asks for.
struct Ask {
    user: String,
    tokens: u64,
    stream: bool,
    lockstep: bool,
    cut: bool,
    body: String,
}

fn ask(request: &Received) -> Ask {
    let path = request.path();
    let query = path.split_once('?').map_or("", |(_, q)| q);
    let param = |name: &str| query.split('&').find_map(|p| p.strip_prefix(name)?.strip_prefix('='));
    let head = String::from_utf8_lossy(request.head()).into_owned();
    let user = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("x-user")).map(|(_, v)| v.trim()))
        .unwrap_or_default()
        .to_owned();
    Ask {
        user,
        tokens: param("tokens").and_then(|t| t.parse().ok()).unwrap_or(0),
        stream: param("stream") == Some("1"),
        lockstep: param("lockstep") == Some("1"),
        cut: param("cut") == Some("1"),
        body: param("body").unwrap_or_default().to_owned(),
    }
}

/// The events of a streamed answer reporting `tokens`, in order.
pub fn events(tokens: u64) -> Vec<String> {
    let mut events: Vec<String> = (0..EVENTS)
        .map(|i| format!("data: {{\"choices\": [{{\"delta\": {{\"content\": \"part {i}\"}}}}], \"usage\": null}}\n\n"))
        .collect();
    events.push(format!("data: {{\"choices\": [], \"usage\": {{\"total_tokens\": {tokens}}}}}\n\n"));
    events.push("data: [DONE]\n\n".to_owned());
    events
}

/// The JSON answer reporting `tokens`.
pub fn document(tokens: u64) -> String {
    format!("{{\"choices\": [{{\"message\": {{\"content\": \"hi\"}}}}], \"usage\": {{\"total_tokens\": {tokens}}}}}")
}

fn serve(stream: TcpStream, state: &(Mutex<State>, Condvar)) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    while let Ok(request) = read_request(&mut reader) {
        let ask = ask(&request);
        let written = if ask.stream { write_stream(&mut writer, &ask, state) } else { write_json(&mut writer, &ask) };
        if !written {
            return;
        }
        let mut guard = state.0.lock().unwrap_or_else(PoisonError::into_inner);
        guard.served.push(Served { user: ask.user, tokens: ask.tokens });
    }
}

/// The body of a whole (not streamed) answer, as `body=` asks.
pub fn answer(tokens: u64, body: &str) -> String {
    match body {
        "none" => "{\"choices\": [{\"message\": {\"content\": \"hi\"}}]}".to_owned(),
        "garbage" => "<html><body>502 Bad Gateway</body></html>".to_owned(),
        "huge" => format!(
            "{{\"choices\": [{{\"message\": {{\"content\": \"{}\"}}}}], \"usage\": {{\"total_tokens\": {tokens}}}}}",
            "x".repeat(HUGE_PADDING)
        ),
        _ => document(tokens),
    }
}

fn write_json(writer: &mut TcpStream, ask: &Ask) -> bool {
    let body = answer(ask.tokens, &ask.body);
    let response =
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    if ask.cut {
        // Half the document, then the connection closes: the upstream resets.
        let _ = writer.write_all(&response.as_bytes()[..response.len() - body.len() / 2]);
        return false;
    }
    writer.write_all(response.as_bytes()).is_ok()
}

fn write_stream(writer: &mut TcpStream, ask: &Ask, state: &(Mutex<State>, Condvar)) -> bool {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    if writer.write_all(head.as_bytes()).is_err() {
        return false;
    }
    for (i, event) in events(ask.tokens).iter().enumerate() {
        if ask.cut && i == EVENTS / 2 {
            return false;
        }
        if ask.lockstep && i > 0 && !acknowledged(state, i) {
            state.0.lock().unwrap_or_else(PoisonError::into_inner).stalled = true;
        }
        if writer.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes()).is_err() {
            return false;
        }
        let _ = writer.flush();
    }
    writer.write_all(b"0\r\n\r\n").is_ok()
}

/// Waits until the test has acknowledged event `n`; false after [`LOCKSTEP_WAIT`].
fn acknowledged(state: &(Mutex<State>, Condvar), n: usize) -> bool {
    let guard = state.0.lock().unwrap_or_else(PoisonError::into_inner);
    let (guard, _) = state
        .1
        .wait_timeout_while(guard, LOCKSTEP_WAIT, |s| s.acknowledged < n)
        .unwrap_or_else(PoisonError::into_inner);
    guard.acknowledged >= n
}

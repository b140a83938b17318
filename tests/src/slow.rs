//! An upstream that holds requests: every request whose path starts with `/hold` is
//! answered only after a fixed hold, or at once when the test releases it (or drops the
//! upstream); other paths are answered at once. It counts the requests it is holding
//! right now and the most it ever held at once: the oracle of the concurrency tests,
//! measured where the requests arrive rather than where the filter decides.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sluice_testkit::peers::{AcceptLoop, read_request};

/// The longest a request is ever held, whatever the test asked: a test that forgets to
/// release still ends.
pub const MAX_HOLD: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Counts {
    holding: AtomicU64,
    most: AtomicU64,
    served: AtomicU64,
    /// Bumped by `release`: every held request whose generation is older is answered.
    generation: Mutex<u64>,
    changed: Condvar,
}

/// A running holding upstream.
#[derive(Debug)]
pub struct SlowUpstream {
    accept: AcceptLoop,
    counts: Arc<Counts>,
}

impl SlowUpstream {
    /// Starts an upstream that holds each `/hold…` request for `hold` (at most
    /// [`MAX_HOLD`]) unless released earlier.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(hold: Duration) -> Self {
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        let hold = hold.min(MAX_HOLD);
        let accept = AcceptLoop::start("the slow upstream", move |stream, stop| serve(stream, hold, &shared, stop));
        Self { accept, counts }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.accept.addr()
    }

    /// Requests it is holding now.
    pub fn holding(&self) -> u64 {
        self.counts.holding.load(Ordering::SeqCst)
    }

    /// The most requests it ever held at once.
    pub fn most_held(&self) -> u64 {
        self.counts.most.load(Ordering::SeqCst)
    }

    /// Requests answered (held or not).
    pub fn served(&self) -> u64 {
        self.counts.served.load(Ordering::SeqCst)
    }

    /// Answers every request held now.
    pub fn release(&self) {
        if let Ok(mut generation) = self.counts.generation.lock() {
            *generation += 1;
        }
        self.counts.changed.notify_all();
    }

    /// Waits until it holds exactly `count` requests, for at most `within`; whether it
    /// did.
    pub fn wait_holding(&self, count: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.holding() == count {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.holding() == count
    }
}

impl Drop for SlowUpstream {
    fn drop(&mut self) {
        self.release();
    }
}

fn serve(stream: TcpStream, hold: Duration, counts: &Counts, stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(MAX_HOLD));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    while let Ok(request) = read_request(&mut reader) {
        let path = request.path();
        if path.starts_with("/hold") {
            let now = counts.holding.fetch_add(1, Ordering::SeqCst) + 1;
            counts.most.fetch_max(now, Ordering::SeqCst);
            wait(counts, hold, stop);
            counts.holding.fetch_sub(1, Ordering::SeqCst);
        }
        counts.served.fetch_add(1, Ordering::SeqCst);
        let body = format!("upstream saw {path}\n");
        let response =
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// Holds for `hold`, or until `release` (or the upstream stops).
fn wait(counts: &Counts, hold: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + hold;
    let Ok(mut generation) = counts.generation.lock() else { return };
    let started = *generation;
    while *generation == started && !stop.load(Ordering::Relaxed) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let step = left.min(Duration::from_millis(100));
        match counts.changed.wait_timeout(generation, step) {
            Ok((next, _)) => generation = next,
            Err(_) => return,
        }
    }
}

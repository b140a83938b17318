//! How a test waits for something outside it (a server to answer, a process to die):
//! polling, with a deadline that fails the test loudly.

use std::time::{Duration, Instant};

/// Polls `ready` every 20 ms until it holds.
///
/// # Panics
/// When `within` passes first, naming `what` it waited for.
pub fn until(within: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

//! What a worker asks of its host, narrowed to the calls that act on a stream (resume,
//! reply, close) or wake the worker's root context; callouts go through the host's
//! [`Callouts`]. The proxy-wasm glue implements it with host calls, the tests with a
//! recording fake that can refuse any of them.

use crate::host::{Callouts, HostFailure};

/// The host calls a worker makes. A call on "the stream" acts on the effective context:
/// the worker enters the stream first when it acts from its root context.
pub trait Port: Callouts {
    /// Makes stream `id` the effective context (before acting on it from the root).
    ///
    /// # Errors
    /// The stream is gone.
    fn enter(&mut self, id: u32) -> Result<(), HostFailure>;

    /// Resumes the paused stream.
    ///
    /// # Errors
    /// The host refused.
    fn resume(&mut self) -> Result<(), HostFailure>;

    /// Answers the stream locally.
    ///
    /// # Errors
    /// The host refused the reply.
    fn reply(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) -> Result<(), HostFailure>;

    /// Resets the stream.
    ///
    /// # Errors
    /// The host refused.
    fn close(&mut self) -> Result<(), HostFailure>;

    /// Wakes this worker's root context through its shared queue.
    ///
    /// # Errors
    /// The host refused (the tick then sends what the wake would have).
    fn wake(&mut self, queue: u32) -> Result<(), HostFailure>;
}

/// What `on_http_request_headers` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Forward the request now.
    Continue,
    /// Hold it (paused, waiting, or answered locally).
    Pause,
}

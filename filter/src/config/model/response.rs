//! What the filter does with a request it limits: the rejection response, the
//! rate-limit headers it sends, and the pausing of shaped requests.

pub use super::bounds::{DEFAULT_MAX_PAUSED, DEFAULT_STATUS, DEFAULT_TICK_MS, MAX_BODY};

/// Which rate-limit headers to send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderSets {
    /// `Retry-After`.
    pub retry_after: bool,
    /// `RateLimit-Policy` and `RateLimit`.
    pub ratelimit: bool,
    /// `X-RateLimit-*`.
    pub legacy: bool,
}

impl HeaderSets {
    /// Whether any header is sent.
    pub const fn any(&self) -> bool {
        self.retry_after || self.ratelimit || self.legacy
    }
}

/// The rejection response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status of a rejection.
    pub status: u16,
    /// Body of a rejection.
    pub body: String,
    /// Extra headers on a rejection, `content-type` included.
    pub headers: Vec<(String, String)>,
    /// Headers on rejections.
    pub on_rejected: HeaderSets,
    /// Headers on allowed responses.
    pub on_allowed: HeaderSets,
    /// The header that names the fallback that decided, if configured.
    pub fallback_header: Option<String>,
    /// The header that names the operators' overrides that decided, if configured.
    pub override_header: Option<String>,
}

/// Pausing of shaped requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shaping {
    /// Most requests paused at once per worker.
    pub max_paused: u32,
    /// Tick period (ms).
    pub tick_ms: u32,
}

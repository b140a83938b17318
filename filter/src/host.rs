//! The port between the policy engine and the proxy: what the engine may ask about a
//! request, and where it reports counts. The wasm glue implements both over proxy-wasm;
//! tests use [`FakeRequest`] and [`RecordedMetrics`].

use std::collections::HashMap;

/// What the engine reads about one request. Values are bytes: HTTP allows non-UTF-8
/// header values, and nothing here may fail on them.
pub trait RequestFacts {
    /// The first value of a request header (lower-case name), or of a pseudo-header
    /// (`:path`, `:method`, `:authority`).
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    /// A host property, such as `["source", "address"]`.
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
}

/// Per-policy counters and the queued gauge; see [`Counter`].
pub trait Metrics {
    /// Adds `delta` to `counter` of the policy at `policy` (its index in the configuration).
    /// Only [`Counter::Queued`] is ever given a negative delta.
    fn add(&mut self, policy: usize, counter: Counter, delta: i64);
}

/// The counters kept per policy. Names are `<stat_prefix>.<policy>.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// Requests the policy applied to (matched, key resolved or handled).
    Offered,
    /// Of those, requests forwarded upstream (now, after a shaping delay, or by a failure
    /// outcome of `allow`). A queued request whose client left also counts here: it spent
    /// its place in the queue (see `Abandoned`).
    Allowed,
    /// Of those, requests answered with a rejection, whichever policy caused it.
    Rejected,
    /// Gauge: requests paused by shaping right now. `Offered = Allowed + Rejected + Queued`.
    Queued,
    /// This policy's own decision said no (the policy that binds).
    OverLimit,
    /// This shadow policy would have rejected the request.
    ShadowRejected,
    /// Requests missing a key part.
    MissingKey,
    /// CAS writes that lost a race and were retried.
    CasConflicts,
    /// Decisions abandoned after every CAS attempt conflicted.
    CasExhausted,
    /// Decisions that failed because the shared-data store failed.
    StoreErrors,
    /// Undecodable shared-data states replaced by exhausted ones.
    Repaired,
    /// Decisions made on the overflow bucket because the caller's slot was held.
    Overflowed,
    /// Refunds (all-or-nothing across policies) that could not be written.
    Unrefunded,
    /// Requests forwarded by the failure outcome `allow`.
    FailureAllowed,
    /// Requests denied by the failure outcome `deny`.
    FailureDenied,
    /// Queued requests whose stream ended before their release.
    Abandoned,
}

impl Counter {
    /// Every counter, in a fixed order.
    pub const ALL: [Self; 16] = [
        Self::Offered,
        Self::Allowed,
        Self::Rejected,
        Self::Queued,
        Self::OverLimit,
        Self::ShadowRejected,
        Self::MissingKey,
        Self::CasConflicts,
        Self::CasExhausted,
        Self::StoreErrors,
        Self::Repaired,
        Self::Overflowed,
        Self::Unrefunded,
        Self::FailureAllowed,
        Self::FailureDenied,
        Self::Abandoned,
    ];

    /// The metric name suffix.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Offered => "offered",
            Self::Allowed => "allowed",
            Self::Rejected => "rejected",
            Self::Queued => "queued",
            Self::OverLimit => "over_limit",
            Self::ShadowRejected => "shadow_rejected",
            Self::MissingKey => "missing_key",
            Self::CasConflicts => "cas_conflicts",
            Self::CasExhausted => "cas_exhausted",
            Self::StoreErrors => "store_errors",
            Self::Repaired => "repaired",
            Self::Overflowed => "overflowed",
            Self::Unrefunded => "unrefunded",
            Self::FailureAllowed => "failure_allowed",
            Self::FailureDenied => "failure_denied",
            Self::Abandoned => "abandoned",
        }
    }

    /// Whether the metric is a gauge (it goes down as well as up).
    pub const fn is_gauge(self) -> bool {
        matches!(self, Self::Queued)
    }

    /// Position in [`Counter::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// A request built in a test: headers and properties as bytes.
#[derive(Debug, Clone, Default)]
pub struct FakeRequest {
    headers: Vec<(String, Vec<u8>)>,
    properties: HashMap<Vec<String>, Vec<u8>>,
}

impl FakeRequest {
    /// A `GET` of `path` from `127.0.0.1`.
    pub fn get(path: &str) -> Self {
        Self::default()
            .with_header(":method", "GET")
            .with_header(":path", path)
            .with_header(":authority", "example.com")
            .with_property(&["source", "address"], "127.0.0.1:50000")
    }

    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// Sets a property.
    #[must_use]
    pub fn with_property(mut self, path: &[&str], value: impl AsRef<[u8]>) -> Self {
        self.properties.insert(path.iter().map(|s| (*s).to_owned()).collect(), value.as_ref().to_vec());
        self
    }

    /// Removes a property.
    #[must_use]
    pub fn without_property(mut self, path: &[&str]) -> Self {
        self.properties.remove(&path.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        self
    }
}

impl RequestFacts for FakeRequest {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.properties.get(&path.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).cloned()
    }
}

/// Metrics kept in memory, for tests.
#[derive(Debug, Clone, Default)]
pub struct RecordedMetrics(pub HashMap<(usize, Counter), i64>);

impl RecordedMetrics {
    /// The value of one counter.
    pub fn get(&self, policy: usize, counter: Counter) -> i64 {
        self.0.get(&(policy, counter)).copied().unwrap_or(0)
    }
}

impl Metrics for RecordedMetrics {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        *self.0.entry((policy, counter)).or_insert(0) += delta;
    }
}

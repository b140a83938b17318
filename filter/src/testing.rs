//! Fakes of the engine's ports for tests and benchmarks: a request, callouts and recorded
//! metrics. Compiled only for this crate's unit tests and behind the `testing` feature
//! (which its bench and integration tests turn on): none of this is in `sluice.wasm`.

use crate::host::{
    Call, Callouts, Counter, DispatchError, HostFailure, Metrics, PluginCounter, RequestFacts, ResponseFacts, Wait,
};
use sluice_protocol::{ErrorBody, ErrorCode};
use std::collections::HashMap;

/// The body the counter service answers an error with (`{"error": {"code", "message"}}`),
/// the code named through [`ErrorCode`] as the service names it.
pub fn service_error(code: ErrorCode, message: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody::new(code.name(), message)).unwrap_or_default()
}

/// A request built in a test: headers and properties as bytes, and reads that fail.
#[derive(Debug, Clone, Default)]
pub struct FakeRequest {
    headers: Vec<(String, Vec<u8>)>,
    properties: HashMap<Vec<String>, Vec<u8>>,
    failing: Vec<String>,
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

    /// Makes reading this header (or property, `.`-joined) fail as a host error would.
    #[must_use]
    pub fn failing(mut self, name: &str) -> Self {
        self.failing.push(name.to_owned());
        self
    }
}

impl RequestFacts for FakeRequest {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        if self.failing.iter().any(|f| f == name) {
            return Err(HostFailure { status: 2 });
        }
        Ok(self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
    }

    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, HostFailure> {
        if self.failing.contains(&path.join(".")) {
            return Err(HostFailure { status: 2 });
        }
        Ok(self.properties.get(&path.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).cloned())
    }
}

/// A response's headers, built in a test; reading `failing` fails as a host error would.
#[derive(Debug, Clone, Default)]
pub struct FakeResponse {
    headers: Vec<(String, Vec<u8>)>,
    failing: Vec<String>,
}

impl FakeResponse {
    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// Makes reading this header fail as a host error would.
    #[must_use]
    pub fn failing(mut self, name: &str) -> Self {
        self.failing.push(name.to_owned());
        self
    }
}

impl ResponseFacts for FakeResponse {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        if self.failing.iter().any(|f| f == name) {
            return Err(HostFailure { status: 2 });
        }
        Ok(self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
    }
}

/// Metrics kept in memory.
#[derive(Debug, Clone, Default)]
pub struct RecordedMetrics {
    /// Per policy.
    pub policies: HashMap<(usize, Counter), i64>,
    /// Per plugin.
    pub plugin: HashMap<PluginCounter, i64>,
    /// How many times a count was handed over (a host call each, in the proxy).
    pub handed_over: u64,
    /// Every wait recorded, in order (milliseconds).
    pub waits: Vec<(Wait, u64)>,
}

impl RecordedMetrics {
    /// The value of one policy counter.
    pub fn get(&self, policy: usize, counter: Counter) -> i64 {
        self.policies.get(&(policy, counter)).copied().unwrap_or(0)
    }

    /// The value of one plugin counter.
    pub fn plugin(&self, counter: PluginCounter) -> i64 {
        self.plugin.get(&counter).copied().unwrap_or(0)
    }

    /// How many times a count was handed over.
    pub const fn calls(&self) -> u64 {
        self.handed_over
    }
}

impl Metrics for RecordedMetrics {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        self.handed_over += 1;
        *self.policies.entry((policy, counter)).or_insert(0) += delta;
    }

    fn add_plugin(&mut self, counter: PluginCounter, delta: i64) {
        self.handed_over += 1;
        *self.plugin.entry(counter).or_insert(0) += delta;
    }

    fn record_wait(&mut self, wait: Wait, ms: u64) {
        self.handed_over += 1;
        self.waits.push((wait, ms));
    }
}

/// A callout as the engine sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCall {
    /// Cluster.
    pub cluster: String,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body, as text.
    pub body: String,
    /// Timeout.
    pub timeout_ms: u32,
}

/// Records callouts and hands out tokens; `refuse` makes dispatch fail.
#[derive(Debug, Clone, Default)]
pub struct FakeCallouts {
    /// Every call, in order.
    pub sent: Vec<SentCall>,
    /// When set, dispatch fails with this status.
    pub refuse: Option<u32>,
}

impl Callouts for FakeCallouts {
    fn dispatch(&mut self, call: &Call<'_>) -> Result<u32, DispatchError> {
        if let Some(status) = self.refuse {
            return Err(DispatchError { status });
        }
        self.sent.push(SentCall {
            cluster: call.cluster.to_owned(),
            headers: call.headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
            body: String::from_utf8_lossy(call.body).into_owned(),
            timeout_ms: call.timeout_ms,
        });
        Ok(u32::try_from(self.sent.len()).unwrap_or(u32::MAX))
    }
}

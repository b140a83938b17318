//! What the simulation and the oracle say to each other: a request as sent, a stream as
//! observed, what to do with it next, a finding, and the fallback header read back.

/// A request as the simulation sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// `x-tenant`.
    pub tenant: String,
    /// `x-user`.
    pub user: String,
    /// `x-route`.
    pub route: String,
    /// Whether its path is under `/a/`.
    pub under_a: bool,
    /// `x-cost`.
    pub cost: u64,
    /// What the upstream's answer reports in `x-usage`.
    pub usage: u64,
}

impl Sent {
    pub(super) fn value(&self, header: &str) -> &str {
        match header {
            "x-tenant" => &self.tenant,
            "x-user" => &self.user,
            _ => &self.route,
        }
    }
}

/// What a stream is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The filter holds it.
    Paused,
    /// It went upstream.
    Forwarded,
    /// The client got an answer.
    Answered {
        /// Its status.
        status: u16,
        /// The filter's own reply (a rejection), not the upstream's.
        local: bool,
        /// The fallback header.
        fallback: Option<String>,
    },
    /// The filter reset it.
    Reset,
    /// It ended (its client left).
    Gone,
}

/// What the simulation does with a stream next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing yet.
    Keep,
    /// Have the upstream answer it.
    Upstream,
    /// Forget it.
    Done,
}

/// An oracle's finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which oracle.
    pub oracle: &'static str,
    /// What it found.
    pub detail: String,
}

impl Violation {
    /// A finding of `oracle`.
    pub fn new(oracle: &'static str, detail: impl Into<String>) -> Self {
        Self { oracle, detail: detail.into() }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.oracle, self.detail)
    }
}

/// `emergency; reason=timeout; policies=a,b` → (kind, reason, policies).
pub(super) fn parse_fallback(value: Option<&str>) -> (Option<&str>, Option<&str>, Vec<String>) {
    let Some(value) = value else { return (None, None, Vec::new()) };
    let mut parts = value.split("; ");
    let kind = parts.next();
    let (mut reason, mut policies) = (None, Vec::new());
    for part in parts {
        if let Some(r) = part.strip_prefix("reason=") {
            reason = Some(r);
        } else if let Some(list) = part.strip_prefix("policies=") {
            policies = list.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        }
    }
    (kind, reason, policies)
}

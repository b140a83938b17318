//! What the simulation and the oracle say to each other: a request as sent, a stream as
//! observed, what to do with it next, a finding, and the fallback header read back.

use crate::fleet::scenario::{PolicyDef, UsageFrom};

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
    /// The cost the upstream's answer reports (where [`Sent::report`] says).
    pub usage: u64,
    /// How the answer reports it.
    pub report: Report,
}

/// How an upstream's answer reports its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// In its `x-usage` header.
    pub header: bool,
    /// In its body.
    pub body: Body,
}

/// An upstream answer's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// None.
    Empty,
    /// A JSON document with `usage.total_tokens`.
    Json,
    /// An event stream whose last event carries `usage.total_tokens`.
    Events,
    /// An event stream none of whose events carries it (a stream without usage).
    EventsWithoutUsage,
    /// Text that is not JSON.
    Text,
}

impl Sent {
    pub(super) fn value(&self, header: &str) -> &str {
        match header {
            "x-tenant" => &self.tenant,
            "x-user" => &self.user,
            _ => &self.route,
        }
    }

    /// The cost the answer reports where `from` reads it, if it does.
    pub fn reported(&self, from: UsageFrom) -> Option<u64> {
        let reported = match from {
            UsageFrom::Header => self.report.header,
            UsageFrom::Json => matches!(self.report.body, Body::Json | Body::Events),
        };
        reported.then_some(self.usage)
    }

    /// What the answer makes of this request's cost under `policy`, whose estimate was
    /// `estimate`: `None` when the policy does not read costs from responses.
    pub fn actual(&self, policy: &PolicyDef, estimate: u64) -> Option<u64> {
        let usage = policy.usage?;
        Some(match self.reported(usage.from) {
            Some(reported) => reported.min(usage.max),
            None => usage.on_unknown.unwrap_or(estimate),
        })
    }

    /// The upstream's answer.
    pub(in crate::fleet) fn response(&self) -> wasm_host::Response {
        let usage = self.usage;
        let mut response = wasm_host::Response::ok();
        if self.report.header {
            response = response.header("x-usage", usage.to_string());
        }
        let json = format!(r#"{{"id":"r","usage":{{"prompt_tokens":0,"total_tokens":{usage}}}}}"#);
        let events = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        match self.report.body {
            Body::Empty => response,
            Body::Json => response.header("content-type", "application/json").body(json),
            Body::Events => response
                .header("content-type", "text/event-stream")
                .body(format!("{events}data: {json}\n\ndata: [DONE]\n\n")),
            Body::EventsWithoutUsage => {
                response.header("content-type", "text/event-stream").body(format!("{events}data: [DONE]\n\n"))
            }
            Body::Text => response.header("content-type", "text/plain").body("not json"),
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
        /// The override header (`clamp; id=ovr-…; policy=p0, bypass; …`).
        overridden: Option<String>,
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

/// The policies an override header (`clamp; id=ovr-…; policy=p0, bypass; id=…; policy=p1`)
/// names under overrides of `kind`.
pub(super) fn parse_overridden(value: Option<&str>, kind: &str) -> Vec<String> {
    let Some(value) = value else { return Vec::new() };
    value
        .split(", ")
        .filter(|one| one.split("; ").next() == Some(kind))
        .filter_map(|one| one.split("; ").find_map(|part| part.strip_prefix("policy=")))
        .map(str::to_owned)
        .collect()
}

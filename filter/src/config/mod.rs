//! Configuration: one JSON document, parsed strictly ([`raw`]) and validated into the
//! compiled form ([`Config`]) that the request path uses.
//!
//! Every error names the field it is about and what was expected, for example
//! `policies[1].rate: expected "<n>/<second|minute|hour|day>", got "10/fortnight"`.
//! Parsing stops at the first malformed value (the JSON cannot be read past it);
//! validation then reports every semantic problem it finds, one per line. Values the
//! admission arithmetic cannot represent are rejected here, never discovered per request.

pub mod global;
pub mod raw;

pub use global::{Breaker, CounterService, Global, Lease, Secret, SecretSource, Strategy};
use raw::{
    DurationSpec, RawAlgorithm, RawConfig, RawCost, RawFailureAction, RawHeaderSet, RawKeyPart, RawMatch,
    RawMissingKey, RawOverflow, RawPolicy, RawResponse, RawShaping,
};
use shared_store::{Limit, MAX_LOG_ENTRIES, Nanos, Rate};
use std::collections::BTreeSet;
use std::fmt;
use std::num::NonZeroU32;

/// Default number of slots per policy: about 0.75 MiB of shared data per policy (a slot
/// is a ~90-byte key plus value), enough to track eight thousand concurrently active
/// callers exactly; callers beyond that share the policy's overflow bucket.
pub const DEFAULT_SLOTS: u32 = 8192;
/// Most slots a policy may have (about 90 MiB of shared data).
pub const MAX_SLOTS: u32 = 1 << 20;
/// Largest rate amount, burst, window limit, queue depth or cost a configuration may
/// give. Far above any real limit; it keeps every header value and every product in the
/// arithmetic small, and it is below the largest amount the counter service takes
/// ([`sluice_protocol::MAX_AMOUNT`], 2^40), so every number a global policy is
/// configured with is one the service accepts.
pub const MAX_CONFIGURED_AMOUNT: u64 = 1_000_000_000_000;
const _: () = assert!(MAX_CONFIGURED_AMOUNT <= sluice_protocol::MAX_AMOUNT);
/// Longest shaping delay: a paused request holds a connection and memory in the proxy.
pub const MAX_WAIT_MS: u128 = 5 * 60 * 1000;
/// Largest rejection body.
pub const MAX_BODY: usize = 64 * 1024;
/// Default rejection status.
pub const DEFAULT_STATUS: u16 = 429;
/// Default status when a policy cannot decide and its failure outcome is `deny`.
pub const DEFAULT_FAILURE_STATUS: u16 = 503;
/// Default bound on requests one worker holds paused.
pub const DEFAULT_MAX_PAUSED: u32 = 1024;
/// Default tick period for releasing paused requests (ms).
pub const DEFAULT_TICK_MS: u32 = 10;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Policies, in configuration order.
    pub policies: Vec<Policy>,
    /// Rejection response and header choices.
    pub response: Response,
    /// Pausing of shaped requests.
    pub shaping: Shaping,
    /// Metric name prefix.
    pub stat_prefix: String,
    /// The counter service, for global policies.
    pub counter_service: Option<CounterService>,
}

/// One validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Unique name (safe for metric names and header strings).
    pub name: String,
    /// Key parts, combined.
    pub key: Vec<KeyPart>,
    /// Which requests it applies to.
    pub matcher: Matcher,
    /// The algorithm and its numbers.
    pub limit: Limit,
    /// Cost per request.
    pub cost: Cost,
    /// What a missing key part does.
    pub on_missing_key: MissingKey,
    /// Count, never reject.
    pub shadow: bool,
    /// Bucket generation.
    pub version: u64,
    /// Slot-table size.
    pub slots: NonZeroU32,
    /// What happens when no decision can be made.
    pub on_failure: FailureOutcome,
    /// Global policies: how the policy consults the counter service. `None`: local.
    pub global: Option<Global>,
    /// Global policies: the local cap that decides first while the service cannot.
    pub emergency: Option<Limit>,
}

impl Policy {
    /// Whether the policy's budget is kept by the counter service.
    pub const fn is_global(&self) -> bool {
        self.global.is_some()
    }
}

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// A request header's value.
    Header(String),
    /// The host's `source.address`, masked to these prefix lengths.
    ClientAddress {
        /// IPv4 prefix length.
        ipv4_prefix: u8,
        /// IPv6 prefix length.
        ipv6_prefix: u8,
    },
    /// `:authority`.
    Authority,
    /// `:path` without the query.
    Path,
    /// `:method`.
    Method,
    /// A query parameter's value.
    QueryParameter(String),
    /// A host property.
    Property(Vec<String>),
    /// A constant.
    Constant(String),
}

/// When a policy applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// Path (without query) must equal this.
    pub path_exact: Option<String>,
    /// Path (without query) must start with this.
    pub path_prefix: Option<String>,
    /// Method must be one of these.
    pub methods: Option<Vec<String>>,
    /// Header conditions.
    pub headers: Vec<HeaderCondition>,
}

/// A header condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderCondition {
    /// Present (`true`) or absent (`false`).
    Present(String, bool),
    /// Equal to these bytes.
    Equals(String, String),
}

/// Cost of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Always this.
    Constant(u64),
    /// From a header, clamped.
    Header {
        /// Header name.
        name: String,
        /// When missing or unparsable.
        default: u64,
        /// Lower bound.
        min: u64,
        /// Upper bound.
        max: u64,
    },
}

impl Cost {
    /// The most one request can cost.
    pub const fn max(&self) -> u64 {
        match self {
            Self::Constant(cost) => *cost,
            Self::Header { max, .. } => *max,
        }
    }
}

/// What a missing key part does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingKey {
    /// One bucket for every request missing the key.
    Shared,
    /// The policy does not apply.
    Skip,
    /// Reject the request.
    Reject,
}

/// What happens when no decision can be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    /// Forward the request.
    Allow,
    /// Answer with this status.
    Deny(u16),
}

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
}

/// Pausing of shaped requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shaping {
    /// Most requests paused at once per worker.
    pub max_paused: u32,
    /// Tick period (ms).
    pub tick_ms: u32,
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The JSON is malformed or a value has the wrong shape.
    Syntax {
        /// Where (`policies[1].rate`), or `.` for the document.
        path: String,
        /// What was expected.
        message: String,
    },
    /// The JSON is well formed but its values do not make a valid configuration.
    Invalid(Vec<Issue>),
}

/// One semantic problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Where.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax { path, message } if path == "." => write!(f, "configuration: {message}"),
            Self::Syntax { path, message } => write!(f, "{path}: {message}"),
            Self::Invalid(issues) => {
                for (i, issue) in issues.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{issue}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Parses and validates a configuration.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] with the path of the first malformed value, or
    /// [`ConfigError::Invalid`] listing every semantic problem.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let raw = parse(bytes)?;
        validate(raw)
    }
}

/// Parses the JSON into its raw form.
///
/// # Errors
/// [`ConfigError::Syntax`].
pub fn parse(bytes: &[u8]) -> Result<RawConfig, ConfigError> {
    // serde accepts a JSON array for a struct (as a tuple); a configuration is an object.
    if bytes.trim_ascii_start().first().is_some_and(|b| *b != b'{') {
        return Err(ConfigError::Syntax { path: ".".to_owned(), message: "expected a JSON object".to_owned() });
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let mut path = e.path().to_string();
        let inner = e.into_inner();
        let message = if inner.is_data() {
            // Data errors are located by the path; the position adds nothing.
            let text = inner.to_string();
            let text = match text.rfind(" at line ") {
                Some(cut) => text.get(..cut).unwrap_or(&text).to_owned(),
                None => text,
            };
            plain_types(&text)
        } else {
            if path.contains('?') {
                path = ".".to_owned();
            }
            // Syntax and end-of-input errors: the position is the only location there is.
            format!("invalid JSON: {inner}")
        };
        ConfigError::Syntax { path, message }
    })?;
    Ok(raw)
}

/// Replaces Rust type names in serde's messages with what a person writes.
fn plain_types(message: &str) -> String {
    let mut out = message.to_owned();
    for (rust, plain) in [
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer below 2^32"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected a boolean", "expected true or false"),
    ] {
        if let Some(stripped) = out.strip_suffix(rust) {
            out = format!("{stripped}{plain}");
        }
    }
    out
}

/// Collects issues while validating.
struct Issues(Vec<Issue>);

impl Issues {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Issue { path: path.into(), message: message.into() });
    }
}

fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// An HTTP field name as Envoy stores it: a lower-case token.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_')
                || matches!(b, b'`' | b'|' | b'~')
        })
}

fn is_header_value(value: &str) -> bool {
    value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

fn header_name(issues: &mut Issues, path: &str, name: &str) {
    if !is_header_name(name) {
        issues.add(path, format!("expected a lower-case header name, got {name:?}"));
    }
}

/// The header names Sluice sets itself on a rejection; configuring them would duplicate.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "cache-control",
];

fn amount(issues: &mut Issues, path: &str, value: u64) -> Option<u64> {
    if value == 0 {
        issues.add(path, "must be at least 1");
        None
    } else if value > MAX_CONFIGURED_AMOUNT {
        issues.add(path, format!("must be at most {MAX_CONFIGURED_AMOUNT}, got {value}"));
        None
    } else {
        Some(value)
    }
}

fn window_nanos(issues: &mut Issues, path: &str, spec: DurationSpec) -> Option<Nanos> {
    if spec.millis == 0 {
        issues.add(path, "must be longer than zero");
        return None;
    }
    match u64::try_from(spec.millis.saturating_mul(1_000_000)) {
        Ok(ns) => Some(Nanos(ns)),
        Err(_) => {
            issues.add(
                path,
                format!(
                    "must be at most 213503d (the longest time a u64 of nanoseconds holds), got \"{}{}\"",
                    spec.amount, spec.unit
                ),
            );
            None
        }
    }
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut issues = Issues(Vec::new());
    if raw.policies.is_empty() {
        issues.add("policies", "expected at least one policy");
    }
    let mut names = BTreeSet::new();
    let mut policies = Vec::with_capacity(raw.policies.len());
    for (index, policy) in raw.policies.into_iter().enumerate() {
        let path = format!("policies[{index}]");
        if !names.insert(policy.name.clone()) {
            issues.add(format!("{path}.name"), format!("{:?} is used by an earlier policy", policy.name));
        }
        if let Some(policy) = validate_policy(&mut issues, &path, policy) {
            policies.push(policy);
        }
    }
    let response = validate_response(&mut issues, raw.response);
    let shaping = validate_shaping(&mut issues, raw.shaping);
    let stat_prefix = raw.stat_prefix.unwrap_or_else(|| "sluice".to_owned());
    if !is_name(&stat_prefix) {
        issues.add("stat_prefix", format!("expected 1 to 64 characters from A-Z a-z 0-9 _ . -, got {stat_prefix:?}"));
    }
    let counter_service = raw.counter_service.map(|service| global::validate_counter_service(&mut issues, service));
    let checks = policies.iter().filter(|p| p.global.is_some_and(|g| g.strategy == Strategy::Check)).count();
    if checks > usize::from(sluice_protocol::DEFAULT_MAX_ENTRIES) {
        issues.add(
            "policies",
            format!(
                "{checks} global policies use strategy \"check\", but one check carries at most {} entries \
                 (sluice-counter's --max-entries default), and a request matching them all would be refused; \
                 use \"lease\" for some, or fewer policies",
                sluice_protocol::DEFAULT_MAX_ENTRIES
            ),
        );
    }
    for (index, policy) in policies.iter().enumerate() {
        if !policy.is_global() {
            continue;
        }
        let Some(service) = &counter_service else {
            issues.add(
                format!("policies[{index}].global"),
                "needs a counter_service (at the top level) to keep its budget",
            );
            continue;
        };
        if let Some(missing) = service.partition.iter().find(|part| !policy.key.contains(part)) {
            issues.add(
                format!("policies[{index}].key"),
                format!(
                    "a global policy's key must include every part of counter_service.partition (missing {})",
                    global::describe(missing)
                ),
            );
        }
    }
    if issues.0.is_empty() {
        Ok(Config { policies, response, shaping, stat_prefix, counter_service })
    } else {
        Err(ConfigError::Invalid(issues.0))
    }
}

fn validate_policy(issues: &mut Issues, path: &str, raw: RawPolicy) -> Option<Policy> {
    let before = issues.0.len();
    if !is_name(&raw.name) {
        issues.add(
            format!("{path}.name"),
            format!("expected 1 to 64 characters from A-Z a-z 0-9 _ . -, got {:?}", raw.name),
        );
    }
    let limit = validate_limit(issues, path, &raw);
    let global = match (&raw.global, &limit) {
        (Some(global), Some(limit)) => global::validate_global(issues, path, &raw, global, limit),
        _ => None,
    };
    let emergency = match raw.on_failure.as_ref().and_then(|f| f.emergency.as_ref()) {
        Some(_) if raw.global.is_none() => {
            issues.add(
                format!("{path}.on_failure.emergency"),
                "only global policies have an emergency cap (a local policy decides in the proxy already)",
            );
            None
        }
        Some(emergency) => global::validate_emergency(issues, &format!("{path}.on_failure.emergency"), emergency),
        None => None,
    };
    let key = validate_key(issues, &format!("{path}.key"), raw.key, false);
    let matcher = validate_match(issues, &format!("{path}.match"), raw.matcher.unwrap_or_default());
    let cost = limit.and_then(|limit| validate_cost(issues, path, raw.cost.as_ref(), limit.capacity()));
    if let (Some(Global { strategy: Strategy::Lease(lease), .. }), Some(cost)) = (&global, &cost)
        && cost.max() > lease.size
    {
        issues.add(
            format!("{path}.global.lease.size"),
            format!(
                "must be at least the most one request can cost ({}), got {}: a request costlier than one grant \
                 could never be admitted",
                cost.max(),
                lease.size
            ),
        );
    }
    let slots = match raw.slots {
        None => NonZeroU32::new(DEFAULT_SLOTS),
        Some(slots) if (1..=MAX_SLOTS).contains(&slots) => NonZeroU32::new(slots),
        Some(slots) => {
            issues.add(format!("{path}.slots"), format!("must be between 1 and {MAX_SLOTS}, got {slots}"));
            None
        }
    };
    let on_failure = match raw.on_failure {
        None => FailureOutcome::Deny(DEFAULT_FAILURE_STATUS),
        Some(failure) => match (failure.action, failure.status) {
            (RawFailureAction::Allow, None) => FailureOutcome::Allow,
            (RawFailureAction::Allow, Some(_)) => {
                issues.add(format!("{path}.on_failure.status"), "only applies to action \"deny\"");
                FailureOutcome::Allow
            }
            (RawFailureAction::Deny, status) => {
                let status = status.unwrap_or(DEFAULT_FAILURE_STATUS);
                if !(400..=599).contains(&status) {
                    issues
                        .add(format!("{path}.on_failure.status"), format!("must be between 400 and 599, got {status}"));
                }
                FailureOutcome::Deny(status)
            }
        },
    };
    let on_missing_key = match raw.on_missing_key {
        RawMissingKey::Shared => MissingKey::Shared,
        RawMissingKey::Skip => MissingKey::Skip,
        RawMissingKey::Reject => MissingKey::Reject,
    };
    if issues.0.len() > before {
        return None;
    }
    Some(Policy {
        name: raw.name,
        key,
        matcher,
        limit: limit?,
        cost: cost?,
        on_missing_key,
        shadow: raw.shadow,
        version: raw.version,
        slots: slots?,
        on_failure,
        global,
        emergency,
    })
}

fn validate_key(issues: &mut Issues, path: &str, parts: Vec<RawKeyPart>, may_be_empty: bool) -> Vec<KeyPart> {
    if parts.is_empty() && !may_be_empty {
        issues.add(path, "expected at least one key part (use {\"constant\": \"all\"} for one shared bucket)");
    }
    let mut key = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        key.push(match part {
            RawKeyPart::Header(name) => {
                header_name(issues, &format!("{at}.header"), &name);
                if name.starts_with(':') {
                    issues.add(format!("{at}.header"), "use \"authority\", \"path\" or \"method\" for pseudo-headers");
                }
                KeyPart::Header(name)
            }
            RawKeyPart::ClientAddress => KeyPart::ClientAddress { ipv4_prefix: 32, ipv6_prefix: 128 },
            RawKeyPart::MaskedClientAddress(mask) => {
                let ipv4_prefix = mask.ipv4_prefix.unwrap_or(32);
                let ipv6_prefix = mask.ipv6_prefix.unwrap_or(64);
                if ipv4_prefix > 32 {
                    issues.add(
                        format!("{at}.masked_client_address.ipv4_prefix"),
                        format!("must be at most 32, got {ipv4_prefix}"),
                    );
                }
                if ipv6_prefix > 128 {
                    issues.add(
                        format!("{at}.masked_client_address.ipv6_prefix"),
                        format!("must be at most 128, got {ipv6_prefix}"),
                    );
                }
                KeyPart::ClientAddress { ipv4_prefix, ipv6_prefix }
            }
            RawKeyPart::Authority => KeyPart::Authority,
            RawKeyPart::Path => KeyPart::Path,
            RawKeyPart::Method => KeyPart::Method,
            RawKeyPart::QueryParameter(name) => {
                if name.is_empty() {
                    issues.add(format!("{at}.query_parameter"), "expected a parameter name, got \"\"");
                }
                KeyPart::QueryParameter(name)
            }
            RawKeyPart::Property(segments) => {
                if segments.is_empty() || segments.iter().any(String::is_empty) {
                    issues.add(
                        format!("{at}.property"),
                        "expected a non-empty path of non-empty segments, such as [\"source\", \"address\"]",
                    );
                }
                KeyPart::Property(segments)
            }
            RawKeyPart::Constant(value) => KeyPart::Constant(value),
        });
    }
    key
}

fn validate_match(issues: &mut Issues, path: &str, raw: RawMatch) -> Matcher {
    for (field, value) in [("path_exact", &raw.path_exact), ("path_prefix", &raw.path_prefix)] {
        if let Some(value) = value
            && !value.starts_with('/')
        {
            issues.add(format!("{path}.{field}"), format!("expected a path starting with \"/\", got {value:?}"));
        }
    }
    if raw.path_exact.is_some() && raw.path_prefix.is_some() {
        issues.add(format!("{path}.path_prefix"), "cannot be combined with path_exact");
    }
    if let Some(methods) = &raw.methods {
        if methods.is_empty() {
            issues.add(format!("{path}.methods"), "expected at least one method");
        }
        for (i, method) in methods.iter().enumerate() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                issues.add(
                    format!("{path}.methods[{i}]"),
                    format!("expected an upper-case method such as \"GET\", got {method:?}"),
                );
            }
        }
    }
    let mut headers = Vec::with_capacity(raw.headers.len());
    for (i, header) in raw.headers.into_iter().enumerate() {
        let at = format!("{path}.headers[{i}]");
        header_name(issues, &format!("{at}.name"), &header.name);
        match (header.present, header.equals) {
            (Some(present), None) => headers.push(HeaderCondition::Present(header.name, present)),
            (None, Some(value)) => headers.push(HeaderCondition::Equals(header.name, value)),
            _ => issues.add(at, "expected exactly one of \"present\" or \"equals\""),
        }
    }
    Matcher { path_exact: raw.path_exact, path_prefix: raw.path_prefix, methods: raw.methods, headers }
}

fn validate_limit(issues: &mut Issues, path: &str, raw: &RawPolicy) -> Option<Limit> {
    let algorithm = raw.algorithm;
    let name = match algorithm {
        RawAlgorithm::TokenBucket => "token_bucket",
        RawAlgorithm::FixedWindow => "fixed_window",
        RawAlgorithm::SlidingWindow => "sliding_window",
        RawAlgorithm::SlidingLog => "sliding_log",
        RawAlgorithm::LeakyBucket => "leaky_bucket",
    };
    let windowed =
        matches!(algorithm, RawAlgorithm::FixedWindow | RawAlgorithm::SlidingWindow | RawAlgorithm::SlidingLog);
    let fields: [(&str, bool, bool); 7] = [
        ("rate", raw.rate.is_some(), !windowed),
        ("burst", raw.burst.is_some(), algorithm == RawAlgorithm::TokenBucket),
        ("limit", raw.limit.is_some(), windowed),
        ("window", raw.window.is_some(), windowed),
        ("queue", raw.queue.is_some(), algorithm == RawAlgorithm::LeakyBucket),
        ("max_wait", raw.max_wait.is_some(), algorithm == RawAlgorithm::LeakyBucket),
        ("overflow", raw.overflow.is_some(), algorithm == RawAlgorithm::LeakyBucket),
    ];
    let mut ok = true;
    for (field, present, allowed) in fields {
        if present && !allowed {
            issues.add(format!("{path}.{field}"), format!("is not used by algorithm \"{name}\""));
            ok = false;
        }
    }
    let required = |issues: &mut Issues, field: &str, present: bool| {
        if !present {
            issues.add(format!("{path}.{field}"), format!("is required by algorithm \"{name}\""));
        }
        present
    };
    let rate = if windowed {
        None
    } else if required(issues, "rate", raw.rate.is_some()) {
        raw.rate.and_then(|spec| {
            let amount = amount(issues, &format!("{path}.rate"), spec.amount)?;
            Rate::new(amount, Nanos::from_secs(spec.per_secs))
        })
    } else {
        None
    };
    let limit = match algorithm {
        RawAlgorithm::TokenBucket => {
            let rate = rate?;
            let burst = match raw.burst {
                Some(burst) => amount(issues, &format!("{path}.burst"), burst)?,
                // The `<n>` as written: `Rate` keeps its fraction in lowest terms.
                None => raw.rate.map_or(1, |spec| spec.amount),
            };
            // The time to refill from empty must fit the clock: it becomes reset values.
            let refill = u128::from(burst) * u128::from(rate.per().0) / u128::from(rate.amount());
            if refill > u128::from(u64::MAX) {
                issues.add(format!("{path}.burst"), "takes longer than 584 years to refill at this rate");
                return None;
            }
            Limit::token_bucket(rate, burst).ok()
        }
        RawAlgorithm::FixedWindow | RawAlgorithm::SlidingWindow | RawAlgorithm::SlidingLog => {
            let limit = if required(issues, "limit", raw.limit.is_some()) {
                raw.limit.and_then(|l| amount(issues, &format!("{path}.limit"), l))
            } else {
                None
            };
            let window = if required(issues, "window", raw.window.is_some()) {
                raw.window.and_then(|w| window_nanos(issues, &format!("{path}.window"), w))
            } else {
                None
            };
            let (limit, window) = (limit?, window?);
            match algorithm {
                RawAlgorithm::FixedWindow => Limit::fixed_window(limit, window).ok(),
                RawAlgorithm::SlidingWindow => Limit::sliding_window(limit, window).ok(),
                _ => {
                    if limit > MAX_LOG_ENTRIES {
                        issues.add(format!("{path}.limit"), format!("must be at most {MAX_LOG_ENTRIES} for algorithm \"sliding_log\" (its state keeps one entry per request), got {limit}"));
                        return None;
                    }
                    Limit::sliding_log(limit, window).ok()
                }
            }
        }
        RawAlgorithm::LeakyBucket => {
            let queue_mode = raw.overflow.unwrap_or(RawOverflow::Queue) == RawOverflow::Queue;
            let queue = if required(issues, "queue", raw.queue.is_some()) {
                raw.queue.and_then(|q| amount(issues, &format!("{path}.queue"), q))
            } else {
                None
            };
            let max_wait = if queue_mode {
                if required(issues, "max_wait", raw.max_wait.is_some()) {
                    raw.max_wait.and_then(|w| {
                        if w.millis > MAX_WAIT_MS {
                            issues.add(
                                format!("{path}.max_wait"),
                                format!("must be at most 5m, got \"{}{}\"", w.amount, w.unit),
                            );
                            None
                        } else {
                            window_nanos(issues, &format!("{path}.max_wait"), w)
                        }
                    })
                } else {
                    None
                }
            } else {
                if raw.max_wait.is_some() {
                    issues.add(format!("{path}.max_wait"), "is not used with overflow \"reject\" (nothing waits)");
                }
                // Nothing waits: a request is admitted only when it would leave now.
                Some(Nanos::ZERO)
            };
            let (rate, queue, max_wait) = (rate?, queue?, max_wait?);
            let drain = u128::from(queue) * u128::from(rate.per().0) / u128::from(rate.amount());
            if drain > u128::from(u64::MAX) {
                issues.add(format!("{path}.queue"), "takes longer than 584 years to drain at this rate");
                return None;
            }
            Limit::leaky_bucket(rate, queue, max_wait).ok()
        }
    };
    if ok { limit } else { None }
}

fn validate_cost(issues: &mut Issues, path: &str, raw: Option<&RawCost>, capacity: u64) -> Option<Cost> {
    let at = format!("{path}.cost");
    match raw {
        None => Some(Cost::Constant(1)),
        Some(RawCost::Constant(cost)) => {
            if *cost == 0 {
                issues.add(at, "must be at least 1");
                None
            } else if *cost > capacity {
                issues.add(
                    at,
                    format!(
                        "must not exceed the policy's capacity ({capacity}), got {cost}: no request could ever pass"
                    ),
                );
                None
            } else {
                Some(Cost::Constant(*cost))
            }
        }
        Some(RawCost::Header(header)) => {
            let before = issues.0.len();
            header_name(issues, &format!("{at}.header"), &header.header);
            let min = header.min.unwrap_or(1);
            if min == 0 {
                issues.add(format!("{at}.min"), "must be at least 1 (a zero cost would let a caller spend nothing)");
            }
            if header.max < min {
                issues.add(format!("{at}.max"), format!("must be at least min ({min}), got {}", header.max));
            } else if header.max > capacity {
                issues.add(
                    format!("{at}.max"),
                    format!("must not exceed the policy's capacity ({capacity}), got {}", header.max),
                );
            }
            let default = header.default.unwrap_or(min);
            if default < min || default > header.max {
                issues.add(
                    format!("{at}.default"),
                    format!("must be between min ({min}) and max ({}), got {default}", header.max),
                );
            }
            (issues.0.len() == before).then(|| Cost::Header {
                name: header.header.clone(),
                default,
                min,
                max: header.max,
            })
        }
    }
}

fn header_sets(issues: &mut Issues, path: &str, sets: &[RawHeaderSet], rejection: bool) -> HeaderSets {
    let mut out = HeaderSets::default();
    for (i, set) in sets.iter().enumerate() {
        let flag = match set {
            RawHeaderSet::RetryAfter => {
                if !rejection {
                    issues.add(format!("{path}[{i}]"), "\"retry_after\" is only sent on rejections");
                }
                &mut out.retry_after
            }
            RawHeaderSet::Ratelimit => &mut out.ratelimit,
            RawHeaderSet::XRatelimit => &mut out.legacy,
        };
        if *flag {
            issues.add(format!("{path}[{i}]"), "is listed twice");
        }
        *flag = true;
    }
    out
}

fn validate_response(issues: &mut Issues, raw: RawResponse) -> Response {
    let status = raw.status.unwrap_or(DEFAULT_STATUS);
    if !(400..=599).contains(&status) {
        issues.add("response.status", format!("must be between 400 and 599, got {status}"));
    }
    let body = raw.body.unwrap_or_default();
    if body.len() > MAX_BODY {
        issues.add("response.body", format!("must be at most {MAX_BODY} bytes, got {}", body.len()));
    }
    let mut headers = Vec::new();
    match raw.content_type {
        Some(content_type) => {
            if !is_header_value(&content_type) || content_type.is_empty() {
                issues.add(
                    "response.content_type",
                    format!("expected a media type such as \"application/json\", got {content_type:?}"),
                );
            }
            headers.push(("content-type".to_owned(), content_type));
        }
        None if !body.is_empty() => headers.push(("content-type".to_owned(), "text/plain; charset=utf-8".to_owned())),
        None => {}
    }
    for (name, value) in raw.headers {
        let at = format!("response.headers.{name}");
        header_name(issues, &at, &name);
        if RESERVED_HEADERS.contains(&name.as_str()) {
            issues.add(&at, "is set by Sluice itself (use content_type and headers_on_rejected)");
        }
        if !is_header_value(&value) {
            issues.add(&at, "expected a value of visible ASCII characters, spaces and tabs");
        }
        headers.push((name, value));
    }
    let default_rejected = [RawHeaderSet::RetryAfter, RawHeaderSet::Ratelimit];
    let on_rejected = header_sets(
        issues,
        "response.headers_on_rejected",
        raw.headers_on_rejected.as_deref().unwrap_or(&default_rejected),
        true,
    );
    let on_allowed =
        header_sets(issues, "response.headers_on_allowed", raw.headers_on_allowed.as_deref().unwrap_or(&[]), false);
    if let Some(name) = &raw.fallback_header {
        header_name(issues, "response.fallback_header", name);
        if RESERVED_HEADERS.contains(&name.as_str()) || headers.iter().any(|(n, _)| n == name) {
            issues.add("response.fallback_header", format!("{name:?} is already a header of the response"));
        }
    }
    Response { status, body, headers, on_rejected, on_allowed, fallback_header: raw.fallback_header }
}

fn validate_shaping(issues: &mut Issues, raw: RawShaping) -> Shaping {
    let max_paused = raw.max_paused.unwrap_or(DEFAULT_MAX_PAUSED);
    if !(1..=1_000_000).contains(&max_paused) {
        issues.add("shaping.max_paused", format!("must be between 1 and 1000000, got {max_paused}"));
    }
    let tick_ms = raw.tick_ms.unwrap_or(DEFAULT_TICK_MS);
    if !(1..=1000).contains(&tick_ms) {
        issues.add("shaping.tick_ms", format!("must be between 1 and 1000, got {tick_ms}"));
    }
    Shaping { max_paused, tick_ms }
}

/// The JSON Schema of the configuration, as committed in `filter/config.schema.json`.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<RawConfig>();
    schema.to_value()
}

#[cfg(test)]
mod tests;

//! The configuration exactly as written in JSON: every struct rejects unknown fields, and
//! the few string forms people write by hand (`"100/minute"`, `"500ms"`) have their own
//! types (module `forms`) whose errors say what was expected, and a cost's three forms
//! are told apart by their fields (module `cost`). [`super::Config::from_json`]
//! validates these into the compiled form the rest of the filter uses.
//!
//! The doc comments on these types become the descriptions in `config.schema.json`
//! ([`json_schema`]).

mod cost;
mod forms;

use super::model::bounds::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, DEFAULT_COLD_BELOW, DEFAULT_FAILURE_STATUS,
    DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, DEFAULT_LEASE, DEFAULT_MAX_CHECKS_IN_FLIGHT, DEFAULT_MAX_PAUSED,
    DEFAULT_MAX_WAITING, DEFAULT_SLOTS, DEFAULT_STAT_PREFIX, DEFAULT_STATUS, DEFAULT_TICK_MS, DEFAULT_TIMEOUT,
    MAX_BREAKER_FAILURES, MAX_CHECKS_PER_CALL, MAX_CONFIGURED_AMOUNT, MAX_IPV4_PREFIX, MAX_IPV6_PREFIX,
    MAX_MAX_CHECKS_IN_FLIGHT, MAX_MAX_PAUSED, MAX_MAX_WAITING, MAX_SLOTS, MAX_STATUS, MAX_TICK_MS, MAX_UNIT_BYTES,
    MIN_BREAKER_FAILURES, MIN_STATUS, MIN_TICK_MS,
};
pub use cost::{RawCost, RawEstimateWord, RawHeaderCost, RawOnUnknown, RawResponseCost};
pub use forms::{DurationSpec, RateSpec, RawAlgorithm};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_protocol::MAX_POLICY_BYTES;
use std::collections::BTreeMap;

/// Sluice filter configuration: Envoy's `configuration` string or Istio's
/// `WasmPlugin.pluginConfig`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Sluice filter configuration")]
pub struct RawConfig {
    /// The rate-limit policies. Every policy whose `match` fits a request is applied to it.
    pub policies: Vec<RawPolicy>,
    /// The response sent when a request is rejected, and the rate-limit headers sent.
    #[serde(default)]
    pub response: RawResponse,
    /// Pausing of requests delayed by `leaky_bucket` policies.
    #[serde(default)]
    pub shaping: RawShaping,
    /// Prefix of every metric name (`<stat_prefix>.<policy>.<counter>`). Default `sluice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_STAT_PREFIX))]
    pub stat_prefix: Option<String>,
    /// Count in the VM and hand the proxy its metrics this often (`10ms` to `60s`),
    /// instead of one host call per counter per request: less CPU per request, and
    /// statistics that lag by up to this long. Default: at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_flush: Option<DurationSpec>,
    /// The central counter service that keeps the budgets of global policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter_service: Option<RawCounterService>,
}

/// How the filter reaches `sluice-counter`: one callout per request, for all of the
/// request's global policies together.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCounterService {
    /// The proxy's cluster for the service (in Envoy, a cluster name).
    pub cluster: String,
    /// The `:authority` of the callouts. Default: the cluster name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// The deadline of one callout, from `1ms` to `10s`; the filter enforces it itself
    /// even if the proxy's own timeout never fires. Default `100ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_TIMEOUT.to_string()))]
    pub timeout: Option<DurationSpec>,
    /// The bearer token the service expects, inline. It then appears in the proxy's
    /// configuration dump: prefer `token_env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The name of the VM environment variable that holds the bearer token (Envoy:
    /// `vm_config.environment_variables`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// The key global keys are hashed with, inline: at least 16 bytes, the same on every
    /// proxy. Prefer `hash_key_env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
    /// The name of the VM environment variable that holds the hash key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key_env: Option<String>,
    /// Key parts whose hashed values name the hash tag of a check (on Redis Cluster: the
    /// slot that decides all of a request's global policies). Every global policy's key
    /// must include them. Default: none, so every counter shares one tag.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition: Vec<RawKeyPart>,
    /// Most check calls one worker has out at once that are not late (out for less than
    /// a quarter of the timeout); while it has that many, checks wait and go together in
    /// one call as soon as one comes back, or at the next tick once every call out is late
    /// (group commit). 0 sends every check alone, at once. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_MAX_CHECKS_IN_FLIGHT))]
    #[schemars(extend("default" = DEFAULT_MAX_CHECKS_IN_FLIGHT))]
    pub max_checks_in_flight: Option<u32>,
    /// Most checks one call carries, 1 to 64. Default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_CHECKS_PER_CALL))]
    #[schemars(extend("default" = MAX_CHECKS_PER_CALL))]
    pub max_checks_per_call: Option<u32>,
    /// When to stop calling a failing service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<RawCircuitBreaker>,
}

/// The circuit breaker shared by the proxy's workers.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCircuitBreaker {
    /// Consecutive failed callouts that open the circuit, 1 to 1000. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_BREAKER_FAILURES, max = MAX_BREAKER_FAILURES))]
    #[schemars(extend("default" = DEFAULT_BREAKER_FAILURES))]
    pub failures: Option<u32>,
    /// How long the circuit stays open before one probe may close it, `1ms` to `5m`.
    /// Default `2s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_BREAKER_COOLDOWN.to_string()))]
    pub cooldown: Option<DurationSpec>,
}

/// A global policy: one budget across every proxy, kept by the counter service.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawGlobal {
    /// How the proxy consults the service. `check`: every request waits for its decision;
    /// `lease`: the proxy spends a leased share of the budget locally.
    pub strategy: RawStrategy,
    /// `lease` only: the size and life of a lease, and when to refill it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<RawLease>,
}

/// How a global policy consults the counter service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawStrategy {
    /// Each request waits for the service's decision (one callout per request).
    Check,
    /// The proxy obtains shares of the budget (leases) and spends them locally across its
    /// workers, refilling before they run out.
    Lease,
}

/// The leases of a `lease` policy (per caller key, per proxy).
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLease {
    /// Tokens asked for per grant, 1 to the policy's capacity. Default: a quarter of the
    /// capacity (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// How long a grant may be spent, from `1ms` to `5m`; tokens left then are forfeited.
    /// Default `2s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_LEASE.to_string()))]
    pub duration: Option<DurationSpec>,
    /// A refill is requested when fewer tokens than this are left, below `size`. Default:
    /// a quarter of `size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_water: Option<u64>,
    /// The most requests one worker holds waiting for a refill, 1 to 100000. Default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_MAX_WAITING), extend("default" = DEFAULT_MAX_WAITING))]
    pub max_waiting: Option<u32>,
    /// The most units admitted under the failure rule while the service was unreachable
    /// that are charged to the global budget once it answers again (per key and proxy);
    /// the rest is forgiven. At most the policy's capacity, which is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_debt: Option<u64>,
    /// A key that asked for fewer units than this over the last lease life on this proxy
    /// (a key seen for the first time included) is cold: its requests are checked at the
    /// service, exactly, rather than leased. `0` leases every key from its first request.
    /// At most the policy's capacity. Default 4 (or the capacity, if smaller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_COLD_BELOW))]
    pub cold_below: Option<u32>,
}

/// A local bucket that decides a global policy while the counter service cannot.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawEmergency {
    /// Sustained rate per caller and proxy, as `"<n>/<second|minute|hour|day>"`.
    pub rate: RateSpec,
    /// The largest burst. Default: the rate's `<n>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_CONFIGURED_AMOUNT))]
    pub burst: Option<u64>,
}

/// One rate-limit policy.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Unique name, 1 to 64 characters from `A-Z a-z 0-9 _ . -`. It appears in metric names and in
    /// the `RateLimit-Policy` / `RateLimit` headers.
    #[schemars(length(min = 1, max = MAX_POLICY_BYTES))]
    pub name: String,
    /// What identifies the caller. The parts are combined: one bucket per distinct tuple of values.
    pub key: Vec<RawKeyPart>,
    /// Which requests the policy applies to. Absent: every request.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matcher: Option<RawMatch>,
    /// The algorithm. Default `token_bucket`.
    #[serde(default)]
    pub algorithm: RawAlgorithm,
    /// Sustained rate for `token_bucket` and `leaky_bucket`, as `"<n>/<second|minute|hour|day>"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateSpec>,
    /// `token_bucket` only: the largest burst an idle caller may spend at once. Default: the
    /// rate's `<n>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_CONFIGURED_AMOUNT))]
    pub burst: Option<u64>,
    /// Window algorithms (`fixed_window`, `sliding_window`, `sliding_log`): units per window;
    /// `concurrency`: requests in flight at once (at most 1 000 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Window algorithms: the window length, such as `"1s"`, `"1m"` or `"1h"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationSpec>,
    /// `leaky_bucket` only: how many cost units may wait at once per key (the queue depth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u64>,
    /// `leaky_bucket` only: the longest delay handed out, such as `"500ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<DurationSpec>,
    /// `leaky_bucket` only: `queue` (default) pauses a request until its turn; `reject` rejects
    /// every request that would have to wait (a smooth policer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<RawOverflow>,
    /// What one request costs. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<RawCost>,
    /// What the policy's numbers count, when not requests (such as `"tokens"`): named in
    /// the `RateLimit-Policy` header as its quota unit (`qu`). 1 to 32 characters from
    /// `a-z 0-9 _ -`. Default: none (requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_UNIT_BYTES))]
    pub unit: Option<String>,
    /// What happens to a request for which a key part is missing. Default `shared`.
    #[serde(default)]
    pub on_missing_key: RawMissingKey,
    /// Decide and count, but never reject: for rolling a policy out. Default false.
    #[serde(default)]
    pub shadow: bool,
    /// Bump to start this policy on fresh buckets. Without a bump, changed numbers carry the
    /// existing buckets over, clamped to the new capacity. Default 0.
    #[serde(default)]
    pub version: u64,
    /// Shared-data keys this policy may create for distinct callers (plus one overflow key).
    /// Default 8192.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_SLOTS), extend("default" = DEFAULT_SLOTS))]
    pub slots: Option<u32>,
    /// What happens when no decision can be made (CAS attempts exhausted, store error, a
    /// failed read of the request; for a global policy also a counter service that is
    /// slow, unreachable or answers garbage). Default: deny with status 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<RawFailure>,
    /// Makes the policy global: its budget is kept by the counter service and shared by
    /// every proxy. Default: local (a budget per proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<RawGlobal>,
}

/// One part of a policy's key.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum RawKeyPart {
    /// The value of a request header (hashed before use). Lower-case name.
    Header(String),
    /// The client address from the host (`source.address`), never from a request header.
    ClientAddress,
    /// The client address masked to a prefix length per address family.
    MaskedClientAddress(RawMask),
    /// The `:authority` pseudo-header.
    Authority,
    /// The `:path` pseudo-header without its query string.
    Path,
    /// The `:method` pseudo-header.
    Method,
    /// The value of a query parameter (first occurrence, raw bytes as sent).
    QueryParameter(String),
    /// A host property, as a path of segments such as `["connection", "requested_server_name"]`.
    Property(Vec<String>),
    /// A constant: every matching request shares one bucket.
    Constant(String),
}

/// Prefix lengths for `masked_client_address`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMask {
    /// Prefix length for IPv4 addresses, 0 to 32. Default 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_IPV4_PREFIX), extend("default" = DEFAULT_IPV4_PREFIX))]
    pub ipv4_prefix: Option<u8>,
    /// Prefix length for IPv6 addresses, 0 to 128. Default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_IPV6_PREFIX), extend("default" = DEFAULT_IPV6_PREFIX))]
    pub ipv6_prefix: Option<u8>,
}

/// Conditions a request must meet for a policy to apply; all given conditions must hold.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    /// The request path (without query string) must equal this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    /// The request path (without query string) must start with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The method must be one of these (upper case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Header conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<RawHeaderMatch>,
}

/// A header condition: `present` alone, or `equals` (exact bytes).
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    /// Lower-case header name.
    pub name: String,
    /// `true`: the header must be present; `false`: it must be absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// The header's value must equal this exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
}

/// What a `leaky_bucket` does with a request that would have to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawOverflow {
    /// Pause the request until its turn.
    Queue,
    /// Reject it.
    Reject,
}

/// What happens to a request for which a key part is missing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawMissingKey {
    /// All such requests share one bucket with the policy's numbers.
    #[default]
    Shared,
    /// The policy does not apply to the request.
    Skip,
    /// The request is rejected with the configured response.
    Reject,
}

/// What happens when no decision can be made.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFailure {
    /// `allow` forwards the request; `deny` answers it with `status`.
    pub action: RawFailureAction,
    /// `deny` only: the status, 400 to 599. Default 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_STATUS, max = MAX_STATUS), extend("default" = DEFAULT_FAILURE_STATUS))]
    pub status: Option<u16>,
    /// Global policies only: a local cap per caller that decides first while the counter
    /// service cannot; `action` applies when the cap itself cannot decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emergency: Option<RawEmergency>,
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawFailureAction {
    /// Forward the request (counted as `failure_allowed`).
    Allow,
    /// Answer it with the failure status (counted as `failure_denied`).
    Deny,
}

/// The rejection response and the rate-limit headers.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawResponse {
    /// Status of a rejection, 400 to 599. Default 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_STATUS, max = MAX_STATUS), extend("default" = DEFAULT_STATUS))]
    pub status: Option<u16>,
    /// Body of a rejection. Default empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// `content-type` of the body. Default `text/plain; charset=utf-8` when there is a body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Extra headers on a rejection (lower-case names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Rate-limit headers on a rejection. Default `["retry_after", "ratelimit"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_on_rejected: Option<Vec<RawHeaderSet>>,
    /// Rate-limit headers on an allowed response. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_on_allowed: Option<Vec<RawHeaderSet>>,
    /// A header (lower-case name) added to responses decided by a fallback while the
    /// counter service could not decide: `emergency`, `fail_open` or `fail_closed`, with
    /// the reason and the policies it decided, such as `emergency; reason=timeout;
    /// policies=per-tenant`. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_header: Option<String>,
    /// A header (lower-case name) added to responses a global policy decided under an
    /// operator's override set on the counter service: its kind, id and policy, such as
    /// `clamp; id=ovr-1f2e3d4c5b6a7988; policy=per-tenant` (several joined by `, `).
    /// Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub override_header: Option<String>,
}

/// A family of rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawHeaderSet {
    /// `Retry-After` in whole seconds, rounded up (rejections only).
    RetryAfter,
    /// The IETF `RateLimit-Policy` and `RateLimit` structured fields.
    Ratelimit,
    /// Legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRatelimit,
}

/// Pausing of shaped requests.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawShaping {
    /// Most requests one worker holds paused at once; a request that would exceed it is
    /// rejected. Default 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_MAX_PAUSED), extend("default" = DEFAULT_MAX_PAUSED))]
    pub max_paused: Option<u32>,
    /// How often (ms) paused requests are checked for release, 1 to 1000. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_TICK_MS, max = MAX_TICK_MS), extend("default" = DEFAULT_TICK_MS))]
    pub tick_ms: Option<u32>,
}

/// The JSON Schema of the configuration, as committed in `filter/config.schema.json`.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<RawConfig>();
    schema.to_value()
}

//! The request and response bodies of `/v1/check`, `/v1/lease`, `/v1/charge` and
//! `/v1/credit`, and
//! the error body every failure is answered with.
//!
//! Requests are parsed strictly: every request type denies unknown fields, so a typo is
//! an error rather than a silently ignored setting. Responses deny unknown fields too,
//! which keeps the two sides honest in tests; a client that must tolerate a newer
//! service should parse responses into its own lenient types.
//!
//! Times in responses are nanoseconds, durations in requests whole milliseconds.

use serde::{Deserialize, Serialize};
use shared_store::{Decision, Nanos, Verdict};

use crate::limit::LimitSpec;
use crate::overrides::{AppliedOverride, EntryOverride};

/// Longest `key`, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest `tag`, in bytes.
pub const MAX_TAG_BYTES: usize = 128;
/// Longest lease, in milliseconds.
pub const MAX_LEASE_TTL_MS: u64 = 300_000;
/// Longest `charge_id`, in bytes (visible ASCII: at least one byte, no spaces).
pub const MAX_CHARGE_ID_BYTES: usize = 64;
/// How long the service remembers a charge or credit id, in milliseconds, unless the
/// request asks for less (`id_ttl_ms`): the same charge sent again within this time is
/// not applied again (its first answer is repeated, with `duplicate: true`); after it,
/// the id is new again. Also the longest `id_ttl_ms` a request may ask for.
pub const CHARGE_ID_TTL_MS: u64 = 600_000;
/// The shortest `id_ttl_ms` a charge or credit may ask for, in milliseconds.
pub const MIN_ID_TTL_MS: u64 = 1_000;
/// Longest `policy` name, in bytes: what the filter accepts for a policy's name (it names
/// the policy's metrics too), and what the service accepts in a request or an override.
pub const MAX_POLICY_BYTES: usize = 64;

/// Whether `name` is a policy name: 1 to [`MAX_POLICY_BYTES`] characters among
/// `A-Z a-z 0-9 _ . -` (the filter's configuration and the counter service apply the same
/// rule, this one).
pub fn is_policy_name(name: &str) -> bool {
    (1..=MAX_POLICY_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The most debt a charge may leave a limit in, given its `capacity`: the capacity itself
/// (a filter's `max_debt` and a charge's are refused above it). Twice the capacity keeps
/// every integer of the Redis script inside the numeric envelope.
pub const fn max_debt_bound(capacity: u64) -> u64 {
    capacity
}

/// `POST /v1/check`: one all-or-nothing decision over one or several entries.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The hash tag every entry's counter lives under. Required when there is more than
    /// one entry; defaults to the entry's key otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The limits to apply, each with its key and cost.
    pub entries: Vec<EntryRequest>,
}

/// One (key, limit, cost) entry of a check.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EntryRequest {
    /// The counter's name within its tag (callers hash identities before sending them).
    pub key: String,
    /// The name of the filter policy this counter belongs to (1 to [`MAX_POLICY_BYTES`]
    /// bytes): the service applies the operators' overrides for that policy. Absent, only
    /// overrides scoped to this exact key apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policy version: a new version starts from fresh state.
    #[serde(default)]
    pub policy_version: u64,
    /// The limit's algorithm and numbers.
    pub limit: LimitSpec,
    /// What this request costs (0 queries without spending).
    #[serde(default = "one")]
    pub cost: u64,
}

const fn one() -> u64 {
    1
}

/// `POST /v1/lease`: take up to `tokens` of a key's budget for a bounded time.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// The hash tag; defaults to `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The counter's name.
    pub key: String,
    /// The name of the filter policy this counter belongs to (1 to [`MAX_POLICY_BYTES`]
    /// bytes): the service applies the operators' overrides for that policy. Absent, only
    /// overrides scoped to this exact key apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policy version.
    #[serde(default)]
    pub policy_version: u64,
    /// The limit's algorithm and numbers (not `leaky_bucket`).
    pub limit: LimitSpec,
    /// How many tokens the proxy asks for (1..=capacity).
    pub tokens: u64,
    /// The fewest worth granting (1..=tokens): with fewer available, nothing is granted
    /// and the answer is the rejection of `min_tokens` units, with its exact wait.
    #[serde(default = "one")]
    pub min_tokens: u64,
    /// How long the proxy may spend them, in milliseconds (1..=[`MAX_LEASE_TTL_MS`]).
    pub ttl_ms: u64,
}

/// `POST /v1/charge`: report `cost` units already admitted (while the service could not
/// be reached), to be spent unconditionally, leaving the counter at most `max_debt`
/// units below empty. What does not fit is forgiven.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    /// The hash tag; defaults to `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The counter's name.
    pub key: String,
    /// The name of the filter policy this counter belongs to (1 to [`MAX_POLICY_BYTES`]
    /// bytes): the service applies the operators' overrides for that policy. Absent, only
    /// overrides scoped to this exact key apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policy version.
    #[serde(default)]
    pub policy_version: u64,
    /// The limit's algorithm and numbers (not `leaky_bucket`).
    pub limit: LimitSpec,
    /// Units admitted without the service, to spend now (0..=2^40).
    pub cost: u64,
    /// How far below empty the charge may push the counter, in the limit's units
    /// (0..=capacity).
    pub max_debt: u64,
    /// Identifies this charge (1 to [`MAX_CHARGE_ID_BYTES`] visible ASCII bytes): a
    /// charge sent again with the same id for the same counter (after a timeout, say)
    /// within [`CHARGE_ID_TTL_MS`] is applied once. Without an id, every charge is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// How long the id is to be remembered, in milliseconds ([`MIN_ID_TTL_MS`] to
    /// [`CHARGE_ID_TTL_MS`], the default): the sender's promise that it never sends the
    /// id again later than this after its first send. A sender that settles often keeps
    /// the service's memory of ids small this way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_ttl_ms: Option<u64>,
}

/// `POST /v1/credit`: give back `units` that a check spent at `spent_at_ns` on an
/// estimate of its cost and the request turned out not to use (a language model's
/// answer shorter than its `max_tokens`). The other direction, a cost above the
/// estimate, is a charge of the difference.
///
/// A credit never makes a limit hold more than it can (a bucket above its burst, a
/// window below zero), and never reaches a window the spend no longer counts in
/// (`shared_store::Limit::credit`). Not for a leaky bucket or a sliding log, whose
/// state cannot give one request's units back.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreditRequest {
    /// The hash tag; defaults to `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The counter's name.
    pub key: String,
    /// The name of the filter policy this counter belongs to (1 to [`MAX_POLICY_BYTES`]
    /// bytes): the service applies the operators' overrides for that policy. Absent, only
    /// overrides scoped to this exact key apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policy version.
    #[serde(default)]
    pub policy_version: u64,
    /// The limit's algorithm and numbers (`token_bucket`, `fixed_window` or
    /// `sliding_window`).
    pub limit: LimitSpec,
    /// Units to give back (0..=2^40).
    pub units: u64,
    /// When they were spent: the `at_ns` of the check that spent them (Unix ns, the
    /// store's clock). A window is credited only if this falls in it.
    pub spent_at_ns: u64,
    /// Identifies this credit, like a charge's `charge_id` (and in a namespace of its
    /// own): sent again with the same id within [`CHARGE_ID_TTL_MS`], it is applied once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credit_id: Option<String>,
    /// How long the id is to be remembered, like a charge's `id_ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_ttl_ms: Option<u64>,
}

/// One entry's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct EntryResponse {
    /// `allowed`, `delayed` or `rejected`.
    pub verdict: VerdictName,
    /// Capacity: burst, window limit or queue depth.
    pub limit: u64,
    /// What is left after this decision.
    pub remaining: u64,
    /// Nanoseconds until the limit is full again.
    pub reset_after_ns: u64,
    /// When rejected: the exact wait (ns) after which this cost would be admitted;
    /// `u64::MAX` for never. Zero otherwise.
    pub retry_after_ns: u64,
    /// When delayed (leaky bucket): how long to hold the request (ns). Zero otherwise.
    pub delay_ns: u64,
}

/// A verdict's name in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictName {
    /// Admitted now.
    Allowed,
    /// Admitted after `delay_ns`.
    Delayed,
    /// Not admitted.
    Rejected,
}

impl From<&Decision> for EntryResponse {
    fn from(d: &Decision) -> Self {
        let (verdict, retry, delay) = match d.verdict {
            Verdict::Allowed => (VerdictName::Allowed, 0, 0),
            Verdict::Delayed(delay) => (VerdictName::Delayed, 0, delay.as_u64()),
            Verdict::Rejected { retry_after } => (VerdictName::Rejected, retry_after.as_u64(), 0),
            // The service keeps cost ≤ capacity, so this does not reach a response; if it
            // did, "never" is the honest answer.
            Verdict::Exceeds => (VerdictName::Rejected, u64::MAX, 0),
        };
        Self {
            verdict,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_ns: d.reset_after.as_u64(),
            retry_after_ns: retry,
            delay_ns: delay,
        }
    }
}

impl EntryResponse {
    /// The decision this answer carries, for a caller that renders headers from
    /// [`Decision`]s. The inverse of `From<&Decision>` except for
    /// [`Verdict::Exceeds`], which travels as a rejection with `retry_after_ns` =
    /// `u64::MAX` and comes back as one.
    pub const fn decision(&self) -> Decision {
        let verdict = match self.verdict {
            VerdictName::Allowed => Verdict::Allowed,
            VerdictName::Delayed if self.delay_ns > 0 => Verdict::Delayed(Nanos(self.delay_ns)),
            // A zero delay is an admission now (shared-store's Delayed is never zero).
            VerdictName::Delayed => Verdict::Allowed,
            VerdictName::Rejected => Verdict::Rejected { retry_after: Nanos(self.retry_after_ns) },
        };
        Decision { verdict, limit: self.limit, remaining: self.remaining, reset_after: Nanos(self.reset_after_ns) }
    }
}

/// Whether a count is zero (left out of an answer then).
#[allow(clippy::trivially_copy_pass_by_ref)]
const fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// A batch of independent checks (`POST /v1/checks`), each decided as `POST /v1/check`
/// decides it, all-or-nothing on its own: one call for several requests' checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChecksRequest {
    /// The checks (1 to [`crate::MAX_CHECKS_PER_CALL`]).
    pub checks: Vec<CheckRequest>,
}

/// The answer to a batch: one result per check, in the order of the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct ChecksResponse {
    /// Each check's answer or error.
    pub results: Vec<CheckResult>,
}

/// One check's result in a batch: the answer `POST /v1/check` would give, or the error
/// it would answer (that check alone: the others are decided regardless).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CheckResult {
    /// Decided: admitted or not, as a check's answer says.
    Answered(CheckResponse),
    /// Not decided: the status and error `POST /v1/check` would have answered.
    Failed(CheckFailure),
}

/// A check of a batch that was not decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckFailure {
    /// The HTTP status `POST /v1/check` would have answered.
    pub status: u16,
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The answer to a check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct CheckResponse {
    /// Whether every entry admitted; when false nothing was spent.
    pub admitted: bool,
    /// The time the store decided at: Unix nanoseconds (Redis `TIME` for the Redis store).
    pub at_ns: u64,
    /// One answer per entry, in request order.
    pub entries: Vec<EntryResponse>,
    /// The operator overrides that decided entries, each with its entry's position (none
    /// for most checks; older services never send it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<EntryOverride>,
    /// Units of debt that carrying a counter over to other numbers (a policy changed
    /// without a version bump) could not keep: forgiven, and counted. 0, and absent, for
    /// almost every answer (older services never send it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carry_forgiven: u64,
}

/// The answer to a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct LeaseResponse {
    /// Tokens granted (0..=tokens asked), already deducted from the global budget.
    pub granted: u64,
    /// How long the proxy may spend them, in milliseconds; unused tokens are forfeited.
    /// The request's `ttl_ms`, or for a fixed or sliding window at most the whole
    /// milliseconds left in the aligned window the grant was decided in (0 when nothing
    /// was granted because less than one was left). Counted from when the proxy sent the
    /// request, a grant never outlives what the service said.
    pub expires_in_ms: u64,
    /// The time the store decided at (Unix ns).
    pub at_ns: u64,
    /// The limit's state after the grant (`retry_after_ns` set when nothing was granted).
    pub entry: EntryResponse,
    /// When this lease leaves fewer than `min_tokens` units available: the exact wait
    /// (ns) until `min_tokens` could be granted again, if nothing else spends meanwhile;
    /// 0 otherwise (also when nothing was granted: then `entry.retry_after_ns` says it).
    ///
    /// Older services do not send it: it then reads as 0.
    #[serde(default)]
    pub refill_after_ns: u64,
    /// The operator override that decided it, if one did (a bypass: nothing was spent; a
    /// clamp: it was decided on the clamp's own counter too, under the clamp's numbers).
    /// Older services never send it.
    #[serde(default, rename = "override", skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedOverride>,
    /// Units of debt that carrying a counter over to other numbers (a policy changed
    /// without a version bump) could not keep: forgiven, and counted. 0, and absent, for
    /// almost every answer (older services never send it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carry_forgiven: u64,
}

/// The answer to a charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct ChargeResponse {
    /// Units spent (0..=cost).
    pub charged: u64,
    /// Units that did not fit within `max_debt` and were dropped: `cost - charged`.
    pub forgiven: u64,
    /// The time the store charged at (Unix ns).
    pub at_ns: u64,
    /// The limit after the charge: `remaining` (0 while in debt), `reset_after_ns` (until
    /// full again, debt included) and, when nothing is left, `verdict: rejected` with
    /// the exact wait until one unit is admitted again.
    pub entry: EntryResponse,
    /// The charge's id was applied before (within [`CHARGE_ID_TTL_MS`]): `charged` and
    /// `forgiven` repeat that answer, nothing was spent now, and `entry` is the limit as
    /// it stands now.
    #[serde(default)]
    pub duplicate: bool,
    /// The operator override that decided it, if one did (a bypass: nothing was spent; a
    /// clamp: it was decided on the clamp's own counter too, under the clamp's numbers).
    /// Older services never send it.
    #[serde(default, rename = "override", skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedOverride>,
    /// Units of debt that carrying a counter over to other numbers (a policy changed
    /// without a version bump) could not keep: forgiven, and counted. 0, and absent, for
    /// almost every answer (older services never send it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carry_forgiven: u64,
}

/// The answer to a credit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct CreditResponse {
    /// The units given back: `units`, or fewer when the counter could take back fewer (a
    /// bucket that refilled meanwhile, a count lower than `units`), 0 when there was
    /// nothing to give them back to (the bucket was full, the window the spend counted in
    /// has passed, the counter had expired).
    pub credited: u64,
    /// `units - credited`.
    pub forgiven: u64,
    /// The time the store credited at (Unix ns).
    pub at_ns: u64,
    /// The limit after the credit, as a charge reports it.
    pub entry: EntryResponse,
    /// The credit's id was applied before (within [`CHARGE_ID_TTL_MS`]): `credited` and
    /// `forgiven` repeat that answer, and nothing was given back now.
    #[serde(default)]
    pub duplicate: bool,
    /// The operator override that decided it, if one did (a bypass: nothing was spent; a
    /// clamp: it was decided on the clamp's own counter too, under the clamp's numbers).
    /// Older services never send it.
    #[serde(default, rename = "override", skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedOverride>,
    /// Units of debt that carrying a counter over to other numbers (a policy changed
    /// without a version bump) could not keep: forgiven, and counted. 0, and absent, for
    /// almost every answer (older services never send it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carry_forgiven: u64,
}

/// The body of every error answer: `{"error": {"code": …, "message": …}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// A stable machine-readable code and a message for a human.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Answers accept fields they do not know (requests stay strict): a filter keeps
// working when a newer service adds one.
pub struct ErrorDetail {
    /// Stable code (`invalid_limit`, `store_unavailable`, `unauthorized`, …); the
    /// counter service's README lists them all.
    pub code: String,
    /// What is wrong, naming the field (with its JSON path) when there is one.
    pub message: String,
}

impl ErrorBody {
    /// An error body with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { error: ErrorDetail { code: code.into(), message: message.into() } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(verdict: Verdict) -> Decision {
        Decision { verdict, limit: 10, remaining: 3, reset_after: Nanos(1_500) }
    }

    #[test]
    fn an_entry_answer_carries_its_decision_both_ways() {
        for verdict in [Verdict::Allowed, Verdict::Delayed(Nanos(7)), Verdict::Rejected { retry_after: Nanos(9) }] {
            let d = decision(verdict);

            assert_eq!(EntryResponse::from(&d).decision(), d);
        }
    }

    #[test]
    fn a_cost_that_can_never_be_admitted_travels_as_a_rejection_forever() {
        let answer = EntryResponse::from(&decision(Verdict::Exceeds));

        assert_eq!((answer.verdict, answer.retry_after_ns), (VerdictName::Rejected, u64::MAX));
    }

    #[test]
    fn a_check_defaults_the_cost_to_one_and_the_version_to_zero() {
        let body = r#"{"entries":[{"key":"k","limit":{"algorithm":"fixed_window","limit":1,"window_ms":1000}}]}"#;

        let request: CheckRequest = serde_json::from_str(body).unwrap();

        assert_eq!((request.tag.as_deref(), request.entries[0].cost, request.entries[0].policy_version), (None, 1, 0));
    }

    #[test]
    fn a_charge_needs_its_cost_and_its_debt_bound() {
        let limit = r#"{"algorithm":"token_bucket","amount":1,"per_ms":1000,"burst":5}"#;

        let without_debt = serde_json::from_str::<ChargeRequest>(&format!(r#"{{"key":"k","limit":{limit},"cost":3}}"#));
        let complete =
            serde_json::from_str::<ChargeRequest>(&format!(r#"{{"key":"k","limit":{limit},"cost":3,"max_debt":2}}"#));

        assert!(without_debt.unwrap_err().to_string().contains("missing field `max_debt`"));
        assert_eq!(complete.unwrap().max_debt, 2);
    }

    #[test]
    fn a_credit_needs_its_units_and_when_they_were_spent() {
        let limit = r#"{"algorithm":"token_bucket","amount":1,"per_ms":1000,"burst":5}"#;

        let without_time =
            serde_json::from_str::<CreditRequest>(&format!(r#"{{"key":"k","limit":{limit},"units":3}}"#));
        let complete = serde_json::from_str::<CreditRequest>(&format!(
            r#"{{"key":"k","limit":{limit},"units":3,"spent_at_ns":7,"credit_id":"a1"}}"#
        ));

        assert!(without_time.unwrap_err().to_string().contains("missing field `spent_at_ns`"));
        assert_eq!(complete.unwrap().credit_id.as_deref(), Some("a1"));
    }

    #[test]
    fn a_lease_has_no_cost_field() {
        let body = r#"{"key":"k","tokens":1,"ttl_ms":1,"cost":1,
                       "limit":{"algorithm":"fixed_window","limit":1,"window_ms":1000}}"#;

        let err = serde_json::from_str::<LeaseRequest>(body).unwrap_err();

        assert!(err.to_string().contains("unknown field `cost`"), "{err}");
    }

    #[test]
    fn a_lease_answer_without_refill_after_ns_reads_as_zero_and_one_with_it_keeps_it() {
        let entry = r#"{"verdict":"allowed","limit":5,"remaining":0,"reset_after_ns":4500000000,
                        "retry_after_ns":0,"delay_ns":0}"#;
        let older = format!(r#"{{"granted":2,"expires_in_ms":1000,"at_ns":1,"entry":{entry}}}"#);

        let read: LeaseResponse = serde_json::from_str(&older).unwrap();
        let newer = LeaseResponse { refill_after_ns: 1_500_000_000, ..read };
        let json = serde_json::to_string(&newer).unwrap();

        assert_eq!((read.granted, read.refill_after_ns), (2, 0));
        assert!(json.ends_with(r#","refill_after_ns":1500000000}"#), "{json}");
        assert_eq!(serde_json::from_str::<LeaseResponse>(&json).unwrap(), newer);
    }

    #[test]
    fn the_error_body_is_an_object_under_error() {
        let body = ErrorBody::new("unauthorized", "missing bearer token");

        let json = serde_json::to_string(&body).unwrap();

        assert_eq!(json, r#"{"error":{"code":"unauthorized","message":"missing bearer token"}}"#);
        assert_eq!(serde_json::from_str::<ErrorBody>(&json).unwrap(), body);
    }

    #[test]
    fn verdicts_are_snake_case_words() {
        let names = [VerdictName::Allowed, VerdictName::Delayed, VerdictName::Rejected].map(|v| {
            let json = serde_json::to_string(&v).unwrap();
            json.trim_matches('"').to_owned()
        });

        assert_eq!(names, ["allowed", "delayed", "rejected"]);
    }
}

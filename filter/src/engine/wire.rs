//! The filter's side of the counter service protocol (`POST /v1/check`, types from
//! `sluice-protocol`): the request body for a request's global policies, and what an
//! answer means, including Envoy's own replies for a service it could not reach.
//!
//! What Envoy 1.40 delivers for each failure (measured; see wasm-host's README): a
//! refused connection is a `503` reply whose body starts `upstream connect error`, a
//! timeout before the headers is a `504`, a protocol error a `502`, and a reset after
//! the headers (or a body slower than the timeout) is a callout with no headers.

use super::resolve::{Place, Resolved};
use crate::host::CalloutAnswer;
use sluice_protocol::{ChargeResponse, CheckRequest, CheckResponse, EntryRequest, LeaseResponse, LimitSpec};

/// The path of a check.
pub(crate) const CHECK_PATH: &str = "/v1/check";
/// The path of a lease.
pub(crate) const LEASE_PATH: &str = "/v1/lease";
/// The path of a charge.
pub(crate) const CHARGE_PATH: &str = "/v1/charge";
/// The largest answer the filter reads; an entry's answer is about 150 bytes.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why the counter service could not decide a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// No answer within the deadline.
    Timeout,
    /// The connection was refused.
    Refused,
    /// The call was reset, or the answer was not HTTP.
    Reset,
    /// An answer with a status other than 200 (or 401).
    BadStatus,
    /// A 200 whose body is not a check answer for these entries.
    BadBody,
    /// 401: the service refused the filter's token.
    Unauthorized,
    /// The circuit breaker is open.
    CircuitOpen,
    /// The proxy would not send the call.
    DispatchFailed,
    /// Lease mode: too many requests wait for a refill on this worker (`max_waiting`).
    LeaseQueueFull,
    /// Lease mode: the caller's slot in the lease table is held by another key's lease
    /// (give the policy more `slots`).
    LeaseSlotTaken,
}

impl Reason {
    /// Every reason, in a fixed order.
    pub const ALL: [Self; 10] = [
        Self::Timeout,
        Self::Refused,
        Self::Reset,
        Self::BadStatus,
        Self::BadBody,
        Self::Unauthorized,
        Self::CircuitOpen,
        Self::DispatchFailed,
        Self::LeaseQueueFull,
        Self::LeaseSlotTaken,
    ];

    /// The name in metrics, logs and the fallback header.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Refused => "refused",
            Self::Reset => "reset",
            Self::BadStatus => "bad_status",
            Self::BadBody => "bad_body",
            Self::Unauthorized => "unauthorized",
            Self::CircuitOpen => "circuit_open",
            Self::DispatchFailed => "dispatch_failed",
            Self::LeaseQueueFull => "lease_queue_full",
            Self::LeaseSlotTaken => "lease_slot_taken",
        }
    }

    /// Position in [`Reason::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The reason of an index ([`Reason::index`]); `Timeout` for one out of range.
    pub fn from_index(index: u64) -> Self {
        usize::try_from(index).ok().and_then(|i| Self::ALL.get(i).copied()).unwrap_or(Self::Timeout)
    }
}

/// The body of the check for `global` (whose specs are `specs[i]` for policy `i`), every
/// counter under one hash `tag`.
pub(crate) fn check_body(
    tag: &str,
    global: &[Resolved],
    spec_of: impl Fn(usize) -> Option<(LimitSpec, u64)>,
) -> Vec<u8> {
    let entries = global
        .iter()
        .filter_map(|resolved| {
            let Place::Global { key, .. } = &resolved.at else { return None };
            let (limit, policy_version) = spec_of(resolved.policy)?;
            Some(EntryRequest { key: super::namespace::hex128(*key), policy_version, limit, cost: resolved.cost })
        })
        .collect();
    let request = CheckRequest { tag: Some(tag.to_owned()), entries };
    // Serialising plain structs of strings and integers cannot fail; an empty body
    // would be answered 400 and decided by the failure rule, never admitted.
    serde_json::to_vec(&request).unwrap_or_default()
}

/// What an answer to a check of `entries` entries means.
pub(crate) fn classify(answer: &CalloutAnswer, entries: usize) -> Result<CheckResponse, Reason> {
    classify_as(answer, |body| {
        serde_json::from_slice::<CheckResponse>(body).ok().filter(|r| r.entries.len() == entries)
    })
}

/// What an answer to a lease means.
pub(crate) fn classify_lease(answer: &CalloutAnswer) -> Result<LeaseResponse, Reason> {
    classify_as(answer, |body| serde_json::from_slice::<LeaseResponse>(body).ok())
}

/// What an answer to a charge means.
pub(crate) fn classify_charge(answer: &CalloutAnswer) -> Result<ChargeResponse, Reason> {
    classify_as(answer, |body| serde_json::from_slice::<ChargeResponse>(body).ok())
}

fn classify_as<T>(answer: &CalloutAnswer, parse: impl FnOnce(&[u8]) -> Option<T>) -> Result<T, Reason> {
    match answer {
        CalloutAnswer::TimedOut => Err(Reason::Timeout),
        CalloutAnswer::Failed => Err(Reason::Reset),
        CalloutAnswer::Response { status: 200, body } => parse(body).ok_or(Reason::BadBody),
        CalloutAnswer::Response { status: 401, .. } => Err(Reason::Unauthorized),
        CalloutAnswer::Response { status: 504, .. } => Err(Reason::Timeout),
        CalloutAnswer::Response { status: 502 | 503, body } if body.starts_with(b"upstream connect error") => {
            let refused = body.ends_with(b"connection failure") || body.ends_with(b"remote connection failure");
            Err(if refused { Reason::Refused } else { Reason::Reset })
        }
        CalloutAnswer::Response { .. } => Err(Reason::BadStatus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, body: &str) -> CalloutAnswer {
        CalloutAnswer::Response { status, body: body.as_bytes().to_vec() }
    }

    #[test]
    fn envoys_own_replies_name_what_happened_to_the_call() {
        let refused =
            "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
        let terminated =
            "upstream connect error or disconnect/reset before headers. reset reason: connection termination";
        let protocol = "upstream connect error or disconnect/reset before headers. reset reason: protocol error";

        assert_eq!(classify(&response(503, refused), 1), Err(Reason::Refused));
        assert_eq!(classify(&response(503, terminated), 1), Err(Reason::Reset));
        assert_eq!(classify(&response(502, protocol), 1), Err(Reason::Reset));
        assert_eq!(classify(&response(504, "upstream request timeout"), 1), Err(Reason::Timeout));
        assert_eq!(classify(&CalloutAnswer::Failed, 1), Err(Reason::Reset));
        assert_eq!(classify(&CalloutAnswer::TimedOut, 1), Err(Reason::Timeout));
    }

    #[test]
    fn the_services_own_errors_are_bad_statuses_and_401_is_unauthorized() {
        let overloaded = r#"{"error":{"code":"overloaded","message":"too many requests in flight"}}"#;

        assert_eq!(classify(&response(503, overloaded), 1), Err(Reason::BadStatus));
        assert_eq!(classify(&response(500, "boom"), 1), Err(Reason::BadStatus));
        assert_eq!(classify(&response(401, "{}"), 1), Err(Reason::Unauthorized));
    }

    #[test]
    fn a_200_must_answer_every_entry_in_the_protocols_form() {
        let one = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":5,"remaining":4,
            "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}]}"#;

        assert!(classify(&response(200, one), 1).is_ok());
        assert_eq!(classify(&response(200, one), 2), Err(Reason::BadBody));
        assert_eq!(classify(&response(200, "not json"), 1), Err(Reason::BadBody));
        assert_eq!(classify(&response(200, r#"{"admitted":true}"#), 1), Err(Reason::BadBody));
    }
}

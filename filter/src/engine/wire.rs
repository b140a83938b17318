//! The filter's side of the counter service protocol (`POST /v1/check`, types from
//! `sluice-protocol`): the request body for a request's global policies, and what an
//! answer means, including Envoy's own replies for a service it could not reach.
//!
//! What Envoy 1.40 delivers for each failure (measured; see wasm-host's README): a
//! refused connection is a `503` reply whose body starts `upstream connect error`, a
//! timeout before the headers is a `504`, a protocol error a `502`, and a reset after
//! the headers (or a body slower than the timeout) is a callout with no headers.

use super::resolved::{Place, Resolved};
use crate::host::{CalloutAnswer, Reason};
use sluice_protocol::{
    ChargeResponse, CheckRequest, CheckResponse, CheckResult, ChecksRequest, ChecksResponse, CreditResponse,
    EntryRequest, ErrorBody, ErrorCode, LeaseResponse, LimitSpec,
};

/// The path of a check.
pub(crate) const CHECK_PATH: &str = "/v1/check";
/// The path of a batch of checks.
pub(crate) const CHECKS_PATH: &str = "/v1/checks";
/// The path of a lease.
pub(crate) const LEASE_PATH: &str = "/v1/lease";
/// The path of a charge.
pub(crate) const CHARGE_PATH: &str = "/v1/charge";
/// The path of a credit.
pub(crate) const CREDIT_PATH: &str = "/v1/credit";
/// The largest answer the filter reads; an entry's answer is about 150 bytes.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The check for `global` (policy `i` named and specified by `spec_of(i)`: its name,
/// limit and version), every counter under one hash `tag`.
pub(crate) fn check_request<'a>(
    tag: &str,
    global: &[Resolved],
    spec_of: impl Fn(usize) -> Option<(&'a str, LimitSpec, u64)>,
) -> CheckRequest {
    let entries = global
        .iter()
        .filter_map(|resolved| {
            let Place::Global { key, .. } = &resolved.at else { return None };
            let (name, limit, policy_version) = spec_of(resolved.policy)?;
            Some(EntryRequest {
                key: super::namespace::hex128(*key),
                policy: Some(name.to_owned()),
                policy_version,
                limit,
                cost: resolved.cost,
            })
        })
        .collect();
    CheckRequest { tag: Some(tag.to_owned()), entries }
}

/// The body of one check, `POST /v1/check`.
pub(crate) fn check_body(check: &CheckRequest) -> Vec<u8> {
    // Serialising plain structs of strings and integers cannot fail; an empty body
    // would be answered 400 and decided by the failure rule, never admitted.
    serde_json::to_vec(check).unwrap_or_default()
}

/// The body of a batch of checks, `POST /v1/checks`.
pub(crate) fn checks_body(checks: Vec<CheckRequest>) -> Vec<u8> {
    // As `check_body`: an empty body is refused, and decided by the failure rule.
    serde_json::to_vec(&ChecksRequest { checks }).unwrap_or_default()
}

/// Why an answer decided nothing, and whether it says the service is unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The reason counted and named in the fallback header.
    pub(crate) reason: Reason,
    /// Whether it says the service is unreachable or unhealthy (a timeout, a refused or
    /// reset call, garbage, a 401, a 5xx of its own), rather than answering about this
    /// request alone (a 4xx, `503 store_full`, `503 overloaded`).
    unhealthy: bool,
}

impl Failure {
    const fn unhealthy(reason: Reason) -> Self {
        Self { reason, unhealthy: true }
    }

    /// What the circuit breaker records: `Some(false)` for an unhealthy service, `None`
    /// for an answer about one request.
    pub(crate) const fn health(&self) -> Option<bool> {
        if self.unhealthy { Some(false) } else { None }
    }
}

/// What an answer to a check of `entries` entries means.
pub(crate) fn classify(answer: &CalloutAnswer, entries: usize) -> Result<CheckResponse, Failure> {
    classify_as(answer, |body| {
        serde_json::from_slice::<CheckResponse>(body).ok().filter(|r| r.entries.len() == entries)
    })
}

/// What an answer to a batch of `size` checks means: the batch's own failure (the call
/// failed, or its answer is not one result per check), or each check's result, in order.
/// A check the service refused alone is a failure of that check only, never about the
/// service's health (the call that carried it was answered).
pub(crate) fn classify_batch(answer: &CalloutAnswer, size: usize) -> Result<Vec<CheckOutcome>, Failure> {
    let batch = classify_as(answer, |body| {
        serde_json::from_slice::<ChecksResponse>(body).ok().filter(|r| r.results.len() == size)
    })?;
    Ok(batch
        .results
        .into_iter()
        .map(|result| match result {
            CheckResult::Answered(response) => Ok(response),
            CheckResult::Failed(_) => Err(Failure { reason: Reason::BadStatus, unhealthy: false }),
        })
        .collect())
}

/// One check's outcome in a batch: its answer, or why it was not decided.
pub(crate) type CheckOutcome = Result<CheckResponse, Failure>;

/// A check's answer in a batch, if it answers each of its `entries` entries (else a bad
/// body, of that check alone).
pub(crate) fn every_entry(outcome: CheckOutcome, entries: usize) -> CheckOutcome {
    outcome.and_then(|response| {
        if response.entries.len() == entries {
            Ok(response)
        } else {
            Err(Failure { reason: Reason::BadBody, unhealthy: false })
        }
    })
}

/// A failure of a check that was never sent (its deadline passed while it waited to be
/// sent): a timeout, which says nothing about the service.
pub(crate) const fn unsent() -> Failure {
    Failure { reason: Reason::Timeout, unhealthy: false }
}

/// What an answer to a lease means.
pub(crate) fn classify_lease(answer: &CalloutAnswer) -> Result<LeaseResponse, Failure> {
    classify_as(answer, |body| serde_json::from_slice::<LeaseResponse>(body).ok())
}

/// What an answer to a charge means.
pub(crate) fn classify_charge(answer: &CalloutAnswer) -> Result<ChargeResponse, Failure> {
    classify_as(answer, |body| serde_json::from_slice::<ChargeResponse>(body).ok())
}

/// What an answer to a credit means.
pub(crate) fn classify_credit(answer: &CalloutAnswer) -> Result<CreditResponse, Failure> {
    classify_as(answer, |body| serde_json::from_slice::<CreditResponse>(body).ok())
}

fn classify_as<T>(answer: &CalloutAnswer, parse: impl FnOnce(&[u8]) -> Option<T>) -> Result<T, Failure> {
    match answer {
        CalloutAnswer::TimedOut => Err(Failure::unhealthy(Reason::Timeout)),
        CalloutAnswer::Failed => Err(Failure::unhealthy(Reason::Reset)),
        CalloutAnswer::Response { status: 200, body } => parse(body).ok_or(Failure::unhealthy(Reason::BadBody)),
        CalloutAnswer::Response { status: 401, .. } => Err(Failure::unhealthy(Reason::Unauthorized)),
        CalloutAnswer::Response { status: 504, .. } => Err(Failure::unhealthy(Reason::Timeout)),
        CalloutAnswer::Response { status: 502 | 503, body } if body.starts_with(b"upstream connect error") => {
            let refused = body.ends_with(b"connection failure") || body.ends_with(b"remote connection failure");
            Err(Failure::unhealthy(if refused { Reason::Refused } else { Reason::Reset }))
        }
        CalloutAnswer::Response { status, body } => {
            // A 4xx is about this request; a 503 is when the service says so
            // (`ErrorCode::is_per_request`: a full store, overload), otherwise it is the
            // service's health.
            let code = serde_json::from_slice::<ErrorBody>(body).ok().and_then(|e| ErrorCode::from_name(&e.error.code));
            let per_request =
                (400..500).contains(status) || (*status == 503 && code.is_some_and(ErrorCode::is_per_request));
            Err(Failure { reason: Reason::BadStatus, unhealthy: !per_request })
        }
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

        let reason = |answer: &CalloutAnswer| classify(answer, 1).map_err(|f| (f.reason, f.health()));
        let unhealthy = |reason: Reason| Err((reason, Some(false)));

        assert_eq!(reason(&response(503, refused)), unhealthy(Reason::Refused));
        assert_eq!(reason(&response(503, terminated)), unhealthy(Reason::Reset));
        assert_eq!(reason(&response(502, protocol)), unhealthy(Reason::Reset));
        assert_eq!(reason(&response(504, "upstream request timeout")), unhealthy(Reason::Timeout));
        assert_eq!(reason(&CalloutAnswer::Failed), unhealthy(Reason::Reset));
        assert_eq!(reason(&CalloutAnswer::TimedOut), unhealthy(Reason::Timeout));
    }

    fn error(code: ErrorCode) -> CalloutAnswer {
        CalloutAnswer::Response { status: code.status(), body: crate::testing::service_error(code, "no") }
    }

    #[test]
    fn the_services_own_errors_are_bad_statuses_and_401_is_unauthorized() {
        let reason = |answer: &CalloutAnswer| classify(answer, 1).map_err(|f| (f.reason, f.health()));

        assert_eq!(reason(&error(ErrorCode::StoreUnavailable)), Err((Reason::BadStatus, Some(false))));
        assert_eq!(reason(&response(500, "boom")), Err((Reason::BadStatus, Some(false))));
        assert_eq!(reason(&response(401, "{}")), Err((Reason::Unauthorized, Some(false))));
    }

    #[test]
    fn an_answer_about_one_request_says_nothing_about_the_services_health() {
        let reason = |answer: &CalloutAnswer| classify(answer, 1).map_err(|f| (f.reason, f.health()));

        assert_eq!(reason(&error(ErrorCode::StoreFull)), Err((Reason::BadStatus, None)));
        assert_eq!(reason(&error(ErrorCode::Overloaded)), Err((Reason::BadStatus, None)));
        assert_eq!(reason(&error(ErrorCode::TooManyEntries)), Err((Reason::BadStatus, None)));
    }

    #[test]
    fn every_error_the_service_answers_opens_the_circuit_exactly_when_it_is_about_the_service() {
        for &code in ErrorCode::ALL {
            let Err(failure) = classify(&error(code), 1) else { panic!("{code} was taken for an answer") };
            let expected = match code.status() {
                401 => (Reason::Unauthorized, Some(false)),
                400..=499 => (Reason::BadStatus, None),
                _ if code.is_per_request() => (Reason::BadStatus, None),
                _ => (Reason::BadStatus, Some(false)),
            };
            assert_eq!((failure.reason, failure.health()), expected, "{code}");
        }
    }

    #[test]
    fn a_200_must_answer_every_entry_in_the_protocols_form() {
        let one = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":5,"remaining":4,
            "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}]}"#;

        let reason = |answer: &CalloutAnswer, n| classify(answer, n).map(|_| ()).map_err(|f| f.reason);

        assert!(classify(&response(200, one), 1).is_ok());
        assert_eq!(reason(&response(200, one), 2), Err(Reason::BadBody));
        assert_eq!(reason(&response(200, "not json"), 1), Err(Reason::BadBody));
        assert_eq!(reason(&response(200, r#"{"admitted":true}"#), 1), Err(Reason::BadBody));
    }
}

//! `POST /v1/checks`: several independent checks decided in one call (issue 40), so that
//! a proxy with many requests waiting on checks sends one callout for them rather than
//! one each.
//!
//! Each check is decided exactly as `POST /v1/check` decides it (the same parsing and
//! validation, overrides, store call, answer and metrics): all-or-nothing on its own, and
//! independent of the others, which commute (they were independent requests). A check
//! that `POST /v1/check` would refuse (a bad entry, a store that could not decide it) is
//! answered with that status and error in its place, the others decided regardless.
//!
//! The checks of one call are decided concurrently: on Redis and Redis Cluster their
//! scripts go out together over the store's multiplexed connections (pipelined per
//! node), each the same atomic script a single check runs. The call is bounded: 1 to
//! [`MAX_CHECKS_PER_CALL`] checks (`400 no_checks`, `400 too_many_checks` otherwise,
//! nothing decided), each within `--max-entries`, the whole body within
//! `--max-body-bytes`; it holds one in-flight permit.

use serde::Deserialize;
use sluice_protocol::{CheckFailure, CheckRequest, ErrorCode, ErrorDetail, MAX_CHECKS_PER_CALL};

use crate::api::{self, ApiError, CheckPlan};
use crate::app::App;
use crate::call::Call;

/// A batch as it is read: each check kept as JSON, to be parsed and validated on its own
/// (a bad check fails alone, with its path).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    checks: Vec<serde_json::Value>,
}

impl App {
    /// The bodies of the checks `body` carries, each as `POST /v1/check` would read it.
    ///
    /// # Errors
    /// A 400 for a body that is not a batch (`malformed_json`, `unknown_field`, …), an
    /// empty one (`no_checks`), or one beyond [`MAX_CHECKS_PER_CALL`]
    /// (`too_many_checks`): then no check is decided.
    pub fn split_checks(&self, body: &[u8]) -> Result<Vec<Vec<u8>>, ApiError> {
        let batch: Batch = api::parse(body)?;
        match batch.checks.len() {
            0 => Err(ApiError::bad_request(
                ErrorCode::NoChecks,
                format!("checks: no checks; a batch carries 1 to {MAX_CHECKS_PER_CALL}"),
            )),
            n if n > MAX_CHECKS_PER_CALL => Err(ApiError::bad_request(
                ErrorCode::TooManyChecks,
                format!("checks: {n} checks, at most {MAX_CHECKS_PER_CALL} per call"),
            )),
            _ => Ok(batch.checks.iter().map(|check| serde_json::to_vec(check).unwrap_or_default()).collect()),
        }
    }

    /// A check's body parsed and validated as `POST /v1/check` does it.
    fn check_call(&self, body: &[u8]) -> Result<Call, ApiError> {
        Ok(Call::Check(CheckPlan::new(&api::parse::<CheckRequest>(body)?, self.max_entries())?))
    }

    /// Decides the `index`-th check of a batch as `POST /v1/check` would: its answer, or
    /// its failure (the status and error that route would answer, the message naming
    /// the check).
    pub async fn decide_in_batch(&self, index: usize, body: &[u8]) -> Vec<u8> {
        let decided = async {
            let call = self.check_call(body)?;
            let (outcome, enforced) = self.decide(&call).await?;
            self.answer(&call, &outcome, &enforced)
        };
        decided.await.unwrap_or_else(|error| failure(index, &error))
    }

    /// [`App::decide_in_batch`] without waiting, on the memory store.
    pub(crate) fn decide_in_batch_now(&self, index: usize, body: &[u8]) -> Vec<u8> {
        let decided = (|| {
            let call = self.check_call(body)?;
            let (outcome, enforced) = self.decide_now_on_memory(&call)?;
            self.answer(&call, &outcome, &enforced)
        })();
        decided.unwrap_or_else(|error| failure(index, &error))
    }
}

/// A check of a batch that was not decided, as its place in the answer holds it.
pub fn failure(index: usize, error: &ApiError) -> Vec<u8> {
    let failure = CheckFailure {
        status: error.status,
        error: ErrorDetail {
            code: error.code.name().to_owned(),
            message: format!("checks[{index}].{}", error.message),
        },
    };
    serde_json::to_vec(&failure).unwrap_or_default()
}

/// The answer to a batch: `{"results": [...]}`, each result's JSON as it was encoded.
pub fn results(results: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"{\"results\":[".to_vec();
    for (i, result) in results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(result);
    }
    out.extend_from_slice(b"]}");
    out
}

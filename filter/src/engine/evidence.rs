//! How what shared data reports besides a decision is counted, in every stage that
//! asks it: the limiter's CAS conflicts, repairs, overflow into the shared bucket,
//! refunds that failed and errors; a lease record's forgiven debt and its errors, which
//! become the cause its failure rule is applied for.

use crate::engine::calls::units;
use crate::engine::cause::Cause;
use crate::engine::lease_record::Updated;
use crate::host::{Counter, Metrics};
use shared_store::{Admission, LimitError, UpdateError};

/// Counts an admission's evidence under `policy`.
pub(crate) fn count_evidence(metrics: &mut impl Metrics, policy: usize, admission: &Admission) {
    for (counter, value) in [
        (Counter::CasConflicts, admission.conflicts),
        (Counter::Repaired, admission.repaired),
        (Counter::Overflowed, admission.overflowed),
        (Counter::Unrefunded, admission.unrefunded),
    ] {
        if value > 0 {
            metrics.add(policy, counter, i64::from(value));
        }
    }
}

/// Counts a limiter error under `policy`.
pub(crate) fn count_error(metrics: &mut impl Metrics, policy: usize, error: &LimitError) {
    match error {
        LimitError::Contended { attempts } => {
            metrics.add(policy, Counter::CasConflicts, i64::from(*attempts));
            metrics.add(policy, Counter::CasExhausted, 1);
        }
        LimitError::Store(_) => metrics.add(policy, Counter::StoreErrors, 1),
    }
}

/// Counts what a lease-record update reports besides its result, and turns its errors
/// into the cause the failure rule is applied for.
pub(crate) fn counted<T>(
    policy: usize,
    updated: Result<Updated<T>, UpdateError>,
    metrics: &mut impl Metrics,
) -> Result<Option<T>, Cause> {
    match updated {
        Ok(Updated { result, forgiven }) => {
            if forgiven > 0 {
                metrics.add(policy, Counter::LeaseForgiven, units(forgiven));
            }
            Ok(result)
        }
        Err(UpdateError::Contended { attempts }) => {
            metrics.add(policy, Counter::CasConflicts, i64::from(attempts));
            Err(Cause::CasExhausted)
        }
        Err(UpdateError::Store(_)) => Err(Cause::StoreError),
    }
}

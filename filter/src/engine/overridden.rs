//! Requests the counter service decided under an operator's override (a bypass or a
//! clamp, set on the service's admin API): counted per policy (`override.bypassed`,
//! `override.clamped`), named in the override header when one is configured, and
//! logged at most once per [`LOG_INTERVAL`] per override on each worker.

use sluice_protocol::{AppliedOverride, OverrideKind};

use super::cause::LOG_INTERVAL;
use super::setup::Setup;
use crate::host::{Counter, Metrics};
use shared_store::Nanos;

/// Counts and (at most once per interval) logs `policy`'s request decided under `applied`.
pub(crate) fn note(setup: &Setup, policy: usize, applied: AppliedOverride, now: Nanos, metrics: &mut impl Metrics) {
    let counter = match applied.kind {
        OverrideKind::Bypass => Counter::OverrideBypassed,
        OverrideKind::Clamp => Counter::OverrideClamped,
    };
    metrics.add(policy, counter, 1);
    log_once(setup, policy, applied, now);
}

/// Logs, at most once per interval, that `policy` is decided under `applied`: for a
/// lease granted under it, whose tokens are then spent on this proxy (a lease-mode
/// request is not counted or named per request; its refills are decided under the
/// override, its lease at most one lease's life after the override is set).
pub(crate) fn log_once(setup: &Setup, policy: usize, applied: AppliedOverride, now: Nanos) {
    let logged = setup.overrides_logged.try_borrow_mut().is_ok_and(|mut log| log.admit(applied.id.0, now));
    if logged && let Some(compiled) = setup.compiled(policy) {
        log::info!(
            "policy {} is decided under the counter service's {} {} (an operator's override; logged once per {} s)",
            compiled.policy.name,
            applied.kind.name(),
            applied.id,
            LOG_INTERVAL.0 / 1_000_000_000
        );
    }
}

/// The override header's value for `overrides` (policy index, override), such as
/// `clamp; id=ovr-1f2e3d4c5b6a7988; policy=per-tenant`, several joined by `, `.
pub(crate) fn header_value(setup: &Setup, overrides: &[(usize, AppliedOverride)]) -> String {
    let mut value = String::new();
    for (i, (policy, applied)) in overrides.iter().enumerate() {
        if i > 0 {
            value.push_str(", ");
        }
        value.push_str(applied.kind.name());
        value.push_str("; id=");
        value.push_str(&applied.id.to_string());
        if let Some(compiled) = setup.compiled(*policy) {
            value.push_str("; policy=");
            value.push_str(&compiled.policy.name);
        }
    }
    value
}

/// Adds the override header to `headers` when it is configured and `overrides` is not
/// empty.
pub(crate) fn add_header(setup: &Setup, overrides: &[(usize, AppliedOverride)], headers: &mut Vec<(String, String)>) {
    if let (Some(name), false) = (&setup.response.override_header, overrides.is_empty()) {
        headers.push((name.clone(), header_value(setup, overrides)));
    }
}

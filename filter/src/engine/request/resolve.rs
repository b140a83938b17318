//! The resolve stage: from a request to what each matching policy needs, where the
//! caller's budget is and what the request costs. No shared data is touched here.
//!
//! A policy whose key part is missing follows `on_missing_key`; a policy for which a host
//! call fails (reading a header, a property) follows its `on_failure`: a failed read is
//! never "missing", which under `skip` would admit silently.

use crate::config::{FailureOutcome, MissingKey};
use crate::engine::compiled::{Compiled, Home};
use crate::engine::resolved::{Few, Place, Rare, Resolved};
use crate::host::{Counter, HostFailure, Metrics, RequestFacts};
use crate::policy::fingerprint_parts;
use shared_store::HashKey;

/// Every matching policy of a request, by how it is decided.
#[derive(Debug, Default)]
pub(crate) struct Resolution {
    /// Local enforcing policies, decided together.
    pub(crate) local: Few<Resolved>,
    /// Global policies in check mode, decided together by the service.
    pub(crate) checked: Rare<Resolved>,
    /// Global policies in lease mode, spent from this proxy's leases.
    pub(crate) leased: Rare<Resolved>,
    /// Shadow policies, decided one by one after an admission.
    pub(crate) shadows: Rare<Resolved>,
    /// Every policy the request counts under.
    pub(crate) offered: Few<usize>,
    /// Set when the request is rejected before any bucket is consulted.
    pub(crate) refused: Option<Refusal>,
}

/// Why a request is rejected before any bucket is consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A policy with `on_missing_key: reject` lacks a key part: the rejection response.
    MissingKey,
    /// A read failed for a policy whose failure action denies, with this status.
    Failure(u16),
}

/// The keys a request's policies are hashed with.
pub(crate) struct Secrets<'a> {
    /// The per-proxy secret of local buckets.
    pub(crate) local: &'a HashKey,
    /// The operator's key of global counters (absent without a counter service).
    pub(crate) global: Option<&'a HashKey>,
}

fn fingerprint(
    compiled: &Compiled,
    request: &impl RequestFacts,
    secret: &HashKey,
) -> Result<Option<u128>, HostFailure> {
    let policy = &compiled.policy;
    fingerprint_parts(&policy.name, policy.version, &policy.key, request, secret)
}

/// Resolves every policy for `request`, counting missing keys and failed reads.
pub(crate) fn resolve(
    policies: &[Compiled],
    request: &impl RequestFacts,
    secrets: &Secrets<'_>,
    metrics: &mut impl Metrics,
) -> Resolution {
    let mut out = Resolution::default();
    for compiled in policies {
        let (index, policy) = (compiled.index, &compiled.policy);
        match resolve_one(compiled, request, secrets) {
            Ok(Applies::No) => {}
            Ok(Applies::SkippedMissingKey) => metrics.add(index, Counter::MissingKey, 1),
            Ok(Applies::Yes { at, cost, missing_key }) => {
                if missing_key {
                    metrics.add(index, Counter::MissingKey, 1);
                }
                out.offered.push(index);
                let resolved = Resolved { policy: index, cost, at };
                match (&resolved.at, policy.shadow) {
                    (Place::Global { lease: Some(_), .. }, _) => out.leased.push(resolved),
                    (Place::Global { .. }, _) => out.checked.push(resolved),
                    (Place::Local(_), true) => out.shadows.push(resolved),
                    (Place::Local(_), false) => out.local.push(resolved),
                }
            }
            Err(Unresolved::Missing) => {
                metrics.add(index, Counter::MissingKey, 1);
                out.offered.push(index);
                if policy.shadow {
                    metrics.add(index, Counter::ShadowRejected, 1);
                } else {
                    metrics.add(index, Counter::OverLimit, 1);
                    out.refused = out.refused.or(Some(Refusal::MissingKey));
                }
            }
            Err(Unresolved::Failed) => {
                metrics.add(index, Counter::ReadFailures, 1);
                out.offered.push(index);
                match policy.on_failure {
                    FailureOutcome::Deny(status) if !policy.shadow => {
                        metrics.add(index, Counter::FailureDenied, 1);
                        // A failure's status says more than a missing key's rejection.
                        if !matches!(out.refused, Some(Refusal::Failure(_))) {
                            out.refused = Some(Refusal::Failure(status));
                        }
                    }
                    _ => metrics.add(index, Counter::FailureAllowed, 1),
                }
            }
        }
    }
    out
}

/// Why a matching policy has no place to decide on.
enum Unresolved {
    /// A key part is missing and the policy says `reject`.
    Missing,
    /// A host call failed.
    Failed,
}

impl From<HostFailure> for Unresolved {
    fn from(_: HostFailure) -> Self {
        Self::Failed
    }
}

/// Whether a policy applies to a request.
enum Applies {
    /// It does not match.
    No,
    /// A key part is missing and the policy skips such requests.
    SkippedMissingKey,
    /// It applies: the budget is `at`; `missing_key` when it is the shared bucket of
    /// requests missing a key part.
    Yes { at: Place, cost: u64, missing_key: bool },
}

fn resolve_one(compiled: &Compiled, request: &impl RequestFacts, secrets: &Secrets<'_>) -> Result<Applies, Unresolved> {
    let policy = &compiled.policy;
    if !policy.matcher.matches(request)? {
        return Ok(Applies::No);
    }
    let mut missing_key = false;
    let at = match &compiled.home {
        Home::Local(table) => match fingerprint(compiled, request, secrets.local)? {
            Some(fingerprint) => Place::Local(table.slots.place(fingerprint)),
            None => match policy.on_missing_key {
                MissingKey::Skip => return Ok(Applies::SkippedMissingKey),
                MissingKey::Reject => return Err(Unresolved::Missing),
                MissingKey::Shared => {
                    missing_key = true;
                    Place::Local(table.missing.clone())
                }
            },
        },
        Home::Global { cap, lease, .. } => {
            // Without a counter service the configuration is refused, so this is only a
            // safeguard: an unreadable secret is a failure, never a silent skip.
            let secret = secrets.global.ok_or(HostFailure { status: 0 })?;
            let found = match fingerprint(compiled, request, secret)? {
                Some(fingerprint) => Some(fingerprint),
                None => match policy.on_missing_key {
                    MissingKey::Skip => return Ok(Applies::SkippedMissingKey),
                    MissingKey::Reject => return Err(Unresolved::Missing),
                    MissingKey::Shared => {
                        missing_key = true;
                        None
                    }
                },
            };
            // Callers missing the key share one counter: the descriptor of no parts,
            // which no caller's descriptor (one value per part) can equal.
            let key = found.unwrap_or_else(|| secret.fingerprinter(&policy.name, policy.version).finish());
            let cap = cap.as_ref().map(|cap| match found {
                Some(fingerprint) => cap.table.slots.place(fingerprint),
                None => cap.table.missing.clone(),
            });
            let lease = lease.as_ref().map(|leased| leased.table.place(key));
            Place::Global { key, cap, lease }
        }
    };
    Ok(Applies::Yes { at, cost: policy.cost_of(request)?, missing_key })
}

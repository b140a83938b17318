//! How one `ShouldRateLimit` request is decided, as envoyproxy/ratelimit decides it,
//! on Sluice's stores: [`decide`].
//!
//! Each descriptor is decided on its own ([`Found`] by [`RlsConfig::find`], or the
//! request's own `limit`), in order, each in one atomic store step:
//!
//! | the descriptor's hits | the store does | the status |
//! |---|---|---|
//! | 0 (`hits_addend: 0`: ask, do not spend) | a check of cost 0 | `OVER_LIMIT` when nothing is left |
//! | 1 to the limit | a check of that cost: admitted, it is spent | `OK`, what is left |
//! | the same, not admitted | the hits are charged (counted, as envoyproxy/ratelimit counts a rejected hit), at most one limit below empty ([`max_debt_bound`]) | `OVER_LIMIT` |
//! | more than the limit | a charge, as above | `OVER_LIMIT` |
//! | `is_negative_hits` | a credit of that many (the current window only) | `OK` |
//!
//! Counting a rejected hit is what a "check on request, charge on stream done" token
//! budget needs: the charge Envoy sends when the stream is done must be recorded even
//! when it does not fit, or the budget never runs out. The debt is bounded: a counter is
//! never more than one limit below empty (a fixed window's debt ends with it).

use std::sync::Arc;
use std::time::Duration;

use shared_store::{Decision, Nanos, Verdict};
use sluice_protocol::{AppliedOverride, CHARGE_ID_TTL_MS, ErrorCode, LimitSpec, max_debt_bound};

use super::config::{Metadata, RlsConfig, Rule, RuleAlgorithm, Unit};
use super::matching::Found;
use crate::api::{ApiError, ChargePlan, CheckPlan, CreditPlan, PlannedEntry, Scope, storage_key};
use crate::app::App;
use crate::call::{Call, Outcome};
use crate::spec::StoreLimit;

/// Most descriptors in one request (a route sends one per `rate_limits` entry).
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_DESCRIPTOR_ENTRIES: usize = 32;

/// A request, as Envoy's filter sends it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsRequest {
    /// `domain`.
    pub domain: String,
    /// `descriptors`, in order.
    pub descriptors: Vec<RlsDescriptor>,
    /// `hits_addend` (0: unset, which counts 1).
    pub hits_addend: u32,
}

/// One descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsDescriptor {
    /// `(key, value)` entries.
    pub entries: Vec<(String, String)>,
    /// The request's own limit (`limit`): requests per unit, and the unit's number in
    /// Envoy's `RateLimitUnit` (1 second … 6 year).
    pub limit: Option<(u32, i32)>,
    /// Its own `hits_addend`, which overrides the request's (0 allowed).
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`: give the hits back instead of spending them.
    pub negative: bool,
}

/// A descriptor's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Over its limit.
    OverLimit,
}

/// The limit a status reports (`current_limit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`.
    pub unit: Unit,
    /// `unit_multiplier` (not in the protocol: Sluice's headers use it).
    pub unit_multiplier: u32,
    /// `name` (empty when the rule has none).
    pub name: String,
    /// The policy name its counters and overrides go by.
    pub policy: String,
}

/// One descriptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Its code (after `shadow_mode`).
    pub code: Code,
    /// The code the limit decided (before `shadow_mode`).
    pub decided: Code,
    /// The limit, when one applied.
    pub current_limit: Option<CurrentLimit>,
    /// Hits left (0 when over; `u32::MAX` when unlimited).
    pub limit_remaining: u32,
    /// Until the window resets (fixed windows), or until the limit is full again (`OK`)
    /// or admits this many hits again (`OVER_LIMIT`), rounded up to whole seconds.
    pub duration_until_reset: Option<Duration>,
    /// The exact wait before a retry of the same cost may be admitted (`OVER_LIMIT`).
    pub retry_after: Option<Nanos>,
    /// The operator's override that decided it.
    pub overridden: Option<AppliedOverride>,
    /// Whether its rule is in `quota_mode`.
    pub quota_mode: bool,
    /// Whether its rule is in `shadow_mode`.
    pub shadow_mode: bool,
    /// The hits it counted (0 when nothing was counted).
    pub hits: u64,
    /// The metrics' rule label, when a rule decided it.
    pub stat: Option<String>,
    /// Its rule's `metadata:`, when a limited rule was counted (for the answer's
    /// `dynamic_metadata`: [`super::metadata`]).
    pub metadata: Option<Arc<Metadata>>,
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlsAnswer {
    /// `overall_code`.
    pub overall: Code,
    /// One per descriptor, in order.
    pub statuses: Vec<Status>,
    /// Whether the domain was not configured.
    pub domain_not_found: bool,
}

/// Why a request was not decided: a gRPC error, never `overall_code: UNKNOWN` (which
/// Envoy lets through whatever `failure_mode_deny` says).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    /// The request is malformed (`INVALID_ARGUMENT`).
    #[error("{0}")]
    Invalid(String),
    /// The store did not decide in time, or the service is overloaded (`UNAVAILABLE`).
    #[error("{0}")]
    Unavailable(String),
    /// The caller's token is missing or wrong (`UNAUTHENTICATED`).
    #[error("{0}")]
    Unauthenticated(String),
}

impl RlsError {
    /// The gRPC code's name, for metrics.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_argument",
            Self::Unavailable(_) => "unavailable",
            Self::Unauthenticated(_) => "unauthenticated",
        }
    }
}

impl From<ApiError> for RlsError {
    fn from(error: ApiError) -> Self {
        match error.status {
            401 => Self::Unauthenticated(error.message),
            400 => Self::Invalid(error.message),
            _ => Self::Unavailable(format!("{}: {}", error.code.name(), error.message)),
        }
    }
}

/// Checks what Envoy's own validation would: a domain, at least one descriptor, and
/// each with at least one entry whose key is not empty; and Sluice's bounds.
///
/// # Errors
/// [`RlsError::Invalid`] naming the first problem.
pub fn validate(request: &RlsRequest) -> Result<(), RlsError> {
    if request.domain.is_empty() {
        return Err(RlsError::Invalid("rate limit domain must not be empty".to_owned()));
    }
    if request.descriptors.is_empty() {
        return Err(RlsError::Invalid("rate limit descriptor list must not be empty".to_owned()));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(RlsError::Invalid(format!(
            "descriptors: {} descriptors, at most {MAX_DESCRIPTORS} per request",
            request.descriptors.len()
        )));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(RlsError::Invalid(format!("descriptors[{index}].entries: must hold at least one entry")));
        }
        if descriptor.entries.len() > MAX_DESCRIPTOR_ENTRIES {
            return Err(RlsError::Invalid(format!(
                "descriptors[{index}].entries: {} entries, at most {MAX_DESCRIPTOR_ENTRIES}",
                descriptor.entries.len()
            )));
        }
        if let Some(e) = descriptor.entries.iter().position(|(key, _)| key.is_empty()) {
            return Err(RlsError::Invalid(format!("descriptors[{index}].entries[{e}].key: must not be empty")));
        }
    }
    Ok(())
}

/// The rule of a request's own `limit` (an override from Envoy's route): a fixed window,
/// no shadow mode, no replaces, counted in the descriptor's own counter.
fn override_rule(domain: &str, index: usize, (rpu, unit): (u32, i32)) -> Result<Rule, RlsError> {
    let unit = match unit {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        7 => Unit::Week,
        6 => {
            return Err(RlsError::Invalid(format!(
                "descriptors[{index}].limit.unit: YEAR is longer than the longest period the stores keep (31 days)"
            )));
        }
        other => {
            return Err(RlsError::Invalid(format!("descriptors[{index}].limit.unit: {other} is not a unit")));
        }
    };
    let limit = if rpu == 0 {
        None
    } else {
        let spec = LimitSpec::FixedWindow { limit: u64::from(rpu), window_ms: unit.seconds() * 1000 };
        Some(StoreLimit::new(spec).map_err(|e| RlsError::Invalid(format!("descriptors[{index}].limit: {e}")))?)
    };
    let path = format!("{domain}.limit_override");
    Ok(Rule {
        name: None,
        policy: super::config::policy_name(None, &path),
        path,
        requests_per_unit: rpu,
        unit: Some(unit),
        unit_multiplier: 1,
        unlimited: false,
        replaces: Vec::new(),
        algorithm: RuleAlgorithm::FixedWindow,
        limit,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        metadata: None,
    })
}

/// The rule a descriptor falls under (borrowed from the configuration, or made from
/// the request's own limit), its counter and its metrics' label.
pub(super) struct Target<'a> {
    pub(super) rule: std::borrow::Cow<'a, Rule>,
    pub(super) counter: String,
    pub(super) stat: String,
}

/// Decides `request` under `config` on `app`'s store, at `at` when given (tests; the
/// store's time otherwise).
///
/// # Errors
/// [`RlsError::Invalid`] for a malformed request (nothing is counted), and
/// [`RlsError::Unavailable`] when the store could not decide a descriptor (those before
/// it may have been counted, as envoyproxy/ratelimit's pipeline may have).
pub async fn decide(
    app: &App,
    config: &RlsConfig,
    request: &RlsRequest,
    at: Option<Nanos>,
) -> Result<RlsAnswer, RlsError> {
    validate(request)?;
    if !config.domains.contains_key(&request.domain) {
        let statuses = request.descriptors.iter().map(|_| Status::allowed(0)).collect();
        return Ok(RlsAnswer { overall: Code::Ok, statuses, domain_not_found: true });
    }
    let mut targets = Vec::with_capacity(request.descriptors.len());
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let entries: Vec<(&str, &str)> = descriptor.entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        targets.push(match descriptor.limit {
            Some(limit) => {
                let rule = override_rule(&request.domain, index, limit)?;
                let stat = rule.path.clone();
                let counter = super::identity::counter(&request.domain, &entries);
                Some(Target { rule: std::borrow::Cow::Owned(rule), counter, stat })
            }
            None => match config.find(&request.domain, &entries) {
                Found::Rule { rule, counter, stat } => {
                    Some(Target { rule: std::borrow::Cow::Borrowed(rule), counter, stat })
                }
                Found::NoDomain | Found::NoRule => None,
            },
        });
    }
    // `replaces`: a rule another matched rule replaces is not counted.
    let replaced: Vec<&str> =
        targets.iter().flatten().flat_map(|t| t.rule.replaces.iter().map(String::as_str)).collect();
    let counted: Vec<usize> = (0..targets.len())
        .filter(|i| {
            targets[*i].as_ref().is_some_and(|t| !t.rule.name.as_deref().is_some_and(|n| replaced.contains(&n)))
        })
        .collect();
    let mut statuses: Vec<Status> = request.descriptors.iter().map(|_| Status::allowed(0)).collect();
    let mut alone = counted.clone();
    if let Some(together) = config.all_or_nothing.get(&request.domain) {
        let decided = super::together::decide_together(app, request, (&targets, &alone), together, at).await?;
        alone.retain(|i| !decided.iter().any(|(d, _)| d == i));
        for (index, status) in decided {
            statuses[index] = status;
        }
    }
    for index in alone {
        let (descriptor, Some(Target { rule, counter, stat })) = (&request.descriptors[index], &targets[index]) else {
            continue;
        };
        let mut status =
            decide_one(app, rule, counter, (hits_of(request, descriptor), descriptor.negative), at).await?;
        status.stat = Some(stat.clone());
        statuses[index] = status;
    }
    for index in counted {
        if let Some(target) = targets[index].as_ref().filter(|t| !t.rule.unlimited) {
            statuses[index].metadata.clone_from(&target.rule.metadata);
        }
    }
    Ok(RlsAnswer { overall: overall(&statuses), statuses, domain_not_found: false })
}

/// A descriptor's hits: its own `hits_addend` when set (0 included), else the
/// request's, at least 1.
pub(super) fn hits_of(request: &RlsRequest, descriptor: &RlsDescriptor) -> u64 {
    descriptor.hits_addend.unwrap_or_else(|| u64::from(request.hits_addend.max(1)))
}

/// envoyproxy/ratelimit's overall code: over when a descriptor outside `quota_mode` is
/// over, or when every descriptor in `quota_mode` is (there being some).
fn overall(statuses: &[Status]) -> Code {
    let over = |s: &&Status| s.code == Code::OverLimit;
    let plain_over = statuses.iter().filter(|s| !s.quota_mode).any(|s| over(&s));
    let quota: Vec<&Status> = statuses.iter().filter(|s| s.quota_mode).collect();
    let quota_over = !quota.is_empty() && quota.iter().all(over);
    if plain_over || quota_over { Code::OverLimit } else { Code::Ok }
}

impl Status {
    /// Allowed without a limit: `remaining` as given (0, or `u32::MAX` when unlimited).
    pub(super) fn allowed(remaining: u32) -> Self {
        Self {
            code: Code::Ok,
            decided: Code::Ok,
            current_limit: None,
            limit_remaining: remaining,
            duration_until_reset: None,
            retry_after: None,
            overridden: None,
            quota_mode: false,
            shadow_mode: false,
            hits: 0,
            stat: None,
            metadata: None,
        }
    }
}

async fn decide_one(
    app: &App,
    rule: &Rule,
    counter: &str,
    (hits, negative): (u64, bool),
    at: Option<Nanos>,
) -> Result<Status, RlsError> {
    // `unlimited` (which has no unit): allowed, every hit left, nothing counted.
    let Some(unit) = rule.unit.filter(|_| !rule.unlimited) else { return Ok(Status::allowed(u32::MAX)) };
    let base = Status { hits: if negative { 0 } else { hits }, ..limited(rule, unit) };
    let period = period_of(rule, unit);
    let Some(limit) = &rule.limit else {
        // `requests_per_unit: 0`: always over, nothing to count.
        let status = Status {
            code: Code::OverLimit,
            decided: Code::OverLimit,
            duration_until_reset: Some(Duration::from_secs(unit.seconds())),
            ..base
        };
        return Ok(shadowed(status));
    };
    let entry = PlannedEntry {
        storage_key: storage_key(&format!("rls:{counter}"), 0, counter),
        limit: limit.clone(),
        cost: 0,
        scope: Scope { policy: Some(rule.policy.clone()), version: 0, key: counter.to_owned() },
        expires: None,
    };
    let fixed = rule.algorithm == RuleAlgorithm::FixedWindow;
    if negative {
        let plan = CreditPlan {
            entry: PlannedEntry { cost: hits, ..entry },
            spent_at: at.unwrap_or_else(|| app.store().now()),
            credit_key: None,
            id_ttl_ms: CHARGE_ID_TTL_MS,
            clamp: None,
        };
        if !plan.entry.limit.creditable() {
            return Ok(base);
        }
        let call = Call::Credit(plan);
        let (outcome, enforced) = app.decide_at(&call, at).await?;
        let Outcome::Credit(credit) = outcome else { return Err(internal()) };
        return Ok(answer(
            Status { overridden: enforced.applied(0), ..base },
            &credit.decision,
            credit.at,
            fixed,
            period,
        ));
    }
    if hits <= limit.capacity() {
        let call = Call::Check(CheckPlan { entries: vec![PlannedEntry { cost: hits, ..entry.clone() }] });
        let (outcome, enforced) = app.decide_at(&call, at).await?;
        let Outcome::Check(check) = outcome else { return Err(internal()) };
        let decision = check.decisions.first().copied().ok_or_else(internal)?;
        let overridden = enforced.applied(0);
        let full = hits == 0 && decision.remaining == 0;
        if check.admitted && !full {
            return Ok(answer(Status { overridden, ..base }, &decision, check.at, fixed, period));
        }
        if hits == 0 {
            let status = Status { code: Code::OverLimit, decided: Code::OverLimit, overridden, ..base };
            return Ok(shadowed(over(status, &decision, check.at, fixed, period)));
        }
    }
    // Not admitted, or more than the limit holds: counted all the same, up to the bound.
    let plan = ChargePlan {
        entry: PlannedEntry { cost: hits, ..entry },
        max_debt: max_debt_bound(limit.capacity()),
        charge_key: None,
        id_ttl_ms: CHARGE_ID_TTL_MS,
        clamp: None,
    };
    let call = Call::Charge(plan);
    let (outcome, enforced) = app.decide_at(&call, at).await?;
    let Outcome::Charge(charge) = outcome else { return Err(internal()) };
    let status = Status { code: Code::OverLimit, decided: Code::OverLimit, overridden: enforced.applied(0), ..base };
    Ok(shadowed(over(status, &charge.decision, charge.at, fixed, period)))
}

/// The status of a descriptor under `rule` (of `unit`), before it is decided.
pub(super) fn limited(rule: &Rule, unit: Unit) -> Status {
    Status {
        current_limit: Some(CurrentLimit {
            requests_per_unit: rule.requests_per_unit,
            unit,
            unit_multiplier: rule.unit_multiplier,
            name: rule.name.clone().unwrap_or_default(),
            policy: rule.policy.clone(),
        }),
        quota_mode: rule.quota_mode,
        shadow_mode: rule.shadow_mode,
        ..Status::allowed(0)
    }
}

/// The length of `rule`'s window or period.
pub(super) fn period_of(rule: &Rule, unit: Unit) -> Nanos {
    Nanos::from_millis(unit.seconds() * 1000 * u64::from(rule.unit_multiplier))
}

/// The store's own answer kind, when it answered another.
pub(super) fn internal() -> RlsError {
    RlsError::Unavailable(format!("{}: the store answered another kind of request", ErrorCode::Internal.name()))
}

/// `shadow_mode`: decided and counted, but answered `OK`.
fn shadowed(status: Status) -> Status {
    if status.shadow_mode { Status { code: Code::Ok, ..status } } else { status }
}

/// Whole seconds until the fixed window `at` falls in ends: envoyproxy/ratelimit's
/// `unit - now % unit` (1 to the window's length).
fn until_window_end(at: Nanos, period: Nanos) -> Duration {
    let period = period.as_u64().max(1);
    Duration::from_secs((period - at.as_u64() % period).div_ceil(1_000_000_000))
}

fn whole_seconds(wait: Nanos) -> Duration {
    Duration::from_secs(wait.as_u64().div_ceil(1_000_000_000))
}

/// An admitted descriptor's status.
pub(super) fn answer(status: Status, decision: &Decision, at: Nanos, fixed: bool, period: Nanos) -> Status {
    let reset = if fixed { until_window_end(at, period) } else { whole_seconds(decision.reset_after) };
    Status {
        code: Code::Ok,
        decided: Code::Ok,
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(reset),
        ..status
    }
}

/// A descriptor over its limit: nothing left, and the wait.
pub(super) fn over(status: Status, decision: &Decision, at: Nanos, fixed: bool, period: Nanos) -> Status {
    let retry_after = match decision.verdict {
        Verdict::Rejected { retry_after } => Some(retry_after),
        _ => None,
    };
    let reset =
        if fixed { until_window_end(at, period) } else { whole_seconds(retry_after.unwrap_or(decision.reset_after)) };
    Status { limit_remaining: 0, duration_until_reset: Some(reset), retry_after, ..status }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_window_resets_at_the_next_multiple_of_its_length() {
        let minute = Nanos::from_millis(60_000);

        assert_eq!(until_window_end(Nanos::from_millis(120_000), minute), Duration::from_secs(60));
        assert_eq!(until_window_end(Nanos::from_millis(130_500), minute), Duration::from_secs(50));
        assert_eq!(until_window_end(Nanos::from_millis(179_999), minute), Duration::from_secs(1));
    }

    #[test]
    fn a_request_without_a_domain_or_descriptors_is_refused_by_name() {
        let empty = RlsRequest::default();
        let no_descriptors = RlsRequest { domain: "d".to_owned(), ..RlsRequest::default() };
        let empty_key = RlsRequest {
            domain: "d".to_owned(),
            descriptors: vec![RlsDescriptor { entries: vec![(String::new(), "v".to_owned())], ..Default::default() }],
            hits_addend: 0,
        };

        assert_eq!(validate(&empty), Err(RlsError::Invalid("rate limit domain must not be empty".to_owned())));
        assert!(matches!(validate(&no_descriptors), Err(RlsError::Invalid(m)) if m.contains("descriptor list")));
        assert!(
            matches!(validate(&empty_key), Err(RlsError::Invalid(m)) if m.contains("descriptors[0].entries[0].key"))
        );
    }
}

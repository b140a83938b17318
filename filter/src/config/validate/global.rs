//! Whether the settings of global policies are valid: the `counter_service` block, a
//! policy's `global` block and lease, and its emergency cap. The numbers a global policy
//! sends are validated with the service's own rules ([`sluice_protocol::LimitSpec::validate`]),
//! so a configuration the filter accepts is never refused by the service.

use super::fields::{amount, between, duration_between, is_header_value};
use super::issues::Issues;
use super::key::validate_key;
use crate::config::model::bounds::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, DEFAULT_COLD_BELOW, DEFAULT_LEASE,
    DEFAULT_MAX_CHECKS_IN_FLIGHT, DEFAULT_MAX_WAITING, DEFAULT_TIMEOUT, MAX_BREAKER_COOLDOWN, MAX_BREAKER_FAILURES,
    MAX_CHECKS_PER_CALL, MAX_LEASE, MAX_MAX_CHECKS_IN_FLIGHT, MAX_MAX_WAITING, MAX_SECRET_BYTES, MAX_TIMEOUT,
    MIN_BREAKER_COOLDOWN, MIN_BREAKER_FAILURES, MIN_HASH_KEY_BYTES, MIN_LEASE, MIN_TIMEOUT,
};
use crate::config::model::global::{Breaker, CounterService, Global, Lease, Secret, SecretSource, Strategy};
use crate::config::raw::{
    DurationSpec, RawCircuitBreaker, RawCounterService, RawEmergency, RawGlobal, RawLease, RawPolicy, RawStrategy,
};
use shared_store::{Algorithm, Limit, Nanos, Rate};
use sluice_protocol::LimitSpec;

fn env_name(issues: &mut Issues, path: &str, name: &str) {
    if name.is_empty() || name.len() > 256 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        issues.add(path, format!("expected an environment variable name (A-Z a-z 0-9 _), got {name:?}"));
    }
}

fn secret_source(
    issues: &mut Issues,
    path: &str,
    (inline_field, inline): (&str, Option<String>),
    (env_field, env): (&str, Option<String>),
) -> Option<SecretSource> {
    match (inline, env) {
        (Some(_), Some(_)) => {
            issues.add(format!("{path}.{inline_field}"), format!("cannot be combined with {env_field}"));
            None
        }
        (Some(value), None) => {
            if value.is_empty() || value.len() > MAX_SECRET_BYTES || !value.bytes().all(|b| b.is_ascii_graphic()) {
                // Never echo a secret in a message.
                issues.add(
                    format!("{path}.{inline_field}"),
                    format!("expected 1 to {MAX_SECRET_BYTES} visible ASCII characters without spaces"),
                );
            }
            Some(SecretSource::Inline(Secret::new(value)))
        }
        (None, Some(name)) => {
            env_name(issues, &format!("{path}.{env_field}"), &name);
            Some(SecretSource::Env(name))
        }
        (None, None) => None,
    }
}

fn timeout_ms(issues: &mut Issues, path: &str, spec: Option<DurationSpec>) -> u32 {
    let default = u32::try_from(DEFAULT_TIMEOUT.millis()).unwrap_or(u32::MAX);
    let Some(spec) = spec else { return default };
    duration_between(issues, path, spec, MIN_TIMEOUT, MAX_TIMEOUT)
        .and_then(|ms| u32::try_from(ms).ok())
        .unwrap_or(default)
}

fn breaker(issues: &mut Issues, path: &str, raw: Option<RawCircuitBreaker>) -> Breaker {
    let raw = raw.unwrap_or(RawCircuitBreaker { failures: None, cooldown: None });
    let failures = raw.failures.unwrap_or(DEFAULT_BREAKER_FAILURES);
    between(issues, &format!("{path}.failures"), failures, MIN_BREAKER_FAILURES, MAX_BREAKER_FAILURES);
    let cooldown = raw
        .cooldown
        .and_then(|spec| {
            duration_between(issues, &format!("{path}.cooldown"), spec, MIN_BREAKER_COOLDOWN, MAX_BREAKER_COOLDOWN)
        })
        .unwrap_or(DEFAULT_BREAKER_COOLDOWN.millis());
    let cooldown = Nanos::from_millis(cooldown);
    Breaker { failures, cooldown }
}

/// Validates the `counter_service` block.
pub(super) fn validate_counter_service(issues: &mut Issues, raw: RawCounterService) -> CounterService {
    let path = "counter_service";
    if raw.cluster.is_empty() || raw.cluster.len() > 256 || !is_header_value(&raw.cluster) {
        issues.add(format!("{path}.cluster"), format!("expected a cluster name, got {:?}", raw.cluster));
    }
    let authority = raw.authority.unwrap_or_else(|| raw.cluster.clone());
    if authority.is_empty() || !authority.bytes().all(|b| b.is_ascii_graphic()) {
        issues.add(
            format!("{path}.authority"),
            format!("expected a host name such as \"sluice-counter\", got {authority:?}"),
        );
    }
    let timeout_ms = timeout_ms(issues, &format!("{path}.timeout"), raw.timeout);
    let token = secret_source(issues, path, ("token", raw.token), ("token_env", raw.token_env));
    let hash_key = secret_source(issues, path, ("hash_key", raw.hash_key), ("hash_key_env", raw.hash_key_env));
    if let Some(SecretSource::Inline(key)) = &hash_key
        && key.expose().len() < MIN_HASH_KEY_BYTES
    {
        issues.add(format!("{path}.hash_key"), format!("must be at least {MIN_HASH_KEY_BYTES} bytes"));
    }
    let hash_key = hash_key.unwrap_or_else(|| {
        issues.add(
            path,
            "expected hash_key_env (or hash_key): the key global keys are hashed with, the same on every proxy",
        );
        SecretSource::Env(String::new())
    });
    let partition = validate_key(issues, &format!("{path}.partition"), raw.partition, true);
    let breaker = breaker(issues, &format!("{path}.circuit_breaker"), raw.circuit_breaker);
    let max_checks_in_flight = raw.max_checks_in_flight.unwrap_or(DEFAULT_MAX_CHECKS_IN_FLIGHT);
    between(issues, &format!("{path}.max_checks_in_flight"), max_checks_in_flight, 0, MAX_MAX_CHECKS_IN_FLIGHT);
    let max_checks_per_call = raw.max_checks_per_call.unwrap_or(MAX_CHECKS_PER_CALL);
    between(issues, &format!("{path}.max_checks_per_call"), max_checks_per_call, 1, MAX_CHECKS_PER_CALL);
    CounterService {
        cluster: raw.cluster,
        authority,
        timeout_ms,
        token,
        hash_key,
        partition,
        breaker,
        max_checks_in_flight,
        max_checks_per_call,
    }
}

/// Why the counter service cannot decide `algorithm`, for one it cannot (`None` for one
/// it can: [`Algorithm::global`]).
const fn why_local(algorithm: Algorithm) -> Option<&'static str> {
    match algorithm {
        Algorithm::Concurrency => Some("requests in flight are counted per proxy, in its shared data"),
        Algorithm::TokenBucket
        | Algorithm::LeakyBucket
        | Algorithm::FixedWindow
        | Algorithm::SlidingWindow
        | Algorithm::SlidingLog => None,
    }
}

/// Why a proxy cannot hold leased shares of `algorithm`, for one it cannot (`None` for
/// one it can: [`Algorithm::leasable`]).
const fn why_not_leased(algorithm: Algorithm) -> Option<&'static str> {
    match algorithm {
        Algorithm::LeakyBucket => Some("its answer is a delay, not a count"),
        Algorithm::Concurrency => Some("it counts requests in flight, not over time"),
        Algorithm::TokenBucket | Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => None,
    }
}

/// The service's form of a policy's limit (`None` while the limit is not valid),
/// validated by the service's own rules; an algorithm the service cannot decide is an
/// issue of `global`.
pub(super) fn validate_global(
    issues: &mut Issues,
    path: &str,
    raw: &RawPolicy,
    global: &RawGlobal,
    limit: Option<&Limit>,
) -> Option<Global> {
    let algorithm = raw.algorithm.0;
    if let Some(why) = why_local(algorithm) {
        issues.add(format!("{path}.global"), format!("is not supported by algorithm \"{algorithm}\": {why}"));
        return None;
    }
    let limit = limit?;
    let strategy = match (global.strategy, &global.lease) {
        (RawStrategy::Check, None) => Strategy::Check,
        (RawStrategy::Check, Some(_)) => {
            issues.add(format!("{path}.global.lease"), "only applies to strategy \"lease\"");
            return None;
        }
        (RawStrategy::Lease, lease) => {
            if let Some(why) = why_not_leased(algorithm) {
                issues.add(
                    format!("{path}.global.strategy"),
                    format!("a {algorithm} cannot be leased ({why}); use \"check\""),
                );
                return None;
            }
            Strategy::Lease(validate_lease(issues, &format!("{path}.global.lease"), lease, limit.capacity())?)
        }
    };
    if raw.shadow {
        issues.add(format!("{path}.shadow"), "is not available for global policies");
        return None;
    }
    let spec = limit_spec(issues, path, raw, limit)?;
    if let Err(error) = spec.validate() {
        let field = match error.field() {
            "limit.amount" | "limit.per_ms" => "rate",
            "limit.burst" => "burst",
            "limit.limit" => "limit",
            "limit.window_ms" => "window",
            "limit.max_queue" => "queue",
            "limit.max_wait_ms" => "max_wait",
            _ => "global",
        };
        let text = error.to_string();
        let reason = text.strip_prefix(&format!("{}: ", error.field())).unwrap_or(&text).to_owned();
        issues.add(format!("{path}.{field}"), format!("the counter service cannot hold this limit: {reason}"));
        return None;
    }
    Some(Global { strategy, spec })
}

/// The limit as the counter service receives it: its numbers as configured (a rate per
/// millisecond, windows and waits in milliseconds), one arm per algorithm.
fn limit_spec(issues: &mut Issues, path: &str, raw: &RawPolicy, limit: &Limit) -> Option<LimitSpec> {
    let rate_ms = raw.rate.map(|r| (r.amount, r.per_secs.saturating_mul(1000)));
    let millis = |spec: Option<DurationSpec>| spec.map(|d| u64::try_from(d.millis).unwrap_or(u64::MAX));
    let spec = match *limit {
        Limit::TokenBucket { burst, .. } => {
            rate_ms.map(|(amount, per_ms)| LimitSpec::TokenBucket { amount, per_ms, burst })
        }
        Limit::LeakyBucket { max_queue, .. } => rate_ms.map(|(amount, per_ms)| LimitSpec::LeakyBucket {
            amount,
            per_ms,
            max_queue,
            max_wait_ms: millis(raw.max_wait).unwrap_or(0),
        }),
        Limit::FixedWindow { limit, .. } => {
            millis(raw.window).map(|window_ms| LimitSpec::FixedWindow { limit, window_ms })
        }
        Limit::SlidingWindow { limit, .. } => {
            millis(raw.window).map(|window_ms| LimitSpec::SlidingWindow { limit, window_ms })
        }
        Limit::SlidingLog { limit, .. } => {
            millis(raw.window).map(|window_ms| LimitSpec::SlidingLog { limit, window_ms })
        }
        Limit::Concurrency { .. } => None,
    };
    if spec.is_none() {
        // A limit built from these fields has them; one that does not is a bug, refused
        // rather than turned into a local policy.
        let algorithm = Algorithm::of(limit);
        issues
            .add(format!("{path}.global"), format!("algorithm \"{algorithm}\" has no form the counter service takes"));
    }
    spec
}

fn validate_lease(issues: &mut Issues, path: &str, raw: &Option<RawLease>, capacity: u64) -> Option<Lease> {
    let default = RawLease::default();
    let raw = raw.as_ref().unwrap_or(&default);
    let before = issues.count();
    let size = raw.size.unwrap_or((capacity / 4).max(1));
    if size == 0 || size > capacity {
        issues.add(
            format!("{path}.size"),
            format!("must be between 1 and the policy's capacity ({capacity}), got {size}"),
        );
    }
    let duration_ms = raw
        .duration
        .and_then(|spec| duration_between(issues, &format!("{path}.duration"), spec, MIN_LEASE, MAX_LEASE))
        .unwrap_or(DEFAULT_LEASE.millis());
    let low_water = raw.low_water.unwrap_or(size / 4);
    if low_water >= size {
        issues.add(format!("{path}.low_water"), format!("must be below size ({size}), got {low_water}"));
    }
    let max_waiting = raw.max_waiting.unwrap_or(DEFAULT_MAX_WAITING);
    between(issues, &format!("{path}.max_waiting"), max_waiting, 1, MAX_MAX_WAITING);
    // The service's bound on a charge's debt, the same rule on both sides.
    let most = sluice_protocol::max_debt_bound(capacity);
    let max_debt = raw.max_debt.unwrap_or(most);
    if max_debt > most {
        issues
            .add(format!("{path}.max_debt"), format!("must be at most the policy's capacity ({most}), got {max_debt}"));
    }
    let cold_below =
        raw.cold_below.unwrap_or_else(|| DEFAULT_COLD_BELOW.min(u32::try_from(capacity).unwrap_or(u32::MAX)));
    if u64::from(cold_below) > capacity {
        issues.add(
            format!("{path}.cold_below"),
            format!("must be at most the policy's capacity ({capacity}), got {cold_below}"),
        );
    }
    (issues.count() == before).then_some(Lease { size, duration_ms, low_water, max_waiting, max_debt, cold_below })
}

/// The emergency cap: a token bucket per caller and proxy.
pub(super) fn validate_emergency(issues: &mut Issues, path: &str, raw: &RawEmergency) -> Option<Limit> {
    let amount = amount(issues, &format!("{path}.rate"), raw.rate.amount)?;
    let burst = amount_or(issues, &format!("{path}.burst"), raw.burst, raw.rate.amount)?;
    let rate = Rate::new(amount, Nanos::from_secs(raw.rate.per_secs))?;
    let refill = u128::from(burst) * u128::from(rate.per().0) / u128::from(rate.amount());
    if refill > u128::from(u64::MAX) {
        issues.add(format!("{path}.burst"), "takes longer than 584 years to refill at this rate");
        return None;
    }
    Limit::token_bucket(rate, burst).ok()
}

fn amount_or(issues: &mut Issues, path: &str, value: Option<u64>, default: u64) -> Option<u64> {
    match value {
        Some(value) => amount(issues, path, value),
        None => Some(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_algorithm_is_refused_global_or_leased_exactly_when_the_one_list_says_it_cannot_be_and_says_why() {
        for algorithm in Algorithm::ALL {
            assert_eq!(why_local(algorithm).is_none(), algorithm.global(), "{algorithm}");
            assert_eq!(why_not_leased(algorithm).is_none(), algorithm.leasable(), "{algorithm}");
        }
    }

    #[test]
    fn a_limit_the_service_has_no_form_for_is_an_issue_of_global_never_a_local_policy() {
        let raw: RawPolicy =
            serde_json::from_str(r#"{"name":"p","key":["path"],"algorithm":"concurrency","limit":2}"#).unwrap();
        let mut issues = Issues::default();

        let spec = limit_spec(&mut issues, "policies[0]", &raw, &Limit::concurrency(2).unwrap());

        assert_eq!(spec, None);
        let issues = issues.into_vec();
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].path, "policies[0].global");
        assert!(issues[0].message.contains("\"concurrency\""), "{}", issues[0].message);
    }
}

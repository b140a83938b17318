//! What a global policy is configured with: the counter service and how to reach it,
//! the secrets it needs, and how a policy consults it (check or lease).

use super::request::KeyPart;
use shared_store::Nanos;
use sluice_protocol::LimitSpec;
use std::fmt;

pub use super::bounds::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, DEFAULT_LEASE, DEFAULT_MAX_CHECKS_IN_FLIGHT,
    DEFAULT_MAX_WAITING, DEFAULT_TIMEOUT, MAX_BREAKER_COOLDOWN, MAX_BREAKER_FAILURES, MAX_CHECKS_PER_CALL, MAX_LEASE,
    MAX_MAX_CHECKS_IN_FLIGHT, MAX_MAX_WAITING, MAX_SECRET_BYTES, MAX_TIMEOUT, MIN_BREAKER_COOLDOWN,
    MIN_BREAKER_FAILURES, MIN_HASH_KEY_BYTES, MIN_LEASE, MIN_TIMEOUT,
};

/// A secret read from the configuration or the VM's environment. Its `Debug` form never
/// shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Written in the configuration.
    Inline(Secret),
    /// An environment variable of the VM, read when the configuration is applied.
    Env(String),
}

/// How the filter reaches the counter service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterService {
    /// The proxy's cluster name.
    pub cluster: String,
    /// `:authority` of the callouts.
    pub authority: String,
    /// Deadline of one callout, in milliseconds (never 0).
    pub timeout_ms: u32,
    /// The bearer token, if the service needs one.
    pub token: Option<SecretSource>,
    /// The key global keys are hashed with.
    pub hash_key: SecretSource,
    /// Key parts naming a check's hash tag.
    pub partition: Vec<KeyPart>,
    /// The circuit breaker.
    pub breaker: Breaker,
    /// Most check calls one worker has out before checks wait to go together (0: each
    /// goes alone, at once).
    pub max_checks_in_flight: u32,
    /// Most checks one call carries.
    pub max_checks_per_call: u32,
}

impl CounterService {
    /// The deadline as a duration.
    pub fn timeout(&self) -> Nanos {
        Nanos::from_millis(u64::from(self.timeout_ms))
    }
}

/// When the circuit opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Consecutive failures that open it.
    pub failures: u32,
    /// How long it stays open before a probe.
    pub cooldown: Nanos,
}

/// How a global policy consults the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Every request waits for the service's decision.
    Check,
    /// The proxy spends leased shares of the budget.
    Lease(Lease),
}

/// The leases of a `lease` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Tokens asked for per grant.
    pub size: u64,
    /// How long a grant may be spent, in milliseconds.
    pub duration_ms: u64,
    /// A refill is requested below this many tokens.
    pub low_water: u64,
    /// Most requests one worker holds waiting for a refill.
    pub max_waiting: u32,
    /// Most units charged afterwards for admissions made under the failure rule.
    pub max_debt: u64,
    /// A key asking for fewer units than this per lease life on this proxy is checked
    /// rather than leased (0: never). A `u32`, as `max_waiting`: it fits in that field's
    /// padding, so no policy grows (as a `u64` it cost a check 4 % more instructions,
    /// docs/benchmarks.md).
    pub cold_below: u32,
}

impl Lease {
    /// The life of a grant.
    pub const fn duration(&self) -> Nanos {
        Nanos::from_millis(self.duration_ms)
    }
}

/// A global policy's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Global {
    /// How it consults the service.
    pub strategy: Strategy,
    /// Its limit as the service receives it.
    pub spec: LimitSpec,
}

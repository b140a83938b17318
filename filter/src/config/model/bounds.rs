//! Every bound and default of the configuration, in one place: validation checks these,
//! its messages print them, the JSON Schema (`config.schema.json`, generated from the
//! parser's types) takes its ranges and defaults from them, and the README's tables are
//! held to the schema by a test. A duration bound is kept as the documentation writes it
//! ([`Written`], `5m`), so its message and its number cannot disagree.

use std::fmt;

/// A duration as the documentation and the messages write it (`10ms`, `2s`, `5m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    amount: u64,
    unit: &'static str,
    per: u64,
}

impl Written {
    /// `amount` milliseconds.
    pub const fn ms(amount: u64) -> Self {
        Self { amount, unit: "ms", per: 1 }
    }

    /// `amount` seconds.
    pub const fn secs(amount: u64) -> Self {
        Self { amount, unit: "s", per: 1000 }
    }

    /// `amount` minutes.
    pub const fn mins(amount: u64) -> Self {
        Self { amount, unit: "m", per: 60_000 }
    }

    /// Its length in milliseconds.
    pub const fn millis(self) -> u64 {
        self.amount.saturating_mul(self.per)
    }
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.amount, self.unit)
    }
}

/// The status of a rejection, and of a failure rule's `deny`: an error status.
pub const MIN_STATUS: u16 = 400;
/// See [`MIN_STATUS`].
pub const MAX_STATUS: u16 = 599;
/// Default rejection status.
pub const DEFAULT_STATUS: u16 = 429;
/// Default status when a policy cannot decide and its failure outcome is `deny`.
pub const DEFAULT_FAILURE_STATUS: u16 = 503;
/// Largest rejection body.
pub const MAX_BODY: usize = 64 * 1024;

/// Default metric name prefix.
pub const DEFAULT_STAT_PREFIX: &str = "sluice";
/// The shortest `metrics_flush`: below it, the tick that flushes costs more than the host
/// calls it saves.
pub const MIN_METRICS_FLUSH: Written = Written::ms(10);
/// The longest `metrics_flush`: statistics may lag by this much.
pub const MAX_METRICS_FLUSH: Written = Written::secs(60);

/// Default bound on requests one worker holds paused.
pub const DEFAULT_MAX_PAUSED: u32 = 1024;
/// Largest bound on requests one worker holds paused.
pub const MAX_MAX_PAUSED: u32 = 1_000_000;
/// Default tick period for releasing paused requests (ms).
pub const DEFAULT_TICK_MS: u32 = 10;
/// Shortest tick period (ms).
pub const MIN_TICK_MS: u32 = 1;
/// Longest tick period (ms): a paused request is released at most this late.
pub const MAX_TICK_MS: u32 = 1000;

/// Default number of slots per policy: about 0.75 MiB of shared data per policy (a slot
/// is a ~90-byte key plus value), enough to track eight thousand concurrently active
/// callers exactly; callers beyond that share the policy's overflow bucket.
pub const DEFAULT_SLOTS: u32 = 8192;
/// Most slots a policy may have (about 90 MiB of shared data).
pub const MAX_SLOTS: u32 = 1 << 20;
/// Largest rate amount, burst, window limit, queue depth or cost a configuration may
/// give. Far above any real limit; it keeps every header value and every product in the
/// arithmetic small, and it is below the largest amount the counter service takes
/// ([`sluice_protocol::MAX_AMOUNT`], 2^40), so every number a global policy is
/// configured with is one the service accepts.
pub const MAX_CONFIGURED_AMOUNT: u64 = 1_000_000_000_000;
const _: () = assert!(MAX_CONFIGURED_AMOUNT <= sluice_protocol::MAX_AMOUNT);
/// Longest shaping delay: a paused request holds a connection and memory in the proxy.
pub const MAX_WAIT: Written = Written::mins(5);
/// Longest quota unit name, in bytes.
pub const MAX_UNIT_BYTES: usize = 32;
/// Default prefix length of a masked IPv4 client address (the address itself).
pub const DEFAULT_IPV4_PREFIX: u8 = 32;
/// Default prefix length of a masked IPv6 client address: one customer usually holds a
/// whole /64.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;
/// Longest IPv4 prefix.
pub const MAX_IPV4_PREFIX: u8 = 32;
/// Longest IPv6 prefix.
pub const MAX_IPV6_PREFIX: u8 = 128;

/// Shortest callout deadline.
pub const MIN_TIMEOUT: Written = Written::ms(1);
/// Longest callout deadline: a request waits at most this long for the service.
pub const MAX_TIMEOUT: Written = Written::secs(10);
/// Default callout deadline.
pub const DEFAULT_TIMEOUT: Written = Written::ms(100);
/// Fewest consecutive failures that open the circuit.
pub const MIN_BREAKER_FAILURES: u32 = 1;
/// Most consecutive failures that open the circuit.
pub const MAX_BREAKER_FAILURES: u32 = 1000;
/// Default consecutive failures that open the circuit.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// Shortest time the circuit stays open.
pub const MIN_BREAKER_COOLDOWN: Written = Written::ms(1);
/// Longest time the circuit stays open.
pub const MAX_BREAKER_COOLDOWN: Written = Written::mins(5);
/// Default time the circuit stays open.
pub const DEFAULT_BREAKER_COOLDOWN: Written = Written::secs(2);
/// Default most check calls one worker has out, late ones not counted, before checks
/// wait to go together (group commit); 0 sends every check alone, at once. One: with a
/// healthy service one call in flight carries every batch (the fewest callouts, and
/// the least proxy CPU per check, docs/benchmarks.md), and a slow call holds nothing
/// back once it is late (`engine::check_group`).
pub const DEFAULT_MAX_CHECKS_IN_FLIGHT: u32 = 1;
/// Largest bound on check calls one worker has out.
pub const MAX_MAX_CHECKS_IN_FLIGHT: u32 = 1024;
/// Default and largest number of checks one call carries: the service's bound.
pub const MAX_CHECKS_PER_CALL: u32 = 64;
const _: () = assert!(MAX_CHECKS_PER_CALL as usize == sluice_protocol::MAX_CHECKS_PER_CALL);
/// Shortest hash key: 128 bits.
pub const MIN_HASH_KEY_BYTES: usize = 16;
/// Longest secret (token or hash key).
pub const MAX_SECRET_BYTES: usize = 4096;

/// Shortest life of a lease.
pub const MIN_LEASE: Written = Written::ms(1);
/// Longest life of a lease: the longest the counter service grants.
pub const MAX_LEASE: Written = Written::mins(5);
const _: () = assert!(MAX_LEASE.millis() == sluice_protocol::MAX_LEASE_TTL_MS);
/// Default life of a lease.
pub const DEFAULT_LEASE: Written = Written::secs(2);
/// Default demand, in units per lease life on one proxy, below which a lease policy's key
/// is cold: checked at the service per request rather than leased (see the filter README,
/// "Lease mode adapts to demand"). Below it, a lease rarely serves more than a request or
/// two before it expires: it costs about a callout per request, as a check does, and
/// strands what is left.
pub const DEFAULT_COLD_BELOW: u32 = 4;
/// Default bound on requests one worker holds waiting for a refill.
pub const DEFAULT_MAX_WAITING: u32 = 64;
/// Largest bound on requests one worker holds waiting for a refill.
pub const MAX_MAX_WAITING: u32 = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_duration_says_what_it_lasts() {
        assert_eq!((MIN_METRICS_FLUSH.to_string(), MIN_METRICS_FLUSH.millis()), ("10ms".to_owned(), 10));
        assert_eq!((MAX_METRICS_FLUSH.to_string(), MAX_METRICS_FLUSH.millis()), ("60s".to_owned(), 60_000));
        assert_eq!((MAX_WAIT.to_string(), MAX_WAIT.millis()), ("5m".to_owned(), 300_000));
    }
}

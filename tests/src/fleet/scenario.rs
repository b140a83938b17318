//! A scenario: everything one seed decides before the run starts. The fleet (proxies ×
//! workers), a random filter configuration drawn from the real schema (local, check and
//! lease policies mixed, several per request, every failure rule, every algorithm each
//! mode allows, costs the response reports), the traffic (hot keys, identity floods,
//! costs, the costs answers report and how), and a timeline of faults, configuration
//! reloads and rolling updates, and operators' overrides.
//!
//! The algorithms come from the one list (`shared_store::Algorithm::ALL`): a policy's
//! mode allows some of them ([`allowed`]), and [`Algorithm::draw`] gives each its numbers
//! by an exhaustive match, so a new algorithm fails to compile here until the
//! simulation covers it.
//!
//! The same seed always gives the same scenario (see `sluice_testkit::rng`).

use super::service::Mode;
use sluice_testkit::rng::Rng;
use std::collections::BTreeMap;
use std::time::Duration;

/// The one list of algorithms.
pub use shared_store::Algorithm as Kinds;

/// The header a policy keys on.
pub const KEY_HEADERS: [&str; 3] = ["x-tenant", "x-user", "x-route"];

/// How a policy keeps its budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// In the proxy's shared data.
    Local,
    /// At the service, asked per request.
    Check,
    /// At the service, leased.
    Lease {
        /// `lease.size`.
        size: u64,
        /// `lease.low_water`.
        low_water: u64,
        /// `lease.duration`, in milliseconds.
        duration_ms: u64,
        /// `lease.max_waiting`.
        max_waiting: u32,
        /// `lease.max_debt`.
        max_debt: u64,
    },
}

/// A policy's algorithm and numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// `rate` per second, bursts of `burst`.
    TokenBucket {
        /// Per second.
        rate: u64,
        /// Capacity.
        burst: u64,
    },
    /// Shaping: requests leave at `rate` per second, `queue` units waiting at most, none
    /// longer than `max_wait_ms`.
    LeakyBucket {
        /// Per second.
        rate: u64,
        /// Units waiting at once.
        queue: u64,
        /// The longest delay, in milliseconds.
        max_wait_ms: u64,
    },
    /// `limit` per `window_ms`.
    FixedWindow {
        /// Per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// `limit` per trailing `window_ms` (weighted).
    SlidingWindow {
        /// Per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// `limit` per trailing `window_ms`, exactly.
    SlidingLog {
        /// Per window (at most 256).
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// `limit` requests in flight at once.
    Concurrency {
        /// Requests in flight.
        limit: u64,
    },
}

/// The algorithms a policy of `kind` may have, from the one list.
pub fn allowed(kind: &Kind) -> Vec<Kinds> {
    Kinds::ALL
        .into_iter()
        .filter(|a| match kind {
            Kind::Local => true,
            Kind::Check => a.global(),
            Kind::Lease { .. } => a.leasable(),
        })
        .collect()
}

impl Algorithm {
    /// Which algorithm of the one list it is.
    pub const fn kind(self) -> Kinds {
        match self {
            Self::TokenBucket { .. } => Kinds::TokenBucket,
            Self::LeakyBucket { .. } => Kinds::LeakyBucket,
            Self::FixedWindow { .. } => Kinds::FixedWindow,
            Self::SlidingWindow { .. } => Kinds::SlidingWindow,
            Self::SlidingLog { .. } => Kinds::SlidingLog,
            Self::Concurrency { .. } => Kinds::Concurrency,
        }
    }

    /// Numbers for an algorithm of the one list. The match is exhaustive: a new algorithm
    /// fails to compile here until the simulation draws it.
    pub fn draw(kind: Kinds, rng: &mut Rng) -> Self {
        match kind {
            Kinds::TokenBucket => {
                let rate = rng.between(5, 200);
                // Sometimes a bucket that takes seconds to refill (longer than a clamp).
                let most = if rng.chance(30) { rate * 5 } else { rate * 2 };
                Self::TokenBucket { rate, burst: rng.between(rate / 4 + 4, most + 8) }
            }
            Kinds::LeakyBucket => {
                let rate = rng.between(20, 400);
                Self::LeakyBucket { rate, queue: rng.between(2, rate / 4 + 4), max_wait_ms: rng.pick(&[10, 50, 200]) }
            }
            // Windows as long as a clamp lasts, too.
            Kinds::FixedWindow => {
                Self::FixedWindow { limit: rng.between(8, 200), window_ms: rng.pick(&[200, 500, 1000, 5000]) }
            }
            Kinds::SlidingWindow => {
                Self::SlidingWindow { limit: rng.between(8, 200), window_ms: rng.pick(&[500, 1000, 5000]) }
            }
            Kinds::SlidingLog => {
                Self::SlidingLog { limit: rng.between(4, 120), window_ms: rng.pick(&[200, 500, 1000, 5000]) }
            }
            Kinds::Concurrency => Self::Concurrency { limit: rng.between(1, 4) },
        }
    }

    /// The most one request may cost.
    pub const fn capacity(self) -> u64 {
        match self {
            Self::TokenBucket { burst, .. } => burst,
            Self::LeakyBucket { queue, .. } => queue,
            Self::FixedWindow { limit, .. }
            | Self::SlidingWindow { limit, .. }
            | Self::SlidingLog { limit, .. }
            | Self::Concurrency { limit } => limit,
        }
    }

    /// The longest a request may be held by it (shaping), in milliseconds.
    pub const fn max_wait_ms(self) -> u64 {
        match self {
            Self::LeakyBucket { max_wait_ms, .. } => max_wait_ms,
            _ => 0,
        }
    }

    /// The same algorithm with its capacity (and rate) scaled by `num / den`, at least
    /// `floor`.
    fn scaled(self, num: u64, den: u64, floor: u64) -> Self {
        let s = |v: u64| (v * num / den).max(floor).max(1);
        match self {
            Self::TokenBucket { rate, burst } => Self::TokenBucket { rate: s(rate), burst: s(burst) },
            Self::LeakyBucket { rate, queue, max_wait_ms } => {
                Self::LeakyBucket { rate: s(rate), queue: s(queue), max_wait_ms }
            }
            Self::FixedWindow { limit, window_ms } => Self::FixedWindow { limit: s(limit), window_ms },
            Self::SlidingWindow { limit, window_ms } => Self::SlidingWindow { limit: s(limit), window_ms },
            Self::SlidingLog { limit, window_ms } => Self::SlidingLog { limit: s(limit).min(256), window_ms },
            Self::Concurrency { limit } => Self::Concurrency { limit: s(limit) },
        }
    }

    /// The tightest of `self` and `other` (the same algorithm and window), number by
    /// number.
    pub fn tightest(self, other: Self) -> Self {
        match (self, other) {
            (Self::TokenBucket { rate, burst }, Self::TokenBucket { rate: r, burst: b }) => {
                Self::TokenBucket { rate: rate.min(r), burst: burst.min(b) }
            }
            (
                Self::LeakyBucket { rate, queue, max_wait_ms },
                Self::LeakyBucket { rate: r, queue: q, max_wait_ms: w },
            ) => Self::LeakyBucket { rate: rate.min(r), queue: queue.min(q), max_wait_ms: max_wait_ms.min(w) },
            (Self::FixedWindow { limit, window_ms }, Self::FixedWindow { limit: l, .. }) => {
                Self::FixedWindow { limit: limit.min(l), window_ms }
            }
            (Self::SlidingWindow { limit, window_ms }, Self::SlidingWindow { limit: l, .. }) => {
                Self::SlidingWindow { limit: limit.min(l), window_ms }
            }
            (Self::SlidingLog { limit, window_ms }, Self::SlidingLog { limit: l, .. }) => {
                Self::SlidingLog { limit: limit.min(l), window_ms }
            }
            (Self::Concurrency { limit }, Self::Concurrency { limit: l }) => Self::Concurrency { limit: limit.min(l) },
            (out, _) => out,
        }
    }

    /// The loosest of `self` and `other` (the same algorithm and window), number by number.
    pub fn loosest(self, other: Self) -> Self {
        match (self, other) {
            (Self::TokenBucket { rate, burst }, Self::TokenBucket { rate: r, burst: b }) => {
                Self::TokenBucket { rate: rate.max(r), burst: burst.max(b) }
            }
            (
                Self::LeakyBucket { rate, queue, max_wait_ms },
                Self::LeakyBucket { rate: r, queue: q, max_wait_ms: w },
            ) => Self::LeakyBucket { rate: rate.max(r), queue: queue.max(q), max_wait_ms: max_wait_ms.max(w) },
            (Self::FixedWindow { limit, window_ms }, Self::FixedWindow { limit: l, .. }) => {
                Self::FixedWindow { limit: limit.max(l), window_ms }
            }
            (Self::SlidingWindow { limit, window_ms }, Self::SlidingWindow { limit: l, .. }) => {
                Self::SlidingWindow { limit: limit.max(l), window_ms }
            }
            (Self::SlidingLog { limit, window_ms }, Self::SlidingLog { limit: l, .. }) => {
                Self::SlidingLog { limit: limit.max(l), window_ms }
            }
            (Self::Concurrency { limit }, Self::Concurrency { limit: l }) => Self::Concurrency { limit: limit.max(l) },
            (out, _) => out,
        }
    }

    /// A clamp under `self` (the tightest numbers a policy takes): lower numbers, by
    /// `1 / div`, never below `floor` (the largest cost a request may spend), and for a
    /// window often a shorter window, as long as it lets no more through per unit of
    /// time (`LimitSpec::admits_at_most`).
    pub fn clamp(self, div: u64, shorter: u64, floor: u64) -> Self {
        let low = |v: u64| (v / div).max(floor).max(1).min(v);
        let window = |limit: u64, window_ms: u64| {
            // limit_c ≤ limit and limit_c / w_c ≤ limit / w.
            let w_c = (window_ms / shorter).max(1);
            let l_c = (limit * w_c / window_ms / div).max(floor).max(1);
            if l_c <= limit && l_c * window_ms <= limit * w_c { (l_c, w_c) } else { (low(limit), window_ms) }
        };
        match self {
            Self::TokenBucket { rate, burst } => Self::TokenBucket { rate: (rate / div).max(1), burst: low(burst) },
            Self::LeakyBucket { rate, queue, max_wait_ms } => {
                Self::LeakyBucket { rate: (rate / div).max(1), queue: low(queue), max_wait_ms: max_wait_ms / div }
            }
            Self::FixedWindow { limit, window_ms } => {
                let (limit, window_ms) = window(limit, window_ms);
                Self::FixedWindow { limit, window_ms }
            }
            Self::SlidingWindow { limit, window_ms } => {
                let (limit, window_ms) = window(limit, window_ms);
                Self::SlidingWindow { limit, window_ms }
            }
            Self::SlidingLog { limit, window_ms } => {
                let (limit, window_ms) = window(limit, window_ms);
                Self::SlidingLog { limit, window_ms }
            }
            Self::Concurrency { limit } => Self::Concurrency { limit: low(limit) },
        }
    }

    /// Its numbers in a filter policy.
    fn write(self, p: &mut serde_json::Value) {
        p["algorithm"] = self.kind().name().into();
        match self {
            Self::TokenBucket { rate, burst } => {
                p["rate"] = format!("{rate}/second").into();
                p["burst"] = burst.into();
            }
            Self::LeakyBucket { rate, queue, max_wait_ms } => {
                p["rate"] = format!("{rate}/second").into();
                p["queue"] = queue.into();
                p["max_wait"] = format!("{max_wait_ms}ms").into();
            }
            Self::FixedWindow { limit, window_ms }
            | Self::SlidingWindow { limit, window_ms }
            | Self::SlidingLog { limit, window_ms } => {
                p["limit"] = limit.into();
                p["window"] = format!("{window_ms}ms").into();
            }
            Self::Concurrency { limit } => p["limit"] = limit.into(),
        }
    }

    /// Its numbers as the counter service takes them (an override's `limit`); `None`
    /// for a concurrency limit, which the service never decides.
    pub fn spec(self) -> Option<serde_json::Value> {
        let name = self.kind().name();
        Some(match self {
            Self::TokenBucket { rate, burst } => {
                serde_json::json!({"algorithm": name, "amount": rate, "per_ms": 1000, "burst": burst})
            }
            Self::LeakyBucket { rate, queue, max_wait_ms } => serde_json::json!({
                "algorithm": name, "amount": rate, "per_ms": 1000, "max_queue": queue, "max_wait_ms": max_wait_ms}),
            Self::FixedWindow { limit, window_ms }
            | Self::SlidingWindow { limit, window_ms }
            | Self::SlidingLog { limit, window_ms } => {
                serde_json::json!({"algorithm": name, "limit": limit, "window_ms": window_ms})
            }
            Self::Concurrency { .. } => return None,
        })
    }
}

/// What a global policy does when it cannot be decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Fail open.
    Allow,
    /// Fail closed.
    Deny,
    /// An emergency cap (per caller and proxy), then `allow` (or `deny`).
    Emergency {
        /// The cap's rate per second.
        rate: u64,
        /// The cap's burst.
        burst: u64,
        /// Whether `allow` follows (else `deny`).
        allow: bool,
    },
}

/// Where a response reports its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageFrom {
    /// Its `x-usage` header.
    Header,
    /// `usage.total_tokens` in its JSON body, or in the last event of an event stream
    /// that carries it.
    Json,
}

/// A cost the response reports (`cost.response_header` or `cost.response_json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Where.
    pub from: UsageFrom,
    /// The most one response is charged.
    pub max: u64,
    /// What a response that reports nothing costs: `None` for the estimate.
    pub on_unknown: Option<u64>,
}

/// One policy of the scenario's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyDef {
    /// Its name.
    pub name: String,
    /// The header its key is.
    pub header: &'static str,
    /// Where its budget lives.
    pub kind: Kind,
    /// Its numbers.
    pub algorithm: Algorithm,
    /// Its failure rule (global policies; local ones deny).
    pub failure: Failure,
    /// The cost: 1, or the `x-cost` header clamped to `1..=max`.
    pub max_cost: u64,
    /// When the response reports the cost: the cost above is the estimate spent at
    /// admission, settled once the response says.
    pub usage: Option<Usage>,
    /// Slots in its tables.
    pub slots: u32,
    /// Only requests under `/a/` match it.
    pub under_a: bool,
    /// Its version.
    pub version: u64,
}

impl PolicyDef {
    /// Whether it is a global policy.
    pub const fn is_global(&self) -> bool {
        !matches!(self.kind, Kind::Local)
    }

    /// The same policy with four times its numbers: a deliberately wrong filter's.
    #[must_use]
    pub fn looser(&self) -> Self {
        let mut out = self.clone();
        out.algorithm = out.algorithm.scaled(4, 1, 0);
        out
    }

    /// The most a response of this policy may be charged: its response cost's `max`, or
    /// its estimate's.
    pub fn usage_max(&self) -> Option<u64> {
        self.usage.map(|u| u.max)
    }

    /// The debt the counter service may hold for one of its callers: a lease's
    /// `max_debt`, or in check mode `min(64 × max, capacity)` for a cost the response
    /// reports (filter/README.md); 0 otherwise. A local bucket owes at most `64 × max`.
    pub fn max_debt(&self) -> u64 {
        match (self.kind, self.usage) {
            (Kind::Lease { max_debt, .. }, _) => max_debt,
            (Kind::Check, Some(usage)) => (64 * usage.max).min(self.algorithm.capacity()),
            (Kind::Local, Some(usage)) => 64 * usage.max,
            (_, None) => 0,
        }
    }

    fn json(&self) -> serde_json::Value {
        let mut p = serde_json::json!({
            "name": self.name,
            "key": [{"header": self.header}],
            "slots": self.slots,
            "version": self.version,
        });
        self.algorithm.write(&mut p);
        let estimate = if self.max_cost > 1 {
            serde_json::json!({"header": "x-cost", "max": self.max_cost})
        } else {
            serde_json::json!(1)
        };
        if let Some(usage) = self.usage {
            let on_unknown = usage.on_unknown.map_or_else(|| serde_json::json!("estimate"), |n| serde_json::json!(n));
            p["cost"] = match usage.from {
                UsageFrom::Header => serde_json::json!({"response_header": "x-usage", "estimate": estimate,
                    "max": usage.max, "on_unknown": on_unknown}),
                UsageFrom::Json => serde_json::json!({"response_json": "usage.total_tokens", "estimate": estimate,
                    "max": usage.max, "on_unknown": on_unknown}),
            };
        } else if self.max_cost > 1 {
            p["cost"] = estimate;
        }
        if self.under_a {
            p["match"] = serde_json::json!({"path_prefix": "/a/"});
        }
        match self.kind {
            Kind::Local => {}
            Kind::Check => p["global"] = serde_json::json!({"strategy": "check"}),
            Kind::Lease { size, low_water, duration_ms, max_waiting, max_debt } => {
                p["global"] = serde_json::json!({"strategy": "lease", "lease": {
                    "size": size, "low_water": low_water, "duration": format!("{duration_ms}ms"),
                    "max_waiting": max_waiting, "max_debt": max_debt}});
            }
        }
        if self.is_global() {
            p["on_failure"] = match self.failure {
                Failure::Allow => serde_json::json!({"action": "allow"}),
                Failure::Deny => serde_json::json!({"action": "deny"}),
                Failure::Emergency { rate, burst, allow } => serde_json::json!({
                    "action": if allow { "allow" } else { "deny" },
                    "emergency": {"rate": format!("{rate}/second"), "burst": burst}}),
            };
        }
        p
    }
}

/// A fault over an interval of virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Start, from the run's start.
    pub from: Duration,
    /// End.
    pub until: Duration,
    /// How the service behaves meanwhile.
    pub mode: Mode,
    /// For one proxy only (a region cut off), or all.
    pub proxy: Option<usize>,
}

/// Something that happens at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The service restarts with nothing kept.
    Restart,
    /// The service's wall clock steps by this many milliseconds.
    ClockStep(i64),
    /// A proxy (or every proxy, one after another: a rolling update) is reconfigured:
    /// policy `policy`'s numbers scaled by `num / den`, its version bumped or not.
    Reload {
        /// One proxy, or all (rolling).
        proxy: Option<usize>,
        /// Which policy.
        policy: usize,
        /// Scale numerator.
        num: u64,
        /// Scale denominator.
        den: u64,
        /// Whether its version is bumped.
        bump: bool,
    },
    /// Clients give up on every request paused on this proxy (streams reset).
    ClientsLeave {
        /// Which proxy.
        proxy: usize,
    },
    /// A rolling update that takes its time: proxy after proxy, `gap_ms` apart, so that
    /// for a while some proxies run the old numbers and some the new ones on one counter.
    Rollout {
        /// Which policy.
        policy: usize,
        /// Scale numerator.
        num: u64,
        /// Scale denominator.
        den: u64,
        /// Whether its version is bumped.
        bump: bool,
        /// Between two proxies.
        gap_ms: u64,
    },
    /// An operator sets an override at the counter service.
    Override(OverrideDef),
}

/// What an operator's override is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideKind {
    /// Lets callers through without spending.
    Bypass,
    /// Lowers the numbers to these.
    Clamp(Algorithm),
}

/// An operator's override: set at the event's time, removed `remove_after_ms` later or
/// expiring after `ttl_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideDef {
    /// Which policy (a global one).
    pub policy: usize,
    /// Bypass or clamp.
    pub kind: OverrideKind,
    /// For one caller (the value of the policy's key header), or the whole policy.
    pub key: Option<String>,
    /// Its life.
    pub ttl_ms: u64,
    /// When the operator removes it, if before it expires.
    pub remove_after_ms: Option<u64>,
}

/// One proxy's reload, as the timeline applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reload {
    /// When, from the run's start.
    pub at: Duration,
    /// Which proxy.
    pub proxy: usize,
    /// Which policy.
    pub policy: usize,
    /// Scale numerator.
    pub num: u64,
    /// Scale denominator.
    pub den: u64,
    /// Whether its version is bumped.
    pub bump: bool,
}

/// Traffic over the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traffic {
    /// Mean time between two requests (fleet-wide).
    pub mean_gap: Duration,
    /// Tenants (`t0` is the hot one).
    pub tenants: u64,
    /// Percent of requests from the hot tenant.
    pub hot_percent: u64,
    /// Intervals during which most requests come from one-off identities.
    pub floods: Vec<(Duration, Duration)>,
    /// Percent of requests under `/a/`.
    pub under_a_percent: u64,
    /// When set, the hot tenant's requests all arrive at one proxy, the next one each
    /// period: a caller that moves between regions, leaving the lease its last proxy
    /// holds to be returned (or to expire) while its new proxy asks for one.
    pub hot_moves_every: Option<Duration>,
    /// When set, requests arrive on this grid of instants: several at once, on several
    /// workers, whose callbacks then race.
    pub grid: Option<Duration>,
}

/// Which kind of scenario a seed makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Everything drawn ([`Scenario::generate`]).
    Generated,
    /// Races on one lease record ([`Scenario::contended`]).
    ContendedLease,
    /// Races on one local bucket ([`Scenario::contended_local`]).
    ContendedLocal,
}

impl Shape {
    /// The value of `SLUICE_FLEET_CONTENDED` that replays it (none for a generated one).
    pub const fn env(self) -> Option<&'static str> {
        match self {
            Self::Generated => None,
            Self::ContendedLease => Some("lease"),
            Self::ContendedLocal => Some("local"),
        }
    }

    /// The shape `SLUICE_FLEET_CONTENDED` names (`1` is `lease`).
    pub fn from_env(value: Option<&str>) -> Self {
        match value {
            None | Some("" | "0") => Self::Generated,
            Some("local") => Self::ContendedLocal,
            Some(_) => Self::ContendedLease,
        }
    }

    /// The scenario of `seed` in this shape.
    pub fn scenario(self, seed: u64) -> Scenario {
        match self {
            Self::Generated => Scenario::generate(seed),
            Self::ContendedLease => Scenario::contended(seed),
            Self::ContendedLocal => Scenario::contended_local(seed),
        }
    }
}

/// A whole scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// Its seed.
    pub seed: u64,
    /// What made it: [`Scenario::generate`] or a contended shape.
    pub shape: Shape,
    /// Proxies.
    pub proxies: usize,
    /// Workers per proxy.
    pub workers: usize,
    /// How long it runs (virtual time), before a quiet, healthy end.
    pub duration: Duration,
    /// The service's round trip when healthy.
    pub rtt: Duration,
    /// The callout deadline.
    pub timeout_ms: u64,
    /// The breaker's cooldown.
    pub cooldown_ms: u64,
    /// Most check calls a worker has out before checks wait to go together (0: each
    /// alone, at once), and most checks in one call.
    pub checks_in_flight: (u64, u64),
    /// The service's sweep interval (`--sweep-interval-ms`): idle keys dropped, expired
    /// overrides claimed.
    pub sweep_ms: u64,
    /// The policies.
    pub policies: Vec<PolicyDef>,
    /// Faults of the service.
    pub faults: Vec<Fault>,
    /// Instant events.
    pub events: Vec<(Duration, Event)>,
    /// The traffic.
    pub traffic: Traffic,
}

fn policy(rng: &mut Rng, index: usize) -> PolicyDef {
    // The mode first, then an algorithm it allows, from the one list.
    let mode = rng.below(3);
    let placeholder = match mode {
        0 => Kind::Local,
        1 => Kind::Check,
        _ => Kind::Lease { size: 1, low_water: 0, duration_ms: 1, max_waiting: 1, max_debt: 0 },
    };
    let algorithm = Algorithm::draw(rng.pick(&allowed(&placeholder)), rng);
    let capacity = algorithm.capacity();
    let kind = match placeholder {
        Kind::Lease { .. } => {
            let size = rng.between(1, (capacity / 3).max(1));
            Kind::Lease {
                size,
                low_water: rng.below(size),
                duration_ms: rng.pick(&[100, 300, 1000, 2000]),
                max_waiting: rng.pick(&[2, 8, 64]) as u32,
                max_debt: rng.between(0, capacity),
            }
        }
        kind => kind,
    };
    let max_cost = match (algorithm, kind) {
        // Each request holds one slot.
        (Algorithm::Concurrency { .. }, _) => 1,
        (_, Kind::Lease { size, .. }) if rng.chance(30) => rng.between(1, size),
        (_, Kind::Lease { .. }) => 1,
        _ if rng.chance(20) => rng.between(1, capacity.min(8)),
        _ => 1,
    };
    let failure = match rng.below(4) {
        0 => Failure::Allow,
        1 => Failure::Deny,
        _ => Failure::Emergency { rate: rng.between(1, 50), burst: rng.between(1, 20), allow: rng.chance(50) },
    };
    PolicyDef {
        name: format!("p{index}"),
        header: KEY_HEADERS[index % KEY_HEADERS.len()],
        kind,
        algorithm,
        failure,
        max_cost,
        usage: None,
        slots: rng.pick(&[1, 2, 4, 64, 1024]),
        under_a: rng.chance(25),
        version: 0,
    }
}

/// The hot caller of a policy keyed on `header` (the one traffic favours).
pub fn hot_value(header: &str) -> &'static str {
    match header {
        "x-tenant" => "t0",
        "x-user" => "u0",
        _ => "r0",
    }
}

/// Check mode batched or not (from a generator of its own: the seeds that ran before it
/// draw the same): `max_checks_in_flight` 0 (unbatched) to 8, and the checks in one call.
fn batching(seed: u64) -> (u64, u64) {
    let mut rng = Rng::new(seed ^ 0xba7c_4ed5);
    (rng.pick(&[0, 1, 2, 4, 8]), rng.pick(&[2, 3, 64]))
}

fn mode(rng: &mut Rng, timeout_ms: u64) -> Mode {
    match rng.below(11) {
        0 => Mode::Slow(Duration::from_millis(timeout_ms / 2 + rng.between(0, timeout_ms))),
        1 => Mode::Refused,
        2 => Mode::Silent,
        3 => Mode::Closed,
        4 => Mode::ResetMidAnswer,
        5 => Mode::Error500,
        6 => Mode::StoreDown,
        7 => Mode::Garbage,
        8 => Mode::WrongToken,
        9 => Mode::AppliedButLost,
        _ => Mode::OneCheckRefused,
    }
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let proxies = rng.between(1, 3) as usize;
        let workers = rng.between(1, 3) as usize;
        let duration = Duration::from_millis(rng.between(1500, 4000));
        let timeout_ms = rng.pick(&[20, 50, 100]);
        let count = rng.between(1, 4) as usize;
        let mut policies = Vec::with_capacity(count);
        for i in 0..count {
            policies.push(policy(&mut rng, i));
        }
        // Policies may settle to the cost the response reports (the algorithms that can
        // give a spend back), drawn apart so the rest of the scenario stays what the
        // seed made before costs were reported.
        let mut costs = Rng::new(seed ^ 0x05a9_e001);
        for p in &mut policies {
            if p.algorithm.kind().creditable() && p.algorithm.kind().chargeable() && costs.chance(40) {
                let max = costs.between(p.max_cost, p.max_cost + p.algorithm.capacity());
                p.usage = Some(Usage {
                    from: if costs.chance(50) { UsageFrom::Header } else { UsageFrom::Json },
                    max,
                    on_unknown: costs.chance(30).then(|| costs.between(1, max)),
                });
            }
        }
        let span = duration.as_millis() as u64;
        let mut faults = Vec::new();
        let mut at = rng.between(100, 600);
        while at < span {
            let length = rng.between(50, 700);
            let proxy = (proxies > 1 && rng.chance(30)).then(|| rng.below(proxies as u64) as usize);
            faults.push(Fault {
                from: Duration::from_millis(at),
                until: Duration::from_millis((at + length).min(span)),
                mode: mode(&mut rng, timeout_ms),
                proxy,
            });
            at += length + rng.between(200, 1200);
        }
        let mut events = Vec::new();
        for _ in 0..rng.below(4) {
            let when = Duration::from_millis(rng.between(0, span));
            let event = match rng.below(4) {
                0 => Event::Restart,
                1 => Event::ClockStep(rng.pick(&[-3000, -500, 500, 3000])),
                2 => Event::ClientsLeave { proxy: rng.below(proxies as u64) as usize },
                _ => {
                    let policy = rng.below(count as u64) as usize;
                    let (num, den) = rng.pick(&[(1, 2), (2, 1), (3, 2)]);
                    let proxy = rng.chance(50).then(|| rng.below(proxies as u64) as usize);
                    Event::Reload { proxy, policy, num, den, bump: rng.chance(30) }
                }
            };
            events.push((when, event));
        }
        let floods = if rng.chance(40) {
            let from = rng.between(0, span / 2);
            vec![(Duration::from_millis(from), Duration::from_millis(from + rng.between(100, 800)))]
        } else {
            Vec::new()
        };
        let traffic = Traffic {
            mean_gap: Duration::from_micros(rng.between(150, 3000)),
            tenants: rng.between(1, 12),
            hot_percent: rng.between(0, 80),
            floods,
            under_a_percent: rng.between(0, 60),
            grid: rng.chance(30).then(|| Duration::from_micros(rng.pick(&[500, 1000, 2000]))),
            // Decided by the seed, not drawn: the seeds that ran before it draw the same.
            hot_moves_every: (seed % 5 == 2 && proxies > 1).then(|| Duration::from_millis(span / 3 + 1)),
        };
        // Rolling updates and operators' overrides, from a generator of their own.
        let mut changes = Rng::new(seed ^ 0x0c4a_9e5e);
        let global: Vec<usize> = (0..count).filter(|i| policies.get(*i).is_some_and(PolicyDef::is_global)).collect();
        // Numbers that change under counters in debt: a rollout of a global policy whose
        // costs the responses report, most often.
        let owing: Vec<usize> =
            global.iter().copied().filter(|i| policies.get(*i).is_some_and(|p| p.usage.is_some())).collect();
        let mut proxies = proxies;
        if changes.chance(50) {
            let when = Duration::from_millis(changes.between(0, span / 2));
            let (num, den) = changes.pick(&[(1, 2), (2, 1), (3, 2), (6, 5)]);
            let policy = if !owing.is_empty() && changes.chance(70) {
                changes.pick(&owing)
            } else {
                changes.below(count as u64) as usize
            };
            let event =
                Event::Rollout { policy, num, den, bump: changes.chance(25), gap_ms: changes.between(300, 1500) };
            events.push((when, event));
            // Old and new numbers side by side need two proxies at least.
            proxies = proxies.max(2);
        }
        let mut overrides = Vec::new();
        if !global.is_empty() {
            let mut taken = Vec::new();
            for _ in 0..changes.below(3) {
                // Each at a millisecond of its own: the service orders overrides set in one
                // millisecond by their random ids.
                let mut ms = changes.between(50, span * 2 / 3);
                while taken.contains(&ms) {
                    ms += 1;
                }
                taken.push(ms);
                let when = Duration::from_millis(ms);
                let policy = changes.pick(&global);
                let clamp = changes.chance(70).then(|| (changes.pick(&[1, 2, 4, 10]), changes.pick(&[1, 1, 2, 5])));
                let keyed = changes.chance(50);
                let ttl_ms = changes.between(1000, 3000);
                let remove_after_ms = changes.chance(50).then(|| changes.between(300, ttl_ms - 1));
                overrides.push((when, policy, clamp, keyed, ttl_ms, remove_after_ms));
            }
        }
        events.sort_by_key(|(when, _)| *when);
        let mut scenario = Self {
            seed,
            shape: Shape::Generated,
            proxies,
            workers,
            duration,
            rtt: Duration::from_micros(rng.between(200, (timeout_ms * 1000 / 8).max(300))),
            timeout_ms,
            cooldown_ms: rng.pick(&[100, 300, 1000]),
            sweep_ms: changes.pick(&[100, 300, 1000]),
            checks_in_flight: batching(seed),
            policies,
            faults,
            events,
            traffic,
        };
        // A clamp lowers the numbers of every form the policy takes (a clamp above the
        // policy's own numbers is not applied, and then bounds nothing).
        let forms = scenario.forms();
        for (when, policy, clamp, keyed, ttl_ms, remove_after_ms) in overrides {
            let Some(def) = scenario.policies.get(policy) else { continue };
            let kind = match clamp {
                None => OverrideKind::Bypass,
                Some((div, shorter)) => {
                    let all = forms.iter().filter(|((name, _), _)| *name == def.name).flat_map(|(_, f)| f.iter());
                    let tightest =
                        all.clone().map(|p| p.algorithm).reduce(Algorithm::tightest).unwrap_or(def.algorithm);
                    let floor = all.map(|p| p.max_cost).max().unwrap_or(1);
                    OverrideKind::Clamp(tightest.clamp(div, shorter, floor))
                }
            };
            let key = keyed.then(|| hot_value(def.header).to_owned());
            let event = Event::Override(OverrideDef { policy, kind, key, ttl_ms, remove_after_ms });
            scenario.events.push((when, event));
        }
        scenario.events.sort_by_key(|(when, _)| *when);
        scenario
    }

    /// A scenario made for races on one lease record: one proxy of three workers, one
    /// lease policy with small grants, a hot key at a high rate, a healthy service.
    pub fn contended(seed: u64) -> Self {
        let mut scenario = Self::generate(seed);
        scenario.shape = Shape::ContendedLease;
        let mut rng = Rng::new(seed ^ 0xc0_47e7_7ed0);
        scenario.proxies = 1;
        scenario.workers = 3;
        scenario.duration = Duration::from_millis(1500);
        let size = rng.between(2, 6);
        scenario.policies = vec![PolicyDef {
            name: "p0".to_owned(),
            header: "x-tenant",
            kind: Kind::Lease { size, low_water: rng.below(size), duration_ms: 1000, max_waiting: 64, max_debt: 0 },
            algorithm: Algorithm::TokenBucket { rate: 200, burst: 200 },
            failure: Failure::Deny,
            max_cost: 1,
            usage: None,
            slots: 64,
            under_a: false,
            version: 0,
        }];
        scenario.contend();
        scenario
    }

    /// A scenario made for races on one local bucket: one proxy of three workers, one
    /// local policy (an algorithm that counts over time, or requests in flight), a hot
    /// key at a high rate.
    pub fn contended_local(seed: u64) -> Self {
        let mut scenario = Self::generate(seed);
        scenario.shape = Shape::ContendedLocal;
        let mut rng = Rng::new(seed ^ 0x10ca_1c0e);
        scenario.proxies = 1;
        scenario.workers = 3;
        scenario.duration = Duration::from_millis(1500);
        let algorithm = match rng.below(5) {
            0 => Algorithm::TokenBucket { rate: 100, burst: 20 },
            1 => Algorithm::FixedWindow { limit: 40, window_ms: 200 },
            2 => Algorithm::SlidingWindow { limit: 40, window_ms: 500 },
            3 => Algorithm::SlidingLog { limit: 40, window_ms: 500 },
            _ => Algorithm::Concurrency { limit: 2 },
        };
        scenario.policies = vec![PolicyDef {
            name: "p0".to_owned(),
            header: "x-tenant",
            kind: Kind::Local,
            algorithm,
            failure: Failure::Deny,
            max_cost: 1,
            usage: None,
            slots: 64,
            under_a: false,
            version: 0,
        }];
        scenario.contend();
        scenario
    }

    /// No faults, no events, a hot key on a grid of instants.
    fn contend(&mut self) {
        self.faults.clear();
        self.events.clear();
        self.traffic = Traffic {
            mean_gap: Duration::from_micros(100),
            tenants: 2,
            hot_percent: 90,
            floods: Vec::new(),
            under_a_percent: 0,
            grid: Some(Duration::from_millis(1)),
            hot_moves_every: None,
        };
    }

    /// The filter configuration of `policies` (the scenario's, or as a reload left them).
    pub fn filter_config(&self, policies: &[PolicyDef]) -> String {
        let config = serde_json::json!({
            "counter_service": {
                "cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "token_env": "SLUICE_COUNTER_TOKEN",
                "timeout": format!("{}ms", self.timeout_ms),
                "circuit_breaker": {"failures": 3, "cooldown": format!("{}ms", self.cooldown_ms)},
                "max_checks_in_flight": self.checks_in_flight.0,
                "max_checks_per_call": self.checks_in_flight.1,
            },
            "policies": policies.iter().map(PolicyDef::json).collect::<Vec<_>>(),
            "response": {"fallback_header": "x-sluice-fallback", "override_header": "x-sluice-override"},
        });
        config.to_string()
    }

    /// `policies` after a reload that scales policy `index` by `num / den`.
    pub fn reloaded(policies: &[PolicyDef], index: usize, num: u64, den: u64, bump: bool) -> Vec<PolicyDef> {
        let mut out = policies.to_vec();
        if let Some(p) = out.get_mut(index) {
            // A lease keeps its size and its largest cost within the new capacity.
            let floor = match p.kind {
                Kind::Lease { size, max_debt, .. } => size.max(max_debt).max(p.max_cost),
                _ => p.max_cost,
            };
            p.algorithm = p.algorithm.scaled(num, den, floor);
            if bump {
                p.version += 1;
            }
        }
        out
    }

    /// Every reload of one proxy, in the order the timeline applies them: a reload of
    /// every proxy is a rolling update 50 ms apart, a [`Event::Rollout`] one `gap_ms`
    /// apart.
    pub fn reloads(&self) -> Vec<Reload> {
        let mut out = Vec::new();
        for (when, event) in &self.events {
            let (proxies, gap, policy, num, den, bump) = match *event {
                Event::Reload { proxy: Some(p), policy, num, den, bump } => (p..p + 1, 0, policy, num, den, bump),
                Event::Reload { proxy: None, policy, num, den, bump } => (0..self.proxies, 50, policy, num, den, bump),
                Event::Rollout { policy, num, den, bump, gap_ms } => (0..self.proxies, gap_ms, policy, num, den, bump),
                _ => continue,
            };
            for (i, proxy) in proxies.enumerate() {
                let at = *when + Duration::from_millis(gap * i as u64);
                out.push(Reload { at, proxy, policy, num, den, bump });
            }
        }
        out.sort_by_key(|r| r.at);
        out
    }

    /// Every form each policy (name and version) takes in the run, on any proxy.
    pub fn forms(&self) -> BTreeMap<(String, u64), Vec<PolicyDef>> {
        let mut forms: BTreeMap<(String, u64), Vec<PolicyDef>> = BTreeMap::new();
        let mut add = |policies: &[PolicyDef]| {
            for p in policies {
                let entry = forms.entry((p.name.clone(), p.version)).or_default();
                if !entry.contains(p) {
                    entry.push(p.clone());
                }
            }
        };
        add(&self.policies);
        let mut per_proxy = vec![self.policies.clone(); self.proxies];
        for reload in self.reloads() {
            if let Some(current) = per_proxy.get_mut(reload.proxy) {
                *current = Self::reloaded(current, reload.policy, reload.num, reload.den, reload.bump);
                add(current);
            }
        }
        forms
    }

    /// The longest a request may stay paused: two refill windows (the one it waits for,
    /// and one it elects itself), the callout deadline, and ticks, with room to spare;
    /// and the longest a shaping policy (local, or at the service) may delay it.
    pub fn max_pause(&self) -> Duration {
        let window = Duration::from_millis(self.timeout_ms + 100);
        let shaping = self.forms().values().flatten().map(|p| p.algorithm.max_wait_ms()).max().unwrap_or(0);
        2 * window + Duration::from_millis(self.timeout_ms) + Duration::from_millis(60 + 2 * shaping)
    }
}

//! A scenario: everything one seed decides before the run starts. The fleet (proxies ×
//! workers), a random filter configuration drawn from the real schema (local, check and
//! lease policies mixed, several per request, every failure rule), the traffic (hot
//! keys, identity floods, costs), and a timeline of faults and configuration reloads.
//!
//! The same seed always gives the same scenario (see `sluice_testkit::rng`).

use super::service::Mode;
use sluice_testkit::rng::Rng;
use std::time::Duration;

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
    /// `limit` per `window_ms`.
    FixedWindow {
        /// Per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// `limit` per trailing `window_ms`.
    SlidingWindow {
        /// Per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
}

impl Algorithm {
    /// The most one request may cost.
    pub const fn capacity(self) -> u64 {
        match self {
            Self::TokenBucket { burst, .. } => burst,
            Self::FixedWindow { limit, .. } | Self::SlidingWindow { limit, .. } => limit,
        }
    }

    /// The same algorithm with its capacity (and rate) scaled by `num / den`, at least
    /// `floor`.
    fn scaled(self, num: u64, den: u64, floor: u64) -> Self {
        let s = |v: u64| (v * num / den).max(floor).max(1);
        match self {
            Self::TokenBucket { rate, burst } => Self::TokenBucket { rate: s(rate), burst: s(burst) },
            Self::FixedWindow { limit, window_ms } => Self::FixedWindow { limit: s(limit), window_ms },
            Self::SlidingWindow { limit, window_ms } => Self::SlidingWindow { limit: s(limit), window_ms },
        }
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
    /// When the response reports the cost (its `x-usage` header, clamped to this max):
    /// the cost above is the estimate spent at admission, settled once the response says.
    pub usage_max: Option<u64>,
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

    fn json(&self) -> serde_json::Value {
        let mut p = serde_json::json!({
            "name": self.name,
            "key": [{"header": self.header}],
            "slots": self.slots,
            "version": self.version,
        });
        match self.algorithm {
            Algorithm::TokenBucket { rate, burst } => {
                p["rate"] = format!("{rate}/second").into();
                p["burst"] = burst.into();
            }
            Algorithm::FixedWindow { limit, window_ms } => {
                p["algorithm"] = "fixed_window".into();
                p["limit"] = limit.into();
                p["window"] = format!("{window_ms}ms").into();
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                p["algorithm"] = "sliding_window".into();
                p["limit"] = limit.into();
                p["window"] = format!("{window_ms}ms").into();
            }
        }
        let estimate = if self.max_cost > 1 {
            serde_json::json!({"header": "x-cost", "max": self.max_cost})
        } else {
            serde_json::json!(1)
        };
        if let Some(max) = self.usage_max {
            p["cost"] = serde_json::json!({"response_header": "x-usage", "estimate": estimate, "max": max});
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
    /// When set, requests arrive on this grid of instants: several at once, on several
    /// workers, whose callbacks then race.
    pub grid: Option<Duration>,
}

/// A whole scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// Its seed.
    pub seed: u64,
    /// Made for races on one lease record ([`Scenario::contended`]).
    pub contended: bool,
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
    /// The policies.
    pub policies: Vec<PolicyDef>,
    /// Faults of the service.
    pub faults: Vec<Fault>,
    /// Instant events.
    pub events: Vec<(Duration, Event)>,
    /// The traffic.
    pub traffic: Traffic,
}

fn algorithm(rng: &mut Rng) -> Algorithm {
    match rng.below(4) {
        0 | 1 => {
            let rate = rng.between(5, 200);
            Algorithm::TokenBucket { rate, burst: rng.between(rate / 4 + 4, rate * 2 + 8) }
        }
        2 => Algorithm::FixedWindow { limit: rng.between(8, 200), window_ms: rng.pick(&[200, 500, 1000]) },
        _ => Algorithm::SlidingWindow { limit: rng.between(8, 200), window_ms: rng.pick(&[500, 1000]) },
    }
}

fn policy(rng: &mut Rng, index: usize, any_global: bool) -> PolicyDef {
    let algorithm = algorithm(rng);
    let capacity = algorithm.capacity();
    let kind = match rng.below(if any_global { 3 } else { 2 }) {
        0 => Kind::Local,
        1 if any_global => Kind::Check,
        _ => {
            let size = rng.between(1, (capacity / 3).max(1));
            Kind::Lease {
                size,
                low_water: rng.below(size),
                duration_ms: rng.pick(&[100, 300, 1000, 2000]),
                max_waiting: rng.pick(&[2, 8, 64]) as u32,
                max_debt: rng.between(0, capacity),
            }
        }
    };
    let kind = if !any_global && kind != Kind::Local { Kind::Check } else { kind };
    let max_cost = match kind {
        Kind::Lease { size, .. } if rng.chance(30) => rng.between(1, size),
        Kind::Lease { .. } => 1,
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
        usage_max: None,
        slots: rng.pick(&[1, 2, 4, 64, 1024]),
        under_a: rng.chance(25),
        version: 0,
    }
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
        _ => Mode::Refused,
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
            policies.push(policy(&mut rng, i, true));
        }
        // Policies may settle to the cost the response reports, drawn apart so the rest
        // of the scenario stays what the seed made before costs were reported.
        let mut costs = Rng::new(seed ^ 0x05a9_e001);
        for p in &mut policies {
            if costs.chance(35) {
                p.usage_max = Some(costs.between(p.max_cost, p.max_cost * 3 + 4));
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
        events.sort_by_key(|(when, _)| *when);
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
        };
        Self {
            seed,
            contended: false,
            proxies,
            workers,
            duration,
            rtt: Duration::from_micros(rng.between(200, (timeout_ms * 1000 / 8).max(300))),
            timeout_ms,
            cooldown_ms: rng.pick(&[100, 300, 1000]),
            policies,
            faults,
            events,
            traffic,
        }
    }

    /// A scenario made for races on one lease record: one proxy of three workers, one
    /// lease policy with small grants, a hot key at a high rate, a healthy service.
    pub fn contended(seed: u64) -> Self {
        let mut scenario = Self::generate(seed);
        scenario.contended = true;
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
            usage_max: None,
            slots: 64,
            under_a: false,
            version: 0,
        }];
        scenario.faults.clear();
        scenario.events.clear();
        scenario.traffic = Traffic {
            mean_gap: Duration::from_micros(100),
            tenants: 2,
            hot_percent: 90,
            floods: Vec::new(),
            under_a_percent: 0,
            grid: Some(Duration::from_millis(1)),
        };
        scenario
    }

    /// The filter configuration of `policies` (the scenario's, or as a reload left them).
    pub fn filter_config(&self, policies: &[PolicyDef]) -> String {
        let config = serde_json::json!({
            "counter_service": {
                "cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "token_env": "SLUICE_COUNTER_TOKEN",
                "timeout": format!("{}ms", self.timeout_ms),
                "circuit_breaker": {"failures": 3, "cooldown": format!("{}ms", self.cooldown_ms)},
            },
            "policies": policies.iter().map(PolicyDef::json).collect::<Vec<_>>(),
            "response": {"fallback_header": "x-sluice-fallback"},
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

    /// The longest a request may stay paused: two refill windows (the one it waits for,
    /// and one it elects itself), the callout deadline, and ticks, with room to spare.
    pub fn max_pause(&self) -> Duration {
        let window = Duration::from_millis(self.timeout_ms + 100);
        2 * window + Duration::from_millis(self.timeout_ms) + Duration::from_millis(60)
    }
}

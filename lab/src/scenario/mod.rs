//! A scenario: the fleet, its callers and the faults on a timeline, in virtual time.
//!
//! Parsed strictly ([`Scenario::parse`]): an unknown field, a wrong type, a number out of
//! range or a name that refers to nothing is an error naming the line, the column and the
//! field (`callers[1].rate[0].rps`). `sluice-lab run --help` documents every field; the
//! shipped scenarios in `lab/scenarios/` are examples of each.

mod locate;
mod parse;

pub use parse::ScenarioError;

use crate::duration::{Span, Step};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Most proxies a fleet may have (each is a wasm-host with its own VMs).
pub const MAX_PROXIES: usize = 64;
/// Most workers per proxy.
pub const MAX_WORKERS: usize = 16;
/// Longest scenario, in virtual time.
pub const MAX_DURATION_SECS: u64 = 24 * 3600;
/// Fewest seconds in a report interval's denominator: at most this many intervals.
pub const MAX_INTERVALS: u64 = 2000;
/// Highest rate of one caller class, requests per second.
pub const MAX_RPS: f64 = 100_000.0;
/// Most distinct keys a class draws from.
pub const MAX_KEYS: u64 = 10_000_000;

/// A whole scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A title for the report.
    pub name: String,
    /// What the scenario shows, in a sentence or two (shown under the title).
    #[serde(default)]
    pub description: String,
    /// Everything random (arrivals, keys, jitter, worker choice) comes from it: the same
    /// seed gives the same report, byte for byte.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// How long the traffic runs, in virtual time.
    pub duration: Span,
    /// The report's resolution: one row per interval.
    #[serde(default = "default_interval")]
    pub interval: Span,
    /// The proxies and the network.
    pub fleet: Fleet,
    /// Who sends requests.
    pub callers: Vec<Caller>,
    /// What goes wrong, and when.
    #[serde(default)]
    pub faults: Vec<Fault>,
}

const fn default_seed() -> u64 {
    1
}

const fn default_interval() -> Span {
    Span(std::time::Duration::from_secs(1))
}

/// The proxies, grouped by region, and the latencies around them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// Regions and their proxies (at least one region).
    pub regions: Vec<Region>,
    /// Envoy worker threads per proxy (each its own wasm VM; they share the proxy's
    /// shared data).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Round trip to the counter service when it is healthy.
    #[serde(default = "default_service_latency")]
    pub service_latency: Span,
    /// How long the upstream takes to answer a forwarded request.
    #[serde(default = "default_upstream_latency")]
    pub upstream_latency: Span,
}

const fn default_workers() -> usize {
    2
}

const fn default_service_latency() -> Span {
    Span(std::time::Duration::from_millis(2))
}

const fn default_upstream_latency() -> Span {
    Span(std::time::Duration::from_millis(20))
}

/// A region: a name and how many proxies it runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// Its name (faults and callers refer to it).
    pub name: String,
    /// Proxies in it.
    pub proxies: usize,
}

/// A class of callers: what they send, how often, under which identities, and what they
/// do when refused.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caller {
    /// The class's name in the report (say `app`, `crawler`, `retrying-clients`).
    pub name: String,
    /// Whether this class is legitimate traffic (the verdict asks whether it kept
    /// working); abuse is `false`.
    #[serde(default = "yes")]
    pub legitimate: bool,
    /// Request method.
    #[serde(default = "default_method")]
    pub method: String,
    /// Request path (with a query string if a policy keys on one).
    #[serde(default = "default_path")]
    pub path: String,
    /// Request headers. `{key}` in a value becomes the caller's identity (see `keys`),
    /// `{region}` the region's name.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The regions whose proxies it reaches (all when empty); requests are spread evenly
    /// over those proxies and their workers.
    #[serde(default)]
    pub regions: Vec<String>,
    /// Its identities.
    #[serde(default)]
    pub keys: Keys,
    /// Its rate over time: from each point's `at`, `rps` requests per second (reached
    /// linearly over `ramp` if given). Before the first point the class is silent.
    pub rate: Vec<RatePoint>,
    /// How arrivals are spaced.
    #[serde(default)]
    pub arrivals: Spacing,
    /// What the upstream reports as the request's usage (header `x-usage` on the
    /// response, for policies whose cost comes from the response).
    #[serde(default)]
    pub usage: Option<u64>,
    /// What a refused caller does (no retries when absent).
    #[serde(default)]
    pub retry: Option<Retry>,
}

const fn yes() -> bool {
    true
}

fn default_method() -> String {
    "GET".to_owned()
}

fn default_path() -> String {
    "/".to_owned()
}

/// Identities a class draws from.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keys {
    /// How many distinct identities (`{key}` is `<class>-<n>`).
    #[serde(default = "one")]
    pub count: u64,
    /// Share of requests (0 to 1) from identity 0, the hot key; the rest uniform.
    #[serde(default)]
    pub hot_share: f64,
    /// A new identity for every request (an identity flood); `count` is ignored.
    #[serde(default)]
    pub rotating: bool,
}

impl Default for Keys {
    fn default() -> Self {
        Self { count: 1, hot_share: 0.0, rotating: false }
    }
}

const fn one() -> u64 {
    1
}

/// A point of a class's rate curve.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatePoint {
    /// From when.
    pub at: Span,
    /// Requests per second.
    pub rps: f64,
    /// Reached linearly from the previous rate over this long (at once when absent).
    #[serde(default)]
    pub ramp: Option<Span>,
}

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Spacing {
    /// Random (a Poisson process): what independent callers make.
    #[default]
    Poisson,
    /// Evenly spaced: a scheduler, a load generator; and a closed form to check.
    Even,
}

/// What a refused caller does: sends the request again (a new offered request: the
/// limiter cannot tell).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Most retries of one call.
    pub attempts: u32,
    /// Wait before the first retry; doubled for each next one.
    pub backoff: Span,
    /// Spread retries at random over [0, wait] ("full jitter"); without it, every caller
    /// refused together comes back together.
    #[serde(default)]
    pub jitter: bool,
    /// Wait `Retry-After` when the refusal gives one (and it is longer than the backoff).
    #[serde(default)]
    pub honor_retry_after: bool,
}

/// A fault or event on the timeline.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// The counter service answers after `latency` (past the filter's deadline, a
    /// timeout).
    Slow {
        /// From when.
        at: Span,
        /// For how long.
        #[serde(rename = "for")]
        lasts: Span,
        /// Its round trip meanwhile.
        latency: Span,
        /// Only for this region's proxies.
        #[serde(default)]
        region: Option<String>,
    },
    /// Nothing listens: connections are refused.
    Down {
        /// From when.
        at: Span,
        /// For how long.
        #[serde(rename = "for")]
        lasts: Span,
        /// Only for this region's proxies.
        #[serde(default)]
        region: Option<String>,
    },
    /// It answers 500.
    Errors {
        /// From when.
        at: Span,
        /// For how long.
        #[serde(rename = "for")]
        lasts: Span,
        /// Only for this region's proxies.
        #[serde(default)]
        region: Option<String>,
    },
    /// A region is cut off: its calls to the service are never answered.
    Partition {
        /// From when.
        at: Span,
        /// For how long.
        #[serde(rename = "for")]
        lasts: Span,
        /// The region cut off.
        region: String,
    },
    /// The service restarts and its memory store loses every counter.
    Restart {
        /// When.
        at: Span,
    },
    /// The service's wall clock steps (windows align to it; negative: backwards).
    ClockStep {
        /// When.
        at: Span,
        /// By how much (`"-2s"`).
        by: Step,
    },
    /// Every proxy loads another filter configuration (a JSON file, relative to the
    /// scenario), as a control-plane push would.
    Config {
        /// When.
        at: Span,
        /// The configuration.
        file: PathBuf,
    },
}

impl Fault {
    /// When it starts.
    pub const fn at(&self) -> Span {
        match self {
            Self::Slow { at, .. }
            | Self::Down { at, .. }
            | Self::Errors { at, .. }
            | Self::Partition { at, .. }
            | Self::Restart { at }
            | Self::ClockStep { at, .. }
            | Self::Config { at, .. } => *at,
        }
    }

    /// A few words for the report's timeline.
    pub fn describe(&self) -> String {
        let scope = |region: &Option<String>| region.as_ref().map_or(String::new(), |r| format!(" for {r}"));
        match self {
            Self::Slow { lasts, latency, region, .. } => {
                format!("service slow ({:?}){} for {:?}", latency.0, scope(region), lasts.0)
            }
            Self::Down { lasts, region, .. } => format!("service down{} for {:?}", scope(region), lasts.0),
            Self::Errors { lasts, region, .. } => format!("service answers 500{} for {:?}", scope(region), lasts.0),
            Self::Partition { lasts, region, .. } => format!("{region} partitioned from the service for {:?}", lasts.0),
            Self::Restart { .. } => "service restarted, counters lost".to_owned(),
            Self::ClockStep { by, .. } => format!("service clock stepped by {} ms", by.0 / 1_000_000),
            Self::Config { file, .. } => format!("configuration changed to {}", file.display()),
        }
    }
}

impl Scenario {
    /// Proxies in the whole fleet.
    pub fn proxies(&self) -> usize {
        self.fleet.regions.iter().map(|r| r.proxies).sum()
    }

    /// The region of each proxy, in proxy order.
    pub fn proxy_regions(&self) -> Vec<&str> {
        self.fleet.regions.iter().flat_map(|r| std::iter::repeat_n(r.name.as_str(), r.proxies)).collect()
    }

    /// The proxies of region `name`.
    pub fn proxies_of(&self, name: &str) -> Vec<usize> {
        self.proxy_regions().iter().enumerate().filter(|(_, r)| **r == name).map(|(p, _)| p).collect()
    }
}

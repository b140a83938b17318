//! Callers → arrivals: each class's rate curve played as a Poisson process (thinned from
//! its peak rate) or evenly spaced, identities drawn from its key distribution, and
//! retries of refused calls scheduled by its retry policy. Everything comes from the
//! scenario's seed.

use crate::scenario::{Caller, Keys, RatePoint, Scenario, Spacing};
use sluice_testkit::rng::Rng;

/// One request to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// When, in ns from the start.
    pub at: u64,
    /// The caller class (its index in the scenario).
    pub class: usize,
    /// The identity within the class.
    pub key: u64,
    /// 0 for a first attempt, then 1, 2, … for retries.
    pub attempt: u32,
    /// The logical call it belongs to (retries share it).
    pub call: u64,
    /// Which proxy of the class's regions, and which worker (drawn at first arrival and
    /// kept by retries, as a client's connection would).
    pub proxy: usize,
    /// The worker.
    pub worker: usize,
    /// The access-log entry it replays (its index), if any.
    pub entry: Option<usize>,
}

/// A caller class's arrivals.
#[derive(Debug)]
struct Class {
    points: Vec<RatePoint>,
    spacing: Spacing,
    keys: Keys,
    proxies: Vec<usize>,
    peak: f64,
    next: Option<u64>,
    rng: Rng,
    serial: u64,
}

/// The rate of a curve at `t` seconds.
pub fn rate_at(points: &[RatePoint], t: f64) -> f64 {
    let mut rate = 0.0;
    let mut before = 0.0;
    for point in points {
        let at = point.at.secs();
        if t < at {
            break;
        }
        let ramp = point.ramp.map_or(0.0, |r| r.secs());
        rate = if ramp > 0.0 && t < at + ramp { before + (point.rps - before) * (t - at) / ramp } else { point.rps };
        before = point.rps;
    }
    rate
}

fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Class {
    fn new(caller: &Caller, proxies: Vec<usize>, rng: Rng) -> Self {
        let peak = caller.rate.iter().map(|p| p.rps).fold(0.0, f64::max);
        let mut class = Self {
            points: caller.rate.clone(),
            spacing: caller.arrivals,
            keys: caller.keys.clone(),
            proxies,
            peak,
            next: None,
            rng,
            serial: 0,
        };
        class.next = class.after(0);
        class
    }

    /// The first arrival at or after `from` ns (`None`: the class is silent from there).
    fn after(&mut self, from: u64) -> Option<u64> {
        if self.peak <= 0.0 {
            return None;
        }
        let mut t = from as f64 / 1e9;
        let last_change =
            self.points.iter().map(|p| p.at.secs() + p.ramp.map_or(0.0, |r| r.secs())).fold(0.0, f64::max);
        loop {
            let rate = rate_at(&self.points, t);
            match self.spacing {
                Spacing::Even => {
                    if rate > 0.0 {
                        return Some((t * 1e9).round() as u64);
                    }
                    // Silent here: to the next point that speaks.
                    t = self.points.iter().map(|p| p.at.secs()).find(|at| *at > t)?;
                }
                Spacing::Poisson => {
                    let gap = -uniform(&mut self.rng).max(f64::MIN_POSITIVE).ln() / self.peak;
                    t += gap;
                    if t > last_change && rate_at(&self.points, t) <= 0.0 {
                        return None;
                    }
                    if uniform(&mut self.rng) * self.peak < rate_at(&self.points, t) {
                        return Some((t * 1e9).round() as u64);
                    }
                }
            }
        }
    }

    /// The gap after an evenly spaced arrival at `at`.
    fn even_gap(&self, at: u64) -> u64 {
        let rate = rate_at(&self.points, at as f64 / 1e9);
        if rate <= 0.0 { 1 } else { (1e9 / rate).round().max(1.0) as u64 }
    }

    fn key(&mut self) -> u64 {
        if self.keys.rotating {
            self.serial += 1;
            return self.serial;
        }
        if self.keys.hot_share > 0.0 && uniform(&mut self.rng) < self.keys.hot_share {
            return 0;
        }
        self.rng.below(self.keys.count)
    }
}

/// Every class's first attempts, in time order (a refused call's retries are its
/// proxy's: see [`retry`]).
#[derive(Debug)]
pub struct Traffic {
    classes: Vec<Class>,
    workers: usize,
    replayed: std::collections::VecDeque<Arrival>,
    calls: u64,
    rng: Rng,
}

impl Traffic {
    /// The traffic of `scenario`, from its seed.
    pub fn new(scenario: &Scenario) -> Self {
        let mut rng = Rng::new(scenario.seed ^ 0x1ab0_7a3f_f1c0_0000);
        let regions = scenario.proxy_regions();
        let classes = scenario
            .callers
            .iter()
            .map(|caller| {
                let proxies = (0..regions.len())
                    .filter(|p| caller.regions.is_empty() || caller.regions.iter().any(|r| r == regions[*p]))
                    .collect();
                Class::new(caller, proxies, rng.fork())
            })
            .collect();
        let replayed = std::collections::VecDeque::new();
        Self { classes, workers: scenario.fleet.workers, replayed, calls: 0, rng }
    }

    /// Adds requests replayed from a log, as class `class`: each at its time (ns from the
    /// start, in order), on a proxy drawn from `proxies`.
    pub fn replay(&mut self, times: &[u64], class: usize, proxies: usize) {
        for (entry, at) in times.iter().enumerate() {
            self.calls += 1;
            let proxy = self.rng.below(proxies.max(1) as u64) as usize;
            let worker = self.rng.below(self.workers as u64) as usize;
            let arrival =
                Arrival { at: *at, class, key: 0, attempt: 0, call: self.calls, proxy, worker, entry: Some(entry) };
            self.replayed.push_back(arrival);
        }
    }

    /// When the next request is due.
    pub fn next(&self) -> Option<u64> {
        let first = self.classes.iter().filter_map(|c| c.next).min();
        let replayed = self.replayed.front().map(|a| a.at);
        first.into_iter().chain(replayed).min()
    }

    /// Every request due at or before `t` (ns), in time order, class order at a tie.
    pub fn due(&mut self, t: u64) -> Vec<Arrival> {
        let mut out = Vec::new();
        for (class, c) in self.classes.iter_mut().enumerate() {
            while let Some(at) = c.next.filter(|at| *at <= t) {
                self.calls += 1;
                let key = c.key();
                let proxy = c.proxies.get(self.rng.below(c.proxies.len() as u64) as usize).copied().unwrap_or(0);
                let worker = self.rng.below(self.workers as u64) as usize;
                out.push(Arrival { at, class, key, attempt: 0, call: self.calls, proxy, worker, entry: None });
                c.next = match c.spacing {
                    Spacing::Even => c.after(at + c.even_gap(at)),
                    Spacing::Poisson => c.after(at),
                };
            }
        }
        while let Some(arrival) = self.replayed.pop_front_if(|a| a.at <= t) {
            out.push(arrival);
        }
        out.sort_by_key(|a| (a.at, a.class, a.call));
        out
    }
}

/// The retry of `arrival`, refused at `now` ns, if its caller retries it: its backoff
/// after the refusal (doubling with each attempt), with the caller's jitter, and no
/// sooner than the refusal's `Retry-After` (seconds) if the caller honours it. The
/// retry keeps the call's proxy and worker, as a client's connection would.
///
/// The jitter is drawn from a hash of the scenario's seed, the call and the attempt, not
/// from a stream: so a retry does not depend on what other proxies did meanwhile, and
/// each proxy can schedule its own.
pub fn retry(caller: &Caller, arrival: &Arrival, now: u64, retry_after: Option<u64>, seed: u64) -> Option<Arrival> {
    let retry = caller.retry.filter(|r| arrival.attempt < r.attempts)?;
    let mut wait = retry.backoff.nanos().saturating_mul(1 << arrival.attempt.min(20));
    if retry.jitter {
        let draw = splitmix(seed ^ splitmix(arrival.call ^ (u64::from(arrival.attempt) << 48)));
        wait = ((draw >> 11) as f64 / (1u64 << 53) as f64 * wait as f64) as u64;
    }
    if retry.honor_retry_after
        && let Some(seconds) = retry_after
    {
        wait = wait.max(seconds.saturating_mul(1_000_000_000));
    }
    Some(Arrival { at: now.saturating_add(wait.max(1)), attempt: arrival.attempt + 1, ..arrival.clone() })
}

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
const fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::Span;
    use std::time::Duration;

    fn point(at_ms: u64, rps: f64, ramp_ms: Option<u64>) -> RatePoint {
        RatePoint {
            at: Span(Duration::from_millis(at_ms)),
            rps,
            ramp: ramp_ms.map(|ms| Span(Duration::from_millis(ms))),
        }
    }

    #[test]
    fn a_rate_curve_holds_each_point_and_ramps_linearly_between() {
        let points = [point(0, 10.0, None), point(1000, 110.0, Some(1000)), point(5000, 0.0, None)];
        assert_eq!(rate_at(&points, 0.5), 10.0);
        assert!((rate_at(&points, 1.5) - 60.0).abs() < 1e-9);
        assert_eq!(rate_at(&points, 3.0), 110.0);
        assert_eq!(rate_at(&points, 6.0), 0.0);
    }

    fn retrying(jitter: bool) -> (Caller, Arrival) {
        let text = format!(
            "name: x\nduration: 5s\nfleet:\n  regions:\n    - {{name: eu, proxies: 1}}\ncallers:\n  - name: app\n    rate:\n      - {{at: 0s, rps: 5}}\n    retry: {{attempts: 2, backoff: 100ms, jitter: {jitter}}}\n"
        );
        let scenario = Scenario::parse(&text).expect("the scenario is valid");
        let arrival = Arrival { at: 0, class: 0, key: 1, attempt: 0, call: 1, proxy: 0, worker: 0, entry: None };
        (scenario.callers[0].clone(), arrival)
    }

    #[test]
    fn a_retry_comes_its_backoff_after_the_refusal_doubling_until_no_attempt_is_left() {
        let (caller, first) = retrying(false);
        let second = retry(&caller, &first, 1_000_000, None, 7).expect("a retry");
        let third = retry(&caller, &second, 2_000_000, None, 7).expect("a retry");
        assert_eq!((second.at, second.attempt, second.proxy), (101_000_000, 1, 0));
        assert_eq!((third.at, third.attempt), (202_000_000, 2));
        assert!(retry(&caller, &third, 3_000_000, None, 7).is_none(), "no attempt is left");
        assert_eq!(
            retry(&caller, &first, 0, Some(2), 7).map(|a| a.at),
            Some(100_000_000),
            "Retry-After is not honoured"
        );
    }

    #[test]
    fn a_jittered_retry_depends_on_its_call_and_seed_only() {
        let (caller, arrival) = retrying(true);
        let at =
            |call: u64, seed: u64| retry(&caller, &Arrival { call, ..arrival.clone() }, 0, None, seed).map(|a| a.at);
        let spread: std::collections::BTreeSet<Option<u64>> = (0..50).map(|call| at(call, 7)).collect();
        assert_eq!(at(3, 7), at(3, 7));
        assert_ne!(at(3, 7), at(3, 8));
        assert!(spread.len() > 45, "the jitter spreads the retries: {spread:?}");
        assert!(spread.iter().flatten().all(|t| (1..=100_000_000).contains(t)));
    }

    #[test]
    fn a_class_is_silent_before_its_first_point() {
        assert_eq!(rate_at(&[point(2000, 5.0, None)], 1.0), 0.0);
    }
}

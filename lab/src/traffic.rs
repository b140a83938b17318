//! Callers → arrivals: each class's rate curve played as a Poisson process (thinned from
//! its peak rate) or evenly spaced, identities drawn from its key distribution, and
//! retries of refused calls scheduled by its retry policy. Everything comes from the
//! scenario's seed.

use crate::scenario::{Caller, Keys, RatePoint, Retry, Scenario, Spacing};
use sluice_testkit::rng::Rng;
use std::collections::BTreeMap;

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

/// Whether `caller` retries `arrival` once it is refused (its class retries, with
/// attempts left).
pub fn will_retry(caller: &Caller, arrival: &Arrival) -> bool {
    caller.retry.is_some_and(|r| arrival.attempt < r.attempts)
}

/// A caller class's arrivals.
#[derive(Debug)]
struct Class {
    points: Vec<RatePoint>,
    spacing: Spacing,
    keys: Keys,
    retry: Option<Retry>,
    proxies: Vec<usize>,
    peak: f64,
    next: Option<u64>,
    rng: Rng,
    /// Draws the retries' jitter: apart from the arrivals' draws, so that when a refusal
    /// is heard of does not change the arrivals.
    jitter: Rng,
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
    fn new(caller: &Caller, proxies: Vec<usize>, rng: Rng, jitter: Rng) -> Self {
        let peak = caller.rate.iter().map(|p| p.rps).fold(0.0, f64::max);
        let mut class = Self {
            points: caller.rate.clone(),
            spacing: caller.arrivals,
            keys: caller.keys.clone(),
            retry: caller.retry,
            proxies,
            peak,
            next: None,
            rng,
            jitter,
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

/// Every class's arrivals and the retries waiting, in time order.
#[derive(Debug)]
pub struct Traffic {
    classes: Vec<Class>,
    workers: usize,
    retries: BTreeMap<(u64, u64), Arrival>,
    replayed: std::collections::VecDeque<Arrival>,
    serial: u64,
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
            .enumerate()
            .map(|(i, caller)| {
                let proxies = (0..regions.len())
                    .filter(|p| caller.regions.is_empty() || caller.regions.iter().any(|r| r == regions[*p]))
                    .collect();
                let jitter = Rng::new(scenario.seed ^ 0x7e7_0000_0000 ^ ((i as u64) << 40));
                Class::new(caller, proxies, rng.fork(), jitter)
            })
            .collect();
        let replayed = std::collections::VecDeque::new();
        Self { classes, workers: scenario.fleet.workers, retries: BTreeMap::new(), replayed, serial: 0, calls: 0, rng }
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
        let retry = self.retries.keys().next().map(|(at, _)| *at);
        let replayed = self.replayed.front().map(|a| a.at);
        first.into_iter().chain(retry).chain(replayed).min()
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
        while let Some(entry) = self.retries.first_entry().filter(|e| e.key().0 <= t) {
            out.push(entry.remove());
        }
        out.sort_by_key(|a| (a.at, a.class, a.call));
        out
    }

    /// A refused request of `arrival`'s call, refused at `now` ns: schedules its retry
    /// if its class retries and has attempts left. `retry_after` is the refusal's
    /// `Retry-After` in seconds. Returns whether it will be retried.
    /// The retry is sent no sooner than `not_before` (a fleet that learns of refusals
    /// after a window of time sends retries that fall inside it at its end).
    pub fn refused(&mut self, arrival: &Arrival, now: u64, retry_after: Option<u64>, not_before: u64) -> bool {
        let Some(class) = self.classes.get_mut(arrival.class) else { return false };
        let Some(retry) = class.retry.filter(|r| arrival.attempt < r.attempts) else { return false };
        let mut wait = retry.backoff.nanos().saturating_mul(1 << arrival.attempt.min(20));
        if retry.jitter {
            wait = (uniform(&mut class.jitter) * wait as f64) as u64;
        }
        if retry.honor_retry_after
            && let Some(seconds) = retry_after
        {
            wait = wait.max(seconds.saturating_mul(1_000_000_000));
        }
        self.serial += 1;
        let at = now.saturating_add(wait.max(1)).max(not_before);
        let next = Arrival { at, attempt: arrival.attempt + 1, ..arrival.clone() };
        self.retries.insert((at, self.serial), next);
        true
    }
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

    fn retrying(jitter: bool) -> (Traffic, Arrival) {
        let text = format!(
            "name: x\nduration: 5s\nfleet:\n  regions:\n    - {{name: eu, proxies: 1}}\ncallers:\n  - name: app\n    rate:\n      - {{at: 0s, rps: 5}}\n    retry: {{attempts: 2, backoff: 100ms, jitter: {jitter}}}\n"
        );
        let scenario = Scenario::parse(&text).expect("the scenario is valid");
        let arrival = Arrival { at: 0, class: 0, key: 1, attempt: 0, call: 1, proxy: 0, worker: 0, entry: None };
        (Traffic::new(&scenario), arrival)
    }

    #[test]
    fn a_retry_comes_its_backoff_after_the_refusal_and_no_sooner_than_it_is_allowed() {
        let (mut traffic, arrival) = retrying(false);
        assert!(traffic.refused(&arrival, 1_000_000, None, 0));
        assert!(traffic.refused(&arrival, 2_000_000, None, 500_000_000));
        let retries: Vec<u64> = traffic.retries.values().map(|a| a.at).collect();
        assert_eq!(retries, [101_000_000, 500_000_000]);
        let last = Arrival { attempt: 2, ..arrival };
        assert!(!traffic.refused(&last, 3_000_000, None, 0), "no attempt is left");
    }

    #[test]
    fn the_retries_jitter_does_not_change_the_arrivals() {
        let (mut quiet, arrival) = retrying(true);
        let (mut jittery, _) = retrying(true);
        for i in 0..50 {
            let _ = jittery.refused(&Arrival { call: i, ..arrival.clone() }, 0, None, 0);
        }
        let first: Vec<u64> = (0..20).filter_map(|_| quiet.due(quiet.next()?).first().map(|a| a.at)).collect();
        let second: Vec<u64> = (0..20)
            .filter_map(|_| {
                let at = jittery.classes.iter().filter_map(|c| c.next).min()?;
                jittery.due(at).iter().find(|a| a.attempt == 0).map(|a| a.at)
            })
            .collect();
        assert_eq!(first, second);
    }

    #[test]
    fn a_class_is_silent_before_its_first_point() {
        assert_eq!(rate_at(&[point(2000, 5.0, None)], 1.0), 0.0);
    }
}

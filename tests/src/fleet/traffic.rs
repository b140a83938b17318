//! The traffic: who arrives when, at which proxy and worker, with which headers.

use super::oracle::Sent;
use super::scenario::Scenario;
use sluice_testkit::rng::Rng;
use std::time::Duration;
use wasm_host::Request;

/// The traffic generator.
pub(super) struct Arrivals {
    pub(super) rng: Rng,
    /// Draws the cost each upstream answer reports.
    pub(super) usage: Rng,
    pub(super) next: u64,
    pub(super) flood_serial: u64,
}

impl Arrivals {
    /// The next arrival (and draws the one after).
    pub(super) fn draw(&mut self, scenario: &Scenario, offset: Duration, now: u64) -> (usize, usize, Sent) {
        let a = self;
        let flooding = scenario.traffic.floods.iter().any(|(from, until)| *from <= offset && offset < *until);
        let tenant = if flooding && a.rng.chance(80) {
            a.flood_serial += 1;
            format!("flood-{}", a.flood_serial)
        } else if a.rng.chance(scenario.traffic.hot_percent) {
            "t0".to_owned()
        } else {
            format!("t{}", a.rng.below(scenario.traffic.tenants))
        };
        let sent = Sent {
            tenant,
            user: format!("u{}", a.rng.below(6)),
            route: format!("r{}", a.rng.below(4)),
            under_a: a.rng.chance(scenario.traffic.under_a_percent),
            cost: if a.rng.chance(30) { a.rng.between(1, 12) } else { 1 },
            usage: a.usage.between(1, 24),
        };
        let proxy = a.rng.below(scenario.proxies as u64) as usize;
        let worker = a.rng.below(scenario.workers as u64) as usize;
        // Exponential-looking gaps: mostly short, sometimes long.
        let mean = scenario.traffic.mean_gap.as_nanos() as u64;
        let gap = match a.rng.below(10) {
            0 => mean * 4,
            1..=3 => mean / 4 + 1,
            _ => a.rng.between(mean / 2, mean * 3 / 2),
        };
        a.next = now + gap.max(1);
        if let Some(grid) = scenario.traffic.grid {
            let grid = grid.as_nanos() as u64;
            a.next = a.next.div_ceil(grid) * grid;
        }
        (proxy, worker, sent)
    }
}

impl Sent {
    pub(super) fn request(&self) -> Request {
        let path = if self.under_a { "/a/item" } else { "/item" };
        Request::get(path)
            .header("x-tenant", self.tenant.as_str())
            .header("x-user", self.user.as_str())
            .header("x-route", self.route.as_str())
            .header("x-cost", self.cost.to_string())
    }
}

//! The traffic: who arrives when, at which proxy and worker, with which headers.

use super::oracle::{Body, Report, Sent};
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
    /// On a grid: when the next arrival would come without it (several arrivals then
    /// share one instant of the grid).
    pub(super) unrounded: u64,
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
            // Costs reported below, at and far above the estimates, and sometimes not at all.
            usage: match a.usage.below(10) {
                0..=2 => a.usage.between(1, 3),
                3..=6 => a.usage.between(1, 24),
                7 | 8 => a.usage.between(24, 120),
                _ => a.usage.between(120, 400),
            },
            report: Report {
                header: a.usage.chance(90),
                body: match a.usage.below(20) {
                    0..=8 => Body::Json,
                    9..=15 => Body::Events,
                    16 => Body::EventsWithoutUsage,
                    17 => Body::Text,
                    _ => Body::Empty,
                },
            },
        };
        let drawn = a.rng.below(scenario.proxies as u64) as usize;
        let proxy = match scenario.traffic.hot_moves_every {
            Some(every) if sent.tenant == "t0" => {
                (offset.as_nanos() / every.as_nanos().max(1)) as usize % scenario.proxies.max(1)
            }
            _ => drawn,
        };
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
            a.unrounded = a.unrounded.max(now.saturating_sub(grid)) + gap.max(1);
            a.next = a.unrounded.div_ceil(grid) * grid;
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

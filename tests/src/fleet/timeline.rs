//! The scenario's timeline: when the service changes mode and events happen, and what
//! each change does to the fleet.

use super::oracle::Violation;
use super::scenario::{Event, Scenario};
use super::{Action, Failure, Fleet, service};
use std::collections::BTreeMap;
use std::sync::PoisonError;
use std::time::Duration;

/// A scheduled change of the scenario.
#[derive(Clone, Debug)]
pub(super) enum Change {
    Mode(Option<usize>, service::Mode),
    Event(Event),
}

impl Fleet<'_> {
    /// The moments the scenario changes something, with what changes.
    pub(super) fn boundaries(&self) -> BTreeMap<u64, Vec<Change>> {
        let mut out: BTreeMap<u64, Vec<Change>> = BTreeMap::new();
        for fault in &self.scenario.faults {
            out.entry(self.at(fault.from)).or_default().push(Change::Mode(fault.proxy, fault.mode));
            out.entry(self.at(fault.until)).or_default().push(Change::Mode(fault.proxy, service::Mode::Healthy));
        }
        for (when, event) in &self.scenario.events {
            match event {
                // A rolling update: one proxy after another, 50 ms apart.
                Event::Reload { proxy: None, policy, num, den, bump } => {
                    for p in 0..self.scenario.proxies {
                        let at = self.at(*when + Duration::from_millis(50 * p as u64));
                        let event =
                            Event::Reload { proxy: Some(p), policy: *policy, num: *num, den: *den, bump: *bump };
                        out.entry(at).or_default().push(Change::Event(event));
                    }
                }
                event => out.entry(self.at(*when)).or_default().push(Change::Event(event.clone())),
            }
        }
        out
    }

    pub(super) fn apply(&mut self, change: Change) -> Result<(), Box<Failure>> {
        let now = self.now();
        match change {
            Change::Mode(proxy, mode) => {
                self.note(format!(
                    "service {mode:?} for {}",
                    proxy.map_or("every proxy".into(), |p| format!("proxy {p}"))
                ));
                self.service.lock().unwrap_or_else(PoisonError::into_inner).set_mode(proxy, mode);
                self.oracle.service_mode(proxy, mode, now);
            }
            Change::Event(Event::Restart) => {
                self.note("service restarts, its counters lost".into());
                self.service.lock().unwrap_or_else(PoisonError::into_inner).restart();
            }
            Change::Event(Event::ClockStep(ms)) => {
                self.note(format!("service clock steps {ms} ms"));
                self.service.lock().unwrap_or_else(PoisonError::into_inner).step_clock(ms * 1_000_000);
            }
            Change::Event(Event::ClientsLeave { proxy }) => {
                let leaving: Vec<u64> = self
                    .streams
                    .iter()
                    .filter(|(_, s)| s.proxy == proxy && s.respond_at.is_none())
                    .map(|(k, _)| *k)
                    .collect();
                self.note(format!("clients of proxy {proxy} leave {} paused requests", leaving.len()));
                let mut actions: BTreeMap<(usize, usize), Vec<Action>> = BTreeMap::new();
                for key in leaving {
                    if let Some(s) = self.streams.get(&key) {
                        actions.entry((s.proxy, s.worker)).or_default().push(Action::Leave(key as usize));
                    }
                }
                self.act(actions)?;
            }
            Change::Event(Event::Reload { proxy: Some(p), policy, num, den, bump }) => {
                let Some(current) = self.proxies.get(p).map(|proxy| proxy.policies.clone()) else { return Ok(()) };
                let next = Scenario::reloaded(&current, policy, num, den, bump);
                let config = self.scenario.filter_config(&next);
                self.note(format!(
                    "proxy {p} reloads policy {policy} ×{num}/{den}{}",
                    if bump { ", version bumped" } else { "" }
                ));
                if let Some(proxy) = self.proxies.get_mut(p) {
                    match proxy.host.reconfigure(config) {
                        Ok(()) => {
                            self.oracle.reloaded(p, &next, now);
                            proxy.policies = next;
                        }
                        Err(error) => return Err(self.fail(Violation::new("reload", format!("refused: {error}")))),
                    }
                }
            }
            Change::Event(Event::Reload { proxy: None, .. }) => {}
        }
        Ok(())
    }
}

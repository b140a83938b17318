//! The scenario's timeline: when the service changes mode and events happen, and what
//! each change does to the fleet.

use super::oracle::Violation;
use super::scenario::{Event, OverrideKind, Scenario};
use super::{Action, Failure, Fleet, Variant, service};
use std::collections::BTreeMap;
use std::sync::PoisonError;
use std::time::Duration;

/// A scheduled change of the scenario.
#[derive(Clone, Debug)]
pub(super) enum Change {
    Mode(Option<usize>, service::Mode),
    Event(Event),
    /// One proxy reloads (a reload, or one step of a rolling update).
    Reload(super::scenario::Reload),
    /// The operator sets the override of the scenario's event `index`.
    SetOverride(usize),
    /// The operator removes the override the scenario's event `index` set.
    RemoveOverride(usize),
    /// The service's sweeper runs.
    Sweep,
}

impl Fleet<'_> {
    /// The moments the scenario changes something, with what changes.
    pub(super) fn boundaries(&self) -> BTreeMap<u64, Vec<Change>> {
        let mut out: BTreeMap<u64, Vec<Change>> = BTreeMap::new();
        for fault in &self.scenario.faults {
            out.entry(self.at(fault.from)).or_default().push(Change::Mode(fault.proxy, fault.mode));
            out.entry(self.at(fault.until)).or_default().push(Change::Mode(fault.proxy, service::Mode::Healthy));
        }
        for (index, (when, event)) in self.scenario.events.iter().enumerate() {
            match event {
                // Reloads and rolling updates, proxy by proxy (below).
                Event::Reload { .. } | Event::Rollout { .. } => {}
                Event::Override(def) => {
                    out.entry(self.at(*when)).or_default().push(Change::SetOverride(index));
                    if let Some(after) = def.remove_after_ms {
                        let removal = self.at(*when + Duration::from_millis(after));
                        out.entry(removal).or_default().push(Change::RemoveOverride(index));
                    }
                }
                event => out.entry(self.at(*when)).or_default().push(Change::Event(event.clone())),
            }
        }
        for reload in self.scenario.reloads() {
            out.entry(self.at(reload.at)).or_default().push(Change::Reload(reload));
        }
        // The sweeper, through the quiet end too.
        let quiet = Duration::from_millis(self.scenario.cooldown_ms + 3000);
        let mut sweep = Duration::from_millis(self.scenario.sweep_ms);
        while sweep <= self.scenario.duration + quiet {
            out.entry(self.at(sweep)).or_default().push(Change::Sweep);
            sweep += Duration::from_millis(self.scenario.sweep_ms);
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
            Change::Reload(super::scenario::Reload { proxy: p, policy, num, den, bump, .. }) => {
                let Some(current) = self.proxies.get(p).map(|proxy| proxy.policies.clone()) else { return Ok(()) };
                let next = Scenario::reloaded(&current, policy, num, den, bump);
                let config = self.scenario.filter_config(&self.variant.configured(&next));
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
            Change::Event(Event::Reload { .. } | Event::Rollout { .. }) => {}
            Change::Event(Event::Override(_)) => {}
            Change::SetOverride(index) => self.set_override(index),
            Change::RemoveOverride(index) => {
                let Some(id) = self.override_ids.get(&index).cloned() else { return Ok(()) };
                let service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
                let at = service.decisions().len();
                let removed = service.remove_override(&id);
                drop(service);
                match removed {
                    Ok(_) => {
                        self.note(format!("operator removes override {id}"));
                        self.oracle.override_removed(&id, at);
                    }
                    Err(e) => self.note(format!("operator removes override {id}: refused ({} {})", e.code, e.message)),
                }
            }
            Change::Sweep => {
                let service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
                let (dropped, at) = (service.sweep(), service.service_now());
                drop(service);
                self.oracle.swept(at);
                if dropped > 0 {
                    self.note(format!("service sweeps {dropped} idle keys"));
                }
            }
        }
        Ok(())
    }

    /// The operator sets override `def` at the service (its admin function, as `sluice-counter
    /// override set` would), and the oracle learns what the service took.
    fn set_override(&mut self, index: usize) {
        let scenario = self.scenario;
        let Some((_, Event::Override(def))) = scenario.events.get(index) else { return };
        // The version the operator names is the one the first proxy runs now.
        let Some(policy) = self.proxies.first().and_then(|p| p.policies.get(def.policy)).cloned() else { return };
        let mut body = serde_json::json!({
            "kind": match def.kind { OverrideKind::Bypass => "bypass", OverrideKind::Clamp(_) => "clamp" },
            "policy": policy.name,
            "ttl_ms": def.ttl_ms,
            "reason": "the fleet simulation's scenario",
            "operator": "fleet",
        });
        let clamp = match def.kind {
            OverrideKind::Clamp(numbers) => {
                body["limit"] = numbers.spec().unwrap_or_default();
                Some(numbers)
            }
            OverrideKind::Bypass => None,
        };
        if let Some(value) = &def.key {
            body["key"] = serde_json::json!([value]);
            body["policy_version"] = policy.version.into();
        }
        let service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
        let (from, now) = (service.decisions().len(), service.service_now());
        // A deliberately wrong run: the service never hears of its clamps.
        let taken = if self.variant == Variant::ClampsNotSet && clamp.is_some() {
            Ok(None)
        } else {
            service.set_override(body.to_string().as_bytes()).map(Some)
        };
        drop(service);
        match taken {
            Ok(item) => {
                let id = item.as_ref().map_or_else(|| format!("ovr-unset-{index}"), |o| o.id.clone());
                let until = item.as_ref().map_or(now + def.ttl_ms * 1_000_000, |o| o.expires_at_ms * 1_000_000);
                self.note(format!(
                    "operator sets override {id}: {:?} on {} v{}{} for {} ms",
                    def.kind,
                    policy.name,
                    policy.version,
                    def.key.as_ref().map(|k| format!(" for caller {k}")).unwrap_or_default(),
                    def.ttl_ms
                ));
                self.oracle.override_set(&id, &policy.name, def.key.as_deref(), policy.version, clamp, from, until);
                self.override_ids.insert(index, id);
            }
            Err(e) => self
                .note(format!("operator sets {:?} on {}: refused ({} {})", def.kind, policy.name, e.code, e.message)),
        }
    }
}

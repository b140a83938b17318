//! The bounds of a proxy's own counters: local policies (per proxy, policy, version and
//! caller), and concurrency policies' requests in flight.
//!
//! **Local bound.** Every unit a local policy admitted (its estimate, spent when the
//! request arrived; a cost the response reported above it, charged when the response
//! ended; one below it, given back then) is replayed in the policy's loosest numbers for
//! that version (reloads without a bump carry a bucket over), at the proxy's wall clock
//! (windows align to it). It may not go past them by more than the debt a local bucket
//! may owe (`64 × max`, filter/README.md) plus what the proxy counted as forgiven. A
//! caller whose slot is held by another spends from the policy's overflow bucket, which
//! starts no looser than where it leaves off (shared-store's `key.rs`): between the two
//! it may spend twice the numbers, so a caller is held to twice them once the proxy has
//! an overflow bucket for the policy, and to them exactly before.
//!
//! A request is known to be admitted only when it is forwarded, which may be up to
//! [`Scenario::max_pause`](crate::fleet::Scenario::max_pause) after it arrived (and
//! spent): the events wait that long, then are replayed in time order.
//!
//! **In flight.** A concurrency policy's requests forwarded and not yet answered, per
//! proxy, version and caller, never outnumber its limit (the loosest in force), or twice
//! it once its overflow bucket exists.

use super::bound::Watched;
use super::{Oracle, Violation, policy_metric};
use crate::fleet::scenario::{Algorithm, Kind, PolicyDef};
use sluice::host::Counter;
use std::collections::BTreeMap;

/// A local counter: proxy, policy, version, caller.
pub(super) type LocalKey = (usize, String, u64, String);

/// Something that happened to a local counter.
#[derive(Clone, Debug)]
pub(super) enum LocalEvent {
    /// Units spent (admitted, or charged when the response ended).
    Spend(u64),
    /// Units given back, spent at this wall-clock time.
    Credit(u64, u64),
}

/// A local counter's replays: exact, and doubled for a caller that may have spilled over.
pub(super) struct Local {
    exact: Watched,
    doubled: Watched,
}

/// `numbers` twice over: what a slot and the overflow bucket admit between them.
const fn doubled(numbers: Algorithm) -> Algorithm {
    match numbers {
        Algorithm::TokenBucket { rate, burst } => Algorithm::TokenBucket { rate: 2 * rate, burst: 2 * burst },
        Algorithm::LeakyBucket { rate, queue, max_wait_ms } => {
            Algorithm::LeakyBucket { rate: 2 * rate, queue: 2 * queue, max_wait_ms }
        }
        Algorithm::FixedWindow { limit, window_ms } => Algorithm::FixedWindow { limit: 2 * limit, window_ms },
        Algorithm::SlidingWindow { limit, window_ms } => Algorithm::SlidingWindow { limit: 2 * limit, window_ms },
        Algorithm::SlidingLog { limit, window_ms } => Algorithm::SlidingLog { limit: 2 * limit, window_ms },
        Algorithm::Concurrency { limit } => Algorithm::Concurrency { limit: 2 * limit },
    }
}

/// Whether proxy `host` holds an overflow bucket for local policy `name` at `version`.
fn overflowed(host: &wasm_host::Host, name: &str, version: u64) -> bool {
    let suffix = format!("/p/{name}/v{version}/overflow");
    host.shared_data().entries().iter().any(|(key, _)| key.ends_with(suffix.as_bytes()))
}

impl Oracle {
    /// Queues `event` of local counter `key` at wall-clock `at`.
    pub(super) fn local_event(&mut self, at: u64, key: LocalKey, event: LocalEvent) {
        self.local_seq += 1;
        self.local_pending.push((at, self.local_seq, key, event));
    }

    /// Replays the local events of `proxy` that are old enough for every admission before
    /// them to be known (all of them with `all`).
    pub(super) fn local_bound(
        &mut self,
        proxy: usize,
        host: &wasm_host::Host,
        now_real: u64,
        all: bool,
    ) -> Result<(), Violation> {
        let horizon = if all { u64::MAX } else { now_real.saturating_sub(self.local_lag) };
        let (mut due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.local_pending)
            .into_iter()
            .partition(|(at, _, key, _)| key.0 == proxy && *at <= horizon);
        self.local_pending = rest;
        due.sort_by_key(|(at, seq, _, _)| (*at, *seq));
        let mut overflow: BTreeMap<(String, u64), bool> = BTreeMap::new();
        for (at, _, key, event) in due {
            let (_, name, version, value) = &key;
            let Some((numbers, allowance)) = self.local_numbers(name, *version) else { continue };
            let forgiven = policy_metric(host, name, Counter::CostForgiven);
            let spilled = *overflow.entry((name.clone(), *version)).or_insert_with(|| overflowed(host, name, *version));
            let local = self.locals.entry(key.clone()).or_insert_with(|| Local {
                exact: Watched::new(numbers, allowance),
                doubled: Watched::new(doubled(numbers), 2 * allowance),
            });
            let line = format!("{:.3} ms {event:?}", (at.saturating_sub(self.start_real)) as f64 / 1e6);
            let mut over = (0, 0);
            for (i, watched) in [&mut local.exact, &mut local.doubled].into_iter().enumerate() {
                watched.note(line.clone());
                let past = match event {
                    LocalEvent::Spend(units) => watched.replay.spend(at, units),
                    LocalEvent::Credit(units, spent_at) => {
                        watched.replay.credit(at, spent_at, units);
                        0
                    }
                };
                if i == 0 { over.0 = past } else { over.1 = past }
            }
            let (watched, past) = if over.1 > local.doubled.allowance + forgiven {
                (&local.doubled, over.1)
            } else if !spilled && over.0 > local.exact.allowance + forgiven {
                (&local.exact, over.0)
            } else {
                continue;
            };
            return Err(Violation::new(
                "local bound",
                format!(
                    "proxy {proxy}, local policy {name} v{version}, caller {value}: admitted {past} units past \
                     {:?} (the loosest numbers in force{}) at {:.3} ms, beyond the debt it may owe ({}) and what \
                     the proxy counted as forgiven ({forgiven}); last events {:#?}",
                    watched.replay.numbers(),
                    if spilled { ", twice over: the policy has spilled into its overflow bucket" } else { "" },
                    (at.saturating_sub(self.start_real)) as f64 / 1e6,
                    watched.allowance,
                    watched.history
                ),
            ));
        }
        Ok(())
    }

    /// The loosest numbers of local policy `name` at `version` and the debt it may owe.
    fn local_numbers(&self, name: &str, version: u64) -> Option<(Algorithm, u64)> {
        let forms: Vec<&PolicyDef> =
            self.forms.get(&(name.to_owned(), version))?.iter().filter(|p| p.kind == Kind::Local).collect();
        let numbers = forms.iter().map(|p| p.algorithm).reduce(Algorithm::loosest)?;
        let allowance = forms.iter().map(|p| p.max_debt()).max().unwrap_or(0);
        Some((numbers, allowance))
    }

    /// No concurrency policy has more requests of one caller in flight on `proxy` than
    /// its limit.
    pub(super) fn in_flight(&self, proxy: usize, host: &wasm_host::Host) -> Result<(), Violation> {
        let mut flying: BTreeMap<(&str, u64, &str), u64> = BTreeMap::new();
        for followed in self.streams.values().filter(|f| f.proxy == proxy && f.forwarded_at.is_some()) {
            for m in &followed.matched {
                if let Algorithm::Concurrency { .. } = m.policy.algorithm {
                    *flying.entry((m.policy.name.as_str(), m.policy.version, m.value.as_str())).or_insert(0) += 1;
                }
            }
        }
        for ((name, version, value), count) in flying {
            let Some((Algorithm::Concurrency { limit }, _)) = self.local_numbers(name, version) else { continue };
            let limit = if overflowed(host, name, version) { 2 * limit } else { limit };
            if count > limit {
                return Err(Violation::new(
                    "in flight",
                    format!(
                        "proxy {proxy}, concurrency policy {name} v{version}, caller {value}: {count} requests in \
                         flight at once, more than its limit {limit}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

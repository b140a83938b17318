//! Operators' overrides as the oracle follows them: which one applies to a decision of
//! the service (counter-service/README.md, "Enforcement": one keyed to the entry's key
//! and version first, then one for its whole policy; within a scope a clamp before a
//! bypass, the one set last first), and the replay of every clamped counter under the
//! clamp's numbers over the clamp's life. An override applies to the decisions made
//! after it was set and before it was removed (or the service restarted), until its
//! expiry on the service's clock (which a clock step moves).

use super::Oracle;
use super::bound::Watched;
use crate::fleet::scenario::Algorithm;
use std::collections::BTreeMap;

/// One override the service took.
#[derive(Clone, Debug)]
pub(super) struct Watch {
    /// Its id.
    pub(super) id: String,
    /// The policy's name.
    pub(super) name: String,
    /// For one caller: the counter's key and the policy version it was hashed under.
    pub(super) keyed: Option<(String, u64)>,
    /// A clamp's numbers; `None` for a bypass.
    pub(super) clamp: Option<Algorithm>,
    /// Set when the service had made this many decisions.
    pub(super) from: usize,
    /// Removed when the service had made this many decisions.
    pub(super) removed: Option<usize>,
    /// Its expiry on the service's clock (ns, exclusive).
    pub(super) until: u64,
    /// Per counter it clamped: its replay under the clamp's numbers.
    pub(super) replays: BTreeMap<String, Watched>,
}

impl Oracle {
    /// The service took an override: `id`, for policy `name` (keyed to the caller whose
    /// key value is `value` at `version`, or the whole policy), a clamp to `clamp` or a
    /// bypass, after its `from`th decision, expiring at `until` on its clock.
    #[allow(clippy::too_many_arguments)]
    pub fn override_set(
        &mut self,
        id: &str,
        name: &str,
        value: Option<&str>,
        version: u64,
        clamp: Option<Algorithm>,
        from: usize,
        until: u64,
    ) {
        let keyed = value.map(|value| {
            let mut hasher = self.hash_key.fingerprinter(name, version);
            hasher.part(value.as_bytes());
            (sluice::engine::namespace::hex128(hasher.finish()), version)
        });
        self.overrides.push(Watch {
            id: id.to_owned(),
            name: name.to_owned(),
            keyed,
            clamp,
            from,
            removed: None,
            until,
            replays: BTreeMap::new(),
        });
    }

    /// The service removed override `id` after its `at`th decision.
    pub fn override_removed(&mut self, id: &str, at: usize) {
        for watch in self.overrides.iter_mut().filter(|w| w.id == id) {
            watch.removed = Some(watch.removed.unwrap_or(at).min(at));
        }
    }

    /// The service's sweeper ran at `at` (its clock): the replays of counters that carry
    /// nothing then are forgotten, as the store may forget the counters (a counter that
    /// still carries something is kept: a store that forgets it starts it over).
    pub fn swept(&mut self, at: u64) {
        self.budgets.retain(|_, watched| !watched.replay.is_idle(at));
        for watch in &mut self.overrides {
            watch.replays.retain(|_, watched| !watched.replay.is_idle(at));
        }
    }

    /// Every override ended after the service's `at`th decision (it restarted: its memory
    /// store kept none).
    pub(super) fn overrides_lost(&mut self, at: usize) {
        for watch in &mut self.overrides {
            watch.removed = Some(watch.removed.unwrap_or(at).min(at));
            watch.replays.clear();
        }
    }

    /// The override that applies to the service's `index`th decision, on counter `key` of
    /// policy `name` at `version`, at `at` on the service's clock: its index.
    pub(super) fn applicable(&self, index: usize, key: &str, name: &str, version: u64, at: u64) -> Option<usize> {
        let live = |w: &&(usize, &Watch)| w.1.from <= index && w.1.removed.is_none_or(|r| index < r) && at < w.1.until;
        let best = |scope: &dyn Fn(&Watch) -> bool| {
            let mut candidates: Vec<(usize, &Watch)> =
                self.overrides.iter().enumerate().filter(|(_, w)| scope(w)).collect();
            candidates.retain(|c| live(&c));
            // A clamp before a bypass, the one set last first.
            candidates.into_iter().max_by_key(|(i, w)| (w.clamp.is_some(), *i)).map(|(i, _)| i)
        };
        best(&|w: &Watch| w.keyed.as_ref().is_some_and(|(k, v)| k == key && *v == version))
            .or_else(|| best(&|w: &Watch| w.keyed.is_none() && w.name == name))
    }
}

//! The concurrency slots this worker holds, by shared-data key: what it renews on its
//! tick, and what it says it holds when it does (see `shared_store::limiter`,
//! "Concurrency").
//!
//! Bounded without a bound of its own: every key is a key of a concurrency policy's slot
//! table (a caller's slot, the overflow bucket or the missing-key bucket), so there are
//! at most `slots + 2` per concurrency policy, however many requests are in flight.

use shared_store::{Limit, Nanos, RENEW_EVERY, Slot};
use std::collections::HashMap;

/// One key's slots held by this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldKey {
    /// The policy they count under (its metrics).
    pub(crate) policy: usize,
    /// The key's owner when they were taken.
    pub(crate) owner: u64,
    /// The policy's limit.
    pub(crate) limit: Limit,
    /// How many this worker's requests hold. Zero while a release that could not be
    /// written waits for the next renewal to write it.
    pub(crate) count: u64,
}

/// This worker's slots, and when it last renewed them.
#[derive(Debug, Default)]
pub(crate) struct Held {
    keys: HashMap<String, HeldKey>,
    renewed: Option<Nanos>,
}

impl Held {
    /// Records a slot taken by a request counted under `policy`.
    pub(crate) fn take(&mut self, policy: usize, slot: &Slot) {
        let held = self.keys.entry(slot.key.clone()).or_insert(HeldKey {
            policy,
            owner: slot.owner,
            limit: slot.limit,
            count: 0,
        });
        held.owner = slot.owner;
        held.count = held.count.saturating_add(slot.count);
    }

    /// Records a slot given back; `written` says whether the release reached shared data
    /// (if not, the key stays until a renewal writes what is held).
    pub(crate) fn give_back(&mut self, slot: &Slot, written: bool) {
        let Some(held) = self.keys.get_mut(&slot.key) else { return };
        held.count = held.count.saturating_sub(slot.count);
        if held.count == 0 && written {
            self.keys.remove(&slot.key);
        }
    }

    /// Whether a renewal is due at `now` (every [`RENEW_EVERY`]); if so, it counts as
    /// done from now.
    pub(crate) fn renewal_due(&mut self, now: Nanos) -> bool {
        let due = self.renewed.is_none_or(|at| now.saturating_sub(at) >= RENEW_EVERY);
        if due {
            self.renewed = Some(now);
        }
        due
    }

    /// Every key held, with what is held there.
    pub(crate) fn keys(&self) -> Vec<(String, HeldKey)> {
        self.keys.iter().map(|(k, h)| (k.clone(), h.clone())).collect()
    }

    /// Forgets `key` if nothing is held there any more (its zero was written).
    pub(crate) fn forget_if_empty(&mut self, key: &str) {
        if self.keys.get(key).is_some_and(|h| h.count == 0) {
            self.keys.remove(key);
        }
    }
}

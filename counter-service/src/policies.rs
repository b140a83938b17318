//! The policies this instance has been asked about: each name a request gave, with the
//! limit it last came with and when. The service has no filter configuration of its own,
//! so this is how it tells an override for a policy no proxy knows (a typo, in an
//! incident) from a real one.
//!
//! Learned from requests, so it starts empty: after a restart, an override for a policy
//! is refused until a proxy has sent a request for it (in a live fleet, within
//! milliseconds). Each instance learns on its own.
//!
//! **Bounded.** At most [`MAX_KNOWN_POLICIES`] names. A name no request has given for
//! [`FORGET_AFTER_MS`] may be forgotten to make room for a new one: a full table looks
//! for such names at most once every [`SWEEP_EVERY_MS`], so that a flood of new names
//! (any holder of the proxies' token can send them, with cost-0 checks) costs one scan a
//! second, not one per request. A new name that finds the table full of names given
//! recently is not learned, and counted; an override for it is refused with a message
//! that says the table is full. The names a live fleet sends keep being given, so they
//! stay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use sluice_protocol::{Algorithm, ErrorCode, LimitSpec};

use crate::api::{ApiError, PlannedEntry};
use crate::overrides::{Override, OverrideKind};

/// The most policy names one instance remembers.
pub const MAX_KNOWN_POLICIES: usize = 10_000;
/// How long a name no request gives is remembered at least: 10 minutes.
pub const FORGET_AFTER_MS: u64 = 600_000;
/// How often a full table looks for names to forget, at most: once a second.
pub const SWEEP_EVERY_MS: u64 = 1_000;
/// How stale a name's last sighting may be before a request refreshes it (so that most
/// requests only read: one write a second per name at most).
const SEEN_RESOLUTION_MS: u64 = 1_000;

/// One policy name's limit and when a request last gave it.
#[derive(Debug)]
struct Known {
    spec: LimitSpec,
    last_seen_ms: AtomicU64,
}

/// What one [`KnownPolicies::learn`] did, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Learned {
    /// Names held after it.
    pub known: usize,
    /// Names forgotten to make room.
    pub forgotten: usize,
    /// New names not learned: the table was full of recent ones.
    pub unlearned: usize,
}

/// Policy names, the limit each last came with, and when.
#[derive(Debug, Default)]
pub struct KnownPolicies {
    map: RwLock<HashMap<String, Known>>,
    /// Until then, a full table does not look for names to forget.
    next_sweep_ms: AtomicU64,
}

impl KnownPolicies {
    // Every change is one insert or one retain: a poisoned lock holds a whole map.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Known>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns the policies `entries` name, at `now_ms`. Almost every request names
    /// policies already known with the same limit: that is checked under the shared read
    /// lock (refreshing when each was seen), and only a new name or a changed limit takes
    /// the write lock.
    pub fn learn<'a>(&self, entries: impl IntoIterator<Item = &'a PlannedEntry> + Clone, now_ms: u64) -> Learned {
        let named = || entries.clone().into_iter().filter_map(|e| e.scope.policy.as_ref().map(|p| (p, e.limit.spec)));
        let mut learned = Learned::default();
        {
            let map = self.read();
            learned.known = map.len();
            let full = map.len() >= MAX_KNOWN_POLICIES;
            let sweep_due = now_ms >= self.next_sweep_ms.load(Ordering::Relaxed);
            let mut all_known = true;
            for (name, spec) in named() {
                match map.get(name) {
                    Some(known) if known.spec == spec => {
                        if known.last_seen_ms.load(Ordering::Relaxed).saturating_add(SEEN_RESOLUTION_MS) <= now_ms {
                            known.last_seen_ms.store(now_ms, Ordering::Relaxed);
                        }
                    }
                    // A new name in a full table that is not due to look for room.
                    None if full && !sweep_due => learned.unlearned += 1,
                    _ => all_known = false,
                }
            }
            if all_known {
                return learned;
            }
        }
        learned.unlearned = 0;
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        for (name, spec) in named() {
            if let Some(known) = map.get_mut(name) {
                known.spec = spec;
                known.last_seen_ms.store(now_ms, Ordering::Relaxed);
                continue;
            }
            if map.len() >= MAX_KNOWN_POLICIES && now_ms >= self.next_sweep_ms.load(Ordering::Relaxed) {
                self.next_sweep_ms.store(now_ms.saturating_add(SWEEP_EVERY_MS), Ordering::Relaxed);
                let before = map.len();
                map.retain(|_, known| {
                    known.last_seen_ms.load(Ordering::Relaxed).saturating_add(FORGET_AFTER_MS) > now_ms
                });
                learned.forgotten += before - map.len();
            }
            if map.len() < MAX_KNOWN_POLICIES {
                map.insert(name.clone(), Known { spec, last_seen_ms: AtomicU64::new(now_ms) });
            } else {
                learned.unlearned += 1;
            }
        }
        learned.known = map.len();
        learned
    }

    /// The limit `name` last came with, if a request named it.
    pub fn get(&self, name: &str) -> Option<LimitSpec> {
        self.read().get(name).map(|known| known.spec)
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether no name is held.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }
}

impl KnownPolicies {
    /// Whether `item` is for a policy a request named and, for a clamp, one its policy can
    /// be decided with. A clamp is a second limit decided beside the policy's own, so
    /// any numbers and any algorithm can only lower what gets through, except that a
    /// `leaky_bucket` clamp answers with delays, which only a `leaky_bucket` policy (a
    /// shaper) gives its callers.
    ///
    /// # Errors
    /// `400 unknown_policy` naming `policy` (and saying when the table of names is full),
    /// or `400 invalid_clamp` naming `limit`.
    pub fn check(&self, item: &Override) -> Result<(), ApiError> {
        let Some(known) = self.get(&item.policy) else {
            let full = if self.len() >= MAX_KNOWN_POLICIES {
                format!(
                    "; this instance's table of policy names is full ({MAX_KNOWN_POLICIES} names given by requests \
                     in the last {} minutes), so a new name is learned only once one has not been named for that long",
                    FORGET_AFTER_MS / 60_000
                )
            } else {
                String::new()
            };
            return Err(ApiError::bad_request(
                ErrorCode::UnknownPolicy,
                format!(
                    "policy: no proxy has asked this service about a policy named {:?} (it learns policy names \
                     from the requests of the proxies: check the name, or send it traffic first){full}",
                    item.policy
                ),
            ));
        };
        let shapes = |spec: &LimitSpec| spec.kind() == Algorithm::LeakyBucket;
        match (item.kind, item.limit) {
            (OverrideKind::Clamp, Some(clamp)) if shapes(&clamp) && !shapes(&known) => Err(ApiError::bad_request(
                ErrorCode::InvalidClamp,
                format!(
                    "limit: a leaky_bucket clamp answers with delays, which only a leaky_bucket policy gives its \
                     callers; the policy's own limit is {} (clamp it with any other algorithm)",
                    describe(&known)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// A limit as its JSON, for an error message.
fn describe(limit: &LimitSpec) -> String {
    serde_json::to_string(limit).unwrap_or_else(|_| format!("{limit:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Scope;
    use crate::spec::StoreLimit;

    fn named(policy: &str, burst: u64) -> PlannedEntry {
        PlannedEntry {
            storage_key: "sluice:{t}:v0:k".to_owned(),
            limit: StoreLimit::new(LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst }).unwrap(),
            cost: 1,
            scope: Scope { policy: Some(policy.to_owned()), version: 0, key: "k".to_owned() },
            expires: None,
        }
    }

    #[test]
    fn a_policy_is_known_with_the_limit_it_last_came_with_and_an_unnamed_entry_teaches_nothing() {
        let known = KnownPolicies::default();
        let unnamed = PlannedEntry { scope: Scope { policy: None, ..named("x", 1).scope }, ..named("x", 1) };

        known.learn([&named("a", 5), &unnamed], 0);
        known.learn([&named("a", 5)], 0);
        let first = known.get("a");
        known.learn([&named("a", 7), &named("b", 1)], 0);

        assert_eq!(first, Some(LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 5 }));
        assert_eq!(known.get("a"), Some(LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 7 }));
        assert!(known.get("b").is_some() && known.get("x").is_none());
    }

    #[test]
    fn a_full_table_forgets_names_not_given_for_ten_minutes_to_learn_new_ones_and_counts_what_it_could_not() {
        let known = KnownPolicies::default();
        for i in 0..MAX_KNOWN_POLICIES {
            known.learn([&named(&format!("flood-{i}"), 1)], 0);
        }
        // One real policy keeps being named; the flood's names are not.
        known.learn([&named("flood-7", 1)], FORGET_AFTER_MS - 2);

        let refused = known.learn([&named("real", 2)], FORGET_AFTER_MS - 1);
        // The refused look was at 599 999 ms: the next is due a second later.
        let learned = known.learn([&named("real", 2)], FORGET_AFTER_MS - 1 + SWEEP_EVERY_MS);

        assert_eq!((refused.unlearned, refused.forgotten), (1, 0), "nothing is old enough yet");
        assert!(known.get("real").is_some(), "learned once the flood's names were old enough: {learned:?}");
        assert_eq!(learned.forgotten, MAX_KNOWN_POLICIES - 1, "all but the one still named");
        assert!(known.get("flood-7").is_some() && known.get("flood-8").is_none());
    }

    #[test]
    fn a_full_table_looks_for_room_at_most_once_a_second() {
        let known = KnownPolicies::default();
        for i in 0..MAX_KNOWN_POLICIES {
            known.learn([&named(&format!("n-{i}"), 1)], 0);
        }

        let first = known.learn([&named("new-a", 1)], 10);
        let second = known.learn([&named("new-b", 1)], 20);

        assert_eq!(first.unlearned, 1);
        assert_eq!(second.unlearned, 1, "refused without taking the write lock: the next look is due at 1 010 ms");
        assert_eq!(known.next_sweep_ms.load(Ordering::Relaxed), 10 + SWEEP_EVERY_MS);
    }
}

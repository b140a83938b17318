//! The policies this instance has been asked about: each name a request gave, with the
//! limit it last came with. The service has no filter configuration of its own, so this
//! is how it tells an override for a policy no proxy knows (a typo, in an incident) from
//! a real one, and a clamp that would raise a policy's numbers from one that lowers them.
//!
//! Learned from requests, so it starts empty: after a restart, an override for a policy
//! is refused until a proxy has sent a request for it (in a live fleet, within
//! milliseconds). Each instance learns on its own. At most [`MAX_KNOWN_POLICIES`] names
//! are kept; more are not learned (overrides for them are refused, and say why).

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use sluice_protocol::LimitSpec;

use crate::api::{ApiError, PlannedEntry};
use crate::overrides::{Override, OverrideKind};

/// The most policy names one instance remembers.
pub const MAX_KNOWN_POLICIES: usize = 10_000;

/// Policy names and the limit each last came with.
#[derive(Debug, Default)]
pub struct KnownPolicies {
    map: RwLock<HashMap<String, LimitSpec>>,
}

impl KnownPolicies {
    // Every change is one insert: a poisoned lock holds a whole map.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, LimitSpec>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns the policies `entries` name. Almost every request names policies already
    /// known with the same limit: that is checked under the shared read lock, and only
    /// a new name or a changed limit takes the write lock.
    pub fn learn<'a>(&self, entries: impl IntoIterator<Item = &'a PlannedEntry> + Clone) {
        let named = || entries.clone().into_iter().filter_map(|e| e.scope.policy.as_ref().map(|p| (p, e.limit.spec)));
        let known = {
            let map = self.read();
            let full = map.len() >= MAX_KNOWN_POLICIES;
            named().all(|(name, spec)| map.get(name).map_or(full, |known| *known == spec))
        };
        if known {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        for (name, spec) in named() {
            let room = map.len() < MAX_KNOWN_POLICIES;
            match map.get_mut(name) {
                Some(known) => *known = spec,
                None if room => {
                    map.insert(name.clone(), spec);
                }
                None => {}
            }
        }
    }

    /// The limit `name` last came with, if a request named it.
    pub fn get(&self, name: &str) -> Option<LimitSpec> {
        self.read().get(name).copied()
    }
}

impl KnownPolicies {
    /// Whether `item` is for a policy a request named and, for a clamp, lowers its limit.
    ///
    /// # Errors
    /// `400 unknown_policy` naming `policy`, or `400 clamp_above_policy` naming `limit`.
    pub fn check(&self, item: &Override) -> Result<(), ApiError> {
        let Some(known) = self.get(&item.policy) else {
            return Err(ApiError::bad_request(
                "unknown_policy",
                format!(
                    "policy: no proxy has asked this service about a policy named {:?} (it learns policy names \
                     from the requests of the proxies: check the name, or send it traffic first)",
                    item.policy
                ),
            ));
        };
        match (item.kind, item.limit) {
            (OverrideKind::Clamp, Some(clamp)) if !clamp.admits_at_most(&known) => Err(ApiError::bad_request(
                "clamp_above_policy",
                format!(
                    "limit: {} lets more through than the policy's own limit, {} (a clamp must use the same \
                     algorithm and no number that admits more)",
                    describe(&clamp),
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
        }
    }

    #[test]
    fn a_policy_is_known_with_the_limit_it_last_came_with_and_an_unnamed_entry_teaches_nothing() {
        let known = KnownPolicies::default();
        let unnamed = PlannedEntry { scope: Scope { policy: None, ..named("x", 1).scope }, ..named("x", 1) };

        known.learn([&named("a", 5), &unnamed]);
        known.learn([&named("a", 5)]);
        let first = known.get("a");
        known.learn([&named("a", 7), &named("b", 1)]);

        assert_eq!(first, Some(LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 5 }));
        assert_eq!(known.get("a"), Some(LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 7 }));
        assert!(known.get("b").is_some() && known.get("x").is_none());
    }
}

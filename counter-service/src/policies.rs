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
use std::sync::{Mutex, PoisonError};

use sluice_protocol::LimitSpec;

use crate::api::{ApiError, PlannedEntry};
use crate::overrides::{Override, OverrideKind};

/// The most policy names one instance remembers.
pub const MAX_KNOWN_POLICIES: usize = 10_000;

/// Policy names and the limit each last came with.
#[derive(Debug, Default)]
pub struct KnownPolicies {
    map: Mutex<HashMap<String, LimitSpec>>,
}

impl KnownPolicies {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, LimitSpec>> {
        // Every change is one insert: a poisoned lock holds a whole map.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns the policies `entries` name.
    pub fn learn<'a>(&self, entries: impl IntoIterator<Item = &'a PlannedEntry>) {
        let mut named =
            entries.into_iter().filter_map(|e| e.scope.policy.as_ref().map(|p| (p, e.limit.spec))).peekable();
        if named.peek().is_none() {
            return;
        }
        let mut map = self.map();
        for (name, spec) in named {
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
        self.map().get(name).copied()
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

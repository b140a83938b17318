//! How many times a guest crossed into its host, and entered the functions a test asked
//! to probe ([`crate::HostBuilder::count_calls_to`]): counts, not times, so that a test
//! can hold a filter to a per-request budget on any machine.

use std::collections::BTreeMap;
use std::ops::Sub;

/// The name under which the host's calls into the guest's allocator are counted: Envoy
/// re-enters the VM this way for every host call that hands the guest bytes (a header
/// value, a property, shared data), and each re-entry costs about what a callback does.
pub const ALLOCATOR_REENTRY: &str = "proxy_on_memory_allocate";

/// Counts by name: host functions the guest called (`proxy_get_header_map_value`,
/// `clock_time_get`, ...), the host's re-entries into the guest's allocator
/// ([`ALLOCATOR_REENTRY`]), and the guest's own probed functions (`malloc`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Calls the guest made to each host function (WASI ones included), and the host's
    /// allocator re-entries.
    pub host: BTreeMap<String, u64>,
    /// Entries into each probed guest function.
    pub guest: BTreeMap<String, u64>,
    /// Instructions the guest ran (wasmtime's fuel, one unit per instruction; 0 unless
    /// the host counts them: [`crate::HostBuilder::count_instructions`]).
    pub instructions: u64,
    /// The instructions each guest function ran itself, by name (empty unless the host
    /// profiles them: [`crate::HostBuilder::profile_instructions`]; functions that ran
    /// none are left out).
    pub profile: BTreeMap<String, u64>,
}

impl CallCounts {
    /// How many calls to host function `name`.
    pub fn host(&self, name: &str) -> u64 {
        self.host.get(name).copied().unwrap_or(0)
    }

    /// How many entries into probed guest function `name`.
    pub fn guest(&self, name: &str) -> u64 {
        self.guest.get(name).copied().unwrap_or(0)
    }

    /// Every host call, allocator re-entries excluded.
    pub fn host_calls(&self) -> u64 {
        self.host.iter().filter(|(name, _)| *name != ALLOCATOR_REENTRY).map(|(_, n)| n).sum()
    }

    /// Adds `other` to these counts (the sum over workers).
    pub fn add(&mut self, other: &Self) {
        for (name, n) in &other.host {
            *self.host.entry(name.clone()).or_default() += n;
        }
        for (name, n) in &other.guest {
            *self.guest.entry(name.clone()).or_default() += n;
        }
        self.instructions += other.instructions;
        for (name, n) in &other.profile {
            *self.profile.entry(name.clone()).or_default() += n;
        }
    }
}

/// A VM's running count of its host calls. A call is counted by its name's address
/// first (each call site passes the same `&'static str`), so counting the fifty-odd
/// host calls of a request costs no string comparison; a name seen at a new address is
/// matched by its text.
#[derive(Debug, Default)]
pub(crate) struct Tally(Vec<(&'static str, u64)>);

impl Tally {
    /// Counts one call to `name`.
    pub(crate) fn bump(&mut self, name: &'static str) {
        if let Some(entry) = self.0.iter_mut().find(|(n, _)| std::ptr::eq(*n, name)) {
            entry.1 += 1;
        } else if let Some(entry) = self.0.iter_mut().find(|(n, _)| *n == name) {
            entry.1 += 1;
        } else {
            self.0.push((name, 1));
        }
    }

    /// The counts by name.
    pub(crate) fn by_name(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for (name, n) in &self.0 {
            *counts.entry((*name).to_owned()).or_default() += n;
        }
        counts
    }
}

/// What happened between two readings: `after - before`, leaving out the names that did
/// not move.
impl Sub for &CallCounts {
    type Output = CallCounts;

    fn sub(self, before: Self) -> CallCounts {
        let since = |after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>| {
            after
                .iter()
                .map(|(name, n)| (name.clone(), n.saturating_sub(before.get(name).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        CallCounts {
            host: since(&self.host, &before.host),
            guest: since(&self.guest, &before.guest),
            instructions: self.instructions.saturating_sub(before.instructions),
            profile: since(&self.profile, &before.profile),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(host: &[(&str, u64)], guest: &[(&str, u64)]) -> CallCounts {
        let map = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        CallCounts { host: map(host), guest: map(guest), instructions: 0, profile: BTreeMap::new() }
    }

    #[test]
    fn a_tally_counts_a_name_passed_from_two_places_as_one() {
        let mut tally = Tally::default();
        let elsewhere = String::from("proxy_log").leak();
        tally.bump("proxy_log");
        tally.bump("clock_time_get");
        tally.bump(elsewhere);
        tally.bump("proxy_log");
        let expected: BTreeMap<String, u64> =
            [("clock_time_get".to_owned(), 1), ("proxy_log".to_owned(), 3)].into_iter().collect();
        assert_eq!(tally.by_name(), expected);
    }

    #[test]
    fn the_difference_of_two_readings_keeps_only_what_moved() {
        let before = counts(&[("proxy_log", 3), ("clock_time_get", 1)], &[("malloc", 10)]);
        let after = counts(&[("proxy_log", 3), ("clock_time_get", 2), ("proxy_get_shared_data", 1)], &[("malloc", 12)]);

        assert_eq!(&after - &before, counts(&[("clock_time_get", 1), ("proxy_get_shared_data", 1)], &[("malloc", 2)]));
    }

    #[test]
    fn allocator_reentries_are_not_host_calls() {
        let reading = counts(&[(ALLOCATOR_REENTRY, 2), ("proxy_get_header_map_value", 1)], &[]);

        assert_eq!(reading.host_calls(), 1);
        assert_eq!(reading.host(ALLOCATOR_REENTRY), 2);
    }
}

//! One compiled struct per policy: the validated policy with everything the request
//! path needs beside it (its slot table, the key shared by callers missing a key part,
//! or for a global policy the limit the service receives and the emergency cap).

use super::namespace::{emergency_table, lease_table, local_table};
use crate::config::{Lease, MAX_CONFIGURED_AMOUNT, Policy, ResponseCost, Strategy};
use shared_store::{Limit, Placement, SlotTable};
use sluice_protocol::LimitSpec;

/// A policy, compiled against one plugin's namespace.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// Its position in the configuration: the metric index.
    pub(crate) index: usize,
    /// As configured.
    pub(crate) policy: Policy,
    /// Where its budget lives.
    pub(crate) home: Home,
}

/// Where a policy's budget lives.
#[derive(Debug)]
pub(crate) enum Home {
    /// In this proxy's shared data.
    Local(Table),
    /// At the counter service; `cap` decides while the service cannot.
    Global {
        /// The limit as the service receives it.
        spec: LimitSpec,
        /// The emergency cap, a local bucket per caller.
        cap: Option<Cap>,
        /// Lease mode: the leases' settings and records.
        lease: Option<Leased>,
    },
}

/// A slot table with its companions in shared data.
#[derive(Debug)]
pub(crate) struct Table {
    /// The callers' slots and the overflow bucket.
    pub(crate) slots: SlotTable,
    /// The bucket shared by requests missing a key part.
    pub(crate) missing: Placement,
    /// The key recording the table's size.
    pub(crate) meta: String,
}

impl Table {
    fn new(base: String, slots: std::num::NonZeroU32) -> Self {
        let missing = Placement::dedicated(format!("{base}missing"));
        let meta = format!("{base}meta");
        Self { slots: SlotTable::new(base, slots), missing, meta }
    }

    /// Every key the table can create: slots, overflow, missing bucket and size record.
    pub(crate) fn max_keys(&self) -> u64 {
        self.slots.max_keys().saturating_add(2)
    }
}

/// A lease policy's leases.
#[derive(Debug)]
pub(crate) struct Leased {
    /// Their settings.
    pub(crate) config: Lease,
    /// Their records, one slot per caller key.
    pub(crate) table: SlotTable,
    /// The key recording the table's size.
    pub(crate) meta: String,
}

/// A global policy's emergency cap.
#[derive(Debug)]
pub(crate) struct Cap {
    /// Its numbers.
    pub(crate) limit: Limit,
    /// Its buckets.
    pub(crate) table: Table,
}

impl Compiled {
    /// Compiles `policy`, the `index`-th of the configuration, under `prefix`.
    pub(crate) fn new(index: usize, policy: Policy, prefix: &str) -> Self {
        let home = match (&policy.global, policy.emergency) {
            (Some(global), emergency) => Home::Global {
                spec: global.spec,
                cap: emergency.map(|limit| Cap {
                    limit,
                    table: Table::new(emergency_table(prefix, &policy.name, policy.version), policy.slots),
                }),
                lease: match global.strategy {
                    Strategy::Check => None,
                    Strategy::Lease(config) => {
                        let base = lease_table(prefix, &policy.name, policy.version);
                        let meta = format!("{base}meta");
                        Some(Leased { config, table: SlotTable::new(base, policy.slots), meta })
                    }
                },
            },
            (None, _) => Home::Local(Table::new(local_table(prefix, &policy.name, policy.version), policy.slots)),
        };
        Self { index, policy, home }
    }

    /// The slot tables it keeps in shared data (none, or one).
    pub(crate) fn table(&self) -> Option<&Table> {
        match &self.home {
            Home::Local(table) => Some(table),
            Home::Global { cap, .. } => cap.as_ref().map(|c| &c.table),
        }
    }

    /// The keys recording the size of each slot table it keeps: its buckets' or its
    /// emergency cap's, and its lease records'.
    pub(crate) fn size_records(&self) -> impl Iterator<Item = &str> {
        let lease = match &self.home {
            Home::Global { lease: Some(leased), .. } => Some(leased.meta.as_str()),
            _ => None,
        };
        self.table().map(|t| t.meta.as_str()).into_iter().chain(lease)
    }
}

/// How many requests' `max` a caller's bucket may owe at once, for a cost the response
/// reports. A bucket below empty admits nothing, so its debt comes only from requests
/// already in flight when it went below: with fewer than this many in flight per caller,
/// nothing is ever forgiven.
pub const MAX_OWING_REQUESTS: u64 = 64;

/// The most a bucket can owe after settling a cost the response reports:
/// [`MAX_OWING_REQUESTS`] requests' `max` (within the configurable amounts). Anything
/// charged beyond it is forgiven.
pub(crate) fn debt_bound(rule: &ResponseCost) -> u64 {
    rule.max.saturating_mul(MAX_OWING_REQUESTS).min(MAX_CONFIGURED_AMOUNT)
}

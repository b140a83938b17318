//! What every stage of the request path reads and the worker's bookkeeping it writes:
//! the compiled policies, the response settings, the counter service (with its circuit
//! breaker), and this worker's outbox, owed charges and ids. Built once per
//! configuration by `Engine::new`; the stages take it by reference.

use super::breaker::CircuitBreaker;
use super::calls::{Outgoing, PendingCharges, Reviews, Target};
use super::cause::LogLimiter;
use super::check_group::CheckGroup;
use super::compiled::{Compiled, Home, Leased};
use super::held::Held;
use super::lease_record::Leases;
use super::settle_queue::SettleQueue;
use crate::config::{KeyPart, Response, Secret, Shaping};
use crate::host::{Call, Callouts};
use shared_store::{HashKey, Nanos, Store};
use std::cell::{Cell, RefCell};

/// How long an elected refill holds beyond the callout's deadline: the time until the
/// root sends it (a wake, or at worst the next tick), with room to spare.
pub(crate) const REFILL_MARGIN: Nanos = Nanos::from_millis(100);
/// The most keys one worker remembers to charge; beyond it, debt waits in its record
/// until the key refills again or its life ends (then it is forgiven, and counted).
pub(crate) const MAX_PENDING_CHARGES: usize = 4096;

/// The most check-mode settlements one worker holds, waiting to be sent (or sent again);
/// beyond it, a settlement is forgiven and counted.
pub(crate) const MAX_PENDING_SETTLEMENTS: usize = 4096;

/// The counter service, as the request path uses it.
#[derive(Debug)]
pub(crate) struct Service {
    pub(crate) cluster: String,
    pub(crate) authority: String,
    pub(crate) timeout_ms: u32,
    pub(crate) timeout: Nanos,
    /// `Bearer <token>`: a [`Secret`] so that no `Debug` print shows it.
    pub(crate) authorization: Option<Secret>,
    pub(crate) partition: Vec<KeyPart>,
    pub(crate) secret: HashKey,
    pub(crate) breaker: CircuitBreaker,
    /// This worker's check calls out, and the checks waiting to go together.
    pub(crate) group: RefCell<CheckGroup>,
}

impl Service {
    /// Tells the circuit breaker how a call sent at `sent_at` went (`health`: see
    /// `CircuitBreaker::record`), and counts the circuit opening if it did.
    pub(crate) fn record_health(
        &self,
        store: &impl Store,
        now: Nanos,
        health: Option<bool>,
        sent_at: Nanos,
        metrics: &mut impl crate::host::Metrics,
    ) {
        if self.breaker.record(store, now, health, sent_at) {
            metrics.add_plugin(crate::host::PluginCounter::CircuitOpened, 1);
        }
    }

    /// Sends `body` to the service's `path` (a POST with the token, if one is
    /// configured) within the callout deadline; the host's token for the answer.
    pub(crate) fn dispatch(
        &self,
        path: &str,
        body: &[u8],
        callouts: &mut (impl Callouts + ?Sized),
    ) -> Result<u32, crate::host::DispatchError> {
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", &self.authority),
            ("content-type", "application/json"),
        ];
        if let Some(authorization) = &self.authorization {
            headers.push(("authorization", authorization.expose()));
        }
        callouts.dispatch(&Call { cluster: &self.cluster, headers: &headers, body, timeout_ms: self.timeout_ms })
    }
}

/// The configuration compiled against one plugin's identity and hash secrets, with the
/// worker's own bookkeeping.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) policies: Vec<Compiled>,
    pub(crate) response: Response,
    pub(crate) shaping: Shaping,
    pub(crate) stat_prefix: String,
    /// How often the worker hands counts kept in the VM to the proxy (`None`: at once).
    pub(crate) metrics_flush_ms: Option<u32>,
    pub(crate) secret: HashKey,
    pub(crate) service: Option<Service>,
    pub(crate) degraded: RefCell<LogLimiter>,
    /// How long each global policy has been decided by a fallback on this worker.
    pub(crate) spells: RefCell<super::spells::Spells>,
    /// When each operator's override was last logged.
    pub(crate) overrides_logged: RefCell<super::cause::OverrideLog>,
    /// The key written to create keys atomically.
    pub(crate) anchor: String,
    /// Calls the root context is to send (lease refills and charges).
    pub(crate) outbox: RefCell<Vec<Outgoing>>,
    /// Keys this worker owes charges for.
    pub(crate) charges: RefCell<PendingCharges>,
    /// Check-mode settlements and lease returns not yet applied.
    pub(crate) settlements: RefCell<SettleQueue>,
    /// Grants this worker applied, to review for tokens it will not spend.
    pub(crate) reviews: RefCell<Reviews>,
    /// This worker's instance: ids it hands out (waiters, charges) start from it.
    pub(crate) instance: u64,
    pub(crate) ids: Cell<u64>,
    /// Where the sweep for unknown debt goes on (see `outgoing::SWEEP_PER_TICK`).
    pub(crate) sweep: Cell<u64>,
    /// The concurrency slots this worker holds.
    pub(crate) held: RefCell<Held>,
}

impl Setup {
    /// The `index`-th policy.
    pub(crate) fn compiled(&self, index: usize) -> Option<&Compiled> {
        self.policies.get(index)
    }

    /// The `index`-th policy's leases, when it is a lease policy.
    pub(crate) fn leased_home(&self, index: usize) -> Option<&Leased> {
        match &self.compiled(index)?.home {
            Home::Global { lease: Some(leased), .. } => Some(leased),
            _ => None,
        }
    }

    /// The lease records in `store`.
    pub(crate) fn leases<'a, S: Store>(&'a self, store: &'a S) -> Leases<'a, S> {
        Leases { store, anchor: &self.anchor }
    }

    /// How long an elected refill (and a request waiting for it) may take.
    pub(crate) fn refill_window(&self) -> Nanos {
        self.service.as_ref().map_or(Nanos::from_secs(1), |s| s.timeout).saturating_add(REFILL_MARGIN)
    }

    /// A fresh id, never 0.
    pub(crate) fn next_id(&self) -> u64 {
        loop {
            let n = self.ids.get().wrapping_add(1);
            self.ids.set(n);
            let id = self.instance.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            if id != 0 {
                return id;
            }
        }
    }

    /// Puts a call in the outbox, for the root context to send; gives it back when the
    /// outbox is in use further up the stack.
    pub(crate) fn send_later(&self, call: Outgoing) -> Result<(), Outgoing> {
        match self.outbox.try_borrow_mut() {
            Ok(mut outbox) => {
                outbox.push(call);
                Ok(())
            }
            Err(_) => Err(call),
        }
    }

    /// Remembers that this worker owes a charge for `target`'s key (at most
    /// [`MAX_PENDING_CHARGES`] keys).
    pub(crate) fn schedule_charge(&self, target: Target) {
        if let Ok(mut charges) = self.charges.try_borrow_mut()
            && (charges.len() < MAX_PENDING_CHARGES || charges.contains_key(&target.slot.key))
        {
            charges.insert(target.slot.key.clone(), target);
        }
    }
}

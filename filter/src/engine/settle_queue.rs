//! The check-mode settlements a worker has not yet seen applied, by aim: at most one
//! call in flight per aim, and what comes meanwhile summed into one settlement waiting
//! behind it.
//!
//! An aim is one caller's counter moved one way: a charge, or a credit of spends in one
//! window (spent-at ÷ the limit's period), for one purpose (a response's cost, a refund,
//! a lease's return). Summing is
//! exact within an aim: charges add, credits of one window commute, and a token
//! bucket's credits add up to the credit of their sum (`shared_store::Limit::credit`).
//!
//! Why: a busy caller's responses each end with a settlement. Sent one by one, a
//! saturated proxy made two calls per request, and the service remembered an id for
//! every one of them. Behind one call in flight, the settlements of a busy aim go out
//! at most once per round trip, however many requests end meanwhile; a quiet aim's
//! settlement goes out at once, as before.
//!
//! A settlement whose call failed is kept apart (`tried`): it may have been applied, so
//! it is sent again as it is, with its id, never summed with another.

use super::calls::{Change, Purpose, Settlement};
use shared_store::Nanos;
use std::collections::{BTreeMap, VecDeque};

/// Where a settlement goes: the settlements of one aim can be summed into one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Aim {
    policy: usize,
    key: u128,
    tag: String,
    /// `None` for a charge; a credit's window.
    credit_window: Option<u64>,
    purpose: Purpose,
}

impl Aim {
    pub(crate) fn of(settlement: &Settlement) -> Self {
        let credit_window = match settlement.change {
            Change::Charge(_) => None,
            Change::Credit { .. } => Some(settlement.window),
        };
        Self {
            policy: settlement.policy,
            key: settlement.key,
            tag: settlement.tag.clone(),
            credit_window,
            purpose: settlement.purpose,
        }
    }
}

/// One aim's settlements waiting to be sent.
#[derive(Debug, Default)]
struct Lane {
    /// Sent before and not applied, oldest first: each goes again as it is.
    tried: VecDeque<Settlement>,
    /// Never sent: what came since, summed.
    fresh: Option<Settlement>,
}

impl Lane {
    fn len(&self) -> usize {
        self.tried.len() + usize::from(self.fresh.is_some())
    }

    /// When its oldest settlement was queued.
    fn since(&self) -> Option<Nanos> {
        self.tried.iter().chain(&self.fresh).map(|s| s.since).min()
    }

    /// The next to send: the oldest tried one, else the fresh one.
    fn next(&mut self) -> Option<Settlement> {
        self.tried.pop_front().or_else(|| self.fresh.take())
    }
}

/// What a new settlement became.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Added {
    /// Nothing of its aim is in flight or waiting: send it now (its aim is now taken).
    SendNow(Settlement),
    /// Summed into the one waiting, or waiting behind the call in flight.
    Waiting,
}

/// A worker's settlements not yet applied: those waiting, by aim, and the aims with a
/// call taken out to be sent (in the outbox, or in flight), with that settlement's id.
#[derive(Debug)]
pub(crate) struct SettleQueue {
    lanes: BTreeMap<Aim, Lane>,
    taken: BTreeMap<Aim, u64>,
    /// Settlements waiting, over all lanes.
    len: usize,
    max: usize,
}

impl SettleQueue {
    /// An empty queue that holds at most `max` settlements waiting.
    pub(crate) fn new(max: usize) -> Self {
        Self { lanes: BTreeMap::new(), taken: BTreeMap::new(), len: 0, max }
    }

    /// Settlements waiting (not those taken out to be sent).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A new settlement, never sent: sent now, summed into the one waiting for its aim,
    /// or waiting; `Err` (it is not kept) when it would wait and `max` already do.
    pub(crate) fn add(&mut self, settlement: Settlement) -> Result<Added, Settlement> {
        let aim = Aim::of(&settlement);
        if let Some(fresh) = self.lanes.get_mut(&aim).and_then(|lane| lane.fresh.as_mut()) {
            fresh.change = fresh.change.plus(settlement.change.units());
            fresh.since = fresh.since.min(settlement.since);
            return Ok(Added::Waiting);
        }
        if !self.taken.contains_key(&aim) && !self.lanes.contains_key(&aim) {
            self.taken.insert(aim, settlement.id);
            return Ok(Added::SendNow(settlement));
        }
        if self.len >= self.max {
            return Err(settlement);
        }
        self.lanes.entry(aim).or_default().fresh = Some(settlement);
        self.len += 1;
        Ok(Added::Waiting)
    }

    /// A settlement not applied, to send again as it is; `Err` when `max` already wait.
    /// Its aim is not released: [`SettleQueue::release`] does that.
    pub(crate) fn hold(&mut self, settlement: Settlement) -> Result<(), Settlement> {
        if self.len >= self.max {
            return Err(settlement);
        }
        self.lanes.entry(Aim::of(&settlement)).or_default().tried.push_back(settlement);
        self.len += 1;
        Ok(())
    }

    /// The call taken out for `settlement` ended: the service `answered` it (applied,
    /// or refused for good), or not (a timeout, a failure, a call never sent). When it
    /// answered, the settlement waiting for the aim, if any, is returned to send now and
    /// takes the aim; otherwise the aim is free, and what waits goes on the tick
    /// ([`SettleQueue::take`]). Nothing happens for a settlement that did not take its
    /// aim (one taken out past its life, to be forgiven).
    pub(crate) fn release(&mut self, settlement: &Settlement, answered: bool) -> Option<Settlement> {
        let aim = Aim::of(settlement);
        if self.taken.get(&aim) != Some(&settlement.id) {
            return None;
        }
        if answered && let Some(next) = self.next_of(&aim) {
            self.taken.insert(aim, next.id);
            return Some(next);
        }
        self.taken.remove(&aim);
        None
    }

    /// Up to `n` settlements to send now, the aims waiting longest first, one per aim
    /// that has no call taken out; their aims are taken.
    pub(crate) fn take(&mut self, n: usize) -> Vec<Settlement> {
        let mut free: Vec<(Nanos, Aim)> = self
            .lanes
            .iter()
            .filter(|(aim, _)| !self.taken.contains_key(*aim))
            .filter_map(|(aim, lane)| Some((lane.since()?, aim.clone())))
            .collect();
        free.sort();
        free.truncate(n);
        let mut out = Vec::with_capacity(free.len());
        for (_, aim) in free {
            if let Some(next) = self.next_of(&aim) {
                self.taken.insert(aim, next.id);
                out.push(next);
            }
        }
        out
    }

    /// Takes out every waiting settlement queued at or before `before` (past its life,
    /// to be forgiven), leaving the others; they take no aim.
    pub(crate) fn take_expired(&mut self, before: Nanos) -> Vec<Settlement> {
        let mut out = Vec::new();
        for lane in self.lanes.values_mut() {
            let (expired, kept): (Vec<Settlement>, Vec<Settlement>) =
                lane.tried.drain(..).partition(|s| s.since <= before);
            lane.tried.extend(kept);
            out.extend(expired);
            if lane.fresh.as_ref().is_some_and(|s| s.since <= before) {
                out.extend(lane.fresh.take());
            }
        }
        self.lanes.retain(|_, lane| lane.len() > 0);
        self.len -= out.len();
        out
    }

    /// Takes out everything waiting, and frees every aim.
    pub(crate) fn drain(&mut self) -> Vec<Settlement> {
        let out: Vec<Settlement> = std::mem::take(&mut self.lanes)
            .into_values()
            .flat_map(|lane| lane.tried.into_iter().chain(lane.fresh))
            .collect();
        self.taken.clear();
        self.len = 0;
        out
    }

    fn next_of(&mut self, aim: &Aim) -> Option<Settlement> {
        let lane = self.lanes.get_mut(aim)?;
        let next = lane.next();
        if lane.len() == 0 {
            self.lanes.remove(aim);
        }
        if next.is_some() {
            self.len -= 1;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 4;

    fn charge(key: u128, units: u64, since: u64) -> Settlement {
        Settlement {
            policy: 0,
            key,
            tag: "t".to_owned(),
            change: Change::Charge(units),
            id: u64::try_from(key).unwrap() * 1000 + since,
            since: Nanos(since),
            purpose: Purpose::Cost,
            window: 0,
        }
    }

    fn credit(key: u128, units: u64, window: u64, since: u64) -> Settlement {
        let change = Change::Credit { units, spent_at_ns: window * 10 };
        Settlement { change, window, ..charge(key, units, since) }
    }

    fn sent_now(added: Result<Added, Settlement>) -> Settlement {
        match added {
            Ok(Added::SendNow(s)) => s,
            other => panic!("expected to send now, got {other:?}"),
        }
    }

    #[test]
    fn a_quiet_aims_settlement_is_sent_at_once() {
        let mut q = SettleQueue::new(MAX);
        assert_eq!(sent_now(q.add(charge(1, 5, 1))).change, Change::Charge(5));
        assert_eq!(sent_now(q.add(charge(2, 5, 1))).key, 2, "another caller's aim is its own");
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn settlements_that_come_while_one_is_in_flight_are_summed_and_sent_once_it_is_applied() {
        let mut q = SettleQueue::new(MAX);
        let first = sent_now(q.add(charge(1, 5, 1)));
        for n in 2..=4 {
            assert_eq!(q.add(charge(1, n, n)), Ok(Added::Waiting));
        }
        assert_eq!(q.len(), 1, "summed into one");
        assert!(q.take(10).is_empty(), "the aim has a call out");
        let next = q.release(&first, true).expect("the sum goes next");
        assert_eq!((next.change, next.since, next.id), (Change::Charge(2 + 3 + 4), Nanos(2), 1002));
        assert_eq!(q.add(charge(1, 1, 9)), Ok(Added::Waiting), "the aim is still taken by the sum");
        assert!(q.release(&next, true).is_some());
    }

    #[test]
    fn credits_of_two_windows_a_charge_and_a_refund_are_four_aims() {
        let mut q = SettleQueue::new(MAX);
        let first = sent_now(q.add(credit(1, 5, 7, 1)));
        let _ = sent_now(q.add(credit(1, 5, 8, 1)));
        let _ = sent_now(q.add(charge(1, 5, 1)));
        let _ = sent_now(q.add(Settlement { purpose: Purpose::Refund, ..credit(1, 5, 7, 1) }));
        assert_eq!(q.add(credit(1, 2, 7, 2)), Ok(Added::Waiting));
        assert_eq!(q.add(credit(1, 3, 7, 3)), Ok(Added::Waiting));
        let next = q.release(&first, true).expect("the window's sum");
        assert_eq!(next.change, Change::Credit { units: 5, spent_at_ns: 70 });
    }

    #[test]
    fn a_settlement_whose_call_failed_is_never_summed_and_waits_for_the_tick() {
        let mut q = SettleQueue::new(MAX);
        let first = sent_now(q.add(charge(1, 5, 1)));
        assert_eq!(q.add(charge(1, 2, 2)), Ok(Added::Waiting));
        // Not applied: held to go again as it is, and nothing is handed out at once.
        q.hold(first.clone()).unwrap();
        assert_eq!(q.release(&first, false), None);
        assert_eq!(q.add(charge(1, 3, 3)), Ok(Added::Waiting));
        assert_eq!(q.len(), 2);
        let again = q.take(10);
        assert_eq!(again, vec![first.clone()], "the tried one first, as it was, and one per aim");
        assert!(q.take(10).is_empty());
        let next = q.release(&first, true).expect("then the sum");
        assert_eq!(next.change, Change::Charge(5));
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_release_by_a_settlement_that_did_not_take_its_aim_changes_nothing() {
        let mut q = SettleQueue::new(MAX);
        let first = sent_now(q.add(charge(1, 5, 1)));
        assert_eq!(q.add(charge(1, 2, 2)), Ok(Added::Waiting));
        let stray = charge(1, 9, 0);
        assert_eq!(q.release(&stray, true), None);
        assert_eq!(q.add(charge(1, 1, 3)), Ok(Added::Waiting), "the aim is still the first's");
        assert_eq!(q.release(&first, true).map(|s| s.change), Some(Change::Charge(3)));
    }

    #[test]
    fn the_tick_sends_the_aims_waiting_longest_first() {
        let mut q = SettleQueue::new(MAX);
        for (key, since) in [(1, 30), (2, 10), (3, 20)] {
            let s = sent_now(q.add(charge(key, 1, since)));
            q.hold(s.clone()).unwrap();
            q.release(&s, false);
        }
        let keys: Vec<u128> = q.take(2).iter().map(|s| s.key).collect();
        assert_eq!(keys, vec![2, 3]);
    }

    #[test]
    fn beyond_its_bound_a_settlement_comes_back_and_a_sum_still_grows() {
        let mut q = SettleQueue::new(1);
        let _ = sent_now(q.add(charge(1, 1, 1)));
        let _ = sent_now(q.add(charge(2, 1, 1)));
        assert_eq!(q.add(charge(1, 1, 2)), Ok(Added::Waiting));
        assert_eq!(q.add(charge(2, 4, 2)), Err(charge(2, 4, 2)));
        assert_eq!(q.add(charge(1, 1, 3)), Ok(Added::Waiting), "summing takes no room");
        assert_eq!(q.hold(charge(3, 1, 1)), Err(charge(3, 1, 1)));
    }

    /// What a driver of the queue does, as the root context would.
    #[derive(Debug, Clone)]
    enum Op {
        /// A response ends with a settlement for caller `key` (a credit of `window`, or a
        /// charge when `None`).
        Add { key: u8, window: Option<u8>, units: u8 },
        /// The call in flight at `index` (modulo) is answered: applied, or not (then held
        /// to go again).
        Answer { index: u8, applied: bool },
        /// The tick sends up to `n`.
        Take { n: u8 },
        /// The tick, with the service unreachable, takes out what was queued before `at`.
        Expire { at: u8 },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..3u8, proptest::option::of(0..2u8), 1..100u8)
                .prop_map(|(key, window, units)| Op::Add { key, window, units }),
            3 => (any::<u8>(), any::<bool>()).prop_map(|(index, applied)| Op::Answer { index, applied }),
            1 => (0..4u8).prop_map(|n| Op::Take { n }),
            1 => any::<u8>().prop_map(|at| Op::Expire { at }),
        ]
    }

    proptest::proptest! {
        /// Under any interleaving of new settlements, answers, failures, ticks and
        /// expiry: every unit is sent, waiting, applied, refused or expired (none lost or
        /// made up), no aim ever has two calls out, and a settlement sent again after a
        /// failure is sent as it was (same id, same units).
        #[test]
        fn every_unit_is_accounted_for_and_no_aim_has_two_calls_out(ops in proptest::collection::vec(op(), 1..200)) {
            let mut q = SettleQueue::new(MAX);
            let (mut added, mut applied, mut refused, mut expired) = (0u64, 0u64, 0u64, 0u64);
            let mut out: Vec<Settlement> = Vec::new();
            let mut tried: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                let since = u64::try_from(n).unwrap();
                match op {
                    Op::Add { key, window, units } => {
                        let s = match window {
                            Some(w) => credit(u128::from(key), u64::from(units), u64::from(w), since),
                            None => charge(u128::from(key), u64::from(units), since),
                        };
                        added += s.change.units();
                        match q.add(s) {
                            Ok(Added::SendNow(s)) => out.push(s),
                            Ok(Added::Waiting) => {}
                            Err(s) => refused += s.change.units(),
                        }
                    }
                    Op::Answer { index, applied: ok } if !out.is_empty() => {
                        let s = out.remove(usize::from(index) % out.len());
                        if ok {
                            applied += s.change.units();
                            out.extend(q.release(&s, true));
                        } else {
                            proptest::prop_assert_eq!(q.release(&s, false), None);
                            tried.insert(s.id, s.change.units());
                            if let Err(s) = q.hold(s) {
                                refused += s.change.units();
                            }
                        }
                    }
                    Op::Answer { .. } => {}
                    Op::Take { n } => {
                        for s in q.take(usize::from(n)) {
                            if let Some(units) = tried.get(&s.id) {
                                proptest::prop_assert_eq!(*units, s.change.units(), "sent again as it was");
                            }
                            out.push(s);
                        }
                    }
                    Op::Expire { at } => {
                        expired += q.take_expired(Nanos(u64::from(at))).iter().map(|s| s.change.units()).sum::<u64>();
                    }
                }
                let mut aims: Vec<Aim> = out.iter().map(Aim::of).collect();
                aims.sort();
                let before = aims.len();
                aims.dedup();
                proptest::prop_assert_eq!(before, aims.len(), "two calls out for one aim: {:?}", out);
            }
            let waiting: u64 = q.drain().iter().map(|s| s.change.units()).sum();
            let in_flight: u64 = out.iter().map(|s| s.change.units()).sum();
            proptest::prop_assert_eq!(added, applied + refused + expired + waiting + in_flight);
        }
    }

    #[test]
    fn expired_settlements_are_taken_out_and_the_rest_kept() {
        let mut q = SettleQueue::new(MAX);
        let first = sent_now(q.add(charge(1, 1, 5)));
        q.hold(first.clone()).unwrap();
        assert_eq!(q.add(charge(1, 2, 20)), Ok(Added::Waiting));
        q.release(&first, false);
        assert_eq!(q.take_expired(Nanos(10)), vec![first]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.drain(), vec![charge(1, 2, 20)]);
        assert_eq!((q.len(), q.take(10)), (0, vec![]));
        let _ = sent_now(q.add(charge(1, 1, 30)));
    }
}

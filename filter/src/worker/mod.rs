//! One worker's requests: the engine, the limiter, and the queues that hold paused
//! streams, behind a narrow [`Port`] to the host. The proxy-wasm glue (`wasm.rs`) only
//! forwards its callbacks here, so every path (the fallback ladder, the tick, a full
//! queue) runs in native tests too.
//!
//! # Never a paused stream left behind
//!
//! A request is paused only while it is in one of three queues of its worker: shaped
//! (until its turn), waiting for its check's answer (until its deadline, which the tick
//! enforces even if the host's own timeout never fires), or waiting for a lease refill
//! (retried when a refill's answer reaches this worker, and on every tick, until its
//! deadline). Every engine answer goes through `conclude`: a wait is queued, or, when it
//! cannot be (a full lease queue), decided at once; a decision is carried out. So no
//! decision can be dropped (`Begun` and `Decided` are `#[must_use]`). Carrying one out
//! always ends in a host action: resume, or local reply; a local reply the host refuses
//! is retried bare, then the stream is reset, and only if that fails too is the request
//! forwarded (counted as `reply_failures`, logged): there is no outcome in which the
//! stream stays paused.
//!
//! No `RefCell` borrow is held across a port call: a local reply runs the stream's
//! response callback at once, which comes back here.
//!
//! # Calls that outlive a request
//!
//! Lease refills and charges are sent by the root context, so that their answers reach
//! it even when the request that asked has ended. A request that puts one in the outbox
//! wakes the root through the worker's shared queue (`proxy_on_queue_ready` runs on the
//! next turn of the worker's event loop, not on the next tick); the tick sends whatever
//! is left. When a refill's answer arrives, the root retries this worker's waiting
//! requests at once.

mod batched;
mod costs;
mod port;
mod setup;
#[cfg(test)]
mod tests;

use crate::due::DueQueue;
use crate::engine::{
    Begun, Decided, Disposition, Engine, HeldSlots, LocalResponse, Outcome, Pending, SentOutgoing, Tally,
};
use crate::host::{CalloutAnswer, Counter, Metrics, PluginCounter, RequestFacts, ResponseFacts, Wait};
use crate::usage::MAX_HELD_PER_WORKER;
use batched::Batched;
use costs::StreamCosts;
pub use port::{Flow, Port};
pub use setup::{LEASE_TICK_MS, MAX_DEADLINE_TICK_MS, MetricName, metric_names, tick_period, wait_names};
use shared_store::{Clock, Limiter, Nanos, Store};
use std::cell::{Cell, RefCell, RefMut};
use std::collections::HashMap;

/// One worker's engine, limiter, metrics and held requests.
pub struct Worker<S, C, M> {
    engine: Engine,
    limiter: Limiter<S, C>,
    /// Counts, handed to the proxy at once or on the tick (`metrics_flush`).
    metrics: RefCell<Batched<M>>,
    /// Requests paused by shaping, until their turn.
    paused: RefCell<DueQueue<Tally>>,
    /// Requests waiting for the counter service's answer to their check, until their
    /// deadline.
    waiting: RefCell<DueQueue<Box<Pending>>>,
    /// Requests waiting for a lease refill, retried on every tick.
    lease_waiting: RefCell<HashMap<u32, Box<Pending>>>,
    /// Refills and charges the root context sent, by callout token.
    in_flight: RefCell<HashMap<u32, SentOutgoing>>,
    /// Headers to add to each forwarded request's response, by context id.
    response_headers: RefCell<HashMap<u32, Vec<(String, String)>>>,
    /// What each forwarded request spent on estimates, until its response reports the
    /// costs, by context id.
    costs: RefCell<HashMap<u32, StreamCosts>>,
    /// The concurrency slots each forwarded (or shaped) request holds until its stream
    /// ends, by context id.
    slots: RefCell<HashMap<u32, HeldSlots>>,
    /// Bytes the body readers of `costs` hold, across its streams: at most
    /// [`MAX_HELD_PER_WORKER`].
    body_bytes: Cell<usize>,
    /// This worker's shared queue, through which a request wakes the root context to
    /// send what it put in the outbox (`None`: the host has no shared queues; the tick
    /// sends it).
    wake: Option<u32>,
}

/// Takes what stream `id` holds in `map`, if anything. An empty map is not hashed into:
/// most streams hold nothing in most maps (a local policy without costs, concurrency or
/// headers on allowed responses holds nothing anywhere), and the hash of a lookup is
/// most of its cost.
fn take<V>(map: &RefCell<HashMap<u32, V>>, id: u32) -> Option<V> {
    let mut map = map.try_borrow_mut().ok()?;
    if map.is_empty() { None } else { map.remove(&id) }
}

/// Where a decision is carried out from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The request's own `on_http_request_headers`: the returned flow continues or
    /// pauses it.
    Headers,
    /// Another callback of the request itself (its callout's answer): it is paused and
    /// is the effective context.
    Own,
    /// The root context (a tick, a refill's answer): the request is paused, and must be
    /// made the effective context first.
    Root,
}

/// Whether a waiting request is new to its queue or already had its turn in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// It is new to the queue: the queue's bound applies.
    New,
    /// It was waiting there already (a retry that still waits).
    Kept,
}

/// The metrics for one callback; `Lost` if they are somehow borrowed already (a
/// callback re-entered), so that counting never panics.
enum Counts<'a, M> {
    Held(RefMut<'a, M>),
    Lost,
}

impl<M: Metrics> Metrics for Counts<'_, M> {
    fn add(&mut self, policy: usize, counter: crate::host::Counter, delta: i64) {
        if let Self::Held(metrics) = self {
            metrics.add(policy, counter, delta);
        }
    }

    fn add_plugin(&mut self, counter: PluginCounter, delta: i64) {
        if let Self::Held(metrics) = self {
            metrics.add_plugin(counter, delta);
        }
    }

    fn record_wait(&mut self, wait: crate::host::Wait, ms: u64) {
        if let Self::Held(metrics) = self {
            metrics.record_wait(wait, ms);
        }
    }
}

impl<S: Store, C: Clock, M: Metrics> Worker<S, C, M> {
    /// A worker with nothing held; `wake` is its shared queue, if the host has them.
    pub fn new(engine: Engine, limiter: Limiter<S, C>, metrics: M, wake: Option<u32>) -> Self {
        let metrics = Batched::new(metrics, engine.policies().count(), engine.metrics_flush_ms().is_some());
        Self {
            engine,
            metrics: RefCell::new(metrics),
            limiter,
            paused: RefCell::new(DueQueue::default()),
            waiting: RefCell::new(DueQueue::default()),
            lease_waiting: RefCell::new(HashMap::new()),
            in_flight: RefCell::new(HashMap::new()),
            response_headers: RefCell::new(HashMap::new()),
            costs: RefCell::new(HashMap::new()),
            slots: RefCell::new(HashMap::new()),
            body_bytes: Cell::new(0),
            wake,
        }
    }

    /// Its shared queue.
    pub fn wake_queue(&self) -> Option<u32> {
        self.wake
    }

    /// Reads its metrics as the proxy has them (tests).
    pub fn metrics(&self) -> Option<std::cell::Ref<'_, M>> {
        self.metrics.try_borrow().ok().map(|m| std::cell::Ref::map(m, Batched::inner))
    }

    /// The root context is done (a new configuration took over and its last stream has
    /// ended, or the VM stops): what it would still send is forgiven and counted, and
    /// its counts go to the proxy.
    pub fn retire(&self) {
        let in_flight: Vec<SentOutgoing> =
            self.in_flight.try_borrow_mut().map(|mut m| m.drain().map(|(_, s)| s).collect()).unwrap_or_default();
        self.engine.retire(in_flight, &mut self.counts());
        self.engine.release_all_slots(&self.limiter, &mut self.counts());
        self.engine.end_fallbacks(&mut self.counts());
        self.flush_metrics();
    }

    /// Hands counts kept in the VM to the proxy (the tick does this; so does the end of
    /// the VM).
    pub fn flush_metrics(&self) {
        if let Ok(mut metrics) = self.metrics.try_borrow_mut() {
            metrics.flush();
        }
    }

    /// How many requests it holds: paused, waiting for a check, waiting for a refill.
    pub fn held(&self) -> (usize, usize, usize) {
        let paused = self.paused.try_borrow().map_or(0, |q| q.len());
        let waiting = self.waiting.try_borrow().map_or(0, |q| q.len());
        let lease = self.lease_waiting.try_borrow().map_or(0, |q| q.len());
        (paused, waiting, lease)
    }

    fn counts(&self) -> Counts<'_, Batched<M>> {
        self.metrics.try_borrow_mut().map_or(Counts::Lost, Counts::Held)
    }

    fn room_to_pause(&self) -> bool {
        let max_paused = usize::try_from(self.engine.shaping().max_paused).unwrap_or(usize::MAX);
        self.paused.try_borrow().is_ok_and(|paused| paused.len() < max_paused)
    }

    /// A request's headers arrived: decide it.
    pub fn on_request_headers(&self, id: u32, request: &impl RequestFacts, port: &mut impl Port) -> Flow {
        let room = self.room_to_pause();
        let begun = self.engine.begin(request, &self.limiter, port, room, &mut self.counts());
        let flow = self.conclude(id, begun, Via::Headers, Entry::New, port);
        self.wake_root(port);
        flow
    }

    /// The answer to stream `id`'s check arrived (a late one, after the tick timed the
    /// wait out, changes nothing).
    pub fn on_check_answer(&self, id: u32, answer: &CalloutAnswer, port: &mut impl Port) {
        self.check_answered(id, answer, Via::Own, port);
    }

    fn check_answered(&self, id: u32, answer: &CalloutAnswer, via: Via, port: &mut impl Port) {
        let Some(pending) = self.waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(id)) else { return };
        let room = self.room_to_pause();
        let begun = self.engine.complete(pending, answer, &self.limiter, port, room, &mut self.counts());
        let _ = self.conclude(id, begun, via, Entry::New, port);
        self.wake_root(port);
    }

    /// The answer to a batch of checks (callout `token`) arrived: each request it
    /// carried that still waits is decided with its own result.
    fn batch_answered(&self, token: u32, answer: &CalloutAnswer, port: &mut impl Port) {
        let members: Vec<(u32, Box<Pending>)> = self
            .waiting
            .try_borrow_mut()
            .map(|mut q| {
                // In due order: the order they asked in, so the order of the batch.
                let ids = q.first_where(usize::MAX, |p| p.token() == Some(token));
                ids.into_iter().filter_map(|id| q.remove(id).map(|p| (id, p))).collect()
            })
            .unwrap_or_default();
        let room = self.room_to_pause();
        let decided = self.engine.complete_batch(members, answer, &self.limiter, port, room, &mut self.counts());
        for (id, begun) in decided {
            let _ = self.conclude(id, begun, Via::Root, Entry::New, port);
        }
    }

    /// Sends the checks that wait to go together, as many calls as the worker has room
    /// for (from the root context, which receives their answers).
    fn send_checks(&self, port: &mut impl Port) {
        loop {
            let size = self.engine.checks_to_send(self.limiter.clock());
            if size == 0 {
                return;
            }
            let batch: Vec<(u32, Box<Pending>)> = self
                .waiting
                .try_borrow_mut()
                .map(|mut q| {
                    let ids = q.first_where(size, |p| p.waits_to_be_sent());
                    ids.into_iter().filter_map(|id| q.remove(id).map(|p| (id, p))).collect()
                })
                .unwrap_or_default();
            if batch.is_empty() {
                // Counted as waiting but not held here: nothing to send.
                return;
            }
            let room = self.room_to_pause();
            let sent = self.engine.send_checks(batch, &self.limiter, port, room, &mut self.counts());
            for (id, begun) in sent {
                let _ = self.conclude(id, begun, Via::Root, Entry::Kept, port);
            }
        }
    }

    /// The headers to add to stream `id`'s response, taken once.
    pub fn take_response_headers(&self, id: u32) -> Option<Vec<(String, String)>> {
        take(&self.response_headers, id)
    }

    /// Stream `id`'s response headers arrived (`has_body`: a body follows): reads the
    /// costs they report, and says whether its body is to be read (passed to
    /// [`Self::on_response_body`]); costs with nothing left to read are settled now.
    pub fn on_response_headers(&self, id: u32, response: &impl ResponseFacts, has_body: bool) -> bool {
        let Some(mut costs) = take(&self.costs, id) else {
            return false;
        };
        if costs.on_headers(&self.engine, response, has_body)
            && let Ok(mut map) = self.costs.try_borrow_mut()
        {
            map.insert(id, costs);
            return true;
        }
        self.settle_costs(costs, true);
        false
    }

    /// Whether stream `id`'s response body is read for its costs.
    pub fn reads_response_body(&self, id: u32) -> bool {
        self.costs.try_borrow().is_ok_and(|map| !map.is_empty() && map.get(&id).is_some_and(StreamCosts::reads_body))
    }

    /// A chunk of stream `id`'s response body passed (a copy: nothing is held back; `None`
    /// when the host would not give it, which cuts the reading short); at the body's end
    /// the costs it reports are settled.
    pub fn on_response_body(&self, id: u32, chunk: Option<&[u8]>, end_of_stream: bool) {
        let Ok(mut map) = self.costs.try_borrow_mut() else { return };
        let lost = chunk.is_none();
        if let (Some(costs), Some(chunk)) = (map.get_mut(&id), chunk) {
            // Its room: the worker's bound, less what the other streams' readers hold.
            let others = self.body_bytes.get().saturating_sub(costs.held());
            costs.on_body(chunk, MAX_HELD_PER_WORKER.saturating_sub(others));
            self.body_bytes.set(others.saturating_add(costs.held()));
        }
        if !end_of_stream && !lost {
            return;
        }
        let costs = map.remove(&id);
        drop(map);
        if let Some(costs) = costs {
            self.settle_costs(costs, !lost);
        }
    }

    /// Stream `id`'s response trailers arrived: its body has ended (the last chunk came
    /// without the end of the stream, which the trailers carry), so the costs it reports
    /// are settled as for a body that ended.
    pub fn on_response_trailers(&self, id: u32) {
        self.on_response_body(id, Some(&[]), true);
    }

    /// Bytes its streams' body readers hold now, across its streams (bounded by
    /// [`MAX_HELD_PER_WORKER`]).
    pub fn body_bytes_held(&self) -> usize {
        self.body_bytes.get()
    }

    /// Settles a stream's estimates to what its response reported (`complete`: its body
    /// ended; otherwise the stream was cut short).
    fn settle_costs(&self, costs: StreamCosts, complete: bool) {
        self.body_bytes.set(self.body_bytes.get().saturating_sub(costs.held()));
        let mut counts = self.counts();
        for policy in costs.over_budget() {
            counts.add(policy, Counter::CostOverBudget, 1);
        }
        for (owed, reported) in costs.finish(complete) {
            self.engine.settle_cost(&owed, reported, &self.limiter, &mut counts);
        }
    }

    /// Stream `id` ended (its response done, reset, or its client gone): forget it
    /// wherever it is held, and count it; estimates its response did not settle are
    /// settled with what it reported before it ended; its concurrency slots are given
    /// back.
    pub fn on_stream_end(&self, id: u32) {
        let slots = take(&self.slots, id);
        if let Some(slots) = slots {
            self.engine.release_slots(slots, &self.limiter, &mut self.counts());
        }
        let _ = take(&self.response_headers, id);
        let costs = take(&self.costs, id);
        if let Some(costs) = costs {
            self.settle_costs(costs, false);
        }
        let paused = self.paused.try_borrow_mut().ok().and_then(|mut q| q.remove(id));
        if let Some(tally) = paused {
            self.engine.abandon(&tally, &mut self.counts());
        }
        let waiting = self.waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(id));
        let lease_waiting = take(&self.lease_waiting, id);
        for pending in waiting.into_iter().chain(lease_waiting) {
            self.engine.forget(pending, &self.limiter, &mut self.counts());
        }
    }

    /// The root context's tick: releases shaped requests whose turn came, times out
    /// checks past their deadline, retries refill waits, sweeps for debt, sends refills
    /// and charges, and times out the root's own calls whose answer can no longer come.
    pub fn on_tick(&self, port: &mut impl Port) {
        let now = self.limiter.clock().now();
        // One at a time, with no borrow held while the host acts.
        while let Some((id, tally)) = self.paused.try_borrow_mut().ok().and_then(|mut q| q.pop_due(now)) {
            let resumed = port.enter(id).and_then(|()| port.resume());
            let mut counts = self.counts();
            match resumed {
                Ok(()) => self.engine.release(&tally, &mut counts),
                Err(failure) => {
                    log::debug!("sluice: could not resume request {id} (host status {})", failure.status);
                    counts.add_plugin(PluginCounter::ResumeFailures, 1);
                    self.engine.abandon(&tally, &mut counts);
                }
            }
        }
        while let Some((id, pending)) = self.waiting.try_borrow_mut().ok().and_then(|mut q| q.pop_due(now)) {
            let room = self.room_to_pause();
            let begun =
                self.engine.complete(pending, &CalloutAnswer::TimedOut, &self.limiter, port, room, &mut self.counts());
            let _ = self.conclude(id, begun, Via::Root, Entry::New, port);
        }
        self.send_checks(port);
        self.retry_lease_waiters(port);
        self.engine.renew_slots(&self.limiter, &mut self.counts());
        self.engine.sweep_debts(&self.limiter);
        self.engine.review_leases(&self.limiter, &mut self.counts());
        self.engine.count_fallbacks(&self.limiter, &mut self.counts());
        self.send_outgoing(true, port);
        let expired: Vec<SentOutgoing> = self
            .in_flight
            .try_borrow_mut()
            .map(|mut in_flight| {
                let tokens: Vec<u32> = in_flight.iter().filter(|(_, s)| s.deadline <= now).map(|(t, _)| *t).collect();
                tokens.into_iter().filter_map(|t| in_flight.remove(&t)).collect()
            })
            .unwrap_or_default();
        for sent in expired {
            self.answered(sent, &CalloutAnswer::TimedOut);
        }
        self.flush_metrics();
    }

    /// The answer to a call the root sent (callout `token`) arrived: one of its own
    /// (a refill, a charge, a settlement), or the check of a request whose lease could
    /// not serve it, sent while the root retried it (the host answers the root).
    pub fn on_root_answer(&self, token: u32, answer: &CalloutAnswer, port: &mut impl Port) {
        let Some(sent) = self.in_flight.try_borrow_mut().ok().and_then(|mut in_flight| in_flight.remove(&token)) else {
            // A check the root sent: alone, or a batch.
            self.batch_answered(token, answer, port);
            self.send_checks(port);
            return;
        };
        let refill = sent.is_refill();
        self.answered(sent, answer);
        if refill {
            // This worker's waiters spend the grant now; other workers' on their tick.
            self.retry_lease_waiters(port);
        }
        self.send_outgoing(false, port);
    }

    /// A request woke the root: send the checks that wait to go together, and the
    /// outbox.
    pub fn on_wake(&self, port: &mut impl Port) {
        self.send_checks(port);
        self.send_outgoing(false, port);
    }

    fn answered(&self, sent: SentOutgoing, answer: &CalloutAnswer) {
        let waiting =
            |waiter: u64| self.lease_waiting.try_borrow().is_ok_and(|q| q.values().any(|p| p.waiter() == waiter));
        self.engine.outgoing_answered(sent, answer, &self.limiter, &mut self.counts(), waiting);
    }

    /// Sends what the outbox holds (and, on the tick, the charges this worker owes).
    fn send_outgoing(&self, with_charges: bool, port: &mut impl Port) {
        for call in self.engine.take_outgoing(&self.limiter, with_charges) {
            let sent = self.engine.dispatch_outgoing(call, port, &self.limiter, &mut self.counts());
            if let (Some(sent), Ok(mut in_flight)) = (sent, self.in_flight.try_borrow_mut()) {
                in_flight.insert(sent.token, sent);
            }
        }
    }

    /// Retries every request of this worker that waits for a lease refill.
    fn retry_lease_waiters(&self, port: &mut impl Port) {
        let ids: Vec<u32> = self.lease_waiting.try_borrow().map(|q| q.keys().copied().collect()).unwrap_or_default();
        for id in ids {
            let Some(pending) = self.lease_waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(&id)) else {
                continue;
            };
            let room = self.room_to_pause();
            let begun = self.engine.retry(pending, &self.limiter, port, room, &mut self.counts());
            let _ = self.conclude(id, begun, Via::Root, Entry::Kept, port);
        }
    }

    /// After a response callback: wakes the root to send what settling the response's
    /// costs put in the outbox (a check-mode settlement), rather than wait for the tick.
    pub fn after_response(&self, port: &mut impl Port) {
        self.wake_root(port);
    }

    /// After a request's callback: wakes the root to send what it put in the outbox.
    fn wake_root(&self, port: &mut impl Port) {
        if (self.engine.has_outgoing() || self.engine.checks_to_send(self.limiter.clock()) > 0)
            && let Some(queue) = self.wake
        {
            // If the host refuses, the tick sends it.
            let _ = port.wake(queue);
        }
    }

    /// Carries out whatever the engine answered for request `id`: a wait is held, or
    /// decided at once when it cannot be; a decision is carried out.
    fn conclude(&self, id: u32, begun: Begun, via: Via, entry: Entry, port: &mut impl Port) -> Flow {
        let decided = match begun {
            Begun::Decided(decided) => decided,
            Begun::Waiting(pending) => match self.hold(id, pending, entry) {
                Ok(()) => return Flow::Pause,
                Err(pending) => {
                    let room = self.room_to_pause();
                    self.engine.overflow(pending, &self.limiter, room, &mut self.counts())
                }
            },
        };
        self.deliver(id, decided, via, port)
    }

    /// Holds a waiting request in its queue; `Err` with it when it cannot be held (a full
    /// lease queue for a request new to it, or a queue already borrowed).
    fn hold(&self, id: u32, pending: Box<Pending>, entry: Entry) -> Result<(), Box<Pending>> {
        if pending.waits_for_lease() {
            let max = self.engine.max_waiting(&pending);
            let Ok(mut queue) = self.lease_waiting.try_borrow_mut() else { return Err(pending) };
            if entry == Entry::New && queue.len() >= max {
                return Err(pending);
            }
            queue.insert(id, pending);
            return Ok(());
        }
        let deadline = pending.deadline();
        match self.waiting.try_borrow_mut() {
            Ok(mut waiting) => {
                waiting.insert(id, deadline, pending);
                Ok(())
            }
            Err(_) => Err(pending),
        }
    }

    /// Carries out a decision for request `id` and counts what really happened.
    fn deliver(&self, id: u32, decided: Decided, via: Via, port: &mut impl Port) -> Flow {
        if via == Via::Root && port.enter(id).is_err() {
            // The stream is gone: nothing is paused any more.
            let mut counts = self.counts();
            counts.add_plugin(PluginCounter::ResumeFailures, 1);
            if let Outcome::Continue { slots, .. } | Outcome::Delay { slots, .. } = decided.outcome {
                self.engine.release_slots(slots, &self.limiter, &mut counts);
            }
            self.engine.record(&decided.tally, Disposition::Rejected, &mut counts);
            return Flow::Pause;
        }
        let in_headers = via == Via::Headers;
        let Decided { outcome, tally, owed } = decided;
        let mut held = HeldSlots::default();
        let (flow, disposition) = match outcome {
            Outcome::Continue { headers, slots } => {
                held = slots;
                self.keep_headers(id, headers);
                self.forward(in_headers, port)
            }
            Outcome::Delay { due, headers, slots, .. } => {
                held = slots;
                self.keep_headers(id, headers);
                match self.paused.try_borrow_mut() {
                    Ok(mut paused) => {
                        paused.insert(id, due, tally.clone());
                        self.record_queue_wait(due);
                        (Flow::Pause, Disposition::Queued)
                    }
                    // Cannot happen (nothing else holds the queue now); if it did,
                    // forwarding now is better than a request held forever.
                    Err(_) => self.forward(in_headers, port),
                }
            }
            Outcome::Reject(response) => self.reject(&response, in_headers, port),
        };
        if !held.is_empty() {
            if disposition == Disposition::Rejected {
                self.engine.release_slots(held, &self.limiter, &mut self.counts());
            } else if let Ok(mut map) = self.slots.try_borrow_mut() {
                // In flight, now or when due: its stream's end gives them back.
                map.insert(id, held);
            }
        }
        if disposition != Disposition::Rejected && !owed.is_empty() {
            // Forwarded, now or when due: its response settles what it spent.
            if let Ok(mut map) = self.costs.try_borrow_mut() {
                map.insert(id, StreamCosts::new(owed));
            }
        }
        self.engine.record(&tally, disposition, &mut self.counts());
        flow
    }

    /// Records a queued request's wait for its turn, `due` (out of line: only a shaped
    /// request comes here, and the path every other request takes stays as small).
    #[inline(never)]
    fn record_queue_wait(&self, due: Nanos) {
        let wait = due.saturating_sub(self.limiter.clock().now()).as_u64() / 1_000_000;
        self.counts().record_wait(Wait::Queue, wait);
    }

    fn keep_headers(&self, id: u32, headers: Vec<(String, String)>) {
        if headers.is_empty() {
            return;
        }
        if let Ok(mut map) = self.response_headers.try_borrow_mut() {
            map.insert(id, headers);
        }
    }

    /// Forwards the request: by the returned flow inside its headers callback, else by
    /// resuming it (and resetting it if the host refuses).
    fn forward(&self, in_headers: bool, port: &mut impl Port) -> (Flow, Disposition) {
        if in_headers {
            return (Flow::Continue, Disposition::Allowed);
        }
        match port.resume() {
            Ok(()) => (Flow::Pause, Disposition::Allowed),
            Err(failure) => {
                log::warn!("sluice: the host refused to resume a request (status {}); resetting it", failure.status);
                self.counts().add_plugin(PluginCounter::ResumeFailures, 1);
                let _ = port.close();
                (Flow::Pause, Disposition::Rejected)
            }
        }
    }

    /// Sends a rejection; a reply the host refuses is retried bare, then the stream is
    /// reset, and only then forwarded (see the module docs).
    fn reject(&self, response: &LocalResponse, in_headers: bool, port: &mut impl Port) -> (Flow, Disposition) {
        if port.reply(response.status, &response.headers, response.body.as_bytes()).is_ok() {
            return (Flow::Pause, Disposition::Rejected);
        }
        self.counts().add_plugin(PluginCounter::ReplyFailures, 1);
        if port.reply(response.status, &[], b"").is_ok() {
            log::warn!("sluice: the host refused the rejection with headers; sent the bare status");
            return (Flow::Pause, Disposition::Rejected);
        }
        if port.close().is_ok() {
            log::warn!("sluice: the host refused every local reply; reset the request instead");
            return (Flow::Pause, Disposition::Rejected);
        }
        log::error!("sluice: the host refused to reject or reset a request; forwarding it rather than holding it");
        self.forward(in_headers, port)
    }
}

//! What is due when, on one worker: ticks (`proxy_on_tick`, one period after the last
//! fired, as Envoy's timer), scripted callout answers and callout timeouts on the host
//! clock, and messages from other threads (real callouts' heads and ends, shared-queue
//! notifications). Everything due is fired in time order; with the virtual clock a step
//! also waits (in real time, bounded) for real callouts in flight.

use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Instant;

use super::{Invoked, Worker};
use crate::callout::Ending;
use crate::services::Inbox;
use crate::state::{Callback, Delivery};

/// Something due at a point of monotonic time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Answer(u32),
    Timeout(u32),
    Tick(u32),
}

impl Worker {
    /// Delivers everything due now: completed real callouts, scripted answers and
    /// timeouts, ticks. With the virtual clock, also waits for real callouts in flight
    /// (see [`crate::HostBuilder::real_callout_wait`]).
    pub fn run_pending(&mut self) {
        self.settle();
    }

    /// Delivers the real callouts that have completed, without waiting.
    pub(crate) fn drain_inbox(&mut self) {
        if self.shared.serve_mode {
            return;
        }
        self.handle_messages();
    }

    /// After a step: delivers what is due and, in library mode with the virtual clock,
    /// waits (in real time, bounded) for the real callouts in flight.
    pub(super) fn settle(&mut self) {
        if self.shared.serve_mode {
            self.fire_due();
            return;
        }
        let give_up = self.shared.wait_for_real_callouts.map(|wait| Instant::now() + wait);
        loop {
            self.drain_inbox();
            self.fire_due();
            let Some(give_up) = give_up else { return };
            if !self.has_real_callouts() {
                return;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.inbox.recv_timeout(left) {
                Ok(message) => self.handle_inbox(message),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn has_real_callouts(&self) -> bool {
        self.store.data().vm.callouts.values().any(|c| matches!(c.delivery, Delivery::InFlight { .. }))
    }

    /// Handles a message from another thread.
    pub(crate) fn handle_inbox(&mut self, message: Inbox) {
        match message {
            Inbox::CalloutHead { generation, token } => {
                if generation == self.generation
                    && let Some(Delivery::InFlight { head_arrived, .. }) =
                        self.store.data_mut().vm.callouts.get_mut(&token).map(|c| &mut c.delivery)
                {
                    *head_arrived = true;
                }
            }
            Inbox::Callout { generation, token, ending } => {
                if generation == self.generation {
                    self.deliver_callout(token, ending);
                }
            }
            Inbox::QueueReady { generation, root, token } => {
                if generation == self.generation && self.store.data().vm.roots.contains_key(&root) {
                    let func = self.exports.on_queue_ready.clone();
                    if let Invoked::Returned(()) = self.invoke(Callback::QueueReady, root, &func, (root, token)) {
                        self.run_deferred();
                    }
                }
            }
        }
    }

    /// For `serve`'s event loop: wakes it whenever a message arrives.
    pub(crate) fn set_waker(&mut self, waker: Arc<tokio::sync::Notify>) {
        self.sender.set_waker(waker);
        self.store.data_mut().inbox = self.sender.clone();
    }

    /// For `serve`'s event loop: handles every message that has arrived.
    pub(crate) fn handle_messages(&mut self) {
        while let Ok(message) = self.inbox.try_recv() {
            self.handle_inbox(message);
        }
    }

    /// The host clock's monotonic time.
    pub(crate) fn clock_monotonic(&self) -> u64 {
        self.shared.clock.monotonic_nanos()
    }

    /// The earliest monotonic time at which something is due on this worker.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.next_event().map(|(at, _)| at)
    }

    /// The host clock's monotonic time (ns, as [`crate::Clock::monotonic_nanos`]) at
    /// which something is next due on this worker: a tick, a scripted callout's answer,
    /// a callout's timeout. For a driver of several hosts on one [`VirtualClock`] (a
    /// fleet): move the clock to the earliest of these over every worker
    /// ([`VirtualClock::advance_to_monotonic`]), then [`Worker::run_pending`] on each.
    ///
    /// [`VirtualClock`]: crate::VirtualClock
    /// [`VirtualClock::advance_to_monotonic`]: crate::VirtualClock::advance_to_monotonic
    pub fn next_due(&self) -> Option<u64> {
        self.next_deadline()
    }

    fn next_event(&self) -> Option<(u64, Event)> {
        if self.failed {
            return None;
        }
        let vm = &self.store.data().vm;
        let ticks = vm.roots.iter().filter_map(|(id, root)| root.next_tick.map(|at| (at, Event::Tick(*id))));
        let callouts = vm.callouts.iter().flat_map(|(token, callout)| {
            let answer = match callout.delivery {
                Delivery::Scheduled { at, .. } => Some((at, Event::Answer(*token))),
                Delivery::Stalled { .. } | Delivery::InFlight { .. } | Delivery::Deferred { .. } => None,
            };
            let timeout = callout.deadline.map(|at| (at, Event::Timeout(*token)));
            answer.into_iter().chain(timeout)
        });
        ticks.chain(callouts).min()
    }

    /// Fires, in time order, everything due at the clock's current time.
    pub(crate) fn fire_due(&mut self) {
        loop {
            let now = self.shared.clock.monotonic_nanos();
            let Some((at, event)) = self.next_event() else { return };
            if at > now {
                return;
            }
            match event {
                Event::Tick(root) => self.tick(root, now),
                Event::Answer(token) => {
                    let ending = match self.store.data_mut().vm.callouts.get_mut(&token).map(|c| &mut c.delivery) {
                        Some(Delivery::Scheduled { ending, .. }) => std::mem::replace(ending, Ending::Reset),
                        _ => continue,
                    };
                    self.deliver_callout(token, ending);
                }
                Event::Timeout(token) => {
                    let Some(callout) = self.store.data().vm.callouts.get(&token) else { continue };
                    let ending = Ending::timed_out(callout.delivery.head_arrived(now));
                    self.deliver_callout(token, ending);
                }
            }
        }
    }

    fn tick(&mut self, root: u32, now: u64) {
        let Some(context) = self.store.data_mut().vm.roots.get_mut(&root) else { return };
        // As Envoy's timer: the next tick is one period after this one fired.
        context.next_tick = context.tick_period.map(|period| now.saturating_add(period));
        let on_tick = self.exports.on_tick.clone();
        if let Invoked::Returned(()) = self.invoke(Callback::Tick, root, &on_tick, root) {
            self.run_deferred();
        }
    }
}

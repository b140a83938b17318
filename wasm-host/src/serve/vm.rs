//! How a `serve` worker drives its VM from its event loop: the streams waiting for the
//! filter to decide, waking them, and the task that delivers messages and fires ticks
//! and timeouts on time.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use crate::request::{ClientResponse, Message, Outcome, StreamId};
use crate::worker::Worker;

/// A worker's VM and the streams waiting for the filter to decide.
pub(super) struct Vm {
    pub(super) worker: RefCell<Worker>,
    waiters: RefCell<HashMap<StreamId, oneshot::Sender<()>>>,
    /// Wakes [`drive`]: a message arrived, or a deadline moved earlier.
    wake: Arc<Notify>,
    /// The deadline [`drive`] sleeps until (`None`: until woken).
    armed: Cell<Option<u64>>,
}

impl Vm {
    /// The VM of `worker`, which from now on wakes [`drive`] when a message arrives.
    pub(super) fn new(mut worker: Worker) -> Rc<Self> {
        let wake = Arc::new(Notify::new());
        worker.set_waker(Arc::clone(&wake));
        Rc::new(Self {
            worker: RefCell::new(worker),
            waiters: RefCell::new(HashMap::new()),
            wake,
            armed: Cell::new(None),
        })
    }

    /// After the filter ran for a connection: wakes the streams it decided, and the
    /// driver if the filter set a timer (or a callout timeout) earlier than it sleeps.
    pub(super) fn changed(&self) {
        let next = self.worker.try_borrow().ok().and_then(|worker| worker.next_deadline());
        if let Some(next) = next
            && self.armed.get().is_none_or(|armed| next < armed)
        {
            self.wake.notify_one();
        }
        self.wake_decided();
    }

    /// Wakes the streams whose fate the filter has decided.
    fn wake_decided(&self) {
        let Ok(worker) = self.worker.try_borrow() else { return };
        let mut waiters = self.waiters.borrow_mut();
        let decided: Vec<StreamId> = waiters
            .keys()
            .copied()
            .filter(|s| !matches!(worker.outcome(*s), Ok(Outcome::Paused | Outcome::ResponsePaused)))
            .collect();
        for stream in decided {
            if let Some(waiter) = waiters.remove(&stream) {
                let _ = waiter.send(());
            }
        }
    }

    /// Waits until the filter has decided what happens to `stream`.
    pub(super) async fn decision(&self, stream: StreamId) -> Decision {
        loop {
            let waiting = {
                let worker = self.worker.borrow();
                match worker.outcome(stream) {
                    Ok(Outcome::Forwarded(message)) => return Decision::Forward(message.clone()),
                    Ok(Outcome::Responded(response)) => return Decision::Respond(response.clone()),
                    Ok(Outcome::Reset) | Err(_) => return Decision::Reset,
                    Ok(Outcome::Paused | Outcome::ResponsePaused) => {
                        let (tx, rx) = oneshot::channel();
                        self.waiters.borrow_mut().insert(stream, tx);
                        rx
                    }
                }
            };
            if waiting.await.is_err() {
                return Decision::Reset;
            }
        }
    }
}

/// What the filter decided about a stream.
pub(super) enum Decision {
    Forward(Message),
    Respond(ClientResponse),
    Reset,
}

/// A worker's event loop for its VM: delivers callout completions and queue
/// notifications as they arrive, and fires ticks and timeouts on time.
pub(super) async fn drive(vm: Rc<Vm>) {
    loop {
        let (deadline, next) = {
            let mut worker = vm.worker.borrow_mut();
            worker.handle_messages();
            worker.fire_due();
            let deadline = worker.next_deadline();
            (deadline, deadline.map(|at| Duration::from_nanos(at.saturating_sub(worker.clock_monotonic()))))
        };
        vm.armed.set(deadline);
        vm.wake_decided();
        match next {
            Some(wait) => {
                tokio::select! {
                    () = vm.wake.notified() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
            None => vm.wake.notified().await,
        }
    }
}

/// Finishes the stream on the filter when the handler ends, however it ends (the client
/// may go away while the filter holds the request).
pub(super) struct FinishOnDrop {
    pub(super) vm: Rc<Vm>,
    pub(super) stream: StreamId,
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.vm.waiters.borrow_mut().remove(&self.stream);
        if let Ok(mut worker) = self.vm.worker.try_borrow_mut() {
            let _ = worker.finish(self.stream);
        }
        self.vm.changed();
    }
}

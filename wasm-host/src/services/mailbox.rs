//! How other threads reach a worker: a [`Mailbox`] (the sending side, cloned into
//! callout tasks and shared queues) and the [`Inbox`] messages it carries.
//!
//! The worker owns the receiving side and handles each message on its own thread, so a
//! guest callback never runs anywhere but on its VM's worker, as in Envoy (whose
//! dispatcher posts completions to the worker that owns the context). Messages name the
//! VM generation they were meant for: a worker drops those of a VM it has replaced.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};

use crate::callout::Ending;

/// Where other threads send a worker's messages; wakes `serve`'s event loop, if any.
#[derive(Clone)]
pub(crate) struct Mailbox {
    sender: Sender<Inbox>,
    waker: Option<Arc<tokio::sync::Notify>>,
}

impl Mailbox {
    /// A mailbox and the receiver its worker reads.
    pub(crate) fn channel() -> (Self, Receiver<Inbox>) {
        let (sender, receiver) = mpsc::channel();
        (Self { sender, waker: None }, receiver)
    }

    /// Delivers `message`; a worker that is gone drops it, as Envoy drops the completion
    /// of a context that no longer exists.
    pub(crate) fn send(&self, message: Inbox) {
        if self.sender.send(message).is_ok()
            && let Some(waker) = &self.waker
        {
            waker.notify_one();
        }
    }

    /// Wakes `waker` after each delivered message (`serve`'s event loop waits on it).
    pub(crate) fn set_waker(&mut self, waker: Arc<tokio::sync::Notify>) {
        self.waker = Some(waker);
    }
}

/// Messages a worker receives from other threads.
pub(crate) enum Inbox {
    /// A real callout's response head arrived.
    CalloutHead { generation: u64, token: u32 },
    /// A real callout ended.
    Callout { generation: u64, token: u32, ending: Ending },
    /// An item was enqueued on a shared queue this worker's root context registered.
    QueueReady { generation: u64, root: u32, token: u32 },
}

//! Shared queues, the store behind `proxy_{register,resolve,enqueue,dequeue}_shared_queue`
//! (the host functions are in `abi::queues`).
//!
//! As in proxy-wasm-cpp-host (`src/shared_queue.cc`): a queue is named by `vm_id` and
//! name, and shared by every worker of the host; registering an existing name opens it
//! and makes the registering root context (on its worker) the one notified by
//! `proxy_on_queue_ready` on every enqueue (the last registrant wins); queues are
//! unbounded.

use std::collections::{HashMap, VecDeque};

use super::mailbox::{Inbox, Mailbox};

/// Every queue of a host.
#[derive(Default)]
pub(crate) struct Queues {
    by_name: HashMap<(String, Vec<u8>), u32>,
    queues: HashMap<u32, Queue>,
    next: u32,
}

struct Queue {
    items: VecDeque<Vec<u8>>,
    /// The registrant to notify.
    notify: Option<Registrant>,
}

/// Who `proxy_on_queue_ready` goes to: a root context on a worker's VM.
pub(crate) struct Registrant {
    /// The worker's mailbox.
    pub(crate) mailbox: Mailbox,
    /// The root context that registered.
    pub(crate) root: u32,
    /// The VM generation it belongs to.
    pub(crate) generation: u64,
}

/// Why a queue operation did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueueError {
    /// No queue has this token.
    NotFound,
    /// The queue has no item.
    Empty,
}

impl Queues {
    /// Opens the queue `name` of `vm_id`, creating it if needed, and makes `registrant`
    /// the one notified of its items. Returns its token (never 0).
    pub(crate) fn register(&mut self, vm_id: &str, name: Vec<u8>, registrant: Registrant) -> u32 {
        let key = (vm_id.to_owned(), name);
        let token = match self.by_name.get(&key) {
            Some(token) => *token,
            None => {
                self.next = self.next.wrapping_add(1).max(1);
                let token = self.next;
                self.by_name.insert(key, token);
                self.queues.insert(token, Queue { items: VecDeque::new(), notify: None });
                token
            }
        };
        if let Some(queue) = self.queues.get_mut(&token) {
            queue.notify = Some(registrant);
        }
        token
    }

    /// The token of the queue `name` of `vm_id`, if it was registered.
    pub(crate) fn resolve(&self, vm_id: String, name: Vec<u8>) -> Option<u32> {
        self.by_name.get(&(vm_id, name)).copied()
    }

    /// Appends `item` and notifies the registrant (through its worker's mailbox).
    pub(crate) fn enqueue(&mut self, token: u32, item: Vec<u8>) -> Result<(), QueueError> {
        let queue = self.queues.get_mut(&token).ok_or(QueueError::NotFound)?;
        queue.items.push_back(item);
        if let Some(Registrant { mailbox, root, generation }) = &queue.notify {
            mailbox.send(Inbox::QueueReady { generation: *generation, root: *root, token });
        }
        Ok(())
    }

    /// Takes the oldest item.
    pub(crate) fn dequeue(&mut self, token: u32) -> Result<Vec<u8>, QueueError> {
        let queue = self.queues.get_mut(&token).ok_or(QueueError::NotFound)?;
        queue.items.pop_front().ok_or(QueueError::Empty)
    }
}

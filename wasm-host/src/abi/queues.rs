//! Shared queues: `proxy_register_shared_queue`, `proxy_resolve_shared_queue`,
//! `proxy_enqueue_shared_queue`, `proxy_dequeue_shared_queue`, and the
//! `proxy_on_queue_ready` notification.
//!
//! As in proxy-wasm-cpp-host (`src/shared_queue.cc`): a queue is named by `vm_id` and
//! name, and shared by every worker of the host; registering an existing name opens it
//! and makes the registering root context (on its worker) the one notified by
//! `proxy_on_queue_ready` on every enqueue (the last registrant wins); queues are
//! unbounded. Resolving with an empty `vm_id` means the caller's own.

use std::collections::{HashMap, VecDeque};

use wasmtime::{Caller, Linker};

use super::{HostResult, check_writable, copy_out, fail, read, register, status, write_u32};
use crate::state::HostState;
use crate::worker::Inbox;

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_register_shared_queue", register_queue, (name: u32, name_size: u32, token_ptr: u32));
    register!(linker, "env", "proxy_resolve_shared_queue", resolve_queue, (vm_id: u32, vm_id_size: u32, name: u32, name_size: u32, token_ptr: u32));
    register!(linker, "env", "proxy_enqueue_shared_queue", enqueue, (token: u32, data: u32, data_size: u32));
    register!(linker, "env", "proxy_dequeue_shared_queue", dequeue, (token: u32, ptr_ptr: u32, size_ptr: u32));
    Ok(())
}

/// Every queue of a host.
#[derive(Default)]
pub(crate) struct Queues {
    by_name: HashMap<(String, Vec<u8>), u32>,
    queues: HashMap<u32, Queue>,
    next: u32,
}

struct Queue {
    items: VecDeque<Vec<u8>>,
    /// The registrant to notify: its worker's inbox, its root context, its VM generation.
    notify: Option<(crate::worker::Mailbox, u32, u64)>,
}

fn register_queue(caller: &mut Caller<'_, HostState>, name: u32, name_size: u32, token_ptr: u32) -> HostResult {
    let name = read(caller, name, name_size)?;
    check_writable(caller, token_ptr, 4)?;
    let state = caller.data();
    let root = state.vm.root_of(state.vm.acting_context()).unwrap_or(0);
    let notify = Some((state.inbox.clone(), root, state.generation));
    let mut queues = state.shared.queues();
    let key = (state.shared.vm_id.clone(), name);
    let token = match queues.by_name.get(&key) {
        Some(token) => *token,
        None => {
            queues.next = queues.next.wrapping_add(1).max(1);
            let token = queues.next;
            queues.by_name.insert(key, token);
            queues.queues.insert(token, Queue { items: VecDeque::new(), notify: None });
            token
        }
    };
    if let Some(queue) = queues.queues.get_mut(&token) {
        queue.notify = notify;
    }
    drop(queues);
    write_u32(caller, token_ptr, token)
}

fn resolve_queue(
    caller: &mut Caller<'_, HostState>,
    vm_id: u32,
    vm_id_size: u32,
    name: u32,
    name_size: u32,
    token_ptr: u32,
) -> HostResult {
    let vm_id = read(caller, vm_id, vm_id_size)?;
    let name = read(caller, name, name_size)?;
    let state = caller.data();
    let vm_id =
        if vm_id.is_empty() { state.shared.vm_id.clone() } else { String::from_utf8_lossy(&vm_id).into_owned() };
    let token = state.shared.queues().by_name.get(&(vm_id, name)).copied();
    match token {
        Some(token) => write_u32(caller, token_ptr, token),
        None => fail(status::NOT_FOUND),
    }
}

fn enqueue(caller: &mut Caller<'_, HostState>, token: u32, data: u32, data_size: u32) -> HostResult {
    let data = read(caller, data, data_size)?;
    let mut queues = caller.data().shared.queues();
    let Some(queue) = queues.queues.get_mut(&token) else {
        return fail(status::NOT_FOUND);
    };
    queue.items.push_back(data);
    if let Some((inbox, root, generation)) = &queue.notify {
        inbox.send(Inbox::QueueReady { generation: *generation, root: *root, token });
    }
    Ok(())
}

fn dequeue(caller: &mut Caller<'_, HostState>, token: u32, ptr_ptr: u32, size_ptr: u32) -> HostResult {
    let item = {
        let mut queues = caller.data().shared.queues();
        let Some(queue) = queues.queues.get_mut(&token) else {
            return fail(status::NOT_FOUND);
        };
        match queue.items.pop_front() {
            Some(item) => item,
            None => return fail(status::EMPTY),
        }
    };
    copy_out(caller, &item, ptr_ptr, size_ptr)
}

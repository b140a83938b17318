//! Shared queues: `proxy_register_shared_queue`, `proxy_resolve_shared_queue`,
//! `proxy_enqueue_shared_queue`, `proxy_dequeue_shared_queue`, and the
//! `proxy_on_queue_ready` notification.
//!
//! The queues themselves, and Envoy's rules for them, are in `services::queues`;
//! these functions read the guest's arguments, act on them, and answer with a status.
//! Resolving with an empty `vm_id` means the caller's own.

use wasmtime::{Caller, Linker};

use super::{HostResult, check_writable, copy_out, fail, read, register, status, write_u32};
use crate::services::{QueueError, Registrant};
use crate::state::HostState;

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_register_shared_queue", register_queue, (name: u32, name_size: u32, token_ptr: u32));
    register!(linker, "env", "proxy_resolve_shared_queue", resolve_queue, (vm_id: u32, vm_id_size: u32, name: u32, name_size: u32, token_ptr: u32));
    register!(linker, "env", "proxy_enqueue_shared_queue", enqueue, (token: u32, data: u32, data_size: u32));
    register!(linker, "env", "proxy_dequeue_shared_queue", dequeue, (token: u32, ptr_ptr: u32, size_ptr: u32));
    Ok(())
}

fn register_queue(caller: &mut Caller<'_, HostState>, name: u32, name_size: u32, token_ptr: u32) -> HostResult {
    let name = read(caller, name, name_size)?;
    check_writable(caller, token_ptr, 4)?;
    let state = caller.data();
    let root = state.vm.root_of(state.vm.acting_context()).unwrap_or(0);
    let registrant = Registrant { mailbox: state.inbox.clone(), root, generation: state.generation };
    let token = state.shared.queues().register(&state.shared.vm_id, name, registrant);
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
    let token = state.shared.queues().resolve(vm_id, name);
    match token {
        Some(token) => write_u32(caller, token_ptr, token),
        None => fail(status::NOT_FOUND),
    }
}

fn enqueue(caller: &mut Caller<'_, HostState>, token: u32, data: u32, data_size: u32) -> HostResult {
    let data = read(caller, data, data_size)?;
    match caller.data().shared.queues().enqueue(token, data) {
        Ok(()) => Ok(()),
        Err(error) => fail(queue_status(error)),
    }
}

fn dequeue(caller: &mut Caller<'_, HostState>, token: u32, ptr_ptr: u32, size_ptr: u32) -> HostResult {
    // The lock is released before the guest's allocator runs.
    let item = caller.data().shared.queues().dequeue(token);
    match item {
        Ok(item) => copy_out(caller, &item, ptr_ptr, size_ptr),
        Err(error) => fail(queue_status(error)),
    }
}

fn queue_status(error: QueueError) -> u32 {
    match error {
        QueueError::NotFound => status::NOT_FOUND,
        QueueError::Empty => status::EMPTY,
    }
}

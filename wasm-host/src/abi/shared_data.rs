//! `proxy_get_shared_data` and `proxy_set_shared_data`, with Envoy's semantics (see
//! [`crate::shared_data`]): a missing key is `NOT_FOUND`; a write with a non-zero CAS
//! that no longer matches an existing key is `CAS_MISMATCH`; a write to a missing key
//! succeeds whatever the CAS.

use wasmtime::{Caller, Linker};

use super::{HostResult, check_writable, copy_out, fail, register, status, view, write_u32};
use crate::shared_data::SetOutcome;
use crate::state::HostState;

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_get_shared_data", get_shared_data, (key: u32, key_size: u32, ptr_ptr: u32, size_ptr: u32, cas_ptr: u32));
    register!(linker, "env", "proxy_set_shared_data", set_shared_data, (key: u32, key_size: u32, value: u32, value_size: u32, cas: u32));
    Ok(())
}

fn get_shared_data(
    caller: &mut Caller<'_, HostState>,
    key: u32,
    key_size: u32,
    ptr_ptr: u32,
    size_ptr: u32,
    cas_ptr: u32,
) -> HostResult {
    before_access(caller);
    let key = view(caller, key, key_size)?;
    let Some((value, cas)) = caller.data().vm.shared_data.get(key) else {
        return fail(status::NOT_FOUND);
    };
    check_writable(caller, cas_ptr, 4)?;
    copy_out(caller, &value, ptr_ptr, size_ptr)?;
    write_u32(caller, cas_ptr, cas)
}

fn set_shared_data(
    caller: &mut Caller<'_, HostState>,
    key: u32,
    key_size: u32,
    value: u32,
    value_size: u32,
    cas: u32,
) -> HostResult {
    before_access(caller);
    let key = view(caller, key, key_size)?;
    let value = view(caller, value, value_size)?;
    match caller.data().vm.shared_data.set(key, value, cas) {
        SetOutcome::Written => Ok(()),
        SetOutcome::CasMismatch => fail(status::CAS_MISMATCH),
    }
}

/// Runs the host's hook before a shared-data access (a test's interleaving point).
fn before_access(caller: &Caller<'_, HostState>) {
    let state = caller.data();
    if let Some(hook) = &state.shared.before_shared_data {
        hook(state.worker);
    }
}

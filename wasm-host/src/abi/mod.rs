//! The host side of the proxy-wasm ABI 0.2.1 and of the WASI preview1 calls a Rust
//! `wasm32-wasip1` module imports. One module per family of host functions; this one
//! holds what they share: status codes, guest-memory access and registration.
//!
//! Layer: these functions use the VM state (`crate::state`, through the `Caller`) and
//! the shared services (`crate::services`), and nothing above them: they never call the
//! guest back except through its allocator, and never drive a stream. What they cannot
//! do during the callback (continue a stream, send a local reply) they leave as a
//! `Deferred` action for the worker to run once the callback returns, as Envoy's
//! `addAfterVmCallAction` does.
//!
//! A host function either answers the guest with a status (`Failure::Status`), or traps
//! (`Failure::Trap`): it never panics, whatever pointers and lengths the guest passes.
//! Pointers and lengths outside linear memory answer `INVALID_MEMORY_ACCESS` (WASI:
//! `FAULT`), as in proxy-wasm-cpp-host.

mod buffers;
mod callout;
mod headers;
mod lifecycle;
mod log;
mod metrics;
mod properties;
mod queues;
mod shared_data;
mod time;
mod wasi;

use wasmtime::{Caller, Linker, Memory, format_err};

use crate::state::HostState;

/// proxy-wasm statuses (`proxy_status_t`), plus cpp-host's `BrokenConnection`.
pub(crate) mod status {
    pub(crate) const OK: u32 = 0;
    pub(crate) const NOT_FOUND: u32 = 1;
    pub(crate) const BAD_ARGUMENT: u32 = 2;
    pub(crate) const INVALID_MEMORY_ACCESS: u32 = 6;
    pub(crate) const EMPTY: u32 = 7;
    pub(crate) const CAS_MISMATCH: u32 = 8;
    pub(crate) const INTERNAL_FAILURE: u32 = 10;
    /// What `proxy_get_status` reports after a failed callout.
    pub(crate) const BROKEN_CONNECTION: u32 = 11;
    pub(crate) const UNIMPLEMENTED: u32 = 12;
}

/// Why a host function did not answer `OK`.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The guest receives this status (or WASI errno).
    Status(u32),
    /// The guest call unwinds with this error, and the VM is failed.
    Trap(wasmtime::Error),
}

impl From<wasmtime::Error> for Failure {
    fn from(error: wasmtime::Error) -> Self {
        Self::Trap(error)
    }
}

pub(crate) type HostResult<T = ()> = Result<T, Failure>;

/// Shorthand for a status failure.
pub(crate) fn fail<T>(status: u32) -> HostResult<T> {
    Err(Failure::Status(status))
}

/// Turns a host function's result into what wasmtime returns to the guest.
fn answer(result: HostResult) -> wasmtime::Result<u32> {
    match result {
        Ok(()) => Ok(status::OK),
        Err(Failure::Status(code)) => Ok(code),
        Err(Failure::Trap(error)) => Err(error),
    }
}

/// Host functions Envoy lets a guest call from inside its allocator
/// (`WasmBase::allocMemory` restricts callbacks to these).
const ALLOWED_IN_ALLOCATOR: &[&str] = &["proxy_log", "fd_write", "clock_time_get"];

/// Counts the call, and refuses every host call but logging and clocks while the guest's
/// allocator runs.
fn enter(caller: &mut Caller<'_, HostState>, name: &'static str) -> HostResult {
    caller.data_mut().calls.bump(name);
    if caller.data().in_allocator && !ALLOWED_IN_ALLOCATOR.contains(&name) {
        return Err(Failure::Trap(format_err!(
            "the guest called `{name}` from inside its allocator (proxy_on_memory_allocate), where only logging and clocks are allowed"
        )));
    }
    // A scripted fault (`HostBuilder::fail_host_call`).
    if let Some(status) = caller.data().shared.failing_calls.get(name) {
        return fail(*status);
    }
    Ok(())
}

fn memory(caller: &Caller<'_, HostState>) -> HostResult<Memory> {
    caller
        .data()
        .memory
        .ok_or_else(|| Failure::Trap(format_err!("the module exports no `memory`, so host calls cannot reach it")))
}

/// A copy of `len` bytes of guest memory at `ptr`.
pub(crate) fn read(caller: &Caller<'_, HostState>, ptr: u32, len: u32) -> HostResult<Vec<u8>> {
    view(caller, ptr, len).map(<[u8]>::to_vec)
}

/// `len` bytes of guest memory at `ptr`, borrowed: for host calls that only look at
/// their arguments (shared data), which then need no copy.
pub(crate) fn view<'a>(caller: &'a Caller<'_, HostState>, ptr: u32, len: u32) -> HostResult<&'a [u8]> {
    let data = memory(caller)?.data(caller);
    let start = ptr as usize;
    let end = start.checked_add(len as usize).ok_or(Failure::Status(status::INVALID_MEMORY_ACCESS))?;
    data.get(start..end).ok_or(Failure::Status(status::INVALID_MEMORY_ACCESS))
}

/// Writes `bytes` at `ptr` in guest memory.
pub(crate) fn write(caller: &mut Caller<'_, HostState>, ptr: u32, bytes: &[u8]) -> HostResult {
    let data = memory(caller)?.data_mut(&mut *caller);
    let start = ptr as usize;
    let end = start.checked_add(bytes.len()).ok_or(Failure::Status(status::INVALID_MEMORY_ACCESS))?;
    data.get_mut(start..end).ok_or(Failure::Status(status::INVALID_MEMORY_ACCESS))?.copy_from_slice(bytes);
    Ok(())
}

pub(crate) fn write_u32(caller: &mut Caller<'_, HostState>, ptr: u32, value: u32) -> HostResult {
    write(caller, ptr, &value.to_le_bytes())
}

pub(crate) fn write_u64(caller: &mut Caller<'_, HostState>, ptr: u32, value: u64) -> HostResult {
    write(caller, ptr, &value.to_le_bytes())
}

/// Fails with `INVALID_MEMORY_ACCESS` unless `len` bytes at `ptr` are writable: Envoy
/// checks output pointers before starting work that cannot be undone.
pub(crate) fn check_writable(caller: &Caller<'_, HostState>, ptr: u32, len: u32) -> HostResult {
    let size = memory(caller)?.data_size(caller);
    match (ptr as usize).checked_add(len as usize) {
        Some(end) if end <= size => Ok(()),
        _ => fail(status::INVALID_MEMORY_ACCESS),
    }
}

/// Allocates `size` bytes with the guest's allocator (`proxy_on_memory_allocate`, or
/// `malloc`) and returns the address.
fn allocate(caller: &mut Caller<'_, HostState>, size: usize) -> HostResult<u32> {
    let allocate =
        caller.data().allocate.clone().ok_or_else(|| {
            Failure::Trap(format_err!("the module exports neither proxy_on_memory_allocate nor malloc"))
        })?;
    let size_arg = i32::try_from(size).map_err(|_| Failure::Status(status::INVALID_MEMORY_ACCESS))?;
    caller.data_mut().calls.bump(crate::counts::ALLOCATOR_REENTRY);
    caller.data_mut().in_allocator = true;
    let result = allocate.call(&mut *caller, size_arg);
    caller.data_mut().in_allocator = false;
    let address = result? as u32;
    if address == 0 {
        return fail(status::INVALID_MEMORY_ACCESS);
    }
    check_writable(caller, address, size as u32)?;
    Ok(address)
}

/// Copies `bytes` into fresh guest memory and writes its address and length to
/// `ptr_ptr` and `size_ptr` (cpp-host's `copyToPointerSize`). Empty data is not
/// allocated: the guest reads a null pointer and a length of 0.
pub(crate) fn copy_out(caller: &mut Caller<'_, HostState>, bytes: &[u8], ptr_ptr: u32, size_ptr: u32) -> HostResult {
    let address = if bytes.is_empty() {
        0
    } else {
        let address = allocate(caller, bytes.len())?;
        write(caller, address, bytes)?;
        address
    };
    write_u32(caller, ptr_ptr, address)?;
    write_u32(caller, size_ptr, u32::try_from(bytes.len()).unwrap_or(u32::MAX))
}

/// Registers one host function: `$f(&mut caller, args...) -> HostResult` becomes an
/// import returning a status, refused while the guest's allocator runs.
macro_rules! register {
    ($linker:expr, $module:expr, $name:literal, $f:path, ($($arg:ident : $ty:ty),*)) => {
        $linker.func_wrap(
            $module,
            $name,
            |mut caller: ::wasmtime::Caller<'_, $crate::state::HostState>, $($arg: $ty),*| -> ::wasmtime::Result<u32> {
                $crate::abi::answer($crate::abi::enter(&mut caller, $name).and_then(|()| $f(&mut caller, $($arg),*)))
            },
        )?;
    };
}
pub(crate) use register;

/// Every host function this host implements, under the names the guest imports.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    log::add_to_linker(linker)?;
    time::add_to_linker(linker)?;
    buffers::add_to_linker(linker)?;
    headers::add_to_linker(linker)?;
    properties::add_to_linker(linker)?;
    shared_data::add_to_linker(linker)?;
    callout::add_to_linker(linker)?;
    metrics::add_to_linker(linker)?;
    lifecycle::add_to_linker(linker)?;
    queues::add_to_linker(linker)?;
    wasi::add_to_linker(linker)?;
    Ok(())
}

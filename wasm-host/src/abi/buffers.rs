//! `proxy_get_buffer_bytes`, `proxy_set_buffer_bytes`, `proxy_get_buffer_status`.
//!
//! Which buffer exists when follows Envoy's `Context::getBuffer`:
//! * `VM_CONFIGURATION` (6) always;
//! * `PLUGIN_CONFIGURATION` (7) only during `proxy_on_configure` (else `NOT_FOUND`);
//! * `HTTP_CALL_RESPONSE_BODY` (4) only during `proxy_on_http_call_response` of a call
//!   that got a response, from its root context or any of its streams (else `NOT_FOUND`);
//! * `HTTP_REQUEST_BODY` (0) / `HTTP_RESPONSE_BODY` (1) hold the body while the filter
//!   holds it (in `proxy_on_*_body`, or paused from there); otherwise, and for the buffer
//!   types an HTTP filter never gets (2, 3, 5, 8), they read as empty.
//!
//! Only a held body can be written, with Envoy's rules: `start == 0, size == 0`
//! prepends, `start == 0, size >= length` replaces, `start >= length` appends, anything
//! else is `BAD_ARGUMENT`; so is writing any other buffer.

use wasmtime::{Caller, Linker};

use super::{HostResult, copy_out, fail, read, register, status, write_u32};
use crate::state::{HostState, Vm};

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_get_buffer_bytes", get_buffer_bytes, (kind: u32, start: u32, max: u32, ptr_ptr: u32, size_ptr: u32));
    register!(linker, "env", "proxy_set_buffer_bytes", set_buffer_bytes, (kind: u32, start: u32, size: u32, data: u32, data_size: u32));
    register!(linker, "env", "proxy_get_buffer_status", get_buffer_status, (kind: u32, length_ptr: u32, flags_ptr: u32));
    Ok(())
}

const HTTP_REQUEST_BODY: u32 = 0;
const HTTP_RESPONSE_BODY: u32 = 1;
const HTTP_CALL_RESPONSE_BODY: u32 = 4;
const VM_CONFIGURATION: u32 = 6;
const PLUGIN_CONFIGURATION: u32 = 7;
const MAX_BUFFER_TYPE: u32 = 8;

/// Runs `f` on the buffer of `kind`; `None` when that buffer does not exist now.
fn with_buffer<R>(vm: &Vm, kind: u32, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let acting = vm.acting_context();
    match kind {
        HTTP_REQUEST_BODY => Some(match vm.streams.get(&acting) {
            Some(stream) if stream.live.request_body => f(stream.request.body_bytes()),
            _ => f(&[]),
        }),
        HTTP_RESPONSE_BODY => Some(match vm.streams.get(&acting) {
            Some(stream) if stream.live.response_body => {
                f(stream.response.as_ref().map(|r| r.body_bytes()).unwrap_or_default())
            }
            _ => f(&[]),
        }),
        HTTP_CALL_RESPONSE_BODY => {
            let live = vm.call_response.as_ref()?;
            let response = live.response.as_ref()?;
            (vm.root_of(acting) == Some(live.root)).then(|| f(&response.body))
        }
        VM_CONFIGURATION => Some(f(&vm.vm_configuration)),
        PLUGIN_CONFIGURATION => vm.plugin_configuration.as_deref().map(f),
        _ => Some(f(&[])),
    }
}

fn get_buffer_bytes(
    caller: &mut Caller<'_, HostState>,
    kind: u32,
    start: u32,
    max: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult {
    if kind > MAX_BUFFER_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    let slice = with_buffer(&caller.data().vm, kind, |bytes| {
        let start = (start as usize).min(bytes.len());
        let end = start.saturating_add(max as usize).min(bytes.len());
        bytes.get(start..end).map(<[u8]>::to_vec).unwrap_or_default()
    });
    match slice {
        None => fail(status::NOT_FOUND),
        Some(bytes) => copy_out(caller, &bytes, ptr_ptr, size_ptr),
    }
}

fn get_buffer_status(caller: &mut Caller<'_, HostState>, kind: u32, length_ptr: u32, flags_ptr: u32) -> HostResult {
    if kind > MAX_BUFFER_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    let Some(length) = with_buffer(&caller.data().vm, kind, <[u8]>::len) else {
        return fail(status::NOT_FOUND);
    };
    write_u32(caller, length_ptr, u32::try_from(length).unwrap_or(u32::MAX))?;
    write_u32(caller, flags_ptr, 0)
}

fn set_buffer_bytes(
    caller: &mut Caller<'_, HostState>,
    kind: u32,
    start: u32,
    size: u32,
    data: u32,
    data_size: u32,
) -> HostResult {
    if kind > MAX_BUFFER_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    if with_buffer(&caller.data().vm, kind, |_| ()).is_none() {
        return fail(status::NOT_FOUND);
    }
    let data = read(caller, data, data_size)?;
    let vm = &mut caller.data_mut().vm;
    let acting = vm.acting_context();
    let Some(stream) = vm.streams.get_mut(&acting) else {
        return fail(status::BAD_ARGUMENT);
    };
    let body = match kind {
        HTTP_REQUEST_BODY if stream.live.request_body => stream.request.body.get_or_insert_with(Vec::new),
        HTTP_RESPONSE_BODY if stream.live.response_body => match stream.response.as_mut() {
            Some(response) => response.body.get_or_insert_with(Vec::new),
            None => return fail(status::BAD_ARGUMENT),
        },
        _ => return fail(status::BAD_ARGUMENT),
    };
    let (start, size) = (start as usize, size as usize);
    if start == 0 && size == 0 {
        body.splice(0..0, data);
    } else if start == 0 && size >= body.len() {
        *body = data;
    } else if start >= body.len() {
        body.extend_from_slice(&data);
    } else {
        return fail(status::BAD_ARGUMENT);
    }
    Ok(())
}

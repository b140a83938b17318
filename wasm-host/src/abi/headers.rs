//! Header maps: `proxy_{get,set}_header_map_pairs`, `proxy_get_header_map_size`, and
//! `proxy_{get,add,replace,remove}_header_map_value`.
//!
//! Availability follows Envoy's `Context::getMap` (writable) and `getConstMap`
//! (readable):
//! * request headers are held from `proxy_on_request_headers` until the filter lets them
//!   go (returns `Continue`, or calls `proxy_continue_stream`); the same for response
//!   headers, and for trailers in their own callbacks;
//! * request and response headers (and response trailers) can be read, not written, in
//!   `proxy_on_log`;
//! * the callout response's headers and trailers can be read during
//!   `proxy_on_http_call_response` of a call that got a response;
//! * trailers can be added from the last body callback when the message has none.
//!
//! Reading a value from a map that is not available is `BAD_ARGUMENT` (`NOT_FOUND` in
//! `proxy_on_log`); reading its pairs gives an empty map; writing to it, or asking its
//! size, is `BAD_ARGUMENT`. Reading an absent key is `NOT_FOUND`. Map types above 7 are
//! `BAD_ARGUMENT`.

use wasmtime::{Caller, Linker};

use super::{HostResult, copy_out, fail, read, register, status, write_u32};
use crate::headers::{self, Headers};
use crate::state::{HostState, Vm};

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_get_header_map_pairs", get_pairs, (map: u32, ptr_ptr: u32, size_ptr: u32));
    register!(linker, "env", "proxy_set_header_map_pairs", set_pairs, (map: u32, ptr: u32, size: u32));
    register!(linker, "env", "proxy_get_header_map_size", get_size, (map: u32, size_ptr: u32));
    register!(linker, "env", "proxy_get_header_map_value", get_value, (map: u32, key: u32, key_size: u32, ptr_ptr: u32, size_ptr: u32));
    register!(linker, "env", "proxy_add_header_map_value", add_value, (map: u32, key: u32, key_size: u32, value: u32, value_size: u32));
    register!(linker, "env", "proxy_replace_header_map_value", replace_value, (map: u32, key: u32, key_size: u32, value: u32, value_size: u32));
    register!(linker, "env", "proxy_remove_header_map_value", remove_value, (map: u32, key: u32, key_size: u32));
    Ok(())
}

const REQUEST_HEADERS: u32 = 0;
const REQUEST_TRAILERS: u32 = 1;
const RESPONSE_HEADERS: u32 = 2;
const RESPONSE_TRAILERS: u32 = 3;
const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const HTTP_CALL_RESPONSE_TRAILERS: u32 = 7;
const MAX_MAP_TYPE: u32 = 7;

/// The map of `kind` the guest may read now (Envoy's `getConstMap`).
fn readable(vm: &Vm, kind: u32) -> Option<&Headers> {
    let acting = vm.acting_context();
    let stream = vm.streams.get(&acting);
    match kind {
        REQUEST_HEADERS => stream.filter(|s| s.live.request_headers || s.log_phase).map(|s| &s.request.headers),
        REQUEST_TRAILERS => stream.filter(|s| s.live.request_trailers && !s.log_phase)?.request.trailers.as_ref(),
        RESPONSE_HEADERS => {
            stream.filter(|s| s.live.response_headers || s.log_phase)?.response.as_ref().map(|r| &r.headers)
        }
        RESPONSE_TRAILERS => {
            stream.filter(|s| s.live.response_trailers || s.log_phase)?.response.as_ref()?.trailers.as_ref()
        }
        HTTP_CALL_RESPONSE_HEADERS | HTTP_CALL_RESPONSE_TRAILERS => {
            let live = vm.call_response.as_ref()?;
            if vm.root_of(acting) != Some(live.root) {
                return None;
            }
            let response = live.response.as_ref()?;
            Some(if kind == HTTP_CALL_RESPONSE_HEADERS { &response.headers } else { &response.trailers })
        }
        _ => None,
    }
}

/// The map of `kind` the guest may write now (Envoy's `getMap`), creating trailers
/// from the last body callback if the message has none.
fn writable(vm: &mut Vm, kind: u32) -> Option<&mut Headers> {
    let acting = vm.acting_context();
    let stream = vm.streams.get_mut(&acting)?;
    if stream.log_phase {
        return None;
    }
    match kind {
        REQUEST_HEADERS => stream.live.request_headers.then_some(&mut stream.request.headers),
        REQUEST_TRAILERS => {
            if !stream.live.request_trailers && stream.live.request_body && stream.request.trailers.is_none() {
                stream.live.request_trailers = true;
            }
            if stream.live.request_trailers {
                Some(stream.request.trailers.get_or_insert_with(Headers::new))
            } else {
                None
            }
        }
        RESPONSE_HEADERS => {
            if stream.live.response_headers {
                stream.response.as_mut().map(|r| &mut r.headers)
            } else {
                None
            }
        }
        RESPONSE_TRAILERS => {
            let response = stream.response.as_mut()?;
            if !stream.live.response_trailers && stream.live.response_body && response.trailers.is_none() {
                stream.live.response_trailers = true;
            }
            if stream.live.response_trailers { Some(response.trailers.get_or_insert_with(Headers::new)) } else { None }
        }
        _ => None,
    }
}

fn in_log_phase(vm: &Vm) -> bool {
    vm.streams.get(&vm.acting_context()).is_some_and(|s| s.log_phase)
}

fn get_pairs(caller: &mut Caller<'_, HostState>, map: u32, ptr_ptr: u32, size_ptr: u32) -> HostResult {
    if map > MAX_MAP_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    let bytes = readable(&caller.data().vm, map).map(|h| headers::serialize(h.iter())).unwrap_or_default();
    copy_out(caller, &bytes, ptr_ptr, size_ptr)
}

fn set_pairs(caller: &mut Caller<'_, HostState>, map: u32, ptr: u32, size: u32) -> HostResult {
    if map > MAX_MAP_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    let pairs = headers::deserialize(&read(caller, ptr, size)?);
    let Some(target) = writable(&mut caller.data_mut().vm, map) else {
        return fail(status::BAD_ARGUMENT);
    };
    *target = Headers::from_pairs(pairs);
    Ok(())
}

fn get_size(caller: &mut Caller<'_, HostState>, map: u32, size_ptr: u32) -> HostResult {
    if map > MAX_MAP_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    // Envoy answers from the writable map only (so never for callout responses).
    let Some(target) = writable(&mut caller.data_mut().vm, map) else {
        return fail(status::BAD_ARGUMENT);
    };
    let size = u32::try_from(target.byte_size()).unwrap_or(u32::MAX);
    write_u32(caller, size_ptr, size)
}

fn get_value(
    caller: &mut Caller<'_, HostState>,
    map: u32,
    key: u32,
    key_size: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult {
    if map > MAX_MAP_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    let key = read(caller, key, key_size)?;
    let vm = &caller.data().vm;
    let value = match readable(vm, map) {
        None if in_log_phase(vm) => return fail(status::NOT_FOUND),
        None => return fail(status::BAD_ARGUMENT),
        Some(headers) => match headers.get(&key) {
            None => return fail(status::NOT_FOUND),
            Some(value) => value.to_vec(),
        },
    };
    copy_out(caller, &value, ptr_ptr, size_ptr)
}

fn add_value(
    caller: &mut Caller<'_, HostState>,
    map: u32,
    key: u32,
    key_size: u32,
    value: u32,
    value_size: u32,
) -> HostResult {
    edit(caller, map, key, key_size, Some((value, value_size)), |headers, key, value| headers.add(key, value))
}

fn replace_value(
    caller: &mut Caller<'_, HostState>,
    map: u32,
    key: u32,
    key_size: u32,
    value: u32,
    value_size: u32,
) -> HostResult {
    edit(caller, map, key, key_size, Some((value, value_size)), |headers, key, value| headers.replace(key, value))
}

fn remove_value(caller: &mut Caller<'_, HostState>, map: u32, key: u32, key_size: u32) -> HostResult {
    edit(caller, map, key, key_size, None, |headers, key, _| headers.remove(key))
}

fn edit(
    caller: &mut Caller<'_, HostState>,
    map: u32,
    key: u32,
    key_size: u32,
    value: Option<(u32, u32)>,
    apply: impl FnOnce(&mut Headers, &[u8], &[u8]),
) -> HostResult {
    if map > MAX_MAP_TYPE {
        return fail(status::BAD_ARGUMENT);
    }
    let key = read(caller, key, key_size)?;
    let value = match value {
        Some((ptr, size)) => read(caller, ptr, size)?,
        None => Vec::new(),
    };
    let Some(target) = writable(&mut caller.data_mut().vm, map) else {
        return fail(status::BAD_ARGUMENT);
    };
    apply(target, &key, &value);
    Ok(())
}

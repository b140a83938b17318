//! `proxy_get_property` and `proxy_set_property`, with Envoy's names and encodings.
//!
//! A path is a list of segments separated by NUL bytes (`source\0address`). Values are
//! encoded as Envoy's `serializeValue` does: strings as their bytes, integers
//! (`int64`, `uint64`) and timestamps (nanoseconds since the epoch, `int64`) as 8
//! little-endian bytes, booleans as 1 byte, maps as serialized header pairs.
//!
//! | path | type |
//! |---|---|
//! | `plugin_name`, `plugin_root_id`, `plugin_vm_id` | string |
//! | `source.address`, `destination.address`, `upstream.address` | string `ip:port` |
//! | `source.port`, `destination.port`, `upstream.port` | int64 |
//! | `connection.id`, `connection_id` | uint64 |
//! | `connection.mtls` | bool (always false: no TLS here) |
//! | `request.path`, `url_path`, `host`, `scheme`, `method`, `referer`, `useragent`, `id`, `query` | string, from the request headers |
//! | `request.headers` (map), `request.headers.<name>` | from the request headers |
//! | `request.time` | timestamp |
//! | `request.protocol` | string |
//! | `request.size`, `request.total_size` | int64 |
//! | `response.code`, `response.flags` | int64 |
//! | `response.code_details` | string |
//! | `response.headers` (map), `response.headers.<name>`, `response.size` | from the response |
//!
//! As in Envoy, the values derived from request (response) headers exist only while the
//! filter holds those headers, or in `proxy_on_log`. Anything else is `NOT_FOUND`,
//! except values written with `proxy_set_property` (readable back under the same path
//! on the same stream) and static properties given to
//! [`crate::HostBuilder::property`].

use wasmtime::{Caller, Linker};

use super::{HostResult, copy_out, fail, read, register, status};
use crate::headers::{self, Headers};
use crate::state::{HostState, StreamContext};

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_get_property", get_property, (path: u32, path_size: u32, ptr_ptr: u32, size_ptr: u32));
    register!(linker, "env", "proxy_set_property", set_property, (path: u32, path_size: u32, value: u32, value_size: u32));
    Ok(())
}

fn get_property(
    caller: &mut Caller<'_, HostState>,
    path: u32,
    path_size: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult {
    let path = read(caller, path, path_size)?;
    let Some(value) = lookup(caller.data(), &path) else {
        return fail(status::NOT_FOUND);
    };
    copy_out(caller, &value, ptr_ptr, size_ptr)
}

fn set_property(
    caller: &mut Caller<'_, HostState>,
    path: u32,
    path_size: u32,
    value: u32,
    value_size: u32,
) -> HostResult {
    let path = read(caller, path, path_size)?;
    let value = read(caller, value, value_size)?;
    let vm = &mut caller.data_mut().vm;
    let acting = vm.acting_context();
    // Envoy stores properties in the stream's filter state: a root context has none.
    let Some(stream) = vm.streams.get_mut(&acting) else {
        return fail(status::NOT_FOUND);
    };
    stream.properties.insert(path, value);
    Ok(())
}

fn string(value: impl AsRef<[u8]>) -> Option<Vec<u8>> {
    Some(value.as_ref().to_vec())
}

fn int64(value: i64) -> Option<Vec<u8>> {
    Some(value.to_le_bytes().to_vec())
}

fn uint64(value: u64) -> Option<Vec<u8>> {
    Some(value.to_le_bytes().to_vec())
}

fn lookup(state: &HostState, path: &[u8]) -> Option<Vec<u8>> {
    let vm = &state.vm;
    let acting = vm.acting_context();
    let stream = vm.streams.get(&acting);
    if let Some(value) = stream.filter(|s| !s.properties.is_empty()).and_then(|s| s.properties.get(path)) {
        return Some(value.clone());
    }
    if !state.shared.properties.is_empty()
        && let Some(value) = state.shared.properties.get(path)
    {
        return Some(value.clone());
    }
    // Paths have at most four segments; a fixed array avoids an allocation per call.
    let mut parts: [&[u8]; 4] = [&[]; 4];
    let mut count = 0;
    for segment in path.split(|b| *b == 0) {
        match parts.get_mut(count) {
            Some(slot) => *slot = segment,
            None => return None,
        }
        count += 1;
    }
    match parts.get(..count).unwrap_or_default() {
        [b"plugin_name"] => string(&vm.roots.get(&vm.root_of(acting)?)?.plugin.name),
        [b"plugin_root_id"] => string(&vm.roots.get(&vm.root_of(acting)?)?.plugin.root_id),
        [b"plugin_vm_id"] => string(&state.shared.vm_id),
        [b"connection_id"] | [b"connection", b"id"] => uint64(stream?.connection_id),
        [b"connection", b"mtls"] => stream.map(|_| vec![0]),
        [b"source", b"address"] => string(stream?.source.to_string()),
        [b"source", b"port"] => int64(i64::from(stream?.source.port())),
        [b"destination", b"address"] => string(stream?.destination.to_string()),
        [b"destination", b"port"] => int64(i64::from(stream?.destination.port())),
        [b"upstream", b"address"] => string(stream?.upstream?.to_string()),
        [b"upstream", b"port"] => int64(i64::from(stream?.upstream?.port())),
        [b"request", rest @ ..] => request_property(stream?, rest),
        [b"response", rest @ ..] => response_property(stream?, rest),
        _ => None,
    }
}

fn request_headers(stream: &StreamContext) -> Option<&Headers> {
    (stream.live.request_headers || stream.log_phase).then_some(&stream.request.headers)
}

fn request_property(stream: &StreamContext, rest: &[&[u8]]) -> Option<Vec<u8>> {
    let header = |name: &str| request_headers(stream).and_then(|h| h.get(name)).map(<[u8]>::to_vec);
    match rest {
        [b"path"] => header(":path"),
        [b"url_path"] => header(":path").map(|p| p.split(|b| *b == b'?').next().unwrap_or_default().to_vec()),
        [b"query"] => header(":path").map(|p| match p.iter().position(|b| *b == b'?') {
            Some(at) => p.get(at + 1..).unwrap_or_default().to_vec(),
            None => Vec::new(),
        }),
        [b"host"] => header(":authority"),
        [b"scheme"] => header(":scheme"),
        [b"method"] => header(":method"),
        [b"referer"] => header("referer"),
        [b"useragent"] => header("user-agent"),
        [b"id"] => header("x-request-id"),
        [b"headers"] => request_headers(stream).map(|h| headers::serialize(h.iter())),
        [b"headers", name] => request_headers(stream)?.get(name).map(<[u8]>::to_vec),
        [b"time"] => int64(i64::try_from(stream.start_time).unwrap_or(i64::MAX)),
        [b"protocol"] => string(stream.protocol),
        [b"size"] => int64(i64::try_from(stream.request.body_bytes().len()).unwrap_or(i64::MAX)),
        [b"total_size"] => {
            let size = stream.request.headers.byte_size()
                + stream.request.body_bytes().len()
                + stream.request.trailers.as_ref().map_or(0, Headers::byte_size);
            int64(i64::try_from(size).unwrap_or(i64::MAX))
        }
        _ => None,
    }
}

fn response_property(stream: &StreamContext, rest: &[&[u8]]) -> Option<Vec<u8>> {
    let response = stream.response.as_ref()?;
    let headers = (stream.live.response_headers || stream.log_phase).then_some(&response.headers);
    match rest {
        [b"code"] => {
            let status = response.headers.get_str(":status")?.parse::<i64>().ok()?;
            int64(status)
        }
        [b"code_details"] => match &stream.response_source {
            Some(crate::request::ResponseSource::Local { details }) => string(details),
            Some(crate::request::ResponseSource::FailurePolicy) => string("wasm_fail_stream"),
            _ => string("via_upstream"),
        },
        [b"flags"] => int64(0),
        [b"headers"] => headers.map(|h| headers::serialize(h.iter())),
        [b"headers", name] => headers?.get(name).map(<[u8]>::to_vec),
        [b"size"] => int64(i64::try_from(response.body_bytes().len()).unwrap_or(i64::MAX)),
        _ => None,
    }
}

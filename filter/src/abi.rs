//! The proxy-wasm host calls the filter makes, wrapped so that no host answer can panic.
//!
//! The Rust SDK (0.2.5) `panic!`s on any status it does not expect (`hostcalls.rs`:
//! `panic!("unexpected status")`) and its `String` header getters `unwrap()` UTF-8
//! decoding, which fails on legal non-UTF-8 header bytes. A panic in a wasm guest traps
//! the VM, and Envoy then fails every later request on that worker. So the filter uses
//! the SDK only for its dispatcher (context bookkeeping) and calls the host itself
//! here: every status becomes a `Result` or an `Option`, and values stay bytes.
//!
//! This is the one module with `unsafe` code: the raw imports take pointers into guest
//! memory, and values the host returns are buffers it allocated through the guest's
//! `proxy_on_memory_allocate` (the SDK's allocator), which we take ownership of with
//! `Vec::from_raw_parts`, exactly as the SDK does.
#![allow(unsafe_code)]

use shared_store::{Cas, Clock, Entry, Nanos, Store, StoreError, Swap};
use std::ptr::{null, null_mut};

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_log(level: u32, message: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_buffer_bytes(kind: u32, start: usize, max: usize, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(map: u32, key: *const u8, key_size: usize, value: *const u8, size: usize) -> u32;
    fn proxy_get_property(path: *const u8, path_size: usize, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(key: *const u8, key_size: usize, value: *const u8, size: usize, cas: u32) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_set_effective_context(context: u32) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_close_stream(stream: u32) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_register_shared_queue(name: *const u8, name_size: usize, token: *mut u32) -> u32;
    fn proxy_enqueue_shared_queue(token: u32, data: *const u8, size: usize) -> u32;
    fn proxy_dequeue_shared_queue(token: u32, data: *mut *mut u8, size: *mut usize) -> u32;
}

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const CAS_MISMATCH: u32 = 8;

const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;
/// `BufferType::HttpResponseBody`.
pub const RESPONSE_BODY: u32 = 1;
/// `BufferType::HttpCallResponseBody`.
pub const CALL_RESPONSE_BODY: u32 = 4;
/// `MapType::HttpRequestHeaders`.
pub const REQUEST_HEADERS: u32 = 0;
/// `MapType::HttpResponseHeaders`.
pub const RESPONSE_HEADERS: u32 = 2;
/// `MapType::HttpCallResponseHeaders`.
pub const CALL_RESPONSE_HEADERS: u32 = 6;
const STREAM_HTTP_REQUEST: u32 = 0;

/// Takes ownership of a buffer the host allocated in guest memory.
///
/// # Safety
/// `data` must be null or point to `size` bytes allocated by `proxy_on_memory_allocate`.
unsafe fn owned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        return Vec::new();
    }
    // SAFETY: the host allocated `size` bytes at `data` through the guest allocator
    // (`Vec::with_capacity(size)` in the SDK), so capacity and length are `size`.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

/// A host status that is not OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u32);

/// Writes a log line; failures are ignored (there is nowhere to report them).
pub fn log(level: u32, message: &str) {
    // SAFETY: the pointer and length describe `message`.
    let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
}

/// The host's log level (proxy-wasm numbering: 0 trace … 5 critical).
pub fn log_level() -> Option<u32> {
    let mut level = 0u32;
    // SAFETY: `level` is a valid out-pointer.
    (unsafe { proxy_get_log_level(&mut level) } == OK).then_some(level)
}

/// The plugin configuration bytes.
pub fn plugin_configuration() -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: out-pointers are valid; the buffer returned is ours (see `owned`).
    match unsafe { proxy_get_buffer_bytes(BUFFER_PLUGIN_CONFIGURATION, 0, usize::MAX, &mut data, &mut size) } {
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(Vec::new()),
        status => Err(Status(status)),
    }
}

/// The first value of a header in `map`, as bytes: `Ok(None)` when there is none,
/// `Err` when the host fails the call (a map that is not available in this phase, as
/// after a failed callout).
pub fn header(map: u32, name: &str) -> Result<Option<Vec<u8>>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the name pointer and length describe `name`; out-pointers are valid.
    match unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size) } {
        OK => Ok(Some(unsafe { owned(data, size) })),
        NOT_FOUND => Ok(None),
        status => Err(Status(status)),
    }
}

/// Up to `max` bytes of a buffer from its start.
pub fn buffer(kind: u32, max: usize) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: out-pointers are valid; the buffer returned is ours (see `owned`).
    match unsafe { proxy_get_buffer_bytes(kind, 0, max, &mut data, &mut size) } {
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(Vec::new()),
        status => Err(Status(status)),
    }
}

/// Sets (replaces) a header in `map`.
pub fn replace_header(map: u32, name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: pointers and lengths describe `name` and `value`.
    match unsafe { proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// A host property: `Ok(None)` when it is missing, `Err` when the host fails the call.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let serialized = path.join("\0");
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the path pointer and length describe `serialized`; out-pointers are valid.
    match unsafe { proxy_get_property(serialized.as_ptr(), serialized.len(), &mut data, &mut size) } {
        OK => Ok(Some(unsafe { owned(data, size) })),
        NOT_FOUND => Ok(None),
        status => Err(Status(status)),
    }
}

/// Sends a local reply.
pub fn send_local_response(status: u16, headers: &[(String, String)], body: &[u8]) -> Result<(), Status> {
    let pairs: Vec<(&[u8], &[u8])> = headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
    let serialized = serialize_map(&pairs);
    let details = b"sluice_rate_limited";
    // SAFETY: every pointer and length describes a live local buffer.
    match unsafe {
        proxy_send_local_response(
            u32::from(status),
            details.as_ptr(),
            details.len(),
            if body.is_empty() { null() } else { body.as_ptr() },
            body.len(),
            serialized.as_ptr(),
            serialized.len(),
            -1,
        )
    } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// proxy-wasm's header map serialization: count, then (name size, value size) pairs,
/// then each name and value followed by a NUL.
fn serialize_map(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
    let size =
        pairs.iter().fold(4usize, |n, (k, v)| n.saturating_add(k.len()).saturating_add(v.len()).saturating_add(10));
    let mut out = Vec::with_capacity(size);
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    out.extend_from_slice(&len(pairs.len()));
    for (k, v) in pairs {
        out.extend_from_slice(&len(k.len()));
        out.extend_from_slice(&len(v.len()));
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Sets the root context's tick period.
pub fn set_tick_period(millis: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    match unsafe { proxy_set_tick_period_milliseconds(millis) } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// Makes `context_id` the context the next calls act for (from the root context's tick).
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    match unsafe { proxy_set_effective_context(context_id) } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// Resumes the current context's paused request.
pub fn continue_request() -> Result<(), Status> {
    // SAFETY: no pointers.
    match unsafe { proxy_continue_stream(STREAM_HTTP_REQUEST) } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// Resets the current context's request (Envoy resets the stream).
pub fn close_request() -> Result<(), Status> {
    // SAFETY: no pointers.
    match unsafe { proxy_close_stream(STREAM_HTTP_REQUEST) } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// Defines a counter (`gauge = false`) or gauge.
pub fn define_metric(name: &str, kind: MetricKind) -> Option<u32> {
    let mut id = 0u32;
    // SAFETY: the name pointer and length describe `name`; `id` is a valid out-pointer.
    (unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) } == OK).then_some(id)
}

/// A metric's type, as the ABI numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter = 0,
    /// Goes up and down.
    Gauge = 1,
    /// A distribution of recorded values.
    Histogram = 2,
}

/// Records a value of a histogram; failures are ignored (a metric must never fail a
/// request).
pub fn record_metric(id: u32, value: u64) {
    // SAFETY: no pointers.
    let _ = unsafe { proxy_record_metric(id, value) };
}

/// Adds to a metric; failures are ignored (a metric must never fail a request).
pub fn increment_metric(id: u32, delta: i64) {
    // SAFETY: no pointers.
    let _ = unsafe { proxy_increment_metric(id, delta) };
}

/// Registers a shared queue of this VM under `name`; its `proxy_on_queue_ready` comes to
/// the calling root context, on its own worker.
pub fn register_queue(name: &str) -> Result<u32, Status> {
    let mut token = 0u32;
    // SAFETY: the name pointer and length describe `name`; `token` is a valid out-pointer.
    match unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut token) } {
        OK => Ok(token),
        status => Err(Status(status)),
    }
}

/// Puts `data` on a shared queue (its owner's `proxy_on_queue_ready` follows, later).
pub fn enqueue(token: u32, data: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointer and length describe `data`.
    match unsafe { proxy_enqueue_shared_queue(token, data.as_ptr(), data.len()) } {
        OK => Ok(()),
        status => Err(Status(status)),
    }
}

/// Takes one item off a shared queue; `None` when it is empty (or the host fails).
pub fn dequeue(token: u32) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: out-pointers are valid; on OK the host allocated `size` bytes at `data`.
    match unsafe { proxy_dequeue_shared_queue(token, &mut data, &mut size) } {
        OK => Some(unsafe { owned(data, size) }),
        _ => None,
    }
}

/// Proxy-wasm shared data as a [`Store`]: statuses become errors, never panics.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
        // SAFETY: the key pointer and length describe `key`; out-pointers are valid.
        let status = unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
        match status {
            OK => {
                let value = unsafe { owned(data, size) };
                match Cas::new(cas) {
                    Some(cas) => Ok(Some(Entry { value, cas })),
                    // A stored value always has a token; none means the host misbehaves.
                    None => Err(StoreError { operation: "get", status: Some(OK) }),
                }
            }
            NOT_FOUND => Ok(None),
            status => Err(StoreError { operation: "get", status: Some(status) }),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        let token = cas.map_or(0, Cas::get);
        // The test-only mutant (see Cargo.toml): every write is unconditional.
        #[cfg(feature = "mutant-blind-writes")]
        let token = {
            let _ = token;
            0
        };
        // SAFETY: pointers and lengths describe `key` and `value`.
        match unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), token) } {
            OK => Ok(Swap::Written),
            CAS_MISMATCH => Ok(Swap::Conflict),
            status => Err(StoreError { operation: "set", status: Some(status) }),
        }
    }
}

/// The host's monotonic clock (WASI `clock_time_get(MONOTONIC)`), which Envoy serves
/// from its process-wide monotonic time, so all workers read one clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct WasiClock;

impl Clock for WasiClock {
    fn now(&self) -> Nanos {
        // SAFETY: a plain WASI call with no pointers of ours.
        // A host that fails the call reads as time zero: buckets then never refill
        // (stricter), and nothing panics.
        Nanos(unsafe { wasi::clock_time_get(wasi::CLOCKID_MONOTONIC, 1) }.unwrap_or(0))
    }
}

/// 16 random bytes from the host (WASI `random_get`); `None` if it fails.
pub fn random16() -> Option<[u8; 16]> {
    let mut bytes = [0u8; 16];
    // SAFETY: the pointer and length describe `bytes`.
    unsafe { wasi::random_get(bytes.as_mut_ptr(), bytes.len()) }.ok().map(|()| bytes)
}

/// A `log` backend writing through `proxy_log`.
pub struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => 0,
            log::Level::Debug => 1,
            log::Level::Info => 2,
            log::Level::Warn => 3,
            log::Level::Error => 4,
        };
        log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

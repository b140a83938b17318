//! Raw ABI calls the SDK cannot make: bad pointers, unknown enum values, and host calls
//! the SDK panics on. Each returns the host's status so the tests can assert it.
#![allow(unsafe_code, clashing_extern_declarations)]

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_size(map: u32, out: *mut usize) -> u32;
    fn proxy_log(level: u32, message: *const u8, len: usize) -> u32;
    fn proxy_get_buffer_bytes(kind: u32, start: usize, max: usize, out: *mut *mut u8, out_len: *mut usize) -> u32;
    fn proxy_get_property(path: *const u8, len: usize, out: *mut *mut u8, out_len: *mut usize) -> u32;
    fn proxy_set_shared_data(key: *const u8, key_len: usize, value: *const u8, value_len: usize, cas: u32) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        value: *mut *mut u8,
        value_len: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_continue_stream(kind: u32) -> u32;
    fn proxy_set_effective_context(context: u32) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, len: usize, out: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, delta: i64) -> u32;
    fn proxy_get_metric(id: u32, out: *mut u64) -> u32;
    fn proxy_call_foreign_function(
        name: *const u8,
        name_len: usize,
        args: *const u8,
        args_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_done() -> u32;
    fn proxy_send_local_response(
        code: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc: i32,
    ) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
unsafe extern "C" {
    fn clock_time_get(id: u32, precision: u64, out: *mut u64) -> u16;
    fn random_get(buf: *mut u8, len: usize) -> u16;
}

/// An address past the end of any linear memory a test guest has.
const OUT_OF_BOUNDS: usize = 0xFFFF_FF00;

/// `proxy_get_header_map_value(map, key)`: the status, and the value when OK.
pub(crate) fn header_value(map: u32, key: &str) -> (u32, Option<Vec<u8>>) {
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len = 0usize;
    let status = unsafe { proxy_get_header_map_value(map, key.as_ptr(), key.len(), &mut out, &mut len) };
    let value = (status == 0 && !out.is_null()).then(|| unsafe { Vec::from_raw_parts(out, len, len) });
    (status, value)
}

/// `proxy_get_header_map_size(map)`.
pub(crate) fn header_map_size(map: u32) -> (u32, usize) {
    let mut size = 0usize;
    let status = unsafe { proxy_get_header_map_size(map, &mut size) };
    (status, size)
}

/// Statuses of calls with bad arguments, as `name=status` pairs.
pub(crate) fn misuse() -> Vec<(&'static str, u32)> {
    let key = b"x";
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len = 0usize;
    let mut id = 0u32;
    let bad = OUT_OF_BOUNDS as *mut u8;
    unsafe {
        vec![
            ("header-key-out-of-bounds", proxy_get_header_map_value(0, bad, 4, &mut out, &mut len)),
            ("header-result-out-of-bounds", proxy_get_header_map_value(0, b":path".as_ptr(), 5, bad.cast(), &mut len)),
            ("header-map-type-99", proxy_get_header_map_value(99, key.as_ptr(), 1, &mut out, &mut len)),
            ("log-level-9", proxy_log(9, key.as_ptr(), 1)),
            ("log-out-of-bounds", proxy_log(2, bad, 16)),
            ("buffer-type-99", proxy_get_buffer_bytes(99, 0, 10, &mut out, &mut len)),
            ("property-out-of-bounds", proxy_get_property(bad, 8, &mut out, &mut len)),
            ("shared-set-value-out-of-bounds", proxy_set_shared_data(key.as_ptr(), 1, bad, 100, 0)),
            ("continue-stream-type-9", proxy_continue_stream(9)),
            ("continue-upstream", proxy_continue_stream(3)),
            ("effective-context-unknown", proxy_set_effective_context(999_999)),
            ("define-metric-type-7", proxy_define_metric(7, key.as_ptr(), 1, &mut id)),
            ("increment-unknown-metric", proxy_increment_metric(4_000_000, 1)),
            ("foreign-function", proxy_call_foreign_function(key.as_ptr(), 1, key.as_ptr(), 1, &mut out, &mut len)),
            ("done-not-pending", proxy_done()),
            (
                "local-response-status-0",
                proxy_send_local_response(0, key.as_ptr(), 0, key.as_ptr(), 0, key.as_ptr(), 0, -1),
            ),
        ]
    }
}

/// `proxy_get_buffer_bytes(kind, 0, 1)`: the status only (the SDK maps `NOT_FOUND` to
/// `None` and panics on the others).
pub(crate) fn buffer_status(kind: u32) -> u32 {
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len = 0usize;
    let status = unsafe { proxy_get_buffer_bytes(kind, 0, 1, &mut out, &mut len) };
    if status == 0 && !out.is_null() {
        drop(unsafe { Vec::from_raw_parts(out, len, len) });
    }
    status
}

/// `proxy_get_shared_data(key)`: the status, and the value and cas when OK (the SDK hides
/// the status and panics on unexpected ones).
pub(crate) fn get_shared_data(key: &[u8]) -> (u32, Vec<u8>, u32) {
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len = 0usize;
    let mut cas = 0u32;
    let status = unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut out, &mut len, &mut cas) };
    let value = if status == 0 && !out.is_null() { unsafe { Vec::from_raw_parts(out, len, len) } } else { Vec::new() };
    (status, value, cas)
}

/// `proxy_set_shared_data(key, value, cas)`: the status.
pub(crate) fn set_shared_data(key: &[u8], value: &[u8], cas: u32) -> u32 {
    unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) }
}

/// `proxy_get_metric` for a histogram id (Envoy refuses to read histograms).
pub(crate) fn get_metric(id: u32) -> (u32, u64) {
    let mut value = 0u64;
    let status = unsafe { proxy_get_metric(id, &mut value) };
    (status, value)
}

/// WASI `clock_time_get(MONOTONIC)`.
pub(crate) fn monotonic_nanos() -> u64 {
    let mut now = 0u64;
    let _ = unsafe { clock_time_get(1, 1, &mut now) };
    now
}

/// WASI `clock_time_get` on an unsupported clock (process CPU time): the errno.
pub(crate) fn cputime_errno() -> u16 {
    let mut now = 0u64;
    unsafe { clock_time_get(2, 1, &mut now) }
}

/// WASI `random_get`: 16 bytes.
pub(crate) fn random16() -> [u8; 16] {
    let mut buf = [0u8; 16];
    let _ = unsafe { random_get(buf.as_mut_ptr(), buf.len()) };
    buf
}

/// WASI `random_get` for more than the host allows: the errno.
pub(crate) fn random_too_much_errno() -> u16 {
    let mut buf = vec![0u8; 64 * 1024 + 1];
    unsafe { random_get(buf.as_mut_ptr(), buf.len()) }
}

//! A proxy-wasm guest (Rust SDK 0.2.5, `wasm32-wasip1`) that exercises every host call
//! `wasm-host` implements, so that wasm-host's tests assert what the host observed.
//!
//! # Plugin configuration
//!
//! One `key=value` per line:
//!
//! | key | effect |
//! |---|---|
//! | `reject=<message>` | `proxy_on_configure` logs `<message>` at error level and returns false |
//! | `vm_start=reject` | `proxy_on_vm_start` returns false |
//! | `panic_on_configure=1` | `proxy_on_configure` panics |
//! | `tick_ms=<n>` | sets the tick period; each tick increments `test_guest.ticks` and resumes paused streams |
//! | `tick_callout=<cluster>` | each tick dispatches a callout from the root context |
//! | `tick_panic=1` | the first tick panics |
//! | `generation=<g>` | every request gets `x-test-generation: <g>` |
//! | `bench=noop`, `bench=get-header`, `bench=get-property`, `bench=shared`, `bench=metric`, `bench=clock`, `bench=admit` (the host calls of one admission by `sluice.wasm`, in its order) | benchmark modes (no other host calls); `calls=<n>` repeats the call |
//! | `bench=batch`, `cluster=<name>`, `in_flight=<n>` | each request paused and resumed by a callout shared with the requests that waited for it (group commit's floor; `guest/batch.rs`) |
//! | `ops=<op,...>` | default request operations when a request has no `x-test-op` |
//!
//! # Request operations
//!
//! A request names operations in `x-test-op` (comma-separated); results come back as
//! request headers `x-*` on the forwarded request (or in the local reply). `operation.rs`
//! lists them (`Operation`, one line each); `guest.rs` runs them, and `guest/` holds what
//! each family does.
//!
//! `shared-script` runs the get / set / CAS steps of `x-shared-script` with the raw host
//! calls and reports every status, cas and value (`x-shared-step-<i>`; see
//! `HttpStream::shared_script`), so that the same sequence can be compared between hosts.
//!
//! `callout` (to the cluster in `x-cluster`, default `upstream`, with the timeout in
//! `x-timeout-ms`) reports what `proxy_on_http_call_response` saw: `x-callout-headers`,
//! `-body-size`, `-trailers`, `-status-code` and `-status-message` (`proxy_get_status`),
//! and then either `x-callout-status`, `-body` and one `x-callout-response-<i>: <name>:
//! <value>` per response header in order, or, with no headers, the statuses of reading
//! them (`x-callout-read-status`, `-pairs`, `-body-read-status`).

#[cfg(target_arch = "wasm32")]
mod config;
#[cfg(target_arch = "wasm32")]
mod guest;
#[cfg(any(target_arch = "wasm32", test))]
mod operation;
#[cfg(target_arch = "wasm32")]
mod raw;

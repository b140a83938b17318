//! A proxy-wasm host (ABI 0.2.1) on wasmtime that runs a compiled plugin, such as
//! `sluice.wasm`, the way Envoy runs it, without Envoy.
//!
//! It is three things: the harness every test of the filter goes through, the rig its
//! benchmarks run on, and `wasm-host serve`, an HTTP/1.1 proxy on loopback. Every result
//! the project claims about the filter goes through it, so its rule is fidelity: each
//! host call answers with the status Envoy (proxy-wasm-cpp-host plus Envoy's
//! `Context`) would give, at the moment Envoy would allow it.
//!
//! # Model
//!
//! * A [`Host`] is one plugin (module, configuration, `vm_id`, `root_id`, name, failure
//!   policy) running on N [`Worker`]s. Each worker owns one VM (a wasmtime store and
//!   instance), as each Envoy worker thread does. Workers share one shared-data store
//!   ([`SharedDataStore`], Envoy's rules, keyed by `vm_id`), one metrics registry, the
//!   captured logs, the clock and the callout clusters.
//! * A test sends a [`Request`] to a worker and reads the [`Outcome`]: paused by the
//!   filter, forwarded upstream (with the headers and body as the filter left them),
//!   answered (a [`ClientResponse`]: the filter's local response, the upstream's response
//!   after the filter's response callbacks, or the failure policy's 503), or reset.
//! * Time is a [`VirtualClock`] by default. [`Host::advance`] moves it and fires, in time
//!   order, every tick and every callout answer or timeout that falls due, so a paused
//!   request resumes without any sleep.
//! * Callouts go to named clusters: a real HTTP/1.1 server ([`HostBuilder::cluster`]) or
//!   a script ([`HostBuilder::scripted_cluster`] returning an [`Answer`]: what the
//!   upstream does on the wire, and when). Either way the guest sees what Envoy's router
//!   makes of it: a refused connection or a timeout is a `503` or `504` response, a
//!   reset after the response head is `(0, 0, 0)` (see [`callout`]).
//! * A trap is never swallowed: it is logged, counted (`wasm_host.traps`), listed by
//!   [`Host::traps`] with the guest's panic message, and the [`FailurePolicy`] applies to
//!   every stream of that VM; the other workers keep serving.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use wasm_host::{Answer, Host, Request, Response};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The repository's test guest: its behaviour is chosen by `x-test-op`.
//! let mut host = Host::builder(sluice_artifacts::TEST_GUEST_WASM)
//!     .vm_id("sluice")
//!     .workers(2)
//!     .scripted_cluster("upstream", |_| Answer::status(200).body("ok").after(Duration::from_millis(20)))
//!     .build()?;
//!
//! // The filter calls out and holds the request until the answer arrives.
//! let worker = host.worker(0);
//! let stream = worker.request(Request::get("/items").header("x-test-op", "callout,metrics"));
//! assert!(worker.outcome(stream)?.is_paused());
//!
//! // 20 ms later (virtual time) the answer arrives and the filter lets the request go.
//! host.advance(Duration::from_millis(20));
//! let worker = host.worker(0);
//! let forwarded = worker.outcome(stream)?.forwarded().expect("forwarded").clone();
//! assert_eq!(forwarded.headers.get_str("x-callout-status"), Some("200"));
//!
//! // The upstream's response goes back through the filter; then the stream ends.
//! let status = worker.respond(stream, Response::ok())?.response().map(|r| r.status);
//! assert_eq!(status, Some(200));
//! worker.finish(stream)?;
//!
//! // What the host observed.
//! assert_eq!(host.metric("test_guest.requests"), Some(1));
//! assert_eq!(host.callouts()[0].cluster, "upstream");
//! assert!(host.traps().is_empty());
//!
//! // Workers are `Send`: drive them on real threads at once, over one shared store.
//! std::thread::scope(|scope| {
//!     for worker in host.workers_mut() {
//!         scope.spawn(move || worker.exchange(Request::get("/"), Response::ok()).map(|e| e.status()));
//!     }
//! });
//! # Ok(())
//! # }
//! ```
//!
//! # What Envoy does, and so does this host
//!
//! * Start: `_initialize`, then per plugin a root context: `proxy_on_context_create`,
//!   `proxy_on_vm_start`, `proxy_on_configure`. False from either rejects the plugin
//!   ([`HostError::ConfigurationRejected`] carries what the plugin logged). A new
//!   configuration ([`Host::reconfigure`]) is a new root context on the same VM; a
//!   rejected one leaves the old one serving.
//! * Streams: request headers, then the body at once (even if the headers paused), then
//!   trailers; `Continue` from a body callback also releases paused headers. A local
//!   response sent from the request path is encoded through the filter's own response
//!   callbacks; one sent from the response path replaces the response directly. A
//!   local response turns the callback's result into `Pause`. Continue, close and local
//!   responses take effect after the callback returns.
//! * Maps and buffers exist only while the filter holds them (request headers until the
//!   request continues, the callout response during `proxy_on_http_call_response`, the
//!   plugin configuration during `proxy_on_configure`...); reading a map that is gone is
//!   `BAD_ARGUMENT`, as in Envoy, which the proxy-wasm Rust SDK turns into a panic.
//! * `proxy_on_done`, `proxy_on_log` (request and response headers readable),
//!   `proxy_on_delete` when a stream finishes; `proxy_done` for a deferred done.
//! * Callouts: see [`callout`]. Shared data: see [`shared_data`]. Metrics: see
//!   [`metrics`]. Properties: see the table in the `abi::properties` module docs
//!   (`source.address` is `ip:port`, integers are 8 bytes little-endian).
//! * Logging: `proxy_log` at its level; WASI stdout at `info`, stderr at `error`, one
//!   line per write.
//! * WASI: clocks from the host's [`Clock`], `random_get` (64 KiB at most), an empty
//!   environment unless [`HostBuilder::env`] adds to it, no files, `proc_exit` fails the
//!   VM.
//! * Unimplemented imports (gRPC calls) fail the VM with the function's name when
//!   called, and are listed in an `info` line when the host starts.
//!
//! Known differences: the body of a request or response reaches the filter in one
//! chunk; the streams of a failed VM get the failure policy at once (Envoy applies it
//! at each stream's next event); `proxy_send_local_response` with a status outside
//! 100–999 is `BAD_ARGUMENT` (Envoy sends it); there are no gRPC calls. A real callout
//! opens a fresh HTTP/1.1 connection (Envoy pools upstream connections and may reuse
//! one, and speaks HTTP/2 to a cluster configured for it); a cluster's connect timeout
//! is not modelled (only the guest's timeout ends a connect that hangs); a response body
//! over 16 MiB resets the call (Envoy's limit was not measured).
//!
//! # Layout: layers that only point down
//!
//! Each module imports only from the layers below it (a test,
//! `tests/host/layers.rs`, reads every `crate::` path in `src/` and fails on an upward
//! one or on a circle). From the bottom:
//!
//! 1. **Data** (no state, no threads): [`headers`], [`request`] (what a test sends and
//!    reads), [`clock`], [`logs`], [`metrics`], [`shared_data`] (Envoy's shared-data
//!    rules), [`callout`] (what the wire or a script makes of a callout), [`counts`]
//!    (host calls and probed guest functions, counted), `probe` (the module rewrite
//!    that counts entries into named guest functions), `profile` (the rewrite that
//!    counts each function's own instructions), `rewrite` (what the two share), and
//!    `error` ([`HostError`],
//!    [`FailurePolicy`], [`TrapReport`]).
//! 2. **Shared services**, `services/`: what every worker of a host shares (`Shared`:
//!    settings, clock, logs, metrics, the shared-data store, the shared queues, the
//!    callout clusters and runtime, the trap and callout records) and the mailbox other
//!    threads reach a worker through.
//! 3. **VM state**, `state.rs`: one VM's contexts, the callback in progress, deferred
//!    actions, pending callouts.
//! 4. **Host functions**, `abi/`: one file per family (`headers`, `buffers`,
//!    `properties`, `shared_data`, `callout`, `metrics`, `queues`, `lifecycle`, `log`,
//!    `time`, `wasi`); they read and write the VM state and the shared services.
//! 5. **Engine and linker**, `engine.rs`: compiling a module, checking its ABI, linking
//!    the host functions.
//! 6. **Worker**, `worker/`: one VM driven as Envoy drives it: `lifecycle.rs` (VM life
//!    and traps), `stream.rs` (the stream state machine), `schedule.rs` (ticks, timers,
//!    messages), `callout.rs` (callout answers to the guest), `reconfigure.rs`.
//! 7. **Facade**, `host/`: [`HostBuilder`] (`builder.rs`) and [`Host`] (`mod.rs`).
//! 8. **[`serve`]**: the proxy behind `wasm-host serve`: `mod.rs` (start, accept loops,
//!    shutdown), `vm.rs` (driving a worker's VM), `exchange.rs` (one request).
//!
//! To change a host call, open its file in `abi/`; to change what happens after it
//! (a stream resuming, a callout answer arriving), the worker file named above.

#![deny(missing_docs)]

mod abi;
pub mod callout;
pub mod clock;
pub mod counts;
mod engine;
mod error;
pub mod headers;
pub mod host;
pub mod logs;
pub mod metrics;
mod probe;
mod profile;
pub mod request;
mod rewrite;
pub mod serve;
mod services;
pub mod shared_data;
mod state;
pub mod worker;

pub use callout::{Answer, CalloutRequest, Cluster};
pub use clock::{Clock, SystemClock, VirtualClock};
pub use counts::CallCounts;
pub use headers::Headers;
pub use host::{FailurePolicy, Host, HostBuilder, HostError, MetricsHandle, TrapReport, Wasm};
pub use logs::{LogLevel, LogRecord, LogSource};
pub use metrics::{Histogram, MetricKind, MetricValue};
pub use request::{ClientResponse, Exchange, Message, Outcome, Request, Response, ResponseSource, StreamId};
pub use shared_data::{BeforeSharedData, SetOutcome, SharedData, SharedDataStore};
pub use worker::{DeferredCallout, Worker};

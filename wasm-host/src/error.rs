//! What can go wrong, and what the host does about it: [`HostError`] (building or
//! driving a host), [`FailurePolicy`] (what a trap does to the VM's streams, as Envoy's
//! `failure_policy`) and [`TrapReport`] (what the host recorded about a trap).
//!
//! These are plain data, at the bottom of the crate: the worker returns and records
//! them, the facade hands them to the caller.

use std::fmt;
use std::path::PathBuf;

use crate::request::StreamId;

/// What the host does when the guest traps, as Envoy's `failure_policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Envoy's default: streams of the failed VM get a `503` local reply, and the worker
    /// answers `503` from then on.
    #[default]
    FailClosed,
    /// Streams of the failed VM, and later requests, pass through without the filter.
    FailOpen,
    /// Open streams are failed closed; the next request starts a fresh VM (same `vm_id`,
    /// shared data kept) with the current configuration.
    FailReload,
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FailClosed => "FAIL_CLOSED",
            Self::FailOpen => "FAIL_OPEN",
            Self::FailReload => "FAIL_RELOAD",
        })
    }
}

/// A trap in a guest callback, as the host reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrapReport {
    /// The worker whose VM trapped.
    pub worker: usize,
    /// The guest export that trapped (for example `proxy_on_request_headers`).
    pub callback: &'static str,
    /// The context the callback ran for.
    pub context_id: u32,
    /// wasmtime's description of the trap, with the wasm backtrace.
    pub message: String,
    /// The last critical or stderr line the guest wrote during the callback: for a Rust
    /// guest, the panic message.
    pub guest_message: Option<String>,
    /// The policy applied.
    pub policy: FailurePolicy,
}

/// Everything that can go wrong building or driving a host. Guest misbehaviour at run
/// time is not an error: it is a trap, handled by the [`FailurePolicy`] and reported by
/// [`Host::traps`](crate::host::Host::traps).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The `.wasm` file could not be read.
    #[error("cannot read the wasm module {}", path.display())]
    ReadWasm {
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// wasmtime refused the module.
    #[error("{origin} is not a valid WebAssembly module: {reason}")]
    InvalidModule {
        /// The path, or "the module bytes".
        origin: String,
        /// wasmtime's explanation.
        reason: String,
    },
    /// The module could not be rewritten to count calls to the functions a test named
    /// ([`crate::HostBuilder::count_calls_to`]).
    #[error("{origin}: {reason}")]
    Probe {
        /// The path, or "the module bytes".
        origin: String,
        /// Which function, and what is wrong.
        reason: String,
    },
    /// The module is WebAssembly, but not a proxy-wasm 0.2 plugin.
    #[error("{origin} is not a proxy-wasm ABI 0.2 plugin: {reason}")]
    NotProxyWasm {
        /// The path, or "the module bytes".
        origin: String,
        /// What is missing or wrong.
        reason: String,
    },
    /// The module could not be instantiated.
    #[error("instantiating the module for worker {worker} failed: {reason}")]
    Instantiate {
        /// The worker.
        worker: usize,
        /// wasmtime's explanation.
        reason: String,
    },
    /// The guest trapped while starting (in `_initialize`, `proxy_on_vm_start` or
    /// `proxy_on_configure`).
    #[error("the plugin trapped in {callback} on worker {worker}: {message}")]
    StartTrapped {
        /// The worker.
        worker: usize,
        /// The export that trapped.
        callback: &'static str,
        /// The trap and the guest's last critical line.
        message: String,
    },
    /// `proxy_on_vm_start` returned false.
    #[error("the plugin refused to start (proxy_on_vm_start returned false on worker {worker}){}", said(.logs))]
    VmStartRejected {
        /// The worker.
        worker: usize,
        /// What the guest logged at warn level or above while starting.
        logs: Vec<String>,
    },
    /// `proxy_on_configure` returned false: Envoy rejects such a configuration.
    #[error("the plugin rejected its configuration (proxy_on_configure returned false on worker {worker}){}", said(.logs))]
    ConfigurationRejected {
        /// The worker.
        worker: usize,
        /// What the guest logged at warn level or above while configuring: normally why.
        logs: Vec<String>,
    },
    /// A worker index out of range.
    #[error("there is no worker {index}: the host has {workers}")]
    NoSuchWorker {
        /// The index asked for.
        index: usize,
        /// How many workers there are.
        workers: usize,
    },
    /// A stream id this worker does not know (never opened, or finished).
    #[error("worker {worker} has no open stream {}", stream.context_id())]
    UnknownStream {
        /// The worker.
        worker: usize,
        /// The stream.
        stream: StreamId,
    },
    /// An upstream response for a stream whose request did not go upstream, or which
    /// already has a response.
    #[error("stream {} cannot take an upstream response: {reason}", stream.context_id())]
    NotForwarded {
        /// The stream.
        stream: StreamId,
        /// Where the stream stands instead.
        reason: &'static str,
    },
    /// [`Worker::exchange`](crate::worker::Worker::exchange) found the request held by the filter.
    #[error("stream {} is paused by the filter; drive it with the clock or callouts, then read its outcome", stream.context_id())]
    Paused {
        /// The paused stream (still open).
        stream: StreamId,
    },
}

fn said(logs: &[String]) -> String {
    if logs.is_empty() { String::new() } else { format!("; it logged: {}", logs.join(" | ")) }
}

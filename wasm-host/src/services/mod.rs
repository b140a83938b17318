//! What every worker of a host shares ([`Shared`]): the plugin's identity, the clock,
//! logs, metrics, shared data and queues, the callout clusters, the records tests read
//! (traps, callouts), and the runtime real callouts run on.
//!
//! This layer sits under the VM state: a host function reaches it through
//! `HostState::shared`, a worker through its own `Arc<Shared>`, the facade through the
//! same `Arc`. It knows nothing about VMs: the compiled module and the VMs belong to the
//! worker. Everything here is `Sync`; the mutable parts sit behind their own mutexes
//! (Envoy's shared data and queues are behind one process-wide mutex each, too).

mod entropy;
mod mailbox;
mod queues;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

pub(crate) use entropy::Entropy;
pub(crate) use mailbox::{Inbox, Mailbox};
pub(crate) use queues::{QueueError, Queues, Registrant};

use crate::callout::{CalloutRequest, Cluster};
use crate::clock::Clock;
use crate::error::{FailurePolicy, TrapReport};
use crate::logs::{LogLevel, LogRecord, LogSink, LogSource};
use crate::metrics::Metrics;
use crate::shared_data::{BeforeSharedData, SharedData, SharedDataStore};

/// What every worker of a host shares. The builder fills in the settings; the records,
/// queues and the callout runtime start empty ([`Services::new`]).
pub(crate) struct Shared {
    pub(crate) vm_id: String,
    pub(crate) plugin_name: String,
    pub(crate) root_id: String,
    pub(crate) vm_configuration: Arc<[u8]>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) logs: LogSink,
    pub(crate) metrics: Metrics,
    pub(crate) store: Arc<SharedDataStore>,
    pub(crate) clusters: HashMap<String, Cluster>,
    pub(crate) properties: HashMap<Vec<u8>, Vec<u8>>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) entropy: Entropy,
    /// The guest functions whose entries each VM counts (`crate::probe`), in the order
    /// of their counters.
    pub(crate) probes: Vec<String>,
    /// The guest's functions whose own instructions are counted, in the order of the
    /// profile's counters ([`crate::profile`]); empty unless asked.
    pub(crate) profiled: Vec<String>,
    /// Whether each store is given fuel, to count the instructions its VM runs.
    pub(crate) count_instructions: bool,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) max_memory: usize,
    /// Epoch ticks a single guest call may run before it traps.
    pub(crate) call_ticks: u64,
    /// Library mode: after each step, wait (in real time, at most this long) for real
    /// callouts in flight. `None` in `serve`, where the worker loop waits instead.
    pub(crate) wait_for_real_callouts: Option<Duration>,
    pub(crate) record_callouts: bool,
    /// Scripted faults: host functions that answer this status instead of running.
    pub(crate) failing_calls: HashMap<&'static str, u32>,
    /// Scripted fault: the host never ends a callout at its timeout.
    pub(crate) ignore_callout_timeouts: bool,
    /// Called before every shared-data host call (see [`BeforeSharedData`]).
    pub(crate) before_shared_data: Option<BeforeSharedData>,
    /// `serve` drives each worker from its own loop, which owns the worker's inbox.
    pub(crate) serve_mode: bool,
    pub(crate) services: Services,
}

/// The mutable services of a [`Shared`]: records, queues, the callout runtime,
/// connection ids.
pub(crate) struct Services {
    traps: Mutex<Vec<TrapReport>>,
    callouts: Mutex<Vec<CalloutRequest>>,
    queues: Mutex<Queues>,
    io: OnceLock<tokio::runtime::Runtime>,
    io_handle: Option<tokio::runtime::Handle>,
    next_connection_id: AtomicU64,
}

impl Services {
    /// Empty records and queues; real callouts run on `io_handle`, or on a runtime of
    /// the host's own started on first use.
    pub(crate) fn new(io_handle: Option<tokio::runtime::Handle>) -> Self {
        Self {
            traps: Mutex::new(Vec::new()),
            callouts: Mutex::new(Vec::new()),
            queues: Mutex::new(Queues::default()),
            io: OnceLock::new(),
            io_handle,
            next_connection_id: AtomicU64::new(0),
        }
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        // A runtime must not be dropped from inside another runtime's context; shutting
        // it down in the background is always allowed.
        if let Some(runtime) = self.io.take() {
            runtime.shutdown_background();
        }
    }
}

impl Shared {
    /// Logs, counts (`wasm_host.traps`) and records a trap.
    pub(crate) fn report_trap(&self, report: TrapReport) {
        let guest = report.guest_message.as_deref().map(|m| format!(" (the guest said: {m})")).unwrap_or_default();
        self.logs.write(LogRecord {
            worker: report.worker,
            level: LogLevel::Critical,
            source: LogSource::Host,
            message: format!(
                "the plugin trapped in {} (context {}){guest}; applying {}: {}",
                report.callback, report.context_id, report.policy, report.message
            ),
        });
        self.metrics.count("wasm_host.traps");
        self.services.traps.lock().unwrap_or_else(PoisonError::into_inner).push(report);
    }

    /// The host's shared queues, locked.
    pub(crate) fn queues(&self) -> MutexGuard<'_, Queues> {
        self.services.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many traps were reported.
    pub(crate) fn traps_len(&self) -> usize {
        self.services.traps.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Every trap reported, in order.
    pub(crate) fn traps(&self) -> Vec<TrapReport> {
        self.services.traps.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The first trap reported after the first `since` ones.
    pub(crate) fn trap_since(&self, since: usize) -> Option<TrapReport> {
        self.services.traps.lock().unwrap_or_else(PoisonError::into_inner).get(since).cloned()
    }

    /// A line from the host itself.
    pub(crate) fn host_log(&self, worker: usize, level: LogLevel, message: String) {
        self.logs.write(LogRecord { worker, level, source: LogSource::Host, message });
    }

    /// Records a dispatched callout, unless recording is off.
    pub(crate) fn record_callout(&self, request: &CalloutRequest) {
        if self.record_callouts {
            self.services.callouts.lock().unwrap_or_else(PoisonError::into_inner).push(request.clone());
        }
    }

    /// Every callout recorded, in order.
    pub(crate) fn callouts(&self) -> Vec<CalloutRequest> {
        self.services.callouts.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The runtime that performs real HTTP callouts: `serve`'s, or a small one of the
    /// host's own, started on first use.
    pub(crate) fn io_runtime(&self) -> Option<tokio::runtime::Handle> {
        if let Some(handle) = &self.services.io_handle {
            return Some(handle.clone());
        }
        if self.services.io.get().is_none() {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("wasm-host-callouts")
                .enable_all()
                .build()
                .ok()?;
            let _ = self.services.io.set(runtime);
        }
        self.services.io.get().map(|runtime| runtime.handle().clone())
    }

    /// A fresh downstream connection id (`connection.id`), from 1.
    pub(crate) fn next_connection_id(&self) -> u64 {
        self.services.next_connection_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The shared data of this host's `vm_id`.
    pub(crate) fn shared_data(&self) -> SharedData {
        SharedData::new(Arc::clone(&self.store), &self.vm_id)
    }
}

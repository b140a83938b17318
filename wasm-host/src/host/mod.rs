//! [`Host`]: a compiled module, its plugin configuration, and one VM per worker; the
//! facade a test (or `serve`) drives.
//!
//! Layer: the top of the library, above the worker. `builder.rs` holds [`HostBuilder`]
//! and [`Wasm`] (what a host is made of); this file holds [`Host`], which moves the
//! virtual clock across its workers, applies reconfiguration to all of them at once, and
//! reads what they share (metrics, logs, shared data, traps, callouts). The error types
//! live in `crate::error` and are re-exported here.

mod builder;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use builder::{HostBuilder, Wasm};

pub use crate::engine::PROFILE_ENV;
pub use crate::error::{FailurePolicy, HostError, TrapReport};

use crate::callout::CalloutRequest;
use crate::clock::{Clock, VirtualClock, saturating_nanos};
use crate::counts::CallCounts;
use crate::logs::{LogLevel, LogRecord};
use crate::metrics::{Histogram, MetricValue};
use crate::services::Shared;
use crate::shared_data::SharedData;
use crate::state::Plugin;
use crate::worker::Worker;

/// Reads a host's metrics from anywhere (for example after its workers moved to
/// threads).
#[derive(Clone)]
pub struct MetricsHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsHandle").finish_non_exhaustive()
    }
}

impl MetricsHandle {
    /// Every metric, sorted by name.
    pub fn all(&self) -> Vec<(String, MetricValue)> {
        self.shared.metrics.all()
    }
}

/// A proxy-wasm host: one compiled plugin, one VM per worker, one shared-data store and
/// one metrics registry for all of them.
pub struct Host {
    shared: Arc<Shared>,
    workers: Vec<Worker>,
    clock: Option<VirtualClock>,
}

impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host").field("vm_id", &self.shared.vm_id).field("workers", &self.workers.len()).finish()
    }
}

impl Host {
    /// Starts building a host for a module: a path (`&str`, `Path`, `PathBuf`) or
    /// [`Wasm::bytes`].
    pub fn builder(wasm: impl Into<Wasm>) -> HostBuilder {
        HostBuilder::new(wasm.into())
    }

    /// Worker `index`.
    ///
    /// # Panics
    /// If there is no such worker; [`Host::try_worker`] returns an error instead.
    pub fn worker(&mut self, index: usize) -> &mut Worker {
        let workers = self.workers.len();
        match self.workers.get_mut(index) {
            Some(worker) => worker,
            None => panic!("there is no worker {index}: the host has {workers}"),
        }
    }

    /// Worker `index`, or an error if there is none.
    ///
    /// # Errors
    /// [`HostError::NoSuchWorker`].
    pub fn try_worker(&mut self, index: usize) -> Result<&mut Worker, HostError> {
        let workers = self.workers.len();
        self.workers.get_mut(index).ok_or(HostError::NoSuchWorker { index, workers })
    }

    /// Every worker, to drive them on threads at once (each `&mut Worker` is `Send`):
    /// `std::thread::scope(|s| for w in host.workers_mut() { s.spawn(move || ...); })`.
    pub fn workers_mut(&mut self) -> &mut [Worker] {
        &mut self.workers
    }

    /// A handle on the metrics that stays valid after [`Host::into_workers`].
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle { shared: Arc::clone(&self.shared) }
    }

    /// Takes the workers out of the host (to move each to its own thread for good).
    pub fn into_workers(self) -> Vec<Worker> {
        self.workers
    }

    /// The virtual clock, if the host was built with one (the default).
    pub fn clock(&self) -> Option<&VirtualClock> {
        self.clock.as_ref()
    }

    /// Moves the virtual clock forward by `by`, firing on the way, in time order, every
    /// tick and every scripted callout answer or timeout that falls due, on every worker,
    /// and at the same instant what those posted (shared-queue notifications); then
    /// waits for real callouts those dispatched. Without a virtual clock, only fires
    /// what is already due.
    pub fn advance(&mut self, by: Duration) {
        let Some(clock) = self.clock.clone() else {
            for worker in &mut self.workers {
                worker.run_pending();
            }
            return;
        };
        // Real callouts that finished before now are delivered before anything later.
        for worker in &mut self.workers {
            worker.drain_inbox();
        }
        let target = clock.monotonic_nanos().saturating_add(saturating_nanos(by));
        loop {
            let next = self.workers.iter().filter_map(Worker::next_deadline).min();
            match next {
                Some(at) if at <= target => {
                    clock.advance_to_monotonic(at);
                    for worker in &mut self.workers {
                        worker.fire_due();
                        // What those callbacks posted (a shared queue's notification) runs
                        // at this instant too, as on Envoy's event loop, not at the end.
                        worker.drain_inbox();
                    }
                }
                _ => break,
            }
        }
        clock.advance_to_monotonic(target);
        for worker in &mut self.workers {
            worker.run_pending();
        }
    }

    /// Applies a new plugin configuration to every worker, as an xDS update does: each
    /// VM gets a new root context (same `vm_id`, shared data kept) that takes the new
    /// streams, while streams already open finish on the old one. If any worker rejects
    /// the configuration, none switches and the old configuration keeps serving.
    ///
    /// # Errors
    /// [`HostError::ConfigurationRejected`] (or `VmStartRejected`, `StartTrapped`) when a
    /// worker refuses it.
    pub fn reconfigure(&mut self, configuration: impl Into<Vec<u8>>) -> Result<(), HostError> {
        let plugin = Arc::new(Plugin {
            name: self.shared.plugin_name.clone(),
            root_id: self.shared.root_id.clone(),
            configuration: configuration.into().into(),
        });
        let mut prepared = Vec::with_capacity(self.workers.len());
        for worker in &mut self.workers {
            match worker.prepare_configuration(Arc::clone(&plugin)) {
                Ok(root) => prepared.push(root),
                Err(error) => {
                    for (worker, root) in self.workers.iter_mut().zip(prepared) {
                        worker.abandon_configuration(root);
                    }
                    return Err(error);
                }
            }
        }
        for (worker, root) in self.workers.iter_mut().zip(prepared) {
            worker.commit_configuration(root, Arc::clone(&plugin));
        }
        Ok(())
    }

    /// The value of a guest counter or gauge (by the guest's own name), or of a host
    /// counter (`wasm_host.traps`, ...).
    pub fn metric(&self, name: &str) -> Option<u64> {
        match self.shared.metrics.find(name)? {
            MetricValue::Counter(value) | MetricValue::Gauge(value) => Some(value),
            MetricValue::Histogram(_) => None,
        }
    }

    /// What a guest histogram recorded.
    pub fn histogram(&self, name: &str) -> Option<Histogram> {
        match self.shared.metrics.find(name)? {
            MetricValue::Histogram(histogram) => Some(histogram),
            _ => None,
        }
    }

    /// Every metric, sorted by name.
    pub fn metrics(&self) -> Vec<(String, MetricValue)> {
        self.shared.metrics.all()
    }

    /// Every captured log line, in order.
    pub fn logs(&self) -> Vec<LogRecord> {
        self.shared.logs.records()
    }

    /// The messages logged at exactly `level`, in order.
    pub fn logs_at(&self, level: LogLevel) -> Vec<String> {
        self.logs().into_iter().filter(|r| r.level == level).map(|r| r.message).collect()
    }

    /// Forgets the captured log lines.
    pub fn clear_logs(&self) {
        self.shared.logs.clear();
    }

    /// The shared data of this host's `vm_id`.
    pub fn shared_data(&self) -> SharedData {
        self.shared.shared_data()
    }

    /// Every trap so far, in order.
    pub fn traps(&self) -> Vec<TrapReport> {
        self.shared.traps()
    }

    /// Every callout the guests dispatched (accepted by the host), in order.
    pub fn callouts(&self) -> Vec<CalloutRequest> {
        self.shared.callouts()
    }

    /// What every worker's VM counted, summed: host calls, allocator re-entries, and
    /// entries into the probed functions ([`HostBuilder::count_calls_to`]). Subtract
    /// two readings for what happened in between.
    pub fn call_counts(&mut self) -> CallCounts {
        let mut total = CallCounts::default();
        for worker in &mut self.workers {
            total.add(&worker.call_counts());
        }
        total
    }

    /// Each worker's linear memory size in bytes.
    pub fn memory_sizes(&self) -> Vec<usize> {
        self.workers.iter().map(Worker::memory_size).collect()
    }
}

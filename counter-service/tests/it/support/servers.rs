//! Which Redis the tests run against: `redis-server` processes and 3-master clusters
//! they start themselves, each on free loopback ports, watched so none outlives them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use sluice_counter::store::{RedisConfig, RedisUrl, Topology};

use super::{free_port, wait_until};

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

//! Which Redis a test runs against: `redis-server` processes and 3-master clusters it
//! starts itself, each on a free loopback port, in its own temporary directory, with
//! persistence off, under a small shell watchdog that kills it when the test process
//! exits (so even a server kept in a `static` never outlives the tests). A guard kills
//! its server when dropped. A missing `redis-server` is a loud failure, never a skip:
//! `.ci/run` installs Debian's package.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::peers::free_port;
use crate::wait;

/// The keys the counter service keeps (the hygiene check reads them).
pub const LIMITER_KEYS: &str = "sluice:*";

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
    /// The port it listens on.
    pub port: u16,
    pid: u32,
    dir: PathBuf,
    extra: Vec<String>,
    /// `requirepass`, which [`RedisServer::url`] then carries.
    password: Option<String>,
    /// The watchdog shells, reaped on drop.
    watchdogs: Vec<std::process::Child>,
    _tmp: tempfile::TempDir,
}

/// Starts the server (its arguments follow the directory) and kills it once the test
/// process (`PARENT`) is gone; removes the directory then.
const WATCHDOG: &str = r#"dir=$1; shift
"$@" &
r=$!
echo $r > "$dir/redis.pid"
while kill -0 "$PARENT" 2>/dev/null && kill -0 $r 2>/dev/null; do sleep 0.2; done
kill -9 $r 2>/dev/null
if ! kill -0 "$PARENT" 2>/dev/null; then rm -rf "$dir"; fi
"#;

/// How many ports a first start tries. A port found free may be taken before the server
/// binds it, and a cluster node also binds its port + 10 000 (the cluster bus), which
/// nobody checked: the server then exits at once, and starts again on another port.
const START_ATTEMPTS: u32 = 5;

/// How long a start waits for one `PING`'s answer.
const PING_TIMEOUT: Duration = Duration::from_millis(500);

/// How one start went.
enum Launch {
    /// It answers `PING`.
    Up,
    /// It exited before answering (its log says why).
    Exited,
}

/// Whether process `pid` runs (not gone, not a zombie waiting for its parent).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(')').next().map(|rest| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

impl RedisServer {
    /// A standalone server.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not answer.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server that requires `password` (`requirepass`); its URL carries it.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_with_password(password: &str) -> Self {
        Self::start_configured(&["--requirepass", password], Some(password))
    }

    /// A server with extra `redis-server` arguments.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_configured(extra, None)
    }

    fn start_configured(extra: &[&str], password: Option<&str>) -> Self {
        Self::start_on(free_port(), extra, password)
    }

    /// A server on `port`, or on another free one if `port` turns out taken.
    fn start_on(port: u16, extra: &[&str], password: Option<&str>) -> Self {
        let tmp = tempfile::Builder::new().prefix("sluice-redis-").tempdir().expect("a temp dir");
        let dir = tmp.path().to_path_buf();
        let mut server = Self {
            port,
            pid: 0,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            password: password.map(str::to_owned),
            watchdogs: Vec::new(),
            _tmp: tmp,
        };
        server.spawn(START_ATTEMPTS);
        server
    }

    /// Starts the server on its port; on a first start (`attempts` above 1), on another
    /// free port when it exits at once (the port was taken meanwhile).
    fn spawn(&mut self, attempts: u32) {
        for attempt in 1..=attempts {
            match self.launch() {
                Launch::Up => return,
                Launch::Exited if attempt < attempts => {
                    // A cluster node's configuration names the port it failed on.
                    let _ = std::fs::remove_file(self.dir.join("nodes.conf"));
                    self.port = free_port();
                }
                Launch::Exited => {
                    panic!("redis-server exited as it started on port {}: {}", self.port, self.log_tail())
                }
            }
        }
    }

    /// Starts the server once: whether it answered, or exited first.
    fn launch(&mut self) -> Launch {
        let pid_file = self.dir.join("redis.pid");
        let _ = std::fs::remove_file(&pid_file);
        let port = self.port.to_string();
        let dir = self.dir.to_str().expect("utf-8 temp dir");
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
            dir,
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
        wait::until(Duration::from_secs(10), "redis-server's pid file", || {
            std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<u32>().ok()).is_some()
        });
        self.pid = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("pid");
        let url = self.url();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Bounded: whatever else holds the port may accept and never answer.
            let answered = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(PING_TIMEOUT))
                .and_then(|mut c| {
                    c.set_read_timeout(Some(PING_TIMEOUT))?;
                    redis::cmd("PING").query::<String>(&mut c)
                })
                .is_ok();
            if answered {
                return Launch::Up;
            }
            if !alive(self.pid) {
                if let Some(mut watchdog) = self.watchdogs.pop() {
                    let _ = watchdog.kill();
                    let _ = watchdog.wait();
                }
                return Launch::Exited;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after 10s waiting for redis-server to answer PING on port {}: {}",
                self.port,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of its log, for a failure message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Its URL (with the password, if it has one).
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Its directory (where `redis.log` is written).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A fresh synchronous connection (for administration and inspection).
    ///
    /// # Panics
    /// When it cannot connect.
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("url");
        let conn = client.get_connection_with_timeout(Duration::from_secs(5)).expect("connect to redis");
        conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        conn
    }

    /// Runs one command and returns its reply.
    ///
    /// # Panics
    /// When the command fails.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let (name, rest) = args.split_first().expect("a command");
        let mut cmd = redis::cmd(name);
        for a in rest {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn()).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Makes Redis hold every client for `for_ms` milliseconds (`CLIENT PAUSE ... ALL`).
    ///
    /// # Panics
    /// When Redis refuses.
    pub fn pause(&self, for_ms: u64) {
        let reply: String = self.cmd(&["CLIENT", "PAUSE", &for_ms.to_string(), "ALL"]);
        assert_eq!(reply, "OK", "CLIENT PAUSE");
    }

    /// Sends the server `signal` (`STOP`, `CONT`, `KILL`, ...).
    ///
    /// # Panics
    /// When `kill` fails.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.pid.to_string()).status().expect("kill");
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Kills the server (SIGKILL) and waits until its port is closed.
    ///
    /// # Panics
    /// When it does not die.
    pub fn kill(&self) {
        self.signal("KILL");
        let port = self.port;
        wait::until(Duration::from_secs(10), "redis-server to die", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        });
    }

    /// Starts the server again on the same port (empty: persistence is off).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn restart(&mut self) {
        self.spawn(1);
    }

    /// `INFO clients` connected_clients (including the connection asking).
    ///
    /// # Panics
    /// When Redis does not say.
    pub fn connected_clients(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("connected_clients in INFO")
    }

    /// Every key of the counter service ([`LIMITER_KEYS`]) with its PTTL.
    ///
    /// # Panics
    /// When Redis cannot be read.
    pub fn limiter_keys(&self) -> Vec<(String, i64)> {
        let mut conn = self.conn();
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(LIMITER_KEYS).query(&mut conn).expect("KEYS (test servers hold few keys)");
        keys.into_iter()
            .map(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).expect("PTTL");
                (k, ttl)
            })
            .collect()
    }

    /// The hygiene check: fails if any limiter key lacks a TTL (`PTTL` -1).
    ///
    /// # Panics
    /// When one does.
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
    /// Its masters.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts one and waits until every node says `cluster_state:ok`.
    ///
    /// # Panics
    /// When `redis-cli` is missing or the cluster does not form.
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
            wait::until(Duration::from_secs(20), "cluster_state:ok on every node", || {
                let info: String = node.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
            });
        }
        Self { nodes }
    }

    /// Its nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The hygiene check on every node.
    ///
    /// # Panics
    /// When a limiter key lacks a TTL.
    pub fn assert_every_key_has_a_ttl(&self) {
        for node in &self.nodes {
            node.assert_every_key_has_a_ttl();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_started_for_a_test_answers_and_is_gone_once_dropped() {
        let server = RedisServer::start_with_password("secret");
        let port = server.port;

        let pong: String = server.cmd(&["PING"]);
        server.pause(1);

        assert_eq!(pong, "PONG");
        assert_eq!(server.url(), format!("redis://:secret@127.0.0.1:{port}"));
        drop(server);
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing listens once it is dropped");
    }

    #[test]
    fn a_server_whose_port_is_taken_as_it_starts_comes_up_on_another() {
        // Someone else binds the port between the moment it was found free and the
        // server's start (for a cluster node, its port + 10 000 as well).
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = taken.local_addr().expect("its address").port();

        let server = RedisServer::start_on(port, &[], None);

        assert_ne!(server.port, port);
        let pong: String = server.cmd(&["PING"]);
        assert_eq!(pong, "PONG");
    }
}

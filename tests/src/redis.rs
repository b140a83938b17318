//! A `redis-server` for one test, on a loopback port, persistence off, killed when
//! dropped (and by a watchdog if the test process dies first). A missing `redis-server`
//! is a loud failure, never a skip: `.ci/run` installs Debian's package.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Redis.
#[derive(Debug)]
pub struct Redis {
    addr: SocketAddr,
    child: Child,
    watchdog: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Redis {
    /// Starts one.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not answer.
    pub fn start() -> Self {
        // Redis cannot bind port 0: take a port the OS picked and hand it over.
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let dir = tempfile::tempdir().expect("a directory for Redis");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("redis-server is not installed ({e}): these tests need Debian's redis-server package")
            });
        let script = format!(
            "while kill -0 {} 2>/dev/null && kill -0 {} 2>/dev/null; do sleep 0.5; done; kill -9 {} 2>/dev/null",
            std::process::id(),
            child.id(),
            child.id()
        );
        let watchdog = Command::new("sh").args(["-c", &script]).stdout(Stdio::null()).spawn().ok();
        let redis = Self { addr: SocketAddr::from(([127, 0, 0, 1], port)), child, watchdog, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while redis.command(&["PING"]).as_deref() != Some("+PONG\r\n") {
            assert!(Instant::now() < deadline, "redis-server did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    /// Its URL for the counter service.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sends one command; returns the raw reply.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_millis(500)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes()).ok()?;
        let mut reply = [0u8; 512];
        let n = stream.read(&mut reply).ok()?;
        Some(String::from_utf8_lossy(reply.get(..n)?).into_owned())
    }

    /// Makes Redis hold every client for `for_ms` milliseconds (`CLIENT PAUSE ... ALL`).
    ///
    /// # Panics
    /// When Redis refuses.
    pub fn pause(&self, for_ms: u64) {
        let reply = self.command(&["CLIENT", "PAUSE", &for_ms.to_string(), "ALL"]);
        assert_eq!(reply.as_deref(), Some("+OK\r\n"), "CLIENT PAUSE");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

//! `wasm-host serve` end to end: the real binary, real sockets, a real HTTP client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use sluice_testkit::peers::{Peer, Step};

/// How long `serve` may take to start or stop before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);

struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Serve {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wasm-host"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start wasm-host serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(DEADLINE).expect("serve prints its address");
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in `{line}`"));
        Self { child, addr }
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit; returns stderr.
    fn stop(mut self) -> String {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + DEADLINE;
        let exit = loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                break exit;
            }
            assert!(Instant::now() < deadline, "serve did not stop");
            thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        let _ = self.child.stderr.take().expect("stderr").read_to_string(&mut stderr);
        assert!(exit.success(), "serve exited with {exit}: {stderr}");
        stderr
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response as read off the wire.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on its own connection.
fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect to serve");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: sluice.test\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines.filter_map(|l| l.split_once(": ")).map(|(n, v)| (n.to_owned(), v.to_owned())).collect();
    Reply { status, headers, body: body.to_owned() }
}

#[test]
fn serve_runs_requests_through_the_filter_and_stops_gracefully() {
    let serve = Serve::start(&[
        "--wasm",
        sluice_artifacts::TEST_GUEST_WASM,
        "--config-inline",
        "generation=5",
        "--workers",
        "2",
    ]);

    let echoed = send(serve.addr, "GET", "/hello?x=1", &[("x-test-op", "headers"), ("x-in", "abc")], "");
    let denied = send(serve.addr, "GET", "/", &[("x-test-op", "local,resp-headers"), ("x-status", "429")], "");
    let rewritten = send(serve.addr, "POST", "/upload", &[("x-test-op", "body")], "payload");
    let too_large = send(serve.addr, "POST", "/", &[], &"x".repeat(2 * 1024 * 1024));
    let stderr = serve.stop();

    assert_eq!(echoed.status, 200);
    assert_eq!(echoed.header("x-echo-upstream"), Some("wasm-host"));
    assert!(echoed.body.contains(":path: /hello?x=1\n"), "{}", echoed.body);
    assert!(echoed.body.contains("x-test-generation: 5\n"), "{}", echoed.body);
    assert!(echoed.body.contains("x-got: abc\n"), "{}", echoed.body);
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-local"), Some("yes"));
    assert_eq!(denied.header("x-filter"), Some("1"));
    assert_eq!(denied.body, "denied");
    assert!(rewritten.body.ends_with("payload+seen\n"), "{}", rewritten.body);
    assert_eq!(too_large.status, 413);
    assert!(stderr.contains("stopped"), "{stderr}");
}

#[test]
fn serve_forwards_to_an_upstream_and_calls_out_to_clusters() {
    let upstream = Peer::start(vec![
        Step::write("HTTP/1.1 201 Created\r\nx-upstream: real\r\ncontent-length: 4\r\nconnection: close\r\n\r\nmade"),
        Step::Close,
    ]);
    let counter = Peer::start(vec![
        Step::write("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nallow"),
        Step::Close,
    ]);
    let upstream_url = format!("http://{}", upstream.addr());
    let cluster = format!("upstream={}", counter.addr());
    let serve = Serve::start(&[
        "--wasm",
        sluice_artifacts::TEST_GUEST_WASM,
        "--upstream",
        &upstream_url,
        "--cluster",
        &cluster,
        "--workers",
        "1",
    ]);

    let reply = send(serve.addr, "GET", "/resource", &[("x-test-op", "callout,resp-headers")], "");
    serve.stop();

    assert_eq!(reply.status, 201);
    assert_eq!(reply.body, "made");
    assert_eq!(reply.header("x-upstream"), Some("real"));
    assert_eq!(reply.header("x-filter"), Some("1"));
    let forwarded = upstream.requests_as_text();
    assert!(forwarded[0].starts_with("GET /resource HTTP/1.1\r\n"), "{}", forwarded[0]);
    assert!(forwarded[0].contains("x-callout-body: allow\r\n"), "{}", forwarded[0]);
    assert_eq!(counter.requests().len(), 1);
}

#[test]
fn serve_without_a_filter_is_a_plain_proxy() {
    let serve = Serve::start(&["--no-filter"]);

    let reply = send(serve.addr, "GET", "/plain", &[("x-test-op", "local")], "");
    serve.stop();

    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("x-test-op: local\n"), "{}", reply.body);
}

fn run_to_exit(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_wasm-host"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn serve_explains_a_configuration_the_plugin_rejects() {
    let (ok, stderr) = run_to_exit(&[
        "--wasm",
        sluice_artifacts::TEST_GUEST_WASM,
        "--config-inline",
        "reject=limits: must not be empty",
    ]);

    assert!(!ok);
    assert!(stderr.contains("rejected its configuration"), "{stderr}");
    assert!(stderr.contains("limits: must not be empty"), "{stderr}");
}

#[test]
fn serve_explains_a_missing_or_invalid_wasm() {
    let (missing_ok, missing) = run_to_exit(&["--wasm", "/nonexistent/plugin.wasm"]);
    let (invalid_ok, invalid) = run_to_exit(&["--wasm", env!("CARGO_MANIFEST_DIR")]);
    let not_wasm = std::env::temp_dir().join(format!("wasm-host-not-wasm-{}.wasm", std::process::id()));
    std::fs::write(&not_wasm, b"not a module").unwrap();
    let (garbage_ok, garbage) = run_to_exit(&["--wasm", not_wasm.to_str().unwrap()]);
    let _ = std::fs::remove_file(&not_wasm);

    assert!(!missing_ok && missing.contains("/nonexistent/plugin.wasm"), "{missing}");
    assert!(!invalid_ok && invalid.contains("is not a file"), "{invalid}");
    assert!(!garbage_ok && garbage.contains("is not a valid WebAssembly module"), "{garbage}");
}

#[test]
fn serve_fires_ticks_and_callout_timeouts_on_the_real_clock() {
    let silent = Peer::silent();
    let cluster = format!("upstream={}", silent.addr());
    let serve = Serve::start(&[
        "--wasm",
        sluice_artifacts::TEST_GUEST_WASM,
        "--config-inline",
        "tick_ms=20",
        "--cluster",
        &cluster,
        "--workers",
        "1",
    ]);

    let resumed_by_tick = send(serve.addr, "GET", "/held", &[("x-test-op", "pause")], "");
    let timed_out = send(serve.addr, "GET", "/call", &[("x-test-op", "callout"), ("x-timeout-ms", "100")], "");
    let stderr = serve.stop();

    assert_eq!(resumed_by_tick.status, 200);
    assert_eq!(timed_out.status, 200);
    // Envoy's router answers for the silent upstream.
    assert!(timed_out.body.contains("x-callout-status: 504\n"), "{}", timed_out.body);
    assert!(timed_out.body.contains("x-callout-body: upstream request timeout\n"), "{}", timed_out.body);
    assert!(stderr.contains("metric test_guest.ticks = "), "{stderr}");
}

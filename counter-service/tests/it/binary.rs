//! How the real `sluice-counter` binary behaves: help, defaults, environment, bad flags,
//! shutdown.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{Http, Protocol, RedisServer, free_port, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-counter");

/// Kills the child if a test fails before stopping it.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Service {
    fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status().expect("kill");
        assert!(status.success());
        let mut exit = None;
        wait_until(Duration::from_secs(10), "the service to exit after SIGTERM", || {
            exit = self.0.try_wait().expect("try_wait");
            exit.is_some()
        });
        exit.expect("exited")
    }
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    http_request(addr, "GET", path, "", "")
}

fn http_request(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

#[test]
fn help_lists_every_setting_with_its_environment_variable() {
    let out = Command::new(BIN).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);

    assert!(out.status.success());
    for flag in [
        "--listen",
        "SLUICE_COUNTER_LISTEN",
        "--store",
        "redis-cluster",
        "--redis-url",
        "--redis-pool-size",
        "--redis-timeout-ms",
        "--max-in-flight",
        "--request-timeout-ms",
        "SLUICE_COUNTER_REQUEST_TIMEOUT_MS",
        "--max-body-bytes",
        "--max-entries",
        "--memory-max-keys",
        "--memory-max-charge-ids",
        "--log-format",
        "--token-file",
        "SLUICE_COUNTER_TOKEN_FILE",
        "SLUICE_COUNTER_TOKEN",
        "--admin-token-env",
        "SLUICE_COUNTER_ADMIN_TOKEN_ENV",
        "--hash-key-env",
        "SLUICE_COUNTER_HASH_KEY_ENV",
        "override",
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}:\n{help}");
    }
}

#[test]
fn started_without_arguments_it_serves_the_memory_store_on_loopback_port_8710_and_stops_on_sigterm() {
    // The documented default is a fixed port, so make sure the answer is ours: nothing
    // serves it before the service starts, and nothing once it has stopped.
    assert!(
        std::net::TcpStream::connect("127.0.0.1:8710").is_err(),
        "another process serves 127.0.0.1:8710; this test checks the default port and needs it free"
    );
    let service = Service(Command::new(BIN).env_clear().stderr(Stdio::null()).spawn().expect("starts"));

    let mut ready = None;
    wait_until(Duration::from_secs(10), "GET /readyz on 127.0.0.1:8710", || {
        ready = http_get("127.0.0.1:8710", "/readyz");
        ready.is_some()
    });
    let exit = service.terminate();

    let ready = ready.expect("answered");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(ready.contains(r#""store":"memory""#), "{ready}");
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
    assert!(std::net::TcpStream::connect("127.0.0.1:8710").is_err(), "the port closes with the service that served it");
}

#[test]
fn settings_come_from_the_environment_and_logs_are_structured() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(BIN)
        .env("SLUICE_COUNTER_LISTEN", &addr)
        .env("SLUICE_COUNTER_STORE", "redis")
        .env("SLUICE_COUNTER_REDIS_URL", redis.url())
        .env("SLUICE_COUNTER_LOG_FORMAT", "json")
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let service = Service(child);
    let mut lines = BufReader::new(stderr).lines();

    let mut ready = None;
    wait_until(Duration::from_secs(10), "GET /readyz", || {
        ready = http_get(&addr, "/readyz");
        ready.is_some()
    });
    let exit = service.terminate();
    let logs: Vec<String> = lines.by_ref().map_while(Result::ok).collect();

    assert!(ready.expect("answered").contains(r#""store":"redis""#));
    assert!(exit.success());
    assert!(logs.iter().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{logs:#?}");
    assert!(
        logs.iter().any(|l| l.contains("WARN") && l.contains("volatile-lru") && l.contains("silently resets limits")),
        "an evicting Redis is reported: {logs:#?}"
    );
}

/// The threads of process `pid`.
fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count)
}

#[test]
fn one_worker_thread_serves_on_the_main_thread_alone_and_more_get_a_pool_of_that_size() {
    let mut seen = Vec::new();
    for workers in ["1", "3"] {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(BIN)
            .args(["--listen", &addr, "--worker-threads", workers])
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let pid = child.id();
        let service = Service(child);
        wait_until(Duration::from_secs(10), "GET /readyz", || http_get(&addr, "/readyz").is_some());
        seen.push(threads_of(pid));
        assert!(service.terminate().success());
    }

    assert_eq!(seen[0], 1, "a current-thread runtime: no thread but the main one");
    assert!(seen[1] >= 4, "the main thread and three workers: {seen:?}");
}

#[test]
fn a_bad_setting_refuses_to_start_and_names_it() {
    let zero = Command::new(BIN).args(["--worker-threads", "0"]).output().expect("runs");
    let zero_err = String::from_utf8_lossy(&zero.stderr);
    assert!(!zero.status.success());
    assert!(zero_err.contains("--worker-threads"), "{zero_err}");

    let out = Command::new(BIN).args(["--redis-pool-size", "0"]).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);

    assert!(!out.status.success());
    assert!(err.contains("--redis-pool-size"), "{err}");
}

#[test]
fn help_never_shows_a_token_set_in_the_environment() {
    let out = Command::new(BIN).arg("--help").env("SLUICE_COUNTER_TOKEN", "env-t0ken-9c1e").output().expect("runs");

    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!help.contains("env-t0ken-9c1e"), "{help}");
}

#[test]
fn a_token_from_a_file_is_required_of_callers_and_never_logged_even_at_trace_level() {
    const TOKEN: &str = "file-t0ken-5d2b88";
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).expect("write");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(BIN)
        .env_clear()
        .env("SLUICE_COUNTER_LISTEN", &addr)
        .env("SLUICE_COUNTER_TOKEN_FILE", &path)
        .args(["--log", "trace"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let service = Service(child);
    // Read the logs as they come: at trace level they would fill the pipe and block the
    // service.
    let logs = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
    let body = r#"{"entries":[{"key":"k","limit":{"algorithm":"fixed_window","limit":5,"window_ms":60000}}]}"#;

    wait_until(Duration::from_secs(10), "GET /healthz", || http_get(&addr, "/healthz").is_some());
    let anonymous = http_request(&addr, "POST", "/v1/check", "", body).expect("answered");
    let wrong = http_request(&addr, "POST", "/v1/check", "Authorization: Bearer file-t0ken-5d2b89\r\n", body)
        .expect("answered");
    let right = http_request(&addr, "POST", "/v1/check", &format!("Authorization: Bearer {TOKEN}\r\n"), body)
        .expect("answered");
    // The same over h2c, whose frames the h2 crate traces.
    let h2 = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime").block_on(async {
        let addr = addr.parse().expect("an address");
        let wrong = Http::with(addr, Protocol::H2c).header("authorization", "Bearer file-t0ken-5d2b89");
        let right = Http::with(addr, Protocol::H2c).header("authorization", &format!("Bearer {TOKEN}"));
        (wrong.post_raw("/v1/check", body).await.0, right.post_raw("/v1/check", body).await.0)
    });
    let exit = service.terminate();
    let logs = logs.join().expect("the log reader");

    assert_eq!(h2, (401, 200));
    assert!(logs.iter().any(|l| l.contains("h2::")), "h2 traces its frames at this level: {logs:#?}");
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    assert!(right.starts_with("HTTP/1.1 200"), "{right}");
    assert!(exit.success());
    assert!(logs.iter().filter(|l| l.contains("caller refused")).count() == 3, "refusals are logged: {logs:#?}");
    assert!(logs.iter().any(|l| l.contains("auth") && l.contains("bearer")), "the start line says a token is required");
    assert!(logs.iter().all(|l| !l.contains(TOKEN)), "the token is in the logs: {logs:#?}");
}

#[test]
fn help_never_shows_a_redis_password_set_in_the_environment() {
    let out = Command::new(BIN)
        .arg("--help")
        .env("SLUICE_COUNTER_REDIS_URL", "redis://sluice:hunter2-7a1c@10.0.0.5:6379/0")
        .output()
        .expect("runs");

    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(help.contains("SLUICE_COUNTER_REDIS_URL"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
}

#[test]
fn a_redis_password_never_reaches_the_logs_even_at_trace_level() {
    const PASSWORD: &str = "hunter2-5e9d";
    let redis = RedisServer::start_with_password(PASSWORD);
    // The second node answers nothing: its eviction check fails, and is logged too.
    let nowhere = format!("redis://:{PASSWORD}@127.0.0.1:{}/0", free_port());
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(BIN)
        .env_clear()
        .env("SLUICE_COUNTER_LISTEN", &addr)
        .env("SLUICE_COUNTER_STORE", "redis")
        .env("SLUICE_COUNTER_REDIS_URL", format!("{}/0,{nowhere}", redis.url()))
        .args(["--log", "trace"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let service = Service(child);
    let logs = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
    let body = r#"{"entries":[{"key":"k","limit":{"algorithm":"fixed_window","limit":5,"window_ms":60000}}]}"#;

    let mut ready = None;
    wait_until(Duration::from_secs(10), "GET /readyz", || {
        ready = http_get(&addr, "/readyz");
        ready.is_some()
    });
    let check = http_request(&addr, "POST", "/v1/check", "", body).expect("answered");
    let exit = service.terminate();
    let logs = logs.join().expect("the log reader");

    assert!(ready.expect("answered").starts_with("HTTP/1.1 200"), "the password works");
    assert!(check.starts_with("HTTP/1.1 200"), "{check}");
    assert!(exit.success());
    let shown = format!("redis://***@127.0.0.1:{}/0", redis.port);
    assert!(
        logs.iter().any(|l| l.contains("redis eviction policy") && l.contains(&shown)),
        "the node is named, without its password: {logs:#?}"
    );
    assert!(logs.iter().any(|l| l.contains("cannot read redis maxmemory-policy")), "{logs:#?}");
    assert!(logs.iter().all(|l| !l.contains(PASSWORD)), "the password is in the logs: {logs:#?}");
}

#[test]
fn an_empty_token_file_refuses_to_start_and_names_the_flag() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("token");
    std::fs::write(&path, "").expect("write");

    let out = Command::new(BIN)
        .env_clear()
        .env("SLUICE_COUNTER_LISTEN", format!("127.0.0.1:{}", free_port()))
        .arg("--token-file")
        .arg(&path)
        .output()
        .expect("runs");

    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--token-file") && err.contains("empty"), "{err}");
}

#[test]
fn an_admin_token_variable_that_is_not_set_refuses_to_start_naming_the_flag() {
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--admin-token-env", "SLUICE_TEST_UNSET_ADMIN_TOKEN"])
        .env_remove("SLUICE_TEST_UNSET_ADMIN_TOKEN")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);

    assert!(!out.status.success());
    assert!(stderr.contains("--admin-token-env SLUICE_TEST_UNSET_ADMIN_TOKEN: "), "{stderr}");
}

#[test]
fn rls_validate_prints_the_rules_of_a_good_directory_and_names_the_file_of_a_bad_one() {
    let good = tempfile::tempdir().expect("a directory");
    std::fs::write(
        good.path().join("shop.yaml"),
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
    )
    .expect("write");
    let bad = tempfile::tempdir().expect("a directory");
    std::fs::write(bad.path().join("broken.yaml"), "domain: shop\ndescriptors:\n  - key: user\n    colour: red\n")
        .expect("write");

    let valid = Command::new(BIN).args(["rls", "validate"]).arg(good.path()).output().expect("runs");
    let invalid = Command::new(BIN).args(["rls", "validate"]).arg(bad.path()).output().expect("runs");

    assert!(valid.status.success(), "{valid:?}");
    assert_eq!(
        String::from_utf8_lossy(&valid.stdout),
        "1 file(s), 1 domain(s): valid\nshop.user: 10/minute (policy rls.shop.user)\n"
    );
    assert_eq!(invalid.status.code(), Some(1));
    let error = String::from_utf8_lossy(&invalid.stderr);
    assert!(error.contains("broken.yaml: config error, unknown key 'colour'"), "{error}");
}

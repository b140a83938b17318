//! Logging, clocks, randomness, environment, and the statuses Envoy gives misuse.

use std::time::Duration;

use wasm_host::{Clock, LogLevel, LogSource};

use crate::common::{forward, guest, host, ops, text};

#[test]
fn guest_logs_are_captured_by_level() {
    let mut host = host("");

    forward(host.worker(0), ops("log"));

    for level in [LogLevel::Trace, LogLevel::Debug, LogLevel::Info, LogLevel::Warn, LogLevel::Error] {
        assert!(host.logs_at(level).contains(&format!("log at {level}")), "{level}");
    }
}

#[test]
fn lines_below_the_host_log_level_are_dropped() {
    let mut host = guest().log_level(LogLevel::Warn).build().unwrap();

    forward(host.worker(0), ops("log"));

    let guest_lines: Vec<String> =
        host.logs().into_iter().filter(|r| r.source == LogSource::Guest).map(|r| r.message).collect();
    assert_eq!(guest_lines, ["log at warn", "log at error"]);
}

#[test]
fn stdout_is_logged_at_info_and_stderr_at_error() {
    let mut host = host("");

    forward(host.worker(0), ops("stdio"));

    let logs = host.logs();
    assert!(
        logs.iter()
            .any(|r| r.source == LogSource::Stdout && r.level == LogLevel::Info && r.message == "to stdout from 2")
    );
    assert!(
        logs.iter()
            .any(|r| r.source == LogSource::Stderr && r.level == LogLevel::Error && r.message.starts_with("to stderr"))
    );
}

#[test]
fn every_clock_the_guest_reads_is_the_hosts_clock() {
    let mut host = host("");
    let clock = host.clock().unwrap().clone();
    let first = forward(host.worker(0), ops("time"));

    host.advance(Duration::from_millis(1500));
    let second = forward(host.worker(0), ops("time"));

    assert_eq!(text(&first, "x-time-proxy"), clock.realtime_nanos().saturating_sub(1_500_000_000).to_string());
    assert_eq!(text(&first, "x-time-wasi"), text(&first, "x-time-proxy"));
    let monotonic = |m: &wasm_host::Message| text(m, "x-time-monotonic").parse::<u64>().unwrap();
    assert_eq!(monotonic(&second) - monotonic(&first), 1_500_000_000);
    assert_eq!(monotonic(&second), clock.monotonic_nanos());
    // Envoy supports only the realtime and monotonic clocks: NOTSUP.
    assert_eq!(text(&first, "x-cputime-errno"), "58");
}

#[test]
fn random_bytes_come_from_the_host_and_oversized_requests_are_refused() {
    let mut one = guest().random_seed(Some(7)).build().unwrap();
    let mut same = guest().random_seed(Some(7)).build().unwrap();

    let a = forward(one.worker(0), ops("random"));
    let b = forward(same.worker(0), ops("random"));
    let c = forward(one.worker(0), ops("random"));

    assert_eq!(text(&a, "x-random").len(), 32);
    assert_eq!(text(&a, "x-random"), text(&b, "x-random"));
    assert_ne!(text(&a, "x-random"), text(&c, "x-random"));
    assert_eq!(text(&a, "x-random-too-much"), "28");
}

#[test]
fn the_guest_sees_only_the_environment_it_was_given() {
    let mut bare = host("");
    let mut configured = guest().env("TEST_ENV", "on").build().unwrap();

    assert_eq!(text(&forward(bare.worker(0), ops("env")), "x-env"), "unset");
    assert_eq!(text(&forward(configured.worker(0), ops("env")), "x-env"), "on");
}

#[test]
fn bad_pointers_and_unknown_values_get_envoys_statuses_not_a_crash() {
    let mut host = host("");

    let forwarded = forward(host.worker(0), ops("raw-misuse"));

    let status = |name: &str| text(&forwarded, &format!("x-raw-{name}"));
    assert_eq!(status("header-key-out-of-bounds"), "6");
    assert_eq!(status("header-result-out-of-bounds"), "6");
    assert_eq!(status("header-map-type-99"), "2");
    assert_eq!(status("log-level-9"), "2");
    assert_eq!(status("log-out-of-bounds"), "6");
    assert_eq!(status("buffer-type-99"), "2");
    assert_eq!(status("property-out-of-bounds"), "6");
    assert_eq!(status("shared-set-value-out-of-bounds"), "6");
    assert_eq!(status("continue-stream-type-9"), "2");
    assert_eq!(status("continue-upstream"), "12");
    assert_eq!(status("effective-context-unknown"), "2");
    assert_eq!(status("define-metric-type-7"), "2");
    assert_eq!(status("increment-unknown-metric"), "1");
    assert_eq!(status("foreign-function"), "1");
    assert_eq!(status("done-not-pending"), "1");
    assert_eq!(status("local-response-status-0"), "2");
    assert!(host.traps().is_empty());
}

//! What the operations that probe the runtime around the guest report: `log` and
//! `stdio` (its output), `time` and `random` (WASI and proxy clocks, randomness), `env`
//! (its environment), `metrics` (its metrics) and `raw-misuse` (host calls with bad
//! arguments).

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::Context;
use proxy_wasm::types::MetricType;

use super::{HttpStream, hex};
use crate::raw;

/// `log`: one line at every level, from trace to error.
pub(super) fn log_at_every_level() {
    log::trace!("log at trace");
    log::debug!("log at debug");
    log::info!("log at info");
    log::warn!("log at warn");
    log::error!("log at error");
}

impl HttpStream {
    /// `stdio`.
    pub(super) fn stdio(&self) {
        println!("to stdout from {}", self.id);
        eprintln!("to stderr from {}", self.id);
    }

    /// `time`: `x-time-proxy`, `x-time-wasi`, `x-time-monotonic` (nanoseconds) and
    /// `x-cputime-errno`.
    pub(super) fn time(&self) {
        let proxy = self.get_current_time().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let wasi = std::time::SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        self.put("x-time-proxy", proxy.to_string());
        self.put("x-time-wasi", wasi.to_string());
        self.put("x-time-monotonic", raw::monotonic_nanos().to_string());
        self.put("x-cputime-errno", raw::cputime_errno().to_string());
    }

    /// `random`: `x-random` (hex) and `x-random-too-much` (an errno).
    pub(super) fn random(&self) {
        self.put("x-random", hex(&raw::random16()));
        self.put("x-random-too-much", raw::random_too_much_errno().to_string());
    }

    /// `env`: `x-env` is `TEST_ENV`, or `unset`.
    pub(super) fn env(&self) {
        self.put("x-env", std::env::var("TEST_ENV").unwrap_or_else(|_| "unset".to_owned()));
    }

    /// `metrics`: a counter (+1; then -1, its result in `x-counter-decrement`), a gauge
    /// (+5 -2) and a histogram (`x-hist`, default 42), each reported back.
    pub(super) fn metrics(&self) {
        let (Ok(counter), Ok(gauge), Ok(histogram)) = (
            hostcalls::define_metric(MetricType::Counter, "test_guest.requests"),
            hostcalls::define_metric(MetricType::Gauge, "test_guest.gauge"),
            hostcalls::define_metric(MetricType::Histogram, "test_guest.latency"),
        ) else {
            self.put("x-metrics", "define-failed");
            return;
        };
        let _ = hostcalls::increment_metric(counter, 1);
        let _ = hostcalls::increment_metric(gauge, 5);
        let _ = hostcalls::increment_metric(gauge, -2);
        let sample = self.request_header("x-hist").and_then(|v| v.parse().ok()).unwrap_or(42);
        let _ = hostcalls::record_metric(histogram, sample);
        self.put("x-counter", hostcalls::get_metric(counter).map_or("error".to_owned(), |v| v.to_string()));
        self.put("x-gauge", hostcalls::get_metric(gauge).map_or("error".to_owned(), |v| v.to_string()));
        let decrement = match hostcalls::increment_metric(counter, -1) {
            Ok(()) => "ok".to_owned(),
            Err(status) => format!("{status:?}"),
        };
        self.put("x-counter-decrement", decrement);
        let (status, _) = raw::get_metric(histogram);
        self.put("x-histogram-get", status.to_string());
    }

    /// `raw-misuse`: `x-raw-<name>: <status>` for each misuse in [`raw::misuse`].
    pub(super) fn raw_misuse(&self) {
        for (name, status) in raw::misuse() {
            self.put(&format!("x-raw-{name}"), status.to_string());
        }
    }
}

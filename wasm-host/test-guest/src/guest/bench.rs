//! What a request does in a benchmark mode (`bench=<mode>`): only that mode's host call,
//! `calls` times, and no operations.

use std::cell::Cell;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MetricType};

use super::HttpStream;
use crate::config::Bench;

thread_local! {
    static BENCH_METRIC: Cell<Option<u32>> = const { Cell::new(None) };
}

/// The counter `bench=metric` increments, defined on first use.
fn bench_metric() -> Option<u32> {
    BENCH_METRIC.with(|cell| {
        if cell.get().is_none() {
            cell.set(hostcalls::define_metric(MetricType::Counter, "test_guest.bench").ok());
        }
        cell.get()
    })
}

impl HttpStream {
    /// The request headers callback in benchmark mode `mode`.
    pub(super) fn bench(&self, mode: Bench) -> Action {
        if mode == Bench::Noop {
            return Action::Continue;
        }
        for _ in 0..self.config.calls {
            match mode {
                Bench::GetHeader => {
                    let _ = self.get_http_request_header_bytes("x-key");
                }
                Bench::GetProperty => {
                    let _ = self.get_property(vec!["source", "address"]);
                }
                Bench::Shared => {
                    let (value, cas) = self.get_shared_data("bench");
                    let _ = self.set_shared_data("bench", Some(&value.unwrap_or_default()), cas);
                }
                Bench::Metric => {
                    if let Some(id) = bench_metric() {
                        let _ = hostcalls::increment_metric(id, 1);
                    }
                }
                Bench::Clock => {
                    std::hint::black_box(std::time::Instant::now());
                }
                Bench::Admit => {
                    let _ = std::hint::black_box(self.get_http_request_header_bytes("x-key"));
                    std::hint::black_box(std::time::Instant::now());
                    let (value, cas) = self.get_shared_data("bench");
                    let _ = self.set_shared_data("bench", Some(&value.unwrap_or_default()), cas);
                    if let Some(id) = bench_metric() {
                        let _ = hostcalls::increment_metric(id, 1);
                        let _ = hostcalls::increment_metric(id, 1);
                    }
                }
                Bench::Noop | Bench::Batch => {}
            }
        }
        Action::Continue
    }
}

//! What recording one decision's metrics costs, and what one `/metrics` scrape costs.
//!
//! * `record one check`: everything the HTTP path records for one admitted check: the
//!   body-read gauge and the in-flight gauge (up, then down), the store latency, the
//!   decision and the response status.
//! * `record one check, 2 threads`: the same on two threads at once, wall time ÷
//!   checks (both threads update the same counters, as two runtime workers do).
//! * `render`: one `/metrics` body after 1000 checks.
//! * `store latency, ...`: one latency observation in the service's histogram (atomic
//!   buckets) beside prometheus-client's `Histogram` (a mutex per observation) with the
//!   same buckets, on one thread and on two.
//!
//! Run: `cargo bench -p sluice-counter --bench metrics`. Method and figures in
//! docs/benchmarks.md ("counter service: metrics recording").

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::metrics::histogram::Histogram;
use sluice_counter::metrics::{Metrics, StoreOp};
use sluice_counter::store::{CounterStore, MemoryConfig, MemoryCounters};

fn metrics() -> Metrics {
    Metrics::new("memory")
}

fn record_one_check(metrics: &Metrics, took: Duration) {
    {
        let _reading = metrics.reading();
    }
    let gauge = metrics.start();
    metrics.store_latency(StoreOp::Check, took);
    metrics.decision(true);
    drop(gauge);
    metrics.response(200);
}

fn recording(c: &mut Criterion) {
    let mut group = c.benchmark_group("metrics");
    let took = Duration::from_micros(40);

    group.bench_function("record one check", |b| {
        let metrics = metrics();
        b.iter(|| record_one_check(black_box(&metrics), black_box(took)));
    });

    group.bench_function("record one check, 2 threads", |b| {
        let metrics = metrics();
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..iters / 2 {
                            record_one_check(black_box(&metrics), black_box(took));
                        }
                    });
                }
            });
            start.elapsed()
        });
    });

    group.bench_function("render", |b| {
        let metrics = metrics();
        let store = CounterStore::Memory(MemoryCounters::new(MemoryConfig::default()));
        for _ in 0..1000 {
            record_one_check(&metrics, took);
        }
        b.iter(|| black_box(metrics.render(&store)));
    });
    group.finish();
}

/// The service's latency buckets (seconds).
const BUCKETS: [f64; 13] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// `iters` calls of `record`, half on each of two threads; wall time.
fn on_two_threads(iters: u64, record: impl Fn() + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..iters / 2 {
                    record();
                }
            });
        }
    });
    start.elapsed()
}

fn histograms(c: &mut Criterion) {
    let mut group = c.benchmark_group("metrics");
    let took = Duration::from_micros(40);

    group.bench_function("store latency, atomic buckets", |b| {
        let metrics = metrics();
        b.iter(|| metrics.store_latency(StoreOp::Check, black_box(took)));
    });
    group.bench_function("store latency, prometheus-client Histogram", |b| {
        let histogram = Histogram::new(BUCKETS);
        b.iter(|| histogram.observe(black_box(took).as_secs_f64()));
    });
    group.bench_function("store latency, atomic buckets, 2 threads", |b| {
        let metrics = metrics();
        b.iter_custom(|iters| on_two_threads(iters, || metrics.store_latency(StoreOp::Check, black_box(took))));
    });
    group.bench_function("store latency, prometheus-client Histogram, 2 threads", |b| {
        let histogram = Histogram::new(BUCKETS);
        b.iter_custom(|iters| on_two_threads(iters, || histogram.observe(black_box(took).as_secs_f64())));
    });
    group.finish();
}

criterion_group!(benches, recording, histograms);
criterion_main!(benches);

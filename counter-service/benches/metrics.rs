//! What recording one decision's metrics costs, and what one `/metrics` scrape costs.
//!
//! * `record one check`: everything the HTTP path records for one admitted check: the
//!   body-read gauge and the in-flight gauge (up, then down), the store latency, the
//!   decision and the response status.
//! * `record one check, 2 threads`: the same on two threads at once, wall time ÷
//!   checks (both threads update the same counters, as two runtime workers do).
//! * `render`: one `/metrics` body after 1000 checks.
//!
//! Run: `cargo bench -p sluice-counter --bench metrics`. Method and figures in
//! docs/benchmarks.md ("counter service: metrics recording").

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_counter::metrics::Metrics;
use sluice_counter::store::{CounterStore, MemoryConfig, MemoryCounters};

fn metrics() -> Metrics {
    Metrics::default()
}

fn record_one_check(metrics: &Metrics, took: Duration) {
    {
        let _reading = metrics.reading();
    }
    let gauge = metrics.start();
    metrics.store_latency(took);
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

criterion_group!(benches, recording);
criterion_main!(benches);

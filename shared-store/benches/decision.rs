//! One token-bucket decision, beside governor's `check()` in the same run.
//!
//! * `pure`: the algorithm alone (`Limit::decide` on a state in a local variable) vs
//!   governor's direct limiter (one atomic CAS). Both with a fake clock, so neither
//!   pays for reading time.
//! * `shared-data`: the whole limiter over `MemoryStore`, which models Envoy's shared
//!   data (one mutex, a copy of the value on every read and write, a versioned encoding):
//!   the cost the filter pays per limit, before the wasm boundary.
//! * `2 threads, 1 key`: two threads deciding on the same key, total time / decisions.
//!
//! Run: `cargo bench -p shared-store --bench decision`. Method and figures in
//! docs/benchmarks.md.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use shared_store::{Clock, Limit, Limiter, ManualClock, MemoryStore, Nanos, Placement, Rate, State};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A quota both libraries can express and that admits every request at the pace the
/// benchmark offers them (the clock advances 1 µs per decision; 1 M/s refill).
fn ours() -> Limit {
    Limit::token_bucket(Rate::new(1_000_000, Nanos::from_secs(1)).unwrap(), 1_000).unwrap()
}

fn theirs() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000).unwrap()).allow_burst(NonZeroU32::new(1_000).unwrap())
}

fn one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("token bucket, 1 thread");

    group.bench_function("governor check", |b| {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(theirs(), clock.clone());
        b.iter(|| {
            clock.advance(Duration::from_micros(1));
            black_box(limiter.check().is_ok())
        });
    });

    group.bench_function("sluice pure decide", |b| {
        let limit = ours();
        let mut state: Option<State> = None;
        let mut now = Nanos::from_secs(1);
        b.iter(|| {
            now = now.saturating_add(Nanos(1_000));
            let (decision, next) = limit.decide(state.as_ref(), black_box(now), 1);
            if next.is_some() {
                state = next;
            }
            black_box(decision.is_admitted())
        });
    });

    group.bench_function("sluice limiter over shared data", |b| {
        let limit = ours();
        let clock = ManualClock::at(Nanos::from_secs(1));
        let limiter = Limiter::new(MemoryStore::new(), clock.clone());
        let key = Placement::dedicated("bench/key");
        b.iter(|| {
            clock.advance(Nanos(1_000));
            black_box(limiter.check_one(&key, &limit, 1).map(|a| a.admitted))
        });
    });
    group.finish();
}

/// A clock shared by threads that moves forward on every read (1 µs).
#[derive(Clone, Default)]
struct Ticking(Arc<std::sync::atomic::AtomicU64>);

impl Clock for Ticking {
    fn now(&self) -> Nanos {
        Nanos((1 << 40) + self.0.fetch_add(1_000, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Runs `per_thread` on two threads, `iters / 2` calls each, and returns the wall time.
fn two_threads<F: Fn() + Send + Sync>(iters: u64, per_thread: F) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for _ in 0..iters / 2 {
                    per_thread();
                }
            });
        }
    });
    start.elapsed()
}

fn shared_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("token bucket, 2 threads, 1 key");
    group.bench_function(BenchmarkId::new("governor check", "shared limiter"), |b| {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(theirs(), clock.clone());
        b.iter_custom(|iters| {
            two_threads(iters, || {
                clock.advance(Duration::from_micros(1));
                black_box(limiter.check().is_ok());
            })
        });
    });
    group.bench_function(BenchmarkId::new("sluice limiter", "shared data"), |b| {
        let limit = ours();
        let store = Arc::new(MemoryStore::new());
        let key = Placement::dedicated("bench/key");
        let clock = Ticking::default();
        b.iter_custom(|iters| {
            let limiter = Limiter::new(Arc::clone(&store), clock.clone());
            two_threads(iters, || {
                black_box(limiter.check_one(&key, &limit, 1).map(|a| a.admitted).ok());
            })
        });
    });
    group.finish();
}

criterion_group!(benches, one_thread, shared_key);
criterion_main!(benches);

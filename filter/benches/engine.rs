//! The policy engine natively: one admitted request through `Engine::begin` with one
//! token-bucket policy keyed on a header, over `MemoryStore` (Envoy's shared-data
//! model). This is the filter's own compute, without the wasm boundary or host calls;
//! `tests/benches/filter.rs` measures the compiled module in wasm-host.
//!
//! Run: `cargo bench -p sluice-filter --bench engine`.

use criterion::{Criterion, criterion_group, criterion_main};
use shared_store::{HashKey, Limiter, ManualClock, MemoryStore, Nanos};
use sluice::config::Config;
use sluice::engine::{Begun, Engine, Outcome};
use sluice::host::{Counter, Metrics, PluginCounter};
use sluice::testing::{FakeCallouts, FakeRequest};
use std::hint::black_box;

struct Discard;

impl Metrics for Discard {
    fn add(&mut self, _: usize, _: Counter, _: i64) {}
    fn add_plugin(&mut self, _: PluginCounter, _: i64) {}
    fn record_wait(&mut self, _: sluice::host::Wait, _: u64) {}
}

const CONFIG: &str = r#"{"policies":[{"name":"per-key","key":[{"header":"x-api-key"}],
  "rate":"1000000/second","burst":1000}]}"#;

fn admitted(c: &mut Criterion) {
    let config = Config::from_json(CONFIG.as_bytes()).expect("the bench configuration is valid");
    let engine =
        Engine::new(config, "sluice/bench/root/", HashKey::new([7; 16]), |_| None).expect("no secrets to read");
    let mut callouts = FakeCallouts::default();
    let clock = ManualClock::at(Nanos::from_secs(1000));
    let limiter = Limiter::new(MemoryStore::new(), clock.clone());
    let request = FakeRequest::get("/").with_header("x-api-key", "alice");
    c.bench_function("engine/admitted", |b| {
        b.iter(|| {
            clock.advance(Nanos(1_000));
            let begun = engine.begin(black_box(&request), &limiter, &mut callouts, true, &mut Discard);
            black_box(matches!(begun, Begun::Decided(ref d) if matches!(d.outcome, Outcome::Continue { .. })))
        });
    });
}

criterion_group!(benches, admitted);
criterion_main!(benches);

//! What the plugin configuration asks of the guest: `Config`, parsed from its
//! `key=value` lines (the keys are listed in the crate docs), and the benchmark modes.

/// Benchmark modes: the request callback makes only this host call, `calls` times.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bench {
    /// `bench=noop` (or any unknown mode): no host call at all.
    Noop,
    /// `bench=get-header`: reads the request header `x-key`.
    GetHeader,
    /// `bench=get-property`: reads the property `source.address`.
    GetProperty,
    /// `bench=shared`: reads the shared-data key `bench` and writes it back with its cas.
    Shared,
    /// `bench=metric`: increments the counter `test_guest.bench`.
    Metric,
    /// `bench=clock`: reads the monotonic clock.
    Clock,
    /// `bench=admit`: the host calls `sluice.wasm` makes to admit a request of one local
    /// policy keyed on a header, in its order: the header `x-key`, the clock, the
    /// shared-data key `bench` read and written back with its cas, and two counter
    /// increments. What those calls cost without the filter's own code.
    Admit,
    /// `bench=batch`: what any filter that asks a service about each request pays at the
    /// least when it sends its questions together (group commit), as `sluice.wasm`'s
    /// check mode does: the header `x-key` read, the request paused, a callout (`GET
    /// /healthz` to the cluster `cluster`) sent at once while fewer than `in_flight` are
    /// out, otherwise the request waits for the next one, which leaves when a call
    /// answers; every request a call carried is resumed from the context its answer
    /// reaches. No body is written or read: the floor under a check, not a check.
    Batch,
}

/// The plugin configuration, one field per key.
#[derive(Default, Clone)]
pub(crate) struct Config {
    /// `reject=<message>`: `on_configure` logs the message and fails.
    pub(crate) reject: Option<String>,
    /// `panic_on_configure=1`.
    pub(crate) panic_on_configure: bool,
    /// `tick_ms=<n>`: the tick period.
    pub(crate) tick_ms: Option<u64>,
    /// `tick_callout=<cluster>`: each tick dispatches a callout there.
    pub(crate) tick_callout: Option<String>,
    /// `tick_panic=1`: the first tick panics.
    pub(crate) tick_panic: bool,
    /// `generation=<g>`: every request gets `x-test-generation: <g>`.
    pub(crate) generation: Option<String>,
    /// `bench=<mode>`.
    pub(crate) bench: Option<Bench>,
    /// `calls=<n>`: how many times a benchmark mode makes its call (default 1).
    pub(crate) calls: usize,
    /// `queue=1`: the root registers the shared queue `events`.
    pub(crate) queue: bool,
    /// `ops=<op,...>`: the operations of a request without `x-test-op`.
    pub(crate) ops: Option<String>,
    /// `cluster=<name>`: where `bench=batch` sends its calls (default `upstream`).
    pub(crate) cluster: Option<String>,
    /// `in_flight=<n>`: how many calls `bench=batch` keeps out at most (default 2, as
    /// `sluice.wasm`'s `max_checks_in_flight`).
    pub(crate) in_flight: usize,
}

impl Config {
    /// Reads `key=value` lines; lines without `=` and unknown keys are ignored.
    pub(crate) fn parse(text: &str) -> Self {
        let mut config = Self { calls: 1, in_flight: 2, ..Self::default() };
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            let value = value.trim().to_owned();
            match key.trim() {
                "reject" => config.reject = Some(value),
                "panic_on_configure" => config.panic_on_configure = value == "1",
                "tick_ms" => config.tick_ms = value.parse().ok(),
                "tick_callout" => config.tick_callout = Some(value),
                "tick_panic" => config.tick_panic = value == "1",
                "generation" => config.generation = Some(value),
                "bench" => {
                    config.bench = Some(match value.as_str() {
                        "get-header" => Bench::GetHeader,
                        "get-property" => Bench::GetProperty,
                        "shared" => Bench::Shared,
                        "metric" => Bench::Metric,
                        "clock" => Bench::Clock,
                        "admit" => Bench::Admit,
                        "batch" => Bench::Batch,
                        _ => Bench::Noop,
                    })
                }
                "calls" => config.calls = value.parse().unwrap_or(1),
                "ops" => config.ops = Some(value),
                "cluster" => config.cluster = Some(value),
                "in_flight" => config.in_flight = value.parse().unwrap_or(2),
                "queue" => config.queue = value == "1",
                _ => {}
            }
        }
        config
    }
}

//! Time as the guest sees it.
//!
//! A proxy-wasm guest reads time three ways, and all three come from one [`Clock`]:
//! `proxy_get_current_time_nanoseconds` and WASI `clock_time_get(REALTIME)` read the
//! wall clock; WASI `clock_time_get(MONOTONIC)` reads the monotonic clock. Tick timers and
//! callout timeouts are scheduled on the monotonic clock. Envoy answers with
//! `time_source_.systemTime()` and `monotonicTime()`, read at the moment of the call (not
//! frozen per callback), and so does this host.
//!
//! Tests use a [`VirtualClock`] and move it forward with [`crate::Host::advance`], which
//! also fires every tick and callout timeout that falls due on the way, in time order.
//! `serve` uses the [`SystemClock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock and monotonic time, in nanoseconds.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since the Unix epoch (WASI `REALTIME`).
    fn realtime_nanos(&self) -> u64;
    /// Nanoseconds since an arbitrary fixed point (WASI `MONOTONIC`). Never decreases,
    /// unless a test rewinds a [`VirtualClock`] on purpose.
    fn monotonic_nanos(&self) -> u64;
}

/// The process clock: `SystemTime` and `Instant`.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic time counts from now.
    pub fn new() -> Self {
        Self { origin: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn realtime_nanos(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, saturating_nanos)
    }

    fn monotonic_nanos(&self) -> u64 {
        // Start at one second rather than zero so that no guest mistakes "now" for
        // "never set".
        saturating_nanos(self.origin.elapsed()).saturating_add(MONOTONIC_ORIGIN_NANOS)
    }
}

/// Where a fresh [`VirtualClock`]'s monotonic time starts: one second, so that a guest
/// never reads 0 (which filters commonly use for "unset").
const MONOTONIC_ORIGIN_NANOS: u64 = 1_000_000_000;

/// Where a fresh [`VirtualClock`]'s wall clock starts: 2026-01-01T00:00:00Z.
const DEFAULT_REALTIME_ORIGIN_NANOS: u64 = 1_767_225_600 * 1_000_000_000;

/// A clock that moves only when told to. Clones share the same time.
///
/// Both the wall clock and the monotonic clock move together. [`VirtualClock::rewind`]
/// moves both backwards, to test a guest against a host clock that steps back.
#[derive(Debug, Clone)]
pub struct VirtualClock {
    inner: Arc<VirtualInner>,
}

#[derive(Debug)]
struct VirtualInner {
    /// Nanoseconds elapsed since the clock was created (may be rewound).
    elapsed: AtomicU64,
    realtime_origin: u64,
}

impl VirtualClock {
    /// A clock that reads 2026-01-01T00:00:00Z on the wall clock and one second on the
    /// monotonic clock.
    pub fn new() -> Self {
        Self::starting_at(UNIX_EPOCH + Duration::from_nanos(DEFAULT_REALTIME_ORIGIN_NANOS))
    }

    /// A clock whose wall clock starts at `start`.
    pub fn starting_at(start: SystemTime) -> Self {
        let realtime_origin = start.duration_since(UNIX_EPOCH).map_or(0, saturating_nanos);
        Self { inner: Arc::new(VirtualInner { elapsed: AtomicU64::new(0), realtime_origin }) }
    }

    /// Moves time forward by `by` without firing anything. [`crate::Host::advance`] is
    /// usually what a test wants: it moves this clock and fires what falls due.
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = self.inner.elapsed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| Some(now.saturating_add(by)));
    }

    /// Moves both clocks back by `by` (saturating at the clock's origin), to test a guest
    /// against a host whose clock steps backwards. Scheduled ticks and timeouts stay
    /// where they were, so they fall due later.
    pub fn rewind(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = self.inner.elapsed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| Some(now.saturating_sub(by)));
    }

    /// Time elapsed since the clock was created.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.inner.elapsed.load(Ordering::SeqCst))
    }

    /// Sets the monotonic time to `monotonic` (ns, as [`Clock::monotonic_nanos`]) if that
    /// is later than now, without firing anything (for drivers of several hosts; see
    /// [`crate::Worker::next_due`]).
    pub fn advance_to_monotonic(&self, monotonic: u64) {
        let target = monotonic.saturating_sub(MONOTONIC_ORIGIN_NANOS);
        let _ = self.inner.elapsed.fetch_max(target, Ordering::SeqCst);
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for VirtualClock {
    fn realtime_nanos(&self) -> u64 {
        self.inner.realtime_origin.saturating_add(self.inner.elapsed.load(Ordering::SeqCst))
    }

    fn monotonic_nanos(&self) -> u64 {
        MONOTONIC_ORIGIN_NANOS.saturating_add(self.inner.elapsed.load(Ordering::SeqCst))
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(crate) fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_clock_moves_only_when_advanced() {
        let clock = VirtualClock::new();
        let before = (clock.realtime_nanos(), clock.monotonic_nanos());

        clock.advance(Duration::from_millis(1500));

        assert_eq!(clock.realtime_nanos() - before.0, 1_500_000_000);
        assert_eq!(clock.monotonic_nanos() - before.1, 1_500_000_000);
    }

    #[test]
    fn clones_of_a_virtual_clock_share_one_time() {
        let clock = VirtualClock::new();
        let other = clock.clone();

        other.advance(Duration::from_secs(2));

        assert_eq!(clock.elapsed(), Duration::from_secs(2));
    }

    #[test]
    fn rewinding_saturates_at_the_origin() {
        let clock = VirtualClock::new();
        clock.advance(Duration::from_secs(1));

        clock.rewind(Duration::from_secs(5));

        assert_eq!(clock.monotonic_nanos(), MONOTONIC_ORIGIN_NANOS);
    }
}

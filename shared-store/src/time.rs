//! Time as an input: nanoseconds in a `u64`, from a [`Clock`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A point on a clock, or a span of time, in nanoseconds.
///
/// One type for both, as in governor: buckets store points, decisions return spans, and
/// all arithmetic on them is saturating, so no input can make it panic or wrap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Nanos {
    /// Zero.
    pub const ZERO: Self = Self(0);
    /// The largest representable time: used as "never".
    pub const MAX: Self = Self(u64::MAX);

    /// `secs` seconds, saturating.
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1_000_000_000))
    }

    /// `millis` milliseconds, saturating.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// The number of nanoseconds.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Whole seconds, rounded up: the form `Retry-After` needs, so that a caller who waits
    /// the advertised number of seconds is never early.
    pub const fn as_secs_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000_000)
    }

    /// `self + other`, saturating at [`Nanos::MAX`].
    #[must_use]
    pub const fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }

    /// `self - other`, saturating at zero.
    #[must_use]
    pub const fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }
}

impl From<std::time::Duration> for Nanos {
    fn from(duration: std::time::Duration) -> Self {
        Self(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Nanos> for std::time::Duration {
    fn from(nanos: Nanos) -> Self {
        Self::from_nanos(nanos.0)
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// A source of time for limiters.
///
/// Buckets shared by the workers of one proxy must all read the same clock, and it
/// should be monotonic: the filter reads WASI's monotonic clock, which Envoy serves from
/// its process-wide monotonic time. The algorithms tolerate a clock that steps backwards
/// (they never refill on it), but a wall clock that jumps forward refills buckets early.
pub trait Clock {
    /// The current time.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// A clock that moves only when told to. Clones share one time, so a test can hand a
/// clone to a limiter (or to several threads) and advance it from outside.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `now`.
    pub fn at(now: Nanos) -> Self {
        Self(Arc::new(AtomicU64::new(now.0)))
    }

    /// Moves the clock forward by `by`, saturating.
    pub fn advance(&self, by: Nanos) {
        // fetch_update cannot fail here: the closure always returns Some.
        let _ = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(by.0)));
    }

    /// Sets the clock to `now`, which may be earlier than the current time.
    pub fn set(&self, now: Nanos) {
        self.0.store(now.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.0.load(Ordering::SeqCst))
    }
}

/// The process's monotonic clock, as nanoseconds since the first time any
/// `MonotonicClock` was read in this process.
///
/// Not available on `wasm32-unknown-unknown`, where `std::time::Instant` panics; the
/// filter brings its own clock on `wasm32-wasip1`.
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct MonotonicClock;

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let origin = *ORIGIN.get_or_init(std::time::Instant::now);
        // Offset by one second so that "time zero" never coincides with a real reading.
        Nanos::from_secs(1).saturating_add(Nanos::from(origin.elapsed()))
    }
}

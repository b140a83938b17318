//! The barrier the fleet's threads meet at, twice a window.

use super::lock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A barrier for `threads` threads that yields its core while it waits, then sleeps.
///
/// `std::sync::Barrier` puts a waiting thread to sleep at once: waking it took longer
/// than a window's work here (the lab ran no faster on two threads than on one). A
/// window is short, so a thread first waits awake, yielding its core at each turn: when
/// there are more threads than idle cores (tests side by side, a busy machine), the
/// thread it waits for may be waiting for that very core (spinning without yielding made
/// such a run seven times slower; on idle cores yielding costs nothing measurable).
/// Past half a millisecond it sleeps.
pub(super) struct YieldingBarrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// How long a waiting thread waits awake before it sleeps: a few windows' work.
const SLEEP_AFTER: Duration = Duration::from_micros(500);

impl YieldingBarrier {
    pub(super) const fn new(threads: usize) -> Self {
        Self {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    pub(super) fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            // Under the lock: a thread going to sleep sees either the old generation
            // and this wake-up, or the new generation.
            let _sleep = lock(&self.sleep);
            self.generation.store(generation.wrapping_add(1), Ordering::Release);
            self.wake.notify_all();
            return;
        }
        let started = Instant::now();
        while self.generation.load(Ordering::Acquire) == generation && started.elapsed() < SLEEP_AFTER {
            std::thread::yield_now();
        }
        let mut sleep = lock(&self.sleep);
        while self.generation.load(Ordering::Acquire) == generation {
            sleep = self.wake.wait(sleep).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

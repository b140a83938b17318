//! Runs the fleet's proxies on several threads, one window of virtual time at a time.
//!
//! The calling thread is one of the threads. A window starts when every thread has its
//! order; each thread then takes the next proxy no thread has taken yet and runs it to
//! the window's end, until none is left (a window's work per proxy varies, and a thread
//! that finishes early takes more). The window ends when every thread is done, so
//! between windows the fleet alone touches the proxies. The calling thread first does
//! the fleet's own work for the window (deciding the previous window's calls to the
//! counter service), so the others take more proxies meanwhile.
//!
//! Threads persist for the whole run: a window lasts about a millisecond of virtual
//! time, too short to start threads for. A panic on any thread ends the window for all
//! and is raised again on the calling thread, so a bug cannot leave a thread waiting.

use super::barrier::YieldingBarrier;
use super::lane::{Context, Lane};
use super::{Lab, lock};
use sluice::config::Policy;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What every thread does next: run its proxies to `until` under `policies`, or stop.
type Order = Option<(u64, Arc<Vec<Policy>>)>;

/// What the threads share.
struct Shared {
    start: YieldingBarrier,
    done: YieldingBarrier,
    order: Mutex<Order>,
    /// The next proxy to take in this window.
    next: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// The threads running the proxies.
pub(super) struct Crew<'a> {
    lanes: &'a [Mutex<Lane>],
    lab: &'a Lab,
    /// `None` on one thread.
    sync: Option<&'a Shared>,
}

/// Runs the proxies no other thread has taken to `until`.
fn run_share(lanes: &[Mutex<Lane>], lab: &Lab, next: &AtomicUsize, until: u64, policies: &[Policy]) {
    while let Some(lane) = lanes.get(next.fetch_add(1, Ordering::Relaxed)) {
        lock(lane).run(Context { lab, policies }, until);
    }
}

impl Crew<'_> {
    /// Runs every proxy to `until` (ns from the start) under `policies`; the calling
    /// thread does `alongside` first, then takes its share of the proxies.
    pub(super) fn run(&mut self, until: u64, policies: &Arc<Vec<Policy>>, alongside: impl FnOnce()) {
        let Some(sync) = self.sync else {
            alongside();
            run_share(self.lanes, self.lab, &AtomicUsize::new(0), until, policies);
            return;
        };
        *lock(&sync.order) = Some((until, policies.clone()));
        sync.next.store(0, Ordering::Relaxed);
        sync.start.wait();
        let mine = catch_unwind(AssertUnwindSafe(|| {
            alongside();
            run_share(self.lanes, self.lab, &sync.next, until, policies);
        }));
        sync.done.wait();
        let panicked = mine.err().or_else(|| lock(&sync.panic).take());
        if let Some(payload) = panicked {
            self.stop();
            resume_unwind(payload);
        }
    }

    fn stop(&mut self) {
        if let Some(sync) = self.sync.take() {
            *lock(&sync.order) = None;
            sync.start.wait();
        }
    }
}

impl Drop for Crew<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Calls `body` with a crew of `threads` threads (at most one per proxy) over `lanes`.
pub(super) fn with_crew<R>(
    lanes: &[Mutex<Lane>],
    lab: &Lab,
    threads: usize,
    body: impl FnOnce(&mut Crew<'_>) -> R,
) -> R {
    let threads = threads.clamp(1, lanes.len().max(1));
    if threads == 1 {
        return body(&mut Crew { lanes, lab, sync: None });
    }
    let sync = Shared {
        start: YieldingBarrier::new(threads),
        done: YieldingBarrier::new(threads),
        order: Mutex::new(None),
        next: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            let sync = &sync;
            let _ = scope.spawn(move || {
                loop {
                    sync.start.wait();
                    let Some((until, policies)) = lock(&sync.order).clone() else { return };
                    let run = catch_unwind(AssertUnwindSafe(|| run_share(lanes, lab, &sync.next, until, &policies)));
                    if let Err(payload) = run {
                        *lock(&sync.panic) = Some(payload);
                    }
                    sync.done.wait();
                }
            });
        }
        let mut crew = Crew { lanes, lab, sync: Some(&sync) };
        body(&mut crew)
    })
}

//! Runs the fleet's proxies on several threads between two of the fleet's own points in
//! time (an interval's end, a change on the timeline), without meeting in between.
//!
//! Each thread has its proxies (thread `i` of `n`: proxies `i`, `i + n`, …; the calling
//! thread is thread 0). A proxy runs ahead on its own until the earliest time one of its
//! calls to the counter service could be answered ([`Lane::run`]). After every instant
//! it posts the calls it made, then the time it has passed. The [`Decider`] decides every
//! call made before the point all proxies have passed (no proxy can make an earlier call
//! any more), in one order, and gives the answers back before the proxy reaches the time
//! they are due. Whichever thread finds the decider free runs it, so an idle thread
//! decides the others' calls while the last proxy still runs. This is a conservative
//! parallel simulation: the lookahead is the service's shortest answer, and the result is
//! the same whatever the number of threads and however they are scheduled. Two counts
//! hold it to that in the tests: answers given after they were due, and calls posted
//! after a later one was decided (`late_answers`, `late_calls`).
//!
//! A proxy that stopped to wait for an answer is not run again until a reply for it
//! comes: it could do nothing, and looking costs (a run used to look a few million
//! times). A thread with nothing to do (its proxies wait for answers the others hold up)
//! looks again [`SPINS`] times, then yields its core rather than sleep: the wait is
//! short, and on a busy machine (tests side by side) the thread it waits for may need
//! that very core. Each thread keeps its own proxies: letting an idle thread run
//! another's proxy was slower here, the proxy's memory then moving between cores.
//! Threads persist for the whole run and meet only at the ends of stretches. A panic on
//! any thread ends the stretch for all and is raised again on the calling thread, so a
//! bug cannot leave a thread waiting.

use super::decider::{Call, Decider, Reply};
use super::lane::{Context, Lane};
use super::{Lab, lock};
use sluice::config::Policy;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

/// A stretch of virtual time to run: every proxy from where it is to `until`, with the
/// service answering no sooner than `shortest` after a call, under `policies`.
#[derive(Clone)]
struct Stretch {
    until: u64,
    shortest: u64,
    policies: Arc<Vec<Policy>>,
}

/// How many times a thread with nothing to do looks again before it yields its core.
const SPINS: u32 = 64;

/// What the threads share.
struct Shared<'a> {
    lanes: &'a [Mutex<Lane>],
    lab: &'a Lab,
    decider: &'a Mutex<Decider>,
    threads: usize,
    start: Barrier,
    done: Barrier,
    stretch: Mutex<Option<Stretch>>,
    /// Per proxy, the time before which it has done everything (ns from the start).
    reached: Vec<AtomicU64>,
    /// Every call made before this time is decided and its answer given to its proxy.
    decided: AtomicU64,
    /// Per proxy, whether it stopped to wait for an answer (running it again before a
    /// reply comes would do nothing).
    waiting: Vec<AtomicBool>,
    /// Per proxy, the calls it made that the decider has not taken yet.
    outboxes: Vec<Mutex<Vec<Call>>>,
    /// Per proxy, the answers decided and not yet taken.
    replies: Vec<Mutex<Vec<Reply>>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Shared<'_> {
    /// Thread `thread`'s part of a stretch, until every proxy has reached its end and
    /// every call before it is decided.
    fn work(&self, thread: usize, stretch: &Stretch) {
        let context = Context { lab: self.lab, policies: &stretch.policies };
        let mut idle = 0u32;
        loop {
            let mut moved = false;
            for i in (thread..self.lanes.len()).step_by(self.threads) {
                let before = self.reached[i].load(Ordering::Acquire);
                if before >= stretch.until {
                    continue;
                }
                let Some(lane) = self.lanes.get(i) else { continue };
                let mut lane = lock(lane);
                let replies = std::mem::take(&mut *lock(&self.replies[i]));
                if replies.is_empty() && self.waiting[i].load(Ordering::Acquire) {
                    continue;
                }
                for reply in replies {
                    lane.answer(reply);
                }
                let reached = lane.run(context, stretch.until, stretch.shortest, |calls, at| {
                    // The calls first: whoever sees the time moved finds them.
                    if !calls.is_empty() {
                        lock(&self.outboxes[i]).extend(calls);
                    }
                    if at > self.reached[i].load(Ordering::Relaxed) {
                        self.reached[i].store(at, Ordering::Release);
                    }
                });
                moved |= reached > before;
                // Short of the stretch's end, a lane waits for an answer: only a reply
                // can move it on.
                self.waiting[i].store(reached < stretch.until, Ordering::Release);
                drop(lane);
            }
            moved |= self.decide();
            if self.decided.load(Ordering::Acquire) >= stretch.until {
                return;
            }
            if moved {
                idle = 0;
            } else {
                idle += 1;
                if idle < SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Decides what can be decided, if no other thread is doing it; whether it did.
    fn decide(&self) -> bool {
        let Ok(mut decider) = self.decider.try_lock() else { return false };
        // The time all proxies have passed, then their calls: a proxy posts its calls
        // before the time it has passed, so every call made before `all` is here.
        let all = self.reached.iter().map(|r| r.load(Ordering::Acquire)).min().unwrap_or(u64::MAX);
        for outbox in &self.outboxes {
            let calls = std::mem::take(&mut *lock(outbox));
            if !calls.is_empty() {
                decider.add(calls);
            }
        }
        let decided = self.decided.load(Ordering::Acquire);
        let before = all.max(decided);
        // A call posted after its time was decided (a bug: counted as `late_calls`) is
        // still decided, so that its proxy does not wait for it forever.
        if before == decided && !decider.has_calls_before(before) {
            return false;
        }
        for (replies, answers) in self.replies.iter().zip(decider.decide(before, self.lanes.len())) {
            if !answers.is_empty() {
                lock(replies).extend(answers);
            }
        }
        self.decided.store(before, Ordering::Release);
        true
    }

    fn run(&self, thread: usize, stretch: &Stretch) {
        let ran = catch_unwind(AssertUnwindSafe(|| self.work(thread, stretch)));
        if let Err(payload) = ran {
            // The others must not wait for this thread's proxies: they end the stretch.
            self.decided.store(u64::MAX, Ordering::Release);
            *lock(&self.panic) = Some(payload);
        }
    }
}

/// The threads running the proxies.
pub(super) struct Crew<'a> {
    shared: &'a Shared<'a>,
    stopped: bool,
}

impl Crew<'_> {
    /// Runs every proxy from `from` (where all of them are) to `until` (ns from the
    /// start), the service answering no sooner than `shortest` after a call. On return
    /// every call made before `until` is decided and answered.
    pub(super) fn run(&mut self, from: u64, until: u64, shortest: u64, policies: &Arc<Vec<Policy>>) {
        let shared = self.shared;
        shared.reached.iter().for_each(|r| r.store(from, Ordering::Relaxed));
        shared.decided.store(from, Ordering::Relaxed);
        shared.waiting.iter().for_each(|w| w.store(false, Ordering::Relaxed));
        let stretch = Stretch { until, shortest, policies: policies.clone() };
        *lock(&shared.stretch) = Some(stretch.clone());
        if shared.threads > 1 {
            let _ = shared.start.wait();
        }
        shared.run(0, &stretch);
        if shared.threads > 1 {
            let _ = shared.done.wait();
        }
        // Answers decided at the end, for calls due after it, reach their proxies now.
        for (lane, replies) in shared.lanes.iter().zip(&shared.replies) {
            let mut lane = lock(lane);
            for reply in std::mem::take(&mut *lock(replies)) {
                lane.answer(reply);
            }
        }
        if let Some(payload) = lock(&shared.panic).take() {
            self.stop();
            resume_unwind(payload);
        }
    }

    fn stop(&mut self) {
        if !self.stopped && self.shared.threads > 1 {
            *lock(&self.shared.stretch) = None;
            let _ = self.shared.start.wait();
        }
        self.stopped = true;
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
    decider: &Mutex<Decider>,
    threads: usize,
    body: impl FnOnce(&mut Crew<'_>) -> R,
) -> R {
    let threads = threads.clamp(1, lanes.len().max(1));
    let shared = Shared {
        lanes,
        lab,
        decider,
        threads,
        start: Barrier::new(threads),
        done: Barrier::new(threads),
        stretch: Mutex::new(None),
        reached: lanes.iter().map(|_| AtomicU64::new(0)).collect(),
        decided: AtomicU64::new(0),
        waiting: lanes.iter().map(|_| AtomicBool::new(false)).collect(),
        outboxes: lanes.iter().map(|_| Mutex::new(Vec::new())).collect(),
        replies: lanes.iter().map(|_| Mutex::new(Vec::new())).collect(),
        panic: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for thread in 1..threads {
            let shared = &shared;
            let _ = scope.spawn(move || {
                loop {
                    let _ = shared.start.wait();
                    let Some(stretch) = lock(&shared.stretch).clone() else { return };
                    shared.run(thread, &stretch);
                    let _ = shared.done.wait();
                }
            });
        }
        let mut crew = Crew { shared: &shared, stopped: false };
        body(&mut crew)
    })
}

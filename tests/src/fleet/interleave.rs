//! Deterministic interleaving of one proxy's workers inside their callbacks.
//!
//! Envoy runs workers on threads at once, and two callbacks on different workers can
//! interleave between any two shared-data calls: that is where a compare-and-swap
//! protocol is tested. The simulation reproduces it deterministically: the workers that
//! have something to do at one instant each run on a thread of their own, but only one
//! thread runs at a time (it holds the *turn*); at every shared-data host call
//! (wasm-host's [`BeforeSharedData`](wasm_host::BeforeSharedData) hook) the running
//! thread draws, from the scenario's generator, which runnable worker goes next, and
//! hands it the turn. Every choice is made by the one running thread from one
//! generator, so a seed replays the same interleaving.

use sluice_testkit::rng::Rng;
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// The turn one batch of workers passes around.
#[derive(Debug)]
pub struct Baton {
    state: Mutex<State>,
    turn: Condvar,
}

#[derive(Debug)]
struct State {
    /// Whether a batch is running (outside one, the hook does nothing).
    active: bool,
    /// The worker that may run.
    running: Option<usize>,
    /// Workers of the batch that have not finished.
    runnable: BTreeSet<usize>,
    rng: Rng,
    /// Turns handed over, for the report.
    switches: u64,
}

impl Baton {
    /// An idle baton drawing from `rng`.
    pub fn new(rng: Rng) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State { active: false, running: None, runnable: BTreeSet::new(), rng, switches: 0 }),
            turn: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The hook: at a shared-data call of `worker`, maybe hand the turn to another.
    pub fn before_access(&self, worker: usize) {
        let mut state = self.lock();
        if !state.active || state.running != Some(worker) {
            return;
        }
        let candidates: Vec<usize> = state.runnable.iter().copied().collect();
        let next = state.rng.pick(&candidates);
        if next == worker {
            return;
        }
        state.running = Some(next);
        state.switches += 1;
        self.turn.notify_all();
        let _state = self.turn.wait_while(state, |s| s.running != Some(worker)).unwrap_or_else(PoisonError::into_inner);
    }

    /// Runs `work` for each of `workers` (a worker index and what to do with it) on
    /// threads of their own, one at a time, interleaved at shared-data calls.
    pub fn run<W: Send>(self: &Arc<Self>, workers: Vec<(usize, W)>, work: impl Fn(usize, W) + Sync) {
        {
            let mut state = self.lock();
            state.active = true;
            state.runnable = workers.iter().map(|(i, _)| *i).collect();
            let candidates: Vec<usize> = state.runnable.iter().copied().collect();
            state.running = Some(state.rng.pick(&candidates));
        }
        std::thread::scope(|scope| {
            for (index, item) in workers {
                let work = &work;
                scope.spawn(move || {
                    {
                        let state = self.lock();
                        let _state = self
                            .turn
                            .wait_while(state, |s| s.running != Some(index))
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    // Whatever happens in `work` (a panic too), the turn moves on.
                    let _done = Done { baton: self, index };
                    work(index, item);
                });
            }
        });
        self.lock().active = false;
    }

    /// Turns handed over so far.
    pub fn switches(&self) -> u64 {
        self.lock().switches
    }
}

/// Passes the turn on when a worker's thread is done.
struct Done<'a> {
    baton: &'a Baton,
    index: usize,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        let mut state = self.baton.lock();
        state.runnable.remove(&self.index);
        let candidates: Vec<usize> = state.runnable.iter().copied().collect();
        state.running = if candidates.is_empty() { None } else { Some(state.rng.pick(&candidates)) };
        self.baton.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_worker_runs_at_a_time_and_a_seed_replays_the_same_order() {
        let order = |seed: u64| {
            let baton = Baton::new(Rng::new(seed));
            let seen = Mutex::new(Vec::new());
            baton.run((0..3).map(|i| (i, ())).collect(), |i, ()| {
                for step in 0..4 {
                    baton.before_access(i);
                    seen.lock().unwrap().push((i, step));
                }
            });
            seen.into_inner().unwrap()
        };

        let first = order(7);

        assert_eq!(first, order(7));
        assert_ne!(first, order(8), "another seed interleaves otherwise");
        assert_eq!(first.len(), 12);
        let switched = first.windows(2).filter(|w| w[0].0 != w[1].0).count();
        assert!(switched > 2, "the workers' steps interleave: {first:?}");
    }
}

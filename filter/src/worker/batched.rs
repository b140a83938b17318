//! Counts kept in the VM and handed to the proxy in one go (`metrics_flush`): a request
//! then makes no metric host call at all, and the proxy's statistics lag by up to one
//! flush period. Without `metrics_flush`, every count goes to the proxy at once.

use crate::host::{Counter, Metrics, PluginCounter};

/// A [`Metrics`] that either passes counts through or holds them until [`Self::flush`].
pub(super) struct Batched<M> {
    inner: M,
    /// Deltas not yet handed over, per policy in [`Counter::ALL`] order, then the
    /// plugin's in [`PluginCounter::ALL`] order; `None` when counts pass straight through.
    pending: Option<Pending>,
}

struct Pending {
    policies: Vec<[i64; Counter::ALL.len()]>,
    plugin: [i64; PluginCounter::ALL.len()],
}

impl<M: Metrics> Batched<M> {
    /// Counts for `policies` policies, held until flushed when `hold` is set.
    pub(super) fn new(inner: M, policies: usize, hold: bool) -> Self {
        let pending = hold.then(|| Pending {
            policies: vec![[0; Counter::ALL.len()]; policies],
            plugin: [0; PluginCounter::ALL.len()],
        });
        Self { inner, pending }
    }

    /// The proxy's side.
    pub(super) const fn inner(&self) -> &M {
        &self.inner
    }

    /// Hands every held count to the proxy: one host call per counter that moved.
    pub(super) fn flush(&mut self) {
        let Some(pending) = &mut self.pending else { return };
        for (policy, deltas) in pending.policies.iter_mut().enumerate() {
            for (counter, delta) in Counter::ALL.iter().zip(deltas.iter_mut()) {
                if *delta != 0 {
                    self.inner.add(policy, *counter, std::mem::take(delta));
                }
            }
        }
        for (counter, delta) in PluginCounter::ALL.iter().zip(pending.plugin.iter_mut()) {
            if *delta != 0 {
                self.inner.add_plugin(*counter, std::mem::take(delta));
            }
        }
    }
}

impl<M: Metrics> Metrics for Batched<M> {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        let held =
            self.pending.as_mut().and_then(|p| p.policies.get_mut(policy)).and_then(|d| d.get_mut(counter.index()));
        match held {
            Some(slot) => *slot = slot.saturating_add(delta),
            None => self.inner.add(policy, counter, delta),
        }
    }

    fn add_plugin(&mut self, counter: PluginCounter, delta: i64) {
        match self.pending.as_mut().and_then(|p| p.plugin.get_mut(counter.index())) {
            Some(slot) => *slot = slot.saturating_add(delta),
            None => self.inner.add_plugin(counter, delta),
        }
    }

    /// A wait is a sample, not a sum: it goes to the proxy at once, held or not.
    fn record_wait(&mut self, wait: crate::host::Wait, ms: u64) {
        self.inner.record_wait(wait, ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::RecordedMetrics;

    #[test]
    fn held_counts_reach_the_proxy_only_when_flushed_and_summed() {
        let mut metrics = Batched::new(RecordedMetrics::default(), 2, true);
        metrics.add(1, Counter::Offered, 1);
        metrics.add(1, Counter::Offered, 1);
        metrics.add(0, Counter::Rejected, 1);
        metrics.add_plugin(PluginCounter::ResumeFailures, 1);

        assert_eq!(metrics.inner().get(1, Counter::Offered), 0, "nothing handed over before the flush");
        metrics.flush();
        assert_eq!(metrics.inner().get(1, Counter::Offered), 2);
        assert_eq!(metrics.inner().get(0, Counter::Rejected), 1);
        assert_eq!(metrics.inner().plugin(PluginCounter::ResumeFailures), 1);
        assert_eq!(metrics.inner().calls(), 3, "one host call per counter that moved");
        metrics.flush();
        assert_eq!(metrics.inner().calls(), 3, "a flush with nothing held makes no call");
    }

    #[test]
    fn a_wait_sample_reaches_the_proxy_at_once_even_while_counts_are_held() {
        let mut metrics = Batched::new(RecordedMetrics::default(), 1, true);
        metrics.add(0, Counter::Queued, 1);
        metrics.record_wait(crate::host::Wait::Queue, 250);

        assert_eq!(metrics.inner().waits, [(crate::host::Wait::Queue, 250)], "a sample is not a sum");
        assert_eq!(metrics.inner().get(0, Counter::Queued), 0, "the count waits for the flush");
    }

    #[test]
    fn without_holding_every_count_goes_to_the_proxy_at_once() {
        let mut metrics = Batched::new(RecordedMetrics::default(), 1, false);
        metrics.add(0, Counter::Allowed, 1);

        assert_eq!(metrics.inner().get(0, Counter::Allowed), 1);
    }

    #[test]
    fn a_gauge_held_down_and_up_hands_over_only_its_net_change() {
        let mut metrics = Batched::new(RecordedMetrics::default(), 1, true);
        metrics.add(0, Counter::Queued, 1);
        metrics.add(0, Counter::Queued, -1);
        metrics.flush();

        assert_eq!(metrics.inner().calls(), 0);
    }
}

//! Fallback spells: how long a worker has been deciding each global policy by a
//! fallback, for the operator's "fallback-mode duration" (`fallback.active`,
//! `fallback.milliseconds`).
//!
//! A spell begins at a policy's first degraded decision on this worker and ends once
//! [`FALLBACK_QUIET`] passes without another; its length is counted from the first
//! degraded decision to the last, on the worker's tick. Nothing on the request path
//! reads it: a degraded decision only notes its time (and the first of a spell moves
//! the gauge), so a spell costs one host call when it begins and a few per tick while
//! it lasts, however many requests it decides.

use crate::host::{Counter, FALLBACK_QUIET, Metrics};
use shared_store::Nanos;

/// Nanoseconds in a millisecond.
const NANOS_PER_MS: u64 = 1_000_000;

/// One policy's spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spell {
    /// The last degraded decision.
    last: Nanos,
    /// Up to where its length has been counted.
    counted_to: Nanos,
}

/// The spells of every policy of this worker, by policy index.
#[derive(Debug, Default)]
pub(crate) struct Spells(Vec<Option<Spell>>);

impl Spells {
    /// `policy` was decided by a fallback at `now`.
    pub(crate) fn degraded(&mut self, policy: usize, now: Nanos, metrics: &mut impl Metrics) {
        if self.0.len() <= policy {
            self.0.resize(policy + 1, None);
        }
        let Some(entry) = self.0.get_mut(policy) else { return };
        match entry {
            Some(spell) => spell.last = spell.last.max(now),
            None => {
                *entry = Some(Spell { last: now, counted_to: now });
                metrics.add(policy, Counter::FallbackActive, 1);
            }
        }
    }

    /// Counts the spells' length up to their last degraded decision, in whole
    /// milliseconds (the rest is kept for the next tick), and ends those quiet for
    /// [`FALLBACK_QUIET`] by `now`.
    pub(crate) fn tick(&mut self, now: Nanos, metrics: &mut impl Metrics) {
        let quiet = Nanos::from(FALLBACK_QUIET);
        for (policy, entry) in self.0.iter_mut().enumerate() {
            let Some(spell) = entry else { continue };
            let ms = spell.last.saturating_sub(spell.counted_to).as_u64() / NANOS_PER_MS;
            if ms > 0 {
                metrics.add(policy, Counter::FallbackMilliseconds, i64::try_from(ms).unwrap_or(i64::MAX));
                spell.counted_to = spell.counted_to.saturating_add(Nanos(ms * NANOS_PER_MS));
            }
            if now.saturating_sub(spell.last) >= quiet {
                *entry = None;
                metrics.add(policy, Counter::FallbackActive, -1);
            }
        }
    }

    /// Ends every spell (the worker is going away), so the gauge does not keep it.
    pub(crate) fn end_all(&mut self, metrics: &mut impl Metrics) {
        for (policy, entry) in self.0.iter_mut().enumerate() {
            if entry.take().is_some() {
                metrics.add(policy, Counter::FallbackActive, -1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::RecordedMetrics;

    const MS: u64 = NANOS_PER_MS;

    #[test]
    fn a_spell_lasts_from_its_first_degraded_decision_to_its_last_and_ends_when_quiet() {
        let (mut spells, mut metrics) = (Spells::default(), RecordedMetrics::default());
        spells.degraded(1, Nanos(1_000 * MS), &mut metrics);
        assert_eq!(metrics.get(1, Counter::FallbackActive), 1);
        spells.degraded(1, Nanos(1_400 * MS), &mut metrics);
        spells.degraded(1, Nanos(2_750 * MS), &mut metrics);
        assert_eq!(metrics.get(1, Counter::FallbackActive), 1, "one spell, however many decisions");
        spells.tick(Nanos(2_760 * MS), &mut metrics);
        assert_eq!(metrics.get(1, Counter::FallbackMilliseconds), 1_750);
        spells.tick(Nanos(3_749 * MS), &mut metrics);
        assert_eq!(metrics.get(1, Counter::FallbackActive), 1, "not quiet for a second yet");
        spells.tick(Nanos(3_750 * MS), &mut metrics);
        assert_eq!(metrics.get(1, Counter::FallbackActive), 0);
        assert_eq!(metrics.get(1, Counter::FallbackMilliseconds), 1_750, "the quiet second is not counted");
        assert_eq!(metrics.get(0, Counter::FallbackActive), 0, "another policy has no spell");
    }

    #[test]
    fn what_is_left_of_a_millisecond_is_counted_on_a_later_tick() {
        let (mut spells, mut metrics) = (Spells::default(), RecordedMetrics::default());
        spells.degraded(0, Nanos(0), &mut metrics);
        spells.degraded(0, Nanos(MS / 2), &mut metrics);
        spells.tick(Nanos(MS / 2), &mut metrics);
        assert_eq!(metrics.get(0, Counter::FallbackMilliseconds), 0);
        spells.degraded(0, Nanos(3 * MS / 2), &mut metrics);
        spells.tick(Nanos(3 * MS / 2), &mut metrics);
        assert_eq!(metrics.get(0, Counter::FallbackMilliseconds), 1);
    }

    #[test]
    fn ending_every_spell_takes_them_off_the_gauge() {
        let (mut spells, mut metrics) = (Spells::default(), RecordedMetrics::default());
        spells.degraded(0, Nanos(0), &mut metrics);
        spells.degraded(2, Nanos(0), &mut metrics);
        spells.end_all(&mut metrics);
        spells.end_all(&mut metrics);
        assert_eq!((metrics.get(0, Counter::FallbackActive), metrics.get(2, Counter::FallbackActive)), (0, 0));
    }
}

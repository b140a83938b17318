//! Requests held by one worker, by context id, ordered by when they are due: paused by
//! shaping until their turn, or waiting for the counter service until their deadline.
//! A tick takes what is due from the front, so it costs what it releases, not what is
//! held.

use shared_store::Nanos;
use std::collections::{BTreeSet, HashMap};

/// Held values by context id, ordered by due time.
#[derive(Debug)]
pub struct DueQueue<T> {
    by_id: HashMap<u32, (Nanos, T)>,
    by_due: BTreeSet<(Nanos, u32)>,
}

impl<T> Default for DueQueue<T> {
    fn default() -> Self {
        Self { by_id: HashMap::new(), by_due: BTreeSet::new() }
    }
}

impl<T> DueQueue<T> {
    /// How many are held.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Holds `value` for context `id` until `due`, replacing what `id` held.
    pub fn insert(&mut self, id: u32, due: Nanos, value: T) {
        if let Some((old, _)) = self.by_id.insert(id, (due, value)) {
            self.by_due.remove(&(old, id));
        }
        self.by_due.insert((due, id));
    }

    /// Takes what context `id` holds.
    pub fn remove(&mut self, id: u32) -> Option<T> {
        // Most streams were never held: no hash for an empty queue.
        if self.by_id.is_empty() {
            return None;
        }
        let (due, value) = self.by_id.remove(&id)?;
        self.by_due.remove(&(due, id));
        Some(value)
    }

    /// The context id of a held value that `pick` picks, if any (a scan).
    pub fn find(&self, pick: impl Fn(&T) -> bool) -> Option<u32> {
        self.by_id.iter().find(|(_, (_, value))| pick(value)).map(|(id, _)| *id)
    }

    /// The context ids of the first `n` held values, in due order, that `pick` picks
    /// (a scan from the front, which stops at the `n`-th).
    pub fn first_where(&self, n: usize, pick: impl Fn(&T) -> bool) -> Vec<u32> {
        self.by_due
            .iter()
            .filter(|(_, id)| self.by_id.get(id).is_some_and(|(_, value)| pick(value)))
            .take(n)
            .map(|(_, id)| *id)
            .collect()
    }

    /// Takes the earliest value due at or before `now`.
    pub fn pop_due(&mut self, now: Nanos) -> Option<(u32, T)> {
        let &(due, id) = self.by_due.first()?;
        if due > now {
            return None;
        }
        self.by_due.pop_first();
        self.by_id.remove(&id).map(|(_, value)| (id, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_out_in_due_order_and_never_early() {
        let mut queue = DueQueue::default();
        queue.insert(7, Nanos(30), "c");
        queue.insert(5, Nanos(10), "a");
        queue.insert(6, Nanos(20), "b");

        assert_eq!(queue.pop_due(Nanos(9)), None);
        assert_eq!(queue.pop_due(Nanos(25)), Some((5, "a")));
        assert_eq!(queue.pop_due(Nanos(25)), Some((6, "b")));
        assert_eq!(queue.pop_due(Nanos(25)), None);
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn a_removed_value_is_never_released() {
        let mut queue = DueQueue::default();
        queue.insert(1, Nanos(10), ());
        queue.insert(2, Nanos(10), ());

        assert_eq!(queue.remove(1), Some(()));
        assert_eq!(queue.pop_due(Nanos(10)), Some((2, ())));
        assert!(queue.is_empty());
    }

    #[test]
    fn inserting_again_moves_a_value_to_its_new_due_time() {
        let mut queue = DueQueue::default();
        queue.insert(1, Nanos(10), "old");
        queue.insert(1, Nanos(50), "new");

        assert_eq!(queue.pop_due(Nanos(20)), None);
        assert_eq!(queue.pop_due(Nanos(50)), Some((1, "new")));
    }
}

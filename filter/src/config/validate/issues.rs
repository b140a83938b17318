//! Where validation writes what is wrong: every check adds its issues here, so one run
//! reports all of them rather than the first.

use crate::config::error::Issue;

/// Collects issues while validating.
#[derive(Debug, Default)]
pub(super) struct Issues(Vec<Issue>);

impl Issues {
    /// Records that the field at `path` is wrong, and what is expected.
    pub(super) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Issue { path: path.into(), message: message.into() });
    }

    /// How many issues were recorded so far: a check compares it before and after to
    /// learn whether it added any.
    pub(super) const fn count(&self) -> usize {
        self.0.len()
    }

    /// The issues recorded, in the order they were found.
    pub(super) fn into_vec(self) -> Vec<Issue> {
        self.0
    }
}

//! What one forwarded stream owes until its response reports its costs: the estimates
//! spent at admission, the costs read so far from response headers, and the reader of the
//! body when a policy reads its cost there.

use crate::config::Usage;
use crate::engine::{Engine, Owed};
use crate::host::ResponseFacts;
use crate::policy::parse_cost;
use crate::usage::UsageReader;

/// A stream's estimates and what its response has said about them so far.
#[derive(Debug)]
pub(super) struct StreamCosts {
    owed: Vec<Owed>,
    /// What the response reported for each of `owed`, in the same order.
    reported: Vec<Option<u64>>,
    /// The body's reader, and for each of its paths the entry of `owed` it settles.
    body: Option<(UsageReader, Vec<usize>)>,
}

impl StreamCosts {
    pub(super) fn new(owed: Vec<Owed>) -> Self {
        let reported = vec![None; owed.len()];
        Self { owed, reported, body: None }
    }

    /// Reads the costs the response headers report, and prepares to read the body when a
    /// policy reads its cost there (`has_body`). A header that cannot be read reports
    /// nothing. Returns whether the body is to be read.
    pub(super) fn on_headers(&mut self, engine: &Engine, response: &impl ResponseFacts, has_body: bool) -> bool {
        let mut paths = Vec::new();
        let mut targets = Vec::new();
        for (i, owed) in self.owed.iter().enumerate() {
            match engine.usage(owed.policy()) {
                Some(Usage::Header(name)) => {
                    let value = response.header(name).ok().flatten();
                    if let Some(slot) = self.reported.get_mut(i) {
                        *slot = value.as_deref().and_then(parse_cost);
                    }
                }
                Some(Usage::Json(path)) if has_body => {
                    paths.push(path.clone());
                    targets.push(i);
                }
                Some(Usage::Json(_)) | None => {}
            }
        }
        if paths.is_empty() {
            return false;
        }
        let content_type = response.header("content-type").ok().flatten();
        self.body = Some((UsageReader::new(paths, content_type.as_deref()), targets));
        true
    }

    /// Reads the next chunk of the body, holding at most `cap` bytes (its worker's room
    /// for it).
    pub(super) fn on_body(&mut self, chunk: &[u8], cap: usize) {
        if let Some((reader, _)) = &mut self.body {
            reader.feed_within(chunk, cap);
        }
    }

    /// The policies whose cost the body reports, once each, when some of the body was
    /// dropped for want of room in its worker.
    pub(super) fn over_budget(&self) -> Vec<usize> {
        let mut policies = Vec::new();
        if let Some((reader, targets)) = &self.body
            && reader.over_budget()
        {
            for policy in targets.iter().filter_map(|i| self.owed.get(*i)).map(Owed::policy) {
                if !policies.contains(&policy) {
                    policies.push(policy);
                }
            }
        }
        policies
    }

    /// Bytes its body's reader holds now.
    pub(super) fn held(&self) -> usize {
        self.body.as_ref().map_or(0, |(reader, _)| reader.held())
    }

    /// Whether the body is being read.
    pub(super) fn reads_body(&self) -> bool {
        self.body.is_some()
    }

    /// Each estimate with the cost the response reported for it (`None`: it reported
    /// none), once the body has ended (`complete`) or the stream ended before it did.
    pub(super) fn finish(mut self, complete: bool) -> impl Iterator<Item = (Owed, Option<u64>)> {
        if let Some((mut reader, targets)) = self.body.take() {
            for (found, i) in reader.finish(complete).iter().zip(targets) {
                if let Some(slot) = self.reported.get_mut(i) {
                    *slot = *found;
                }
            }
        }
        self.owed.into_iter().zip(self.reported)
    }
}

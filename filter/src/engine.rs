//! The policy engine: compiled configuration → request → one atomic decision across
//! every matching policy → a response plan, with the counts for metrics.
//!
//! # One decision per request
//!
//! Every enforcing policy that matches is decided in **one** [`Limiter::check`]: either
//! all admit and all spend, or the request is rejected and nothing is spent anywhere.
//! Shadow policies are decided afterwards, each on its own (a shadow policy must never
//! change what enforcing policies spend), and only for requests that were admitted.
//!
//! # Keys
//!
//! A caller's key values are encoded canonically with the policy's name and version
//! ([`shared_store::descriptor`]), hashed with the proxy's secret
//! ([`HashKey::fingerprint`]) and placed in the policy's slot table: no raw identity
//! ever reaches a shared-data key, a log line or a metric name, and the number of keys
//! a policy creates is bounded by its `slots` whatever the number of callers.
//!
//! # The response
//!
//! The strictest outcome decides the headers: on a rejection, the rejecting policy with
//! the longest wait; on an allowed response, the policy with the least remaining.

use crate::config::{Config, FailureOutcome, HeaderSets, MissingKey, Policy};
use crate::host::{Counter, Metrics, RequestFacts};
use shared_store::{
    Admission, Cas, Clock, Decision, HashKey, LimitError, Limiter, MAX_INLINE_LIMITS, Nanos, Placement, Request,
    SlotTable, Store, StoreError, Swap, push_decimal,
};
use smallvec::SmallVec;

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Forward it; add these headers to its response.
    Continue {
        /// Response headers (rate-limit headers on allowed responses).
        headers: Vec<(String, String)>,
    },
    /// Answer it locally.
    Reject(LocalResponse),
    /// Forward it after `delay` (shaping), then add `headers` to its response.
    Delay {
        /// How long to hold it.
        delay: Nanos,
        /// When it is due, on the limiter's clock.
        due: Nanos,
        /// Response headers.
        headers: Vec<(String, String)>,
        /// The policies it counts under, for [`Engine::release`] and [`Engine::abandon`].
        policies: Vec<usize>,
    },
}

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status.
    pub status: u16,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: String,
}

/// The configuration compiled against one plugin's identity and hash secret.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    tables: Vec<SlotTable>,
    /// Per policy: the key of the bucket shared by requests missing a key part.
    missing: Vec<String>,
    /// Per policy: the key recording the slot-table size.
    meta: Vec<String>,
    secret: HashKey,
}

/// Encodes a plugin identity (name and root id, any bytes) into a key prefix that
/// cannot collide with another identity: bytes outside `A-Z a-z 0-9 _ . -` are
/// percent-encoded, and `/` separates the parts.
pub fn plugin_prefix(plugin_name: &[u8], root_id: &[u8]) -> String {
    fn encode(out: &mut String, bytes: &[u8]) {
        for &b in bytes {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    let mut out = String::from("sluice/");
    encode(&mut out, plugin_name);
    out.push('/');
    encode(&mut out, root_id);
    out.push('/');
    out
}

/// The key under which the plugin's hash secret is kept.
pub fn secret_key(prefix: &str) -> String {
    format!("{prefix}secret")
}

/// The key the limiter writes to create keys atomically.
pub fn anchor_key(prefix: &str) -> String {
    format!("{prefix}anchor")
}

/// Establishes the hash secret all workers of a proxy share: the first worker to get
/// here stores `candidate`; every other worker, racing or later, adopts the stored one.
///
/// Envoy has no atomic create, so this uses the same anchor protocol as the limiter:
/// the create carries a CAS token that belongs to a fresh anchor write, so a second
/// creator conflicts instead of overwriting (see `shared_store::limiter`).
///
/// # Errors
/// When the store fails, or keeps conflicting.
pub fn establish_secret(store: &impl Store, prefix: &str, candidate: [u8; 16]) -> Result<HashKey, StoreError> {
    let key = secret_key(prefix);
    let anchor = anchor_key(prefix);
    for _ in 0..shared_store::DEFAULT_MAX_ATTEMPTS {
        if let Some(entry) = store.get(&key)? {
            if let Ok(bytes) = <[u8; 16]>::try_from(entry.value.as_slice()) {
                return Ok(HashKey::new(bytes));
            }
            // Damaged: replace it, conditionally, so racing repairs agree.
            let _ = store.set(&key, &candidate, Some(entry.cas))?;
            continue;
        }
        let _ = store.set(&anchor, &[], None)?;
        let token: Option<Cas> = store.get(&anchor)?.map(|e| e.cas);
        if let Some(token) = token {
            // Written or Conflict: either way, read back what won.
            let _: Swap = store.set(&key, &candidate, Some(token))?;
        }
    }
    Err(StoreError { operation: "create of the hash secret", status: None })
}

/// How a request's policies were resolved before deciding.
struct Resolved {
    policy: usize,
    place: Placement,
    cost: u64,
}

impl Engine {
    /// Compiles `config` for the plugin whose keys start with `prefix` (see
    /// [`plugin_prefix`]), hashing keys with `secret`.
    pub fn new(config: Config, prefix: &str, secret: HashKey) -> Self {
        let base = |p: &Policy| format!("{prefix}p/{}/v{}/", p.name, p.version);
        let tables = config.policies.iter().map(|p| SlotTable::new(base(p), p.slots)).collect();
        let missing = config.policies.iter().map(|p| format!("{}missing", base(p))).collect();
        let meta = config.policies.iter().map(|p| format!("{}meta", base(p))).collect();
        Self { config, tables, missing, meta, secret }
    }

    /// The configuration.
    pub const fn config(&self) -> &Config {
        &self.config
    }

    /// The most shared-data keys this configuration can create, all policies together:
    /// slots, overflow, missing-key bucket and table record per policy.
    pub fn max_keys(&self) -> u64 {
        self.tables.iter().map(|t| t.max_keys().saturating_add(2)).sum()
    }

    /// Records each policy's slot count in shared data, or checks it against the count
    /// recorded by an earlier configuration of the same policy version: a table cannot
    /// change size in place (callers would move to other slots, some onto idle state,
    /// which would hand them a full bucket), so a new size needs a new `version`.
    ///
    /// # Errors
    /// A message naming the policy, or the store failure.
    pub fn claim_tables(&self, store: &impl Store) -> Result<(), String> {
        for (index, (policy, meta)) in self.config.policies.iter().zip(&self.meta).enumerate() {
            let want = policy.slots.get().to_string();
            match store.get(meta).map_err(|e| e.to_string())? {
                Some(entry) if entry.value == want.as_bytes() => {}
                Some(entry) => {
                    let had = String::from_utf8_lossy(&entry.value).into_owned();
                    return Err(format!(
                        "policies[{index}].slots: policy {:?} version {} already has {had} slots in this proxy; \
                         changing the table size needs a new version",
                        policy.name, policy.version
                    ));
                }
                None => {
                    let _ = store.set(meta, want.as_bytes(), None).map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Decides a request.
    ///
    /// `room_to_pause` says whether the caller can hold one more request paused; when
    /// it cannot, a request that would be delayed is rejected instead (its place in the
    /// shaping queue stays spent: stricter, never looser).
    pub fn decide<S: Store, C: Clock>(
        &self,
        request: &impl RequestFacts,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Outcome {
        // Inline up to MAX_INLINE_LIMITS policies: deciding a request does not allocate
        // for its own bookkeeping (this runs on every request).
        let mut enforcing: SmallVec<[Resolved; MAX_INLINE_LIMITS]> = SmallVec::new();
        let mut shadows: SmallVec<[Resolved; MAX_INLINE_LIMITS]> = SmallVec::new();
        let mut offered: SmallVec<[usize; MAX_INLINE_LIMITS]> = SmallVec::new();
        let mut missing_rejects = false;
        for (index, policy) in self.config.policies.iter().enumerate() {
            if !policy.matcher.matches(request) {
                continue;
            }
            let place = match policy.fingerprint(request, &self.secret) {
                Some(fingerprint) => match self.tables.get(index) {
                    Some(table) => table.place(fingerprint),
                    None => continue,
                },
                None => {
                    metrics.add(index, Counter::MissingKey, 1);
                    match policy.on_missing_key {
                        MissingKey::Skip => continue,
                        MissingKey::Shared => match self.missing.get(index) {
                            Some(key) => Placement::dedicated(key.clone()),
                            None => continue,
                        },
                        MissingKey::Reject => {
                            offered.push(index);
                            if policy.shadow {
                                metrics.add(index, Counter::ShadowRejected, 1);
                            } else {
                                metrics.add(index, Counter::OverLimit, 1);
                                missing_rejects = true;
                            }
                            continue;
                        }
                    }
                }
            };
            offered.push(index);
            let resolved = Resolved { policy: index, place, cost: policy.cost_of(request) };
            if policy.shadow { shadows.push(resolved) } else { enforcing.push(resolved) }
        }
        for &index in &offered {
            metrics.add(index, Counter::Offered, 1);
        }
        let count_all = |metrics: &mut dyn FnMut(usize), offered: &[usize]| offered.iter().for_each(|i| metrics(*i));

        if missing_rejects {
            count_all(&mut |i| metrics.add(i, Counter::Rejected, 1), &offered);
            return Outcome::Reject(self.rejection(None, self.config.response.status));
        }

        let admission = if enforcing.is_empty() {
            None
        } else {
            let requests: SmallVec<[Request<'_>; MAX_INLINE_LIMITS]> = enforcing
                .iter()
                .filter_map(|r| {
                    let limit = &self.config.policies.get(r.policy)?.limit;
                    Some(Request { place: &r.place, limit, cost: r.cost })
                })
                .collect();
            match limiter.check(&requests) {
                Ok(admission) => {
                    for r in &enforcing {
                        count_evidence(metrics, r.policy, &admission);
                    }
                    Some(admission)
                }
                Err(error) => return self.failure(&enforcing, &shadows, &offered, limiter, &error, metrics),
            }
        };

        if let Some(admission) = &admission
            && !admission.admitted
        {
            for (r, decision) in enforcing.iter().zip(&admission.decisions) {
                if !decision.is_admitted() {
                    metrics.add(r.policy, Counter::OverLimit, 1);
                }
            }
            count_all(&mut |i| metrics.add(i, Counter::Rejected, 1), &offered);
            let strictest = strictest_rejection(&enforcing, &admission.decisions);
            return Outcome::Reject(self.rejection(strictest.map(|(p, d)| (p, *d)), self.config.response.status));
        }

        self.decide_shadows(&shadows, limiter, metrics);

        let headers = match &admission {
            Some(admission) => self.allowed_headers(&enforcing, &admission.decisions),
            None => Vec::new(),
        };
        let delay = admission.as_ref().map_or(Nanos::ZERO, Admission::delay);
        if delay > Nanos::ZERO {
            if !room_to_pause {
                count_all(&mut |i| metrics.add(i, Counter::Rejected, 1), &offered);
                return Outcome::Reject(self.rejection(None, self.config.response.status));
            }
            count_all(&mut |i| metrics.add(i, Counter::Queued, 1), &offered);
            let at = admission.as_ref().map_or(Nanos::ZERO, |a| a.at);
            return Outcome::Delay { delay, due: at.saturating_add(delay), headers, policies: offered.into_vec() };
        }
        count_all(&mut |i| metrics.add(i, Counter::Allowed, 1), &offered);
        Outcome::Continue { headers }
    }

    /// Counts a paused request released to the upstream.
    pub fn release(&self, policies: &[usize], metrics: &mut impl Metrics) {
        for &i in policies {
            metrics.add(i, Counter::Queued, -1);
            metrics.add(i, Counter::Allowed, 1);
        }
    }

    /// Counts a paused request whose stream ended before its release. It spent its place
    /// in the queue, so it counts as allowed, and as abandoned.
    pub fn abandon(&self, policies: &[usize], metrics: &mut impl Metrics) {
        for &i in policies {
            metrics.add(i, Counter::Queued, -1);
            metrics.add(i, Counter::Allowed, 1);
            metrics.add(i, Counter::Abandoned, 1);
        }
    }

    fn decide_shadows<S: Store, C: Clock>(
        &self,
        shadows: &[Resolved],
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        for r in shadows {
            let Some(policy) = self.config.policies.get(r.policy) else { continue };
            match limiter.check_one(&r.place, &policy.limit, r.cost) {
                Ok(admission) => {
                    count_evidence(metrics, r.policy, &admission);
                    if !admission.admitted {
                        metrics.add(r.policy, Counter::ShadowRejected, 1);
                    }
                }
                Err(error) => count_error(metrics, r.policy, &error),
            }
        }
    }

    /// No decision could be made: apply the strictest failure outcome of the enforcing
    /// policies (any `deny` denies).
    fn failure<S: Store, C: Clock>(
        &self,
        enforcing: &[Resolved],
        shadows: &[Resolved],
        offered: &[usize],
        limiter: &Limiter<S, C>,
        error: &LimitError,
        metrics: &mut impl Metrics,
    ) -> Outcome {
        let deny = enforcing.iter().find_map(|r| match self.config.policies.get(r.policy)?.on_failure {
            FailureOutcome::Deny(status) => Some(status),
            FailureOutcome::Allow => None,
        });
        for r in enforcing {
            count_error(metrics, r.policy, error);
            metrics.add(r.policy, if deny.is_some() { Counter::FailureDenied } else { Counter::FailureAllowed }, 1);
        }
        log::debug!("sluice: no decision ({error}); failure outcome {}", if deny.is_some() { "deny" } else { "allow" });
        match deny {
            Some(status) => {
                for &i in offered {
                    metrics.add(i, Counter::Rejected, 1);
                }
                Outcome::Reject(self.rejection(None, status))
            }
            None => {
                self.decide_shadows(shadows, limiter, metrics);
                for &i in offered {
                    metrics.add(i, Counter::Allowed, 1);
                }
                Outcome::Continue { headers: Vec::new() }
            }
        }
    }

    fn rejection(&self, strictest: Option<(usize, Decision)>, status: u16) -> LocalResponse {
        let response = &self.config.response;
        let mut headers = response.headers.clone();
        if let Some((policy, decision)) = strictest
            && let Some(policy) = self.config.policies.get(policy)
        {
            let sent = rate_limit_headers(&mut headers, response.on_rejected, &policy.name, &policy.limit, &decision);
            if sent {
                headers.push(("cache-control".to_owned(), "private".to_owned()));
            }
        }
        LocalResponse { status, headers, body: response.body.clone() }
    }

    fn allowed_headers(&self, enforcing: &[Resolved], decisions: &[Decision]) -> Vec<(String, String)> {
        let sets = self.config.response.on_allowed;
        if !sets.any() {
            return Vec::new();
        }
        let strictest = enforcing
            .iter()
            .zip(decisions)
            .min_by(|(_, a), (_, b)| a.remaining.cmp(&b.remaining).then(b.reset_after.cmp(&a.reset_after)));
        let mut headers = Vec::new();
        if let Some((r, decision)) = strictest
            && let Some(policy) = self.config.policies.get(r.policy)
        {
            rate_limit_headers(&mut headers, sets, &policy.name, &policy.limit, decision);
        }
        headers
    }
}

/// Among rejecting decisions, the one with the longest wait (a cost that can never pass
/// counts as the longest).
fn strictest_rejection<'a>(enforcing: &[Resolved], decisions: &'a [Decision]) -> Option<(usize, &'a Decision)> {
    enforcing
        .iter()
        .zip(decisions)
        .filter(|(_, d)| !d.is_admitted())
        .max_by_key(|(_, d)| d.retry_after().unwrap_or(Nanos::MAX))
        .map(|(r, d)| (r.policy, d))
}

fn count_evidence(metrics: &mut impl Metrics, policy: usize, admission: &Admission) {
    for (counter, value) in [
        (Counter::CasConflicts, admission.conflicts),
        (Counter::Repaired, admission.repaired),
        (Counter::Overflowed, admission.overflowed),
        (Counter::Unrefunded, admission.unrefunded),
    ] {
        if value > 0 {
            metrics.add(policy, counter, i64::from(value));
        }
    }
}

fn count_error(metrics: &mut impl Metrics, policy: usize, error: &LimitError) {
    match error {
        LimitError::Contended { attempts } => {
            metrics.add(policy, Counter::CasConflicts, i64::from(*attempts));
            metrics.add(policy, Counter::CasExhausted, 1);
        }
        LimitError::Store(_) => metrics.add(policy, Counter::StoreErrors, 1),
    }
}

fn decimal(n: u64) -> String {
    let mut out = String::with_capacity(20);
    push_decimal(&mut out, n);
    out
}

/// Whole seconds, rounded up, at least 1 for any non-zero span.
fn secs_ceil(n: Nanos) -> u64 {
    n.as_secs_ceil()
}

/// Appends the rate-limit headers in `sets` for one policy's decision. Returns whether
/// any was added.
pub fn rate_limit_headers(
    headers: &mut Vec<(String, String)>,
    sets: HeaderSets,
    name: &str,
    limit: &shared_store::Limit,
    decision: &Decision,
) -> bool {
    let before = headers.len();
    // `t`: on a rejection, when this request could pass (so Retry-After is never earlier
    // than `t`); otherwise when the quota is whole again.
    let t = secs_ceil(decision.retry_after().unwrap_or(decision.reset_after));
    if sets.retry_after
        && let Some(wait) = decision.retry_after()
    {
        headers.push(("retry-after".to_owned(), decimal(secs_ceil(wait).max(1))));
    }
    if sets.ratelimit {
        let window = secs_ceil(limit.period()).max(1);
        // `"<name>";q=<limit>;w=<window>` and `"<name>";r=<remaining>;t=<t>`, built by
        // hand: `format!` is the slowest part of these headers in wasm.
        let field = |first: &str, a: u64, second: &str, b: u64| {
            let mut value = String::with_capacity(name.len() + 48);
            value.push('"');
            value.push_str(name);
            value.push_str(first);
            push_decimal(&mut value, a);
            value.push_str(second);
            push_decimal(&mut value, b);
            value
        };
        headers.push(("ratelimit-policy".to_owned(), field("\";q=", decision.limit, ";w=", window)));
        headers.push(("ratelimit".to_owned(), field("\";r=", decision.remaining, ";t=", t)));
    }
    if sets.legacy {
        headers.push(("x-ratelimit-limit".to_owned(), decimal(decision.limit)));
        headers.push(("x-ratelimit-remaining".to_owned(), decimal(decision.remaining)));
        headers.push(("x-ratelimit-reset".to_owned(), decimal(t)));
    }
    headers.len() > before
}

/// Merges `cache-control: private` into an upstream response's `Cache-Control` value,
/// for responses that carry per-client rate-limit headers: a shared cache must not
/// serve one caller's remaining quota to another. `None` when the value already keeps
/// the response out of shared caches.
pub fn private_cache_control(existing: Option<&[u8]>) -> Option<String> {
    let Some(existing) = existing else { return Some("private".to_owned()) };
    let text = String::from_utf8_lossy(existing);
    let directives: Vec<&str> = text.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let name = |d: &str| d.split('=').next().unwrap_or(d).trim().to_ascii_lowercase();
    if directives.iter().any(|d| matches!(name(d).as_str(), "private" | "no-store")) {
        return None;
    }
    let mut out = vec!["private".to_owned()];
    out.extend(
        directives.iter().filter(|d| !matches!(name(d).as_str(), "public" | "s-maxage")).map(|d| (*d).to_owned()),
    );
    Some(out.join(", "))
}

#[cfg(test)]
mod tests;

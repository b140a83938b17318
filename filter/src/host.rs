//! The ports between the policy engine and the proxy: what the engine may ask about a
//! request ([`RequestFacts`]), where it reports counts ([`Metrics`]), and how it calls the
//! counter service ([`Callouts`]). The wasm glue implements them over proxy-wasm; native
//! tests use the fakes in `testing` (not compiled into `sluice.wasm`).

/// A host call that failed: the host answered a status other than OK or NOT_FOUND. Not
/// the same as "missing": a policy whose key cannot be read takes its `on_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFailure {
    /// The proxy-wasm status the host answered.
    pub status: u32,
}

/// What the engine reads about one request. Values are bytes: HTTP allows non-UTF-8
/// header values, and nothing here may fail on them.
pub trait RequestFacts {
    /// The first value of a request header (lower-case name), or of a pseudo-header
    /// (`:path`, `:method`, `:authority`); `Ok(None)` when the request has none.
    ///
    /// # Errors
    /// When the host fails the call.
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure>;

    /// A host property, such as `["source", "address"]`; `Ok(None)` when missing.
    ///
    /// # Errors
    /// When the host fails the call.
    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, HostFailure>;
}

/// What the engine reads about a response: its headers, when a policy's cost is
/// reported there.
pub trait ResponseFacts {
    /// The first value of a response header (lower-case name); `Ok(None)` when missing.
    ///
    /// # Errors
    /// When the host fails the call.
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure>;
}

/// One HTTP callout to the counter service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    /// The proxy's cluster name for the service.
    pub cluster: &'a str,
    /// Request headers, pseudo-headers (`:method`, `:path`, `:authority`) included.
    pub headers: &'a [(&'a str, &'a str)],
    /// The JSON body.
    pub body: &'a [u8],
    /// The host's timeout for the call, in milliseconds (never 0: 0 means none).
    pub timeout_ms: u32,
}

/// The host would not send a callout (unknown cluster, bad headers, host failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchError {
    /// The proxy-wasm status the host answered.
    pub status: u32,
}

/// Sends callouts. The answer arrives later, through the glue, as a [`CalloutAnswer`].
pub trait Callouts {
    /// Dispatches `call`; returns the host's token for its answer.
    ///
    /// # Errors
    /// When the host refuses to send it.
    fn dispatch(&mut self, call: &Call<'_>) -> Result<u32, DispatchError>;
}

/// What came back from a callout, as read from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalloutAnswer {
    /// A response (Envoy also answers this way for a refused connection or a timeout:
    /// `503` and `504` replies of its own).
    Response {
        /// `:status`.
        status: u16,
        /// The body (bounded by the glue).
        body: Vec<u8>,
    },
    /// The call failed without a response (Envoy: zero headers, a reset).
    Failed,
    /// The filter's own deadline passed first.
    TimedOut,
}

/// Counts reported per policy and per plugin; see [`Counter`] and [`PluginCounter`].
pub trait Metrics {
    /// Adds `delta` to `counter` of the policy at `policy` (its index in the configuration).
    /// Only gauges are ever given a negative delta.
    fn add(&mut self, policy: usize, counter: Counter, delta: i64);

    /// Adds `delta` to a plugin-wide counter.
    fn add_plugin(&mut self, counter: PluginCounter, delta: i64);

    /// Records how long a request waited before its decision was carried out, in
    /// milliseconds (a histogram per [`Wait`]; never held for a flush: a wait is a
    /// sample, not a sum).
    fn record_wait(&mut self, wait: Wait, ms: u64);
}

/// What a request waited for before its decision: each a histogram of the plugin's
/// (`sluice_wait_milliseconds{reason}`), recorded once per request that waited, when
/// it stops waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Wait {
    /// Its turn in a shaping queue (recorded when it is queued: the wait is known then).
    Queue,
    /// The counter service's answer to its check (from when it first asked).
    Service,
    /// A lease refill (from when it began waiting for one).
    Refill,
}

impl Wait {
    /// Every wait, in a fixed order.
    pub const ALL: [Self; 3] = [Self::Queue, Self::Service, Self::Refill];

    /// Its name: the `reason` label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Service => "service",
            Self::Refill => "refill",
        }
    }

    /// Position in [`Self::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident = ($name:literal, $counter:ident),)*) => {
        /// Why the counter service (or a lease) could not decide a request: one failure
        /// class each, with its name in metrics, logs and the fallback header, and the
        /// per-policy counter that counts it (`degraded.<name>`).
        ///
        /// **Append only.** A reason's index ([`Reason::index`], its position here) is
        /// persisted in lease records (why a refill failed), which outlive a
        /// configuration and a filter update: add a reason at the end, never reorder or
        /// remove one (a test pins the indices).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $($(#[$doc])* $variant,)*
        }

        impl Reason {
            /// Every reason, in index order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            /// The name in metrics, logs and the fallback header.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The name of the per-policy counter that counts it, `degraded.<name>`.
            pub const fn metric_name(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!("degraded.", $name),)*
                }
            }

            /// The per-policy counter that counts it.
            pub const fn counter(self) -> Counter {
                match self {
                    $(Self::$variant => Counter::$counter,)*
                }
            }
        }
    };
}

reasons! {
    /// No answer within the deadline.
    Timeout = ("timeout", DegradedTimeout),
    /// The connection was refused.
    Refused = ("refused", DegradedRefused),
    /// The call was reset, or the answer was not HTTP.
    Reset = ("reset", DegradedReset),
    /// An answer with a status other than 200 (or 401).
    BadStatus = ("bad_status", DegradedBadStatus),
    /// A 200 whose body is not a check answer for these entries.
    BadBody = ("bad_body", DegradedBadBody),
    /// 401: the service refused the filter's token.
    Unauthorized = ("unauthorized", DegradedUnauthorized),
    /// The circuit breaker is open.
    CircuitOpen = ("circuit_open", DegradedCircuitOpen),
    /// The proxy would not send the call.
    DispatchFailed = ("dispatch_failed", DegradedDispatchFailed),
    /// Lease mode: too many requests wait for a refill on this worker (`max_waiting`).
    LeaseQueueFull = ("lease_queue_full", DegradedLeaseQueueFull),
    /// Lease mode: the caller's slot in the lease table is held by another key's lease
    /// (give the policy more `slots`). The request is then decided by a check at the
    /// service (`lease.checked.slot_taken`), not by the failure rule: this reason is
    /// counted as degraded only where no check can be sent for it (a request the worker
    /// cannot hold, or a policy whose cost the response reports, not checked yet).
    LeaseSlotTaken = ("lease_slot_taken", DegradedLeaseSlotTaken),
    /// Lease mode: the wait ran out while refills were granted, and other requests
    /// spent them first (demand above what refills bring: a larger `size`). As
    /// `LeaseSlotTaken`, the request is then decided by a check at the service
    /// (`lease.checked.contended`); degraded only where no check can be sent.
    LeaseContended = ("lease_contended", DegradedLeaseContended),
    /// Lease mode: the caller's key is cold (it asked for fewer than the lease's
    /// `cold_below` units over the last lease life, a first request included), so its
    /// request is checked at the service rather than leased, and
    /// that check could not be held for it (the worker decides it at once). Otherwise the
    /// service decides it: `lease.checked.cold`.
    LeaseCold = ("lease_cold", DegradedLeaseCold),
}

impl Reason {
    /// Its position in [`Reason::ALL`], as lease records keep it.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The reason of an index ([`Reason::index`]); `Timeout` for one out of range.
    pub fn from_index(index: u64) -> Self {
        usize::try_from(index).ok().and_then(|i| Self::ALL.get(i).copied()).unwrap_or(Self::Timeout)
    }
}

/// How long a worker goes without a degraded decision before its fallback spell for a
/// policy is over (`fallback.active` goes down): longer than the gaps of steady traffic,
/// short enough that a recovered service shows within seconds.
pub const FALLBACK_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// Which policies define a counter (and, for a plugin counter, which configurations):
/// the proxy holds no series for a counter that nothing it runs can move. Declared with
/// each counter, never read from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every policy (every configuration).
    Every,
    /// Global policies only (for a plugin counter: a configuration with a global policy,
    /// which is one with a counter service to call).
    Global,
    /// Concurrency policies only.
    Concurrency,
    /// Policies whose cost the response reports only.
    ResponseCost,
}

macro_rules! counters {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[$doc:meta])* $variant:ident = ($text:expr, $scope:ident $(, $gauge:ident)?),)*
    }) => {
        $(#[$meta])*
        $vis enum $name {
            $($(#[$doc])* $variant,)*
        }

        impl $name {
            /// Every counter, in a fixed order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            /// The metric name suffix.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)*
                }
            }

            /// The counter whose metric name suffix is `name`, if any: how a reader of the
            /// proxy's metrics (the lab, the tests) names a counter without writing its
            /// name again.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|c| c.name() == name)
            }

            /// Whether the metric is a gauge (it goes down as well as up).
            pub const fn is_gauge(self) -> bool {
                match self {
                    $(Self::$variant => counters!(@gauge $($gauge)?),)*
                }
            }

            /// Which policies (or configurations) define it.
            pub const fn scope(self) -> Scope {
                match self {
                    $(Self::$variant => Scope::$scope,)*
                }
            }

            /// Position in [`Self::ALL`].
            pub const fn index(self) -> usize {
                self as usize
            }
        }
    };
    (@gauge) => { false };
    (@gauge gauge) => { true };
}

counters! {
    /// The counters kept per policy. Names are `<stat_prefix>.<policy>.<name>`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Counter {
        /// Requests the policy applied to, counted when their fate is known.
        /// `Offered = Allowed + Rejected + Queued` at all times.
        Offered = ("offered", Every),
        /// Of those, requests forwarded upstream (now, after a shaping delay, or by a
        /// failure rule). A queued request whose client left also counts here: it spent
        /// its place in the queue (see `Abandoned`).
        Allowed = ("allowed", Every),
        /// Of those, requests answered with a rejection, whichever policy caused it.
        Rejected = ("rejected", Every),
        /// Gauge: requests paused by shaping right now.
        Queued = ("queued", Every, gauge),
        /// This policy's own decision said no (the policy that binds): locally, or the
        /// counter service for a global policy.
        OverLimit = ("over_limit", Every),
        /// This shadow policy would have rejected the request.
        ShadowRejected = ("shadow_rejected", Every),
        /// Requests missing a key part.
        MissingKey = ("missing_key", Every),
        /// Requests for which a host call failed while reading the key, the cost or a
        /// match condition: the policy's `on_failure` decided.
        ReadFailures = ("read_failures", Every),
        /// CAS writes that lost a race and were retried.
        CasConflicts = ("cas_conflicts", Every),
        /// Decisions abandoned after every CAS attempt conflicted.
        CasExhausted = ("cas_exhausted", Every),
        /// Decisions that failed because the shared-data store failed.
        StoreErrors = ("store_errors", Every),
        /// Undecodable shared-data states replaced by exhausted ones.
        Repaired = ("repaired", Every),
        /// Decisions made on the overflow bucket because the caller's slot was held.
        Overflowed = ("overflowed", Every),
        /// Spends that could not be given back (all-or-nothing refunds): stricter, never looser.
        Unrefunded = ("unrefunded", Every),
        /// Requests forwarded by the failure action `allow`.
        FailureAllowed = ("failure_allowed", Every),
        /// Requests denied by the failure action `deny`.
        FailureDenied = ("failure_denied", Every),
        /// Queued requests whose stream ended before their release.
        Abandoned = ("abandoned", Every),
        /// Global: the counter service did not answer in time (Envoy's 504 or the filter's deadline).
        DegradedTimeout = (Reason::Timeout.metric_name(), Global),
        /// Global: the connection to the service was refused (Envoy's 503 "connection failure").
        DegradedRefused = (Reason::Refused.metric_name(), Global),
        /// Global: the call was reset (no response, a reset mid-answer, a protocol error).
        DegradedReset = (Reason::Reset.metric_name(), Global),
        /// Global: the service answered a status other than 200 (401 aside).
        DegradedBadStatus = (Reason::BadStatus.metric_name(), Global),
        /// Global: the service's answer could not be read.
        DegradedBadBody = (Reason::BadBody.metric_name(), Global),
        /// Global: the service refused the filter's token (401).
        DegradedUnauthorized = (Reason::Unauthorized.metric_name(), Global),
        /// Global: the circuit breaker was open; no callout was made.
        DegradedCircuitOpen = (Reason::CircuitOpen.metric_name(), Global),
        /// Global: the proxy refused to send the callout (unknown cluster).
        DegradedDispatchFailed = (Reason::DispatchFailed.metric_name(), Global),
        /// Lease: too many requests waited for a refill on one worker.
        DegradedLeaseQueueFull = (Reason::LeaseQueueFull.metric_name(), Global),
        /// Lease: the caller's lease slot was held by another key's lease.
        DegradedLeaseSlotTaken = (Reason::LeaseSlotTaken.metric_name(), Global),
        /// Lease: a wait ran out while refills were granted and spent by others.
        DegradedLeaseContended = (Reason::LeaseContended.metric_name(), Global),
        /// Global: a cold key's request whose check could not be held for it.
        DegradedLeaseCold = (Reason::LeaseCold.metric_name(), Global),
        /// Gauge, global: this proxy's workers deciding the policy by a fallback now: from
        /// a worker's first degraded decision until [`FALLBACK_QUIET`] passes without
        /// one (0 while the service decides).
        FallbackActive = ("fallback.active", Global, gauge),
        /// Global: milliseconds the workers spent deciding the policy by a fallback, from
        /// the first degraded decision of a spell to its last, summed over workers.
        FallbackMilliseconds = ("fallback.milliseconds", Global),
        /// Global: requests the counter service decided under an operator's bypass
        /// (admitted without spending).
        OverrideBypassed = ("override.bypassed", Global),
        /// Global: requests the counter service decided under an operator's clamp (the
        /// policy's numbers lowered fleet-wide), admitted or rejected.
        OverrideClamped = ("override.clamped", Global),
        /// Global: admitted by the emergency cap while the service could not decide.
        EmergencyAllowed = ("emergency.allowed", Global),
        /// Global: rejected by the emergency cap while the service could not decide.
        EmergencyRejected = ("emergency.rejected", Global),
        /// Lease: refills sent.
        LeaseRefills = ("lease.refills", Global),
        /// Lease: tokens granted by the service.
        LeaseGranted = ("lease.granted", Global),
        /// Lease: tokens that expired unspent (forfeited), counted when their record is
        /// next written: those of a record never written again are not counted.
        LeaseExpired = ("lease.expired", Global),
        /// Lease: tokens this proxy was not expected to spend before its lease expired,
        /// taken out of the lease and credited back to the service (counted once the
        /// service applied the credit; one it could not apply counts as `lease.expired`).
        LeaseReturned = ("lease.returned", Global),
        /// Lease: units admitted under the failure rule and charged to the global budget
        /// once the service answered again.
        LeaseReconciled = ("lease.reconciled", Global),
        /// Lease: units of debt paid from a later grant before any of it was spent (the
        /// service counted them when it granted them: they are not charged).
        LeaseRepaid = ("lease.repaid", Global),
        /// Lease: units admitted under the failure rule beyond `max_debt`, that the
        /// service could not charge, or whose counter could not be named (the request's
        /// partition could not be read): forgiven.
        LeaseForgiven = ("lease.forgiven", Global),
        /// Lease: requests whose lease slot held another key's lease, decided by a check
        /// of their cost at the service instead (exact: its 429 and `Retry-After`).
        LeaseCheckedSlotTaken = ("lease.checked.slot_taken", Global),
        /// Lease: requests whose wait for a refill was outrun by other requests, decided
        /// by a check of their cost at the service instead.
        LeaseCheckedContended = ("lease.checked.contended", Global),
        /// Lease: requests of a cold key (one that asked for fewer than `cold_below` units,
        /// four by default, over a lease's life on this proxy, a key seen for the first
        /// time included), decided by a check of their cost at the service rather than
        /// leased: nothing leased, nothing stranded.
        LeaseCheckedCold = ("lease.checked.cold", Global),
        /// Response cost: units spent on estimates by forwarded requests (the units such a
        /// policy admitted are `cost.estimated + cost.charged - cost.credited`).
        CostEstimated = ("cost.estimated", ResponseCost),
        /// Response cost: responses that did not report their cost (the estimate, or
        /// `on_unknown`, stood).
        CostUnknown = ("cost.unknown", ResponseCost),
        /// Response cost: units charged beyond the estimates (the responses cost more).
        CostCharged = ("cost.charged", ResponseCost),
        /// Response cost: units of the estimates given back (the responses cost less).
        CostCredited = ("cost.credited", ResponseCost),
        /// Response cost: units not settled: charged beyond the debt bound, a credit the
        /// algorithm cannot give, or a settlement that failed.
        CostForgiven = ("cost.forgiven", ResponseCost),
        /// Response cost: responses whose body the worker could not hold, having its
        /// bound (`usage::MAX_HELD_PER_WORKER`) in other streams' bodies already: a JSON
        /// body was dropped (its cost is unknown, and counted as such too), an event line
        /// skipped.
        CostOverBudget = ("cost.over_budget", ResponseCost),
        /// Concurrency: renewals of this worker's slots that could not be written (every
        /// CAS attempt lost, a store error, a key with no room for another holder). Slots
        /// not renewed for `STALE_AFTER` stop counting while their requests are in flight.
        ConcurrencyRenewFailures = ("concurrency.renew_failures", Concurrency),
    }
}

counters! {
    /// Counters kept once per plugin. Names are `<stat_prefix>.<name>`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum PluginCounter {
        /// Callouts sent to the counter service.
        Callouts = ("counter_service.callouts", Global),
        /// Gauge: requests waiting for the counter service right now.
        Waiting = ("counter_service.waiting", Global, gauge),
        /// Times this proxy's circuit breaker opened.
        CircuitOpened = ("counter_service.circuit_opened", Global),
        /// Calls that carried several checks together (`POST /v1/checks`), also counted
        /// in `callouts`.
        CheckBatches = ("counter_service.check_batches", Global),
        /// Checks those calls carried (÷ `check_batches`: the mean batch).
        ChecksBatched = ("counter_service.checks_batched", Global),
        /// Checks whose deadline passed while they waited to be sent with a batch: their
        /// policies took the failure rule (as a timeout).
        ChecksUnsent = ("counter_service.checks_unsent", Global),
        /// Check calls sent past late ones: the worker had `max_checks_in_flight` calls
        /// out, and had room only because some were late (out for more than a quarter of
        /// the timeout). A sign that the service answers slowly, before any timeout.
        CheckCallsPastLate = ("counter_service.check_calls_past_late", Global),
        /// Shared-data keys this plugin created for buckets (bounded by the slot tables).
        KeysCreated = ("keys_created", Every),
        /// Local replies the host refused; the request was then reset or, if that failed
        /// too, forwarded (and counted as allowed).
        ReplyFailures = ("reply_failures", Every),
        /// Paused requests the host would not resume (their stream had ended).
        ResumeFailures = ("resume_failures", Every),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_of_every_reason_is_pinned_because_lease_records_keep_it() {
        // Append only: a reason added goes at the end; an index here never changes.
        let pinned = [
            (0, "timeout"),
            (1, "refused"),
            (2, "reset"),
            (3, "bad_status"),
            (4, "bad_body"),
            (5, "unauthorized"),
            (6, "circuit_open"),
            (7, "dispatch_failed"),
            (8, "lease_queue_full"),
            (9, "lease_slot_taken"),
            (10, "lease_contended"),
        ];
        let indices: Vec<(usize, &str)> = Reason::ALL.iter().map(|r| (r.index(), r.name())).collect();

        assert_eq!(indices[..pinned.len()], pinned, "a reason was reordered, renamed or removed");
        for reason in Reason::ALL {
            assert_eq!(Reason::from_index(reason.index() as u64), *reason);
        }
    }

    #[test]
    fn every_reason_has_its_own_degraded_counter_and_every_degraded_counter_a_reason() {
        for reason in Reason::ALL {
            assert_eq!(reason.counter().name(), format!("degraded.{}", reason.name()), "{reason:?}");
        }
        let degraded: Vec<Counter> =
            Counter::ALL.iter().copied().filter(|c| c.name().starts_with("degraded.")).collect();
        let counted: Vec<Counter> = Reason::ALL.iter().map(|r| r.counter()).collect();
        assert_eq!(degraded, counted);
        assert!(counted.iter().all(|c| c.scope() == Scope::Global), "only a global policy asks the service");
    }
}

//! The limiter: read, decide, compare-and-swap, retry — one atomic admission per request
//! over a [`Store`] with Envoy's shared-data semantics.
//!
//! # One decision, one atomic step
//!
//! For each limit a request touches, the limiter reads the key (value + CAS token),
//! runs the pure algorithm ([`Limit::decide`]) at one clock reading, and writes the new
//! state with the token it read. The write succeeds only if no other worker wrote the
//! key in between, so two workers can never both spend the same last token: a worker
//! whose write conflicts re-reads and decides again. Contention is retried at most
//! `max_attempts` times ([`DEFAULT_MAX_ATTEMPTS`]); then the limiter answers
//! [`LimitError::Contended`], and the caller applies its configured outcome. It never
//! admits silently.
//!
//! # All or nothing across limits
//!
//! A request that matches several limits is decided against all of them first; if any
//! rejects, nothing is written, so a rejected request spends nothing anywhere. If all
//! admit, the states are written one by one; if a later write conflicts, the writes
//! already made are refunded ([`Limit::refund`]) and the whole decision is retried.
//!
//! # Reservations: decide now, keep or give back later
//!
//! A request whose fate also depends on something outside shared data (the counter
//! service, for global policies) is decided in two phases. [`Limiter::reserve`] is
//! [`Limiter::check`] that also returns a [`Reservation`]: the record of exactly what
//! the admission wrote. When the outside answer comes, [`Limiter::commit`] keeps the
//! spend and [`Limiter::refund`] gives it back. Why nothing is spent twice or lost:
//!
//! * **Spent once.** The spend happens inside `reserve`, under the same read–decide–CAS
//!   rules as `check`; a reservation exists only when every write succeeded
//!   (all-or-nothing), and is empty when the request was not admitted.
//! * **Given back at most once.** A reservation is not `Clone`, and `commit` and
//!   `refund` take it by value: the type system allows one of them, once.
//! * **Never given back more than was spent.** A refund uses [`Limit::refund`], which is
//!   never more generous than the state the key would hold had the request never been
//!   admitted, and re-reads the key under CAS: spends made by other workers in between
//!   stay spent. A slot that changed hands took the spend with it (nothing to give back).
//! * **A refund that cannot be written is counted**, not retried forever: the limit is
//!   then stricter than it should be, never looser.
//! * **Dropping a reservation keeps the spend** (like `commit`): forgetting to decide
//!   errs on the strict side.
//!
//! # Concurrency: slots held until the request ends
//!
//! A concurrency limit ([`Limit::Concurrency`]) is decided in the same step as the
//! others, on behalf of this limiter's *holder* ([`Limiter::with_holder`], one per
//! worker). What it grants is not spent but held: [`Reservation::take_slots`] takes the
//! [`Slot`]s out of a reservation, [`Limiter::release`] gives one back when its request
//! ends, and [`Limiter::renew`] (on the worker's tick, every
//! [`RENEW_EVERY`](crate::RENEW_EVERY)) keeps the holder's entry alive and sets it to
//! what the holder knows it holds, so a release whose write failed is made good there.
//! A holder that stops renewing stops counting after
//! [`STALE_AFTER`](crate::STALE_AFTER) (see [`concurrency`](crate::limit::concurrency)).
//!
//! # Creating a key without losing an update
//!
//! Envoy has no atomic create: a write to a missing key succeeds whatever CAS token it
//! carries. Two workers that both read "missing" would both write, and the second
//! would erase the first one's spend. The limiter closes that race with the one
//! property Envoy does give: **a CAS token belongs to exactly one write**, because all
//! tokens come from one process-wide counter.
//!
//! To create key `K`, the limiter first writes an *anchor* key of its own and reads it
//! back, obtaining a token `T` that is, at that moment, the token of the anchor's
//! latest write. It then writes `K` with CAS `T`:
//!
//! * if `K` is still missing, the host ignores the CAS and creates it;
//! * if another worker created `K` in the meantime, `K`'s token is the token of *that*
//!   write, which is not `T` (a token is never given to two writes), so the host
//!   answers CAS mismatch and this worker re-reads `K` and decides again on the other
//!   worker's state.
//!
//! Either way no update is lost. The argument fails only if `K`'s token equals `T`,
//! which needs the token counter to wrap (2³² writes) between the anchor write and
//! the create, a few microseconds apart. Creation happens once per key per process
//! (keys are never deleted), so the anchor's cost (two extra host calls) is paid rarely.
//!
//! # Damaged state
//!
//! Bytes that do not decode (garbage, another format version, another plugin's value)
//! are replaced by the limit's most conservative state ([`Limit::exhausted`]) with a
//! CAS write, and counted in [`Admission::repaired`]; the request is then decided on
//! that state. Damage never becomes a fresh full bucket.

mod reservation;
mod settle;
mod slots;

use crate::codec::Record;
use crate::decision::Decision;
use crate::key::{OVERFLOW_OWNER, Placement};
use crate::limit::{ANONYMOUS_HOLDER, Limit, State};
use crate::store::{Cas, Store, StoreError, Swap, create};
use crate::time::{Clock, Nanos};
pub use reservation::Reservation;
pub use settle::Settlement;
pub use slots::{Renewal, Slot};
use smallvec::SmallVec;

/// How many times a decision is retried when another worker wrote first. Every retry
/// means some other worker's write succeeded, so the system as a whole makes progress;
/// the bound only caps one request's latency under extreme contention.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 16;

/// The shared-data key the limiter writes to obtain a fresh CAS token when it creates
/// a key (see the module docs). Must differ from every limit key.
pub const DEFAULT_ANCHOR_KEY: &str = "sluice/anchor";

/// How many limits one request can have before deciding it allocates: requests with
/// up to this many limits (nearly all) are decided without touching the heap for the
/// decision's own bookkeeping.
pub const MAX_INLINE_LIMITS: usize = 4;

/// One decision per limit of a request, in order.
pub type Decisions = SmallVec<[Decision; MAX_INLINE_LIMITS]>;

/// One limit to apply to a request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Where the client's state lives. Keys of one call must be distinct.
    pub place: &'a Placement,
    /// The limit.
    pub limit: &'a Limit,
    /// What the request costs under this limit.
    pub cost: u64,
}

/// The outcome of [`Limiter::check`], with the evidence callers turn into metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Whether every limit admitted the request. When false, nothing was spent.
    pub admitted: bool,
    /// One decision per request, in order. When the request was not admitted, the
    /// decisions of limits that alone would have admitted it report their state as it
    /// stands (nothing was spent), with the verdict they would have given.
    pub decisions: Decisions,
    /// The clock reading the decisions were made at.
    pub at: Nanos,
    /// Writes that lost a CAS race and were retried.
    pub conflicts: u32,
    /// Undecodable states replaced by exhausted ones.
    pub repaired: u32,
    /// Limits decided on their overflow bucket because the client's slot was held.
    pub overflowed: u32,
    /// Refunds (after a partial all-or-nothing write) that could not be written. Each one
    /// leaves a limit slightly stricter than it should be, never looser.
    pub unrefunded: u32,
    /// Keys this decision created (a slot or bucket written for the first time): what
    /// a caller counts to show that shared data stays within its bounds.
    pub created: u32,
}

impl Admission {
    /// The longest shaping delay among the decisions.
    pub fn delay(&self) -> Nanos {
        self.decisions.iter().map(Decision::delay).max().unwrap_or(Nanos::ZERO)
    }
}

/// Why no decision could be made. The caller applies its configured failure outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// Every attempt lost a CAS race.
    Contended {
        /// How many attempts were made.
        attempts: u32,
    },
    /// The store failed.
    Store(StoreError),
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Contended { attempts } => write!(f, "gave up after {attempts} conflicting writes"),
            Self::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LimitError {}

impl From<StoreError> for LimitError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// Applies limits atomically over a [`Store`], reading time from a [`Clock`].
#[derive(Debug)]
pub struct Limiter<S, C> {
    store: S,
    clock: C,
    max_attempts: u32,
    anchor: String,
    holder: u64,
}

/// What the read phase found for one request.
struct Plan<'a> {
    key: &'a str,
    owner: u64,
    /// The token to write with; `None` when the key is missing.
    cas: Option<Cas>,
    /// The state to decide on; `None` for a fresh key.
    state: Option<State>,
    /// The state to write, once decided; `None` when nothing is to be written.
    next: Option<State>,
    overflowed: bool,
}

/// What one read found.
enum Read {
    Missing,
    Found(Cas, Record),
    Damaged(Cas),
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// A limiter with the default attempt bound and anchor key.
    pub fn new(store: S, clock: C) -> Self {
        Self {
            store,
            clock,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            anchor: DEFAULT_ANCHOR_KEY.to_owned(),
            holder: ANONYMOUS_HOLDER,
        }
    }

    /// Sets the holder under which concurrency slots are taken and given back: unique
    /// among the limiters sharing the store (a random id per worker), so that one
    /// worker's release or renewal never touches another's slots.
    #[must_use]
    pub const fn with_holder(mut self, holder: u64) -> Self {
        self.holder = holder;
        self
    }

    /// The holder of the concurrency slots it takes.
    pub const fn holder(&self) -> u64 {
        self.holder
    }

    /// Sets how many conflicting attempts are made before [`LimitError::Contended`]
    /// (at least one).
    #[must_use]
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Sets the key written to obtain fresh CAS tokens (see the module docs).
    #[must_use]
    pub fn with_anchor_key(mut self, key: impl Into<String>) -> Self {
        self.anchor = key.into();
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Decides one request against one limit.
    ///
    /// # Errors
    /// See [`Limiter::check`].
    pub fn check_one(&self, place: &Placement, limit: &Limit, cost: u64) -> Result<Admission, LimitError> {
        self.check(&[Request { place, limit, cost }])
    }

    /// Decides a request against every limit it matches, all or nothing.
    ///
    /// # Errors
    /// [`LimitError::Contended`] when every attempt lost a CAS race, and
    /// [`LimitError::Store`] when the store fails. In both cases nothing stays spent
    /// (refunds permitting, see [`Admission::unrefunded`]).
    pub fn check(&self, requests: &[Request<'_>]) -> Result<Admission, LimitError> {
        self.decide_all(requests, None)
    }

    fn decide_all(&self, requests: &[Request<'_>], keep: Option<&mut Reservation>) -> Result<Admission, LimitError> {
        let mut conflicts = 0;
        let mut repaired = 0;
        let mut unrefunded = 0;
        let mut created = 0;
        for _ in 0..self.max_attempts {
            let now = self.clock.now();
            let mut plans: SmallVec<[Plan<'_>; MAX_INLINE_LIMITS]> = SmallVec::new();
            let mut damaged = false;
            for request in requests {
                match self.plan(request, now)? {
                    Ok(plan) => plans.push(plan),
                    Err((key, cas)) => {
                        // Replace damage with the most conservative state, then start over.
                        let record = Record {
                            owner: request.place.owner,
                            limit: *request.limit,
                            state: request.limit.exhausted(now),
                        };
                        match self.store.set(key, &record.encode(), Some(cas))? {
                            Swap::Written => repaired += 1,
                            Swap::Conflict => conflicts += 1,
                        }
                        damaged = true;
                        break;
                    }
                }
            }
            if damaged {
                continue;
            }

            let mut decisions = Decisions::new();
            for (request, plan) in requests.iter().zip(&mut plans) {
                let (decision, next) = request.limit.decide_for(plan.state.as_ref(), now, request.cost, self.holder);
                decisions.push(decision);
                plan.next = next;
            }
            let admitted = decisions.iter().all(Decision::is_admitted);
            if !admitted {
                // Nothing is spent: limits that would have admitted report what they
                // still hold, not what they would have held after this request.
                for ((decision, request), plan) in decisions.iter_mut().zip(requests).zip(&plans) {
                    if decision.is_admitted() {
                        let (unspent, _) = request.limit.decide_for(plan.state.as_ref(), now, 0, self.holder);
                        decision.remaining = unspent.remaining;
                        decision.reset_after = unspent.reset_after;
                    }
                }
            }
            let mut conflict = false;
            if admitted {
                for (index, (request, plan)) in requests.iter().zip(&plans).enumerate() {
                    let Some(next) = &plan.next else { continue };
                    let record = Record { owner: plan.owner, limit: *request.limit, state: next.clone() };
                    let swap = record.encode_with(|bytes| match plan.cas {
                        Some(cas) => self.store.set(plan.key, bytes, Some(cas)),
                        None => self.create(plan.key, bytes),
                    });
                    match swap {
                        Ok(Swap::Written) => created += u32::from(plan.cas.is_none()),
                        Ok(Swap::Conflict) => {
                            unrefunded += self.refund_all(requests, &plans, index);
                            conflict = true;
                            break;
                        }
                        Err(e) => {
                            let _ = self.refund_all(requests, &plans, index);
                            return Err(e.into());
                        }
                    }
                }
            }
            if conflict {
                conflicts += 1;
                continue;
            }
            if admitted && let Some(reservation) = keep {
                reservation.record(requests, &plans);
            }
            return Ok(Admission {
                admitted,
                decisions,
                at: now,
                conflicts,
                repaired,
                overflowed: u32::try_from(plans.iter().filter(|p| p.overflowed).count()).unwrap_or(u32::MAX),
                unrefunded,
                created,
            });
        }
        Err(LimitError::Contended { attempts: self.max_attempts })
    }

    fn read(&self, key: &str, limit: &Limit) -> Result<Read, StoreError> {
        Ok(match self.store.get(key)? {
            None => Read::Missing,
            Some(entry) => match Record::decode_expecting(&entry.value, Some(limit)) {
                Ok(record) => Read::Found(entry.cas, record),
                Err(_) => Read::Damaged(entry.cas),
            },
        })
    }

    /// The read phase for one request: where to decide and on what state. `Err` carries
    /// a damaged key to repair.
    #[allow(clippy::type_complexity)]
    fn plan<'a>(&self, request: &Request<'a>, now: Nanos) -> Result<Result<Plan<'a>, (&'a str, Cas)>, StoreError> {
        let place = request.place;
        let limit = request.limit;
        let own = |cas, state| Plan { key: &place.key, owner: place.owner, cas, state, next: None, overflowed: false };
        let (cas, record) = match self.read(&place.key, limit)? {
            Read::Missing => return Ok(Ok(own(None, None))),
            Read::Damaged(cas) => return Ok(Err((&place.key, cas))),
            Read::Found(cas, record) => (cas, record),
        };
        let state = limit.adopt(&record.limit, record.state, now);
        if record.owner == place.owner {
            return Ok(Ok(own(Some(cas), Some(state))));
        }
        let Some(overflow) = place.overflow.as_deref() else {
            // A key that is not in a table: whoever wrote it, it is this client's.
            return Ok(Ok(Plan { owner: record.owner, ..own(Some(cas), Some(state)) }));
        };
        let overflow_state = |read: Read| -> Result<Option<(Option<Cas>, State)>, (&'a str, Cas)> {
            match read {
                Read::Missing => Ok(None),
                Read::Damaged(cas) => Err((overflow, cas)),
                Read::Found(cas, record) => Ok(Some((Some(cas), limit.adopt(&record.limit, record.state, now)))),
            }
        };
        if limit.is_idle(&state, now) {
            // The holder's state carries no information: take the slot, starting from
            // the overflow bucket (where this client may have been spending) if busy.
            let start = match overflow_state(self.read(overflow, limit)?) {
                Err(damaged) => return Ok(Err(damaged)),
                Ok(found) => found.map(|(_, s)| s).filter(|s| !limit.is_idle(s, now)),
            };
            return Ok(Ok(own(Some(cas), start)));
        }
        Ok(match overflow_state(self.read(overflow, limit)?) {
            Err(damaged) => Err(damaged),
            Ok(found) => {
                let (cas, state) = found.map_or((None, None), |(cas, s)| (cas, Some(s)));
                Ok(Plan { key: overflow, owner: OVERFLOW_OWNER, cas, state, next: None, overflowed: true })
            }
        })
    }

    /// Creates a missing key without losing a concurrent creation (see the module docs).
    fn create(&self, key: &str, bytes: &[u8]) -> Result<Swap, StoreError> {
        create(&self.store, &self.anchor, key, bytes)
    }
}

//! How one decision request (`POST /v1/check`, `/v1/lease`, `/v1/charge`, `/v1/credit`)
//! is decided and answered, whichever path carries it.
//!
//! The HTTP routes and [`App::handle_now`] share everything here: parsing and
//! validation ([`App::prepare`]), the store call's metrics and errors, the response body
//! and its metrics ([`App::answer`]). What the HTTP path adds is only what is
//! asynchronous: reading the body (bounded in size and time, in the server's
//! middleware) and awaiting the store.

use std::time::Instant;

use shared_store::Nanos;

use sluice_protocol::{
    ChargeRequest, ChargeResponse, CheckRequest, CheckResponse, CreditRequest, CreditResponse, EntryOverride,
    EntryResponse, LeaseRequest, LeaseResponse,
};

use crate::api::{self, ApiError, ChargePlan, CheckPlan, CreditPlan, LeasePlan};
use crate::app::App;
use crate::enforce::Enforced;
use crate::metrics::StoreOp;
use crate::store::CounterStore;
use sluice_protocol::ErrorCode;

/// A decision route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/check`.
    Check,
    /// `POST /v1/lease`.
    Lease,
    /// `POST /v1/charge`.
    Charge,
    /// `POST /v1/credit`.
    Credit,
}

impl Route {
    /// The route served at `path`, if any.
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/check" => Some(Self::Check),
            "/v1/lease" => Some(Self::Lease),
            "/v1/charge" => Some(Self::Charge),
            "/v1/credit" => Some(Self::Credit),
            _ => None,
        }
    }
}

pub use crate::call::{Call, Outcome};

impl App {
    /// Parses `body` strictly and validates it for `route`: a request that gets a 4xx
    /// here never reaches the store.
    ///
    /// # Errors
    /// The 400 [`ApiError`] naming the first problem found.
    pub fn prepare(&self, route: Route, body: &[u8]) -> Result<Call, ApiError> {
        Ok(match route {
            Route::Check => Call::Check(CheckPlan::new(&api::parse::<CheckRequest>(body)?, self.max_entries())?),
            Route::Lease => Call::Lease(LeasePlan::new(&api::parse::<LeaseRequest>(body)?)?),
            Route::Charge => Call::Charge(ChargePlan::new(&api::parse::<ChargeRequest>(body)?)?),
            Route::Credit => Call::Credit(CreditPlan::new(&api::parse::<CreditRequest>(body)?)?),
        })
    }

    /// Decides `call` under the live overrides ([`App::enforce`]), on the store at its
    /// time: the outcome, and which override decided which entry.
    ///
    /// # Errors
    /// The 503 [`ApiError`] of a store that could not decide (counted and logged).
    pub async fn decide(&self, call: &Call) -> Result<(Outcome, Enforced), ApiError> {
        self.decide_at(call, None).await
    }

    /// [`App::decide`] at `at` instead of the store's time when given (tests only, as the
    /// stores' own override).
    ///
    /// # Errors
    /// As [`App::decide`].
    pub async fn decide_at(&self, call: &Call, at: Option<Nanos>) -> Result<(Outcome, Enforced), ApiError> {
        let enforced = self.enforce(call);
        let decided = match enforced.store_call(call) {
            Some(store_call) => Some(self.call_store_at(store_call, at).await?),
            None => None,
        };
        Ok((self.complete(call, &enforced, decided)?, enforced))
    }

    /// [`App::decide`] without waiting, on the memory store ([`App::call_store_now`]).
    ///
    /// # Errors
    /// As [`App::call_store_now`].
    pub fn decide_now_on_memory(&self, call: &Call) -> Result<(Outcome, Enforced), ApiError> {
        let enforced = self.enforce(call);
        let decided = match enforced.store_call(call) {
            Some(store_call) => Some(self.call_store_now(store_call)?),
            None => None,
        };
        Ok((self.complete(call, &enforced, decided)?, enforced))
    }

    fn complete(&self, call: &Call, enforced: &Enforced, decided: Option<Outcome>) -> Result<Outcome, ApiError> {
        enforced.complete(call, decided, self.store().now()).ok_or_else(|| ApiError {
            status: 500,
            code: ErrorCode::Internal,
            message: "the store answered another kind of request".to_owned(),
        })
    }

    /// Runs `call` on the store, at the store's time.
    ///
    /// # Errors
    /// The 503 [`ApiError`] of a store that could not decide (counted and logged).
    pub async fn call_store(&self, call: &Call) -> Result<Outcome, ApiError> {
        self.call_store_at(call, None).await
    }

    /// [`App::call_store`] at `at` when given, else at the store's time.
    ///
    /// # Errors
    /// As [`App::call_store`].
    pub async fn call_store_at(&self, call: &Call, at: Option<Nanos>) -> Result<Outcome, ApiError> {
        let start = Instant::now();
        let store = self.store();
        let result = match call {
            Call::Check(plan) => store.check(plan, at).await.map(Outcome::Check),
            Call::Lease(plan) => store.lease(plan, at).await.map(Outcome::Lease),
            Call::Charge(plan) => store.charge(plan, at).await.map(Outcome::Charge),
            Call::Credit(plan) => store.credit(plan, at).await.map(Outcome::Credit),
        };
        self.stored(op_of(call), start.elapsed(), result)
    }

    /// [`App::call_store`] without waiting: the memory store decides in the caller's
    /// thread.
    ///
    /// # Errors
    /// As [`App::call_store`]; on the Redis store, always a 503 `store_unavailable` (it
    /// can only be awaited).
    pub fn call_store_now(&self, call: &Call) -> Result<Outcome, ApiError> {
        let CounterStore::Memory(memory) = self.store() else {
            return Err(ApiError {
                status: 503,
                code: ErrorCode::StoreUnavailable,
                message: "handle_now decides on the memory store only: the redis store needs the async HTTP path"
                    .to_owned(),
            });
        };
        let start = Instant::now();
        let result = match call {
            Call::Check(plan) => memory.check(plan, None).map(Outcome::Check),
            Call::Lease(plan) => memory.lease(plan, None).map(Outcome::Lease),
            Call::Charge(plan) => memory.charge(plan, None).map(Outcome::Charge),
            Call::Credit(plan) => memory.credit(plan, None).map(Outcome::Credit),
        };
        self.stored(op_of(call), start.elapsed(), result)
    }

    /// Counts `outcome` and encodes the `200` answer to `call`.
    ///
    /// # Errors
    /// A 500 `internal` when the answer cannot be encoded (it always can).
    pub fn answer(&self, call: &Call, outcome: &Outcome, enforced: &Enforced) -> Result<Vec<u8>, ApiError> {
        let metrics = self.metrics();
        metrics.carried_forgiven(outcome.carry_forgiven());
        let encoded = match (call, outcome) {
            (Call::Check(plan), Outcome::Check(outcome)) => {
                metrics.decision(outcome.admitted);
                for entry in &plan.entries {
                    metrics.policy_decision(entry.scope.policy.as_deref(), outcome.admitted);
                }
                serde_json::to_vec(&CheckResponse {
                    admitted: outcome.admitted,
                    at_ns: outcome.at.as_u64(),
                    entries: outcome.decisions.iter().map(EntryResponse::from).collect(),
                    overrides: enforced
                        .all_applied()
                        .map(|(entry, a)| EntryOverride { entry, id: a.id, kind: a.kind })
                        .collect(),
                    carry_forgiven: outcome.carry_forgiven,
                })
            }
            (Call::Lease(_), Outcome::Lease(outcome)) => {
                metrics.lease(outcome.granted);
                serde_json::to_vec(&LeaseResponse {
                    granted: outcome.granted,
                    expires_in_ms: outcome.expires_in_ms,
                    at_ns: outcome.at.as_u64(),
                    entry: EntryResponse::from(&outcome.decision),
                    refill_after_ns: outcome.refill_after.as_u64(),
                    applied: enforced.applied(0),
                    carry_forgiven: outcome.carry_forgiven,
                })
            }
            (Call::Charge(_), Outcome::Charge(outcome)) => {
                if outcome.duplicate {
                    metrics.duplicate_charge();
                } else {
                    metrics.charge(outcome.charged, outcome.forgiven);
                }
                serde_json::to_vec(&ChargeResponse {
                    charged: outcome.charged,
                    forgiven: outcome.forgiven,
                    at_ns: outcome.at.as_u64(),
                    entry: EntryResponse::from(&outcome.decision),
                    duplicate: outcome.duplicate,
                    applied: enforced.applied(0),
                    carry_forgiven: outcome.carry_forgiven,
                })
            }
            (Call::Credit(_), Outcome::Credit(outcome)) => {
                if outcome.duplicate {
                    metrics.duplicate_credit();
                } else {
                    metrics.credit(outcome.credited, outcome.forgiven);
                }
                serde_json::to_vec(&CreditResponse {
                    credited: outcome.credited,
                    forgiven: outcome.forgiven,
                    at_ns: outcome.at.as_u64(),
                    entry: EntryResponse::from(&outcome.decision),
                    duplicate: outcome.duplicate,
                    applied: enforced.applied(0),
                    carry_forgiven: outcome.carry_forgiven,
                })
            }
            _ => {
                return Err(ApiError {
                    status: 500,
                    code: ErrorCode::Internal,
                    message: "the store answered another kind of request".to_owned(),
                });
            }
        };
        encoded.map_err(|e| ApiError {
            status: 500,
            code: ErrorCode::Internal,
            message: format!("cannot encode the response: {e}"),
        })
    }

    /// Answers a request exactly as the HTTP routes `POST /v1/check`, `/v1/checks`,
    /// `/v1/lease`, `/v1/charge` and `/v1/credit` do (a batch's checks one after the
    /// other), synchronously: for tests that simulate a fleet on a virtual
    /// clock (a [`crate::store::MemoryCounters::with_clock`] store) and step the service as
    /// they step everything else. Returns the status and the body the HTTP path would.
    ///
    /// The same code as HTTP decides: authentication (`authorization` is the header's
    /// value, `None` when absent), the body bound (`413 body_too_large`), the in-flight
    /// bound (`503 overloaded`, shared with concurrent HTTP requests on this app),
    /// parsing and validation, the store call, every metric, the response and error
    /// bodies. What it does not do is what HTTP adds around them: reading the body
    /// (there is no `408`), response headers (`WWW-Authenticate`, `Content-Type`), and
    /// the probes, which it answers `404` (`/healthz`, `/readyz` and `/metrics` are
    /// served over HTTP only). Unknown paths get `404 not_found` and other methods
    /// `405 method_not_allowed`, as over HTTP (after authentication, as over HTTP).
    ///
    /// On the Redis store it answers `503 store_unavailable`: Redis can only be awaited.
    pub fn handle_now(&self, method: &str, path: &str, authorization: Option<&[u8]>, body: &[u8]) -> (u16, Vec<u8>) {
        let (status, body) = match self.decide_now(method, path, authorization, body) {
            Ok(body) => (200, body),
            Err(error) => (error.status, serde_json::to_vec(&error.body()).unwrap_or_default()),
        };
        self.metrics().response(status);
        (status, body)
    }

    fn decide_now(
        &self,
        method: &str,
        path: &str,
        authorization: Option<&[u8]>,
        body: &[u8],
    ) -> Result<Vec<u8>, ApiError> {
        if matches!(path, "/healthz" | "/readyz" | "/metrics") {
            return Err(ApiError {
                status: 404,
                code: ErrorCode::NotFound,
                message: format!("{path} is served over HTTP only: handle_now serves the decision routes"),
            });
        }
        self.authenticate(authorization.into_iter())?;
        // `None`: a batch (`POST /v1/checks`).
        let route = match Route::from_path(path) {
            Some(route) => Some(route),
            None if path == "/v1/checks" => None,
            None => return Err(ApiError::not_found(path)),
        };
        if method != "POST" {
            return Err(ApiError::method_not_allowed(method, path));
        }
        if body.len() > self.max_body() {
            return Err(ApiError::body_too_large(self.max_body()));
        }
        let _permit = self.in_flight_permit()?;
        let _gauge = self.metrics().start();
        let Some(route) = route else {
            let bodies = self.split_checks(body)?;
            let results: Vec<Vec<u8>> =
                bodies.iter().enumerate().map(|(index, check)| self.decide_in_batch_now(index, check)).collect();
            return Ok(crate::batch::results(&results));
        };
        let call = self.prepare(route, body)?;
        let (outcome, enforced) = self.decide_now_on_memory(&call)?;
        self.answer(&call, &outcome, &enforced)
    }
}

/// What a call asks of the store, for its latency's `op` label.
const fn op_of(call: &Call) -> StoreOp {
    match call {
        Call::Check(_) => StoreOp::Check,
        Call::Lease(_) => StoreOp::Lease,
        Call::Charge(_) => StoreOp::Charge,
        Call::Credit(_) => StoreOp::Credit,
    }
}

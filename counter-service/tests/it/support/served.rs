//! Where a behavioural scenario runs: on a store directly, or over HTTP against a
//! memory-store service on a manual clock, with the same answers expected of both.

use shared_store::Nanos;
use sluice_counter::api::{ChargePlan, CreditPlan};
use sluice_counter::store::{
    ChargeOutcome, CheckOutcome, CounterStore, CreditOutcome, LeaseOutcome, MemoryConfig, MemoryCounters,
};
use sluice_protocol::{
    ChargeResponse, CheckRequest, CheckResponse, CreditResponse, EntryRequest, EntryResponse, LeaseResponse, LimitSpec,
};

use super::{Http, Protocol, charge_request, check, credit_request, lease_plan_at_least, lease_request, t_us};

/// A memory-store service on a manual clock, with a client in one protocol: the
/// behavioural suite runs over HTTP with exact times, as it does on the stores directly.
#[derive(Debug)]
pub struct Served {
    pub http: Http,
    pub clock: shared_store::ManualClock,
    pub running: sluice_counter::Running,
}

impl Served {
    pub async fn start(protocol: Protocol) -> Self {
        let clock = shared_store::ManualClock::at(t_us(0));
        let store = CounterStore::Memory(MemoryCounters::with_clock(
            MemoryConfig { shards: 8, max_keys: 10_000, ..MemoryConfig::default() },
            std::sync::Arc::new(clock.clone()),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let running = sluice_counter::Running::start_with_store(listener, sluice_counter::Config::defaults(), store)
            .expect("the service starts");
        Self { http: Http::with(running.addr, protocol), clock, running }
    }

    async fn post<T: serde::de::DeserializeOwned>(&self, path: &str, body: &impl serde::Serialize, at: Nanos) -> T {
        self.clock.set(at);
        let (status, bytes) = self.http.send("POST", path, serde_json::to_vec(body).expect("json")).await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path}: {e}: {bytes:?}"))
    }
}

/// Where a behavioural scenario runs: on a store directly, or over HTTP.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    Store(&'a CounterStore),
    Http(&'a Served),
}

impl Target<'_> {
    pub async fn check(&self, tag: &str, entries: Vec<EntryRequest>, at: Nanos) -> CheckOutcome {
        match self {
            Self::Store(store) => check(store, tag, entries, at).await,
            Self::Http(served) => {
                let request = CheckRequest { tag: Some(tag.to_owned()), entries };
                let answer: CheckResponse = served.post("/v1/check", &request, at).await;
                CheckOutcome {
                    admitted: answer.admitted,
                    at: Nanos(answer.at_ns),
                    decisions: answer.entries.iter().map(EntryResponse::decision).collect(),
                    carry_forgiven: answer.carry_forgiven,
                }
            }
        }
    }

    pub async fn lease(&self, tag: &str, key: &str, limit: LimitSpec, tokens: u64, at: Nanos) -> LeaseOutcome {
        self.lease_at_least(tag, key, limit, (tokens, 1), at).await
    }

    /// A lease of `tokens`, granted only when at least `min_tokens` are left.
    pub async fn lease_at_least(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        tokens: (u64, u64),
        at: Nanos,
    ) -> LeaseOutcome {
        match self {
            Self::Store(store) => {
                store.lease(&lease_plan_at_least(tag, key, limit, tokens), Some(at)).await.expect("the store answers")
            }
            Self::Http(served) => {
                let request = lease_request(tag, key, limit, tokens);
                let answer: LeaseResponse = served.post("/v1/lease", &request, at).await;
                LeaseOutcome {
                    granted: answer.granted,
                    expires_in_ms: answer.expires_in_ms,
                    at: Nanos(answer.at_ns),
                    decision: answer.entry.decision(),
                    refill_after: Nanos(answer.refill_after_ns),
                    carry_forgiven: answer.carry_forgiven,
                }
            }
        }
    }

    pub async fn charge(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        (cost, max_debt): (u64, u64),
        at: Nanos,
    ) -> ChargeOutcome {
        self.charge_once(tag, key, limit, (cost, max_debt), None, at).await
    }

    /// A charge with an optional charge id: applied once per id.
    pub async fn charge_once(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        (cost, max_debt): (u64, u64),
        charge_id: Option<&str>,
        at: Nanos,
    ) -> ChargeOutcome {
        let request = charge_request(tag, key, limit, (cost, max_debt), charge_id);
        match self {
            Self::Store(store) => {
                let plan = ChargePlan::new(&request).expect("a valid charge");
                store.charge(&plan, Some(at)).await.expect("the store answers")
            }
            Self::Http(served) => {
                let answer: ChargeResponse = served.post("/v1/charge", &request, at).await;
                if !answer.duplicate {
                    assert_eq!(answer.charged + answer.forgiven, cost);
                }
                ChargeOutcome {
                    charged: answer.charged,
                    forgiven: answer.forgiven,
                    duplicate: answer.duplicate,
                    at: Nanos(answer.at_ns),
                    decision: answer.entry.decision(),
                    carry_forgiven: answer.carry_forgiven,
                }
            }
        }
    }

    /// A credit of `units` spent at `spent_at`, without an id.
    pub async fn credit(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        (units, spent_at): (u64, Nanos),
        at: Nanos,
    ) -> CreditOutcome {
        self.credit_once(tag, key, limit, (units, spent_at), None, at).await
    }

    /// A credit with an optional credit id: applied once per id.
    pub async fn credit_once(
        &self,
        tag: &str,
        key: &str,
        limit: LimitSpec,
        (units, spent_at): (u64, Nanos),
        credit_id: Option<&str>,
        at: Nanos,
    ) -> CreditOutcome {
        let request = credit_request(tag, key, limit, (units, spent_at), credit_id);
        let outcome = match self {
            Self::Store(store) => {
                let plan = CreditPlan::new(&request).expect("a valid credit");
                store.credit(&plan, Some(at)).await.expect("the store answers")
            }
            Self::Http(served) => {
                let answer: CreditResponse = served.post("/v1/credit", &request, at).await;
                CreditOutcome {
                    credited: answer.credited,
                    forgiven: answer.forgiven,
                    duplicate: answer.duplicate,
                    at: Nanos(answer.at_ns),
                    decision: answer.entry.decision(),
                    carry_forgiven: answer.carry_forgiven,
                }
            }
        };
        if !outcome.duplicate {
            assert_eq!(outcome.credited + outcome.forgiven, units, "what is not given back is forgiven: {outcome:?}");
        }
        outcome
    }
}

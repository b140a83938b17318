//! The protocol between Sluice's filter and `sluice-counter`, defined once for both.
//!
//! The filter (inside the proxy, on `wasm32-wasip1`) and the counter service (a tokio
//! server) must agree on three things, and this crate is the single definition of each:
//!
//! * **the bodies** of `POST /v1/check`, `/v1/lease`, `/v1/charge` and `/v1/credit`, and
//!   the error body `{"error": {"code", "message"}}` ([`wire`]);
//! * **the limits** as requests carry them ([`LimitSpec`]) and what each one means: the
//!   [`shared_store::Limit`] that [`LimitSpec::validate`] builds, which every store runs;
//! * **the numeric envelope**: the bounds within which the Redis store's Lua script
//!   computes exactly what `shared-store` computes ([`limit`] explains them). The filter
//!   validates its global policies with [`LimitSpec::validate`] when it is configured,
//!   so a policy the service would answer `400 outside_envelope` is refused by Envoy at
//!   configuration time, with the same message, rather than failing on every request.
//!
//! Anything specific to one side stays on that side: storage keys, Redis script
//! parameters and request plans in the service; callouts, deadlines and fallbacks in the
//! filter. The crate depends on `serde` and `shared-store` only, and has no `unwrap`,
//! `panic!` or slice indexing outside tests, since it runs inside the proxy.
//!
//! The HTTP protocol itself (routes, status codes, every error code, authentication) is
//! documented with examples in `counter-service/README.md`.
//!
//! # Example
//!
//! ```
//! use sluice_protocol::{CheckRequest, EntryRequest, LimitSpec};
//!
//! // 100 per minute, bursts of 20: inside the envelope.
//! let limit = LimitSpec::TokenBucket { amount: 100, per_ms: 60_000, burst: 20 };
//! assert_eq!(limit.validate()?.capacity(), 20);
//!
//! // A bucket that takes more than 31 days to refill is not, and the error names the field.
//! let slow = LimitSpec::TokenBucket { amount: 1, per_ms: 86_400_000, burst: 1000 };
//! let err = slow.validate().unwrap_err();
//! assert_eq!(err.field(), "limit.burst");
//! assert_eq!(err.code().name(), "outside_envelope");
//!
//! let check = CheckRequest {
//!     tag: Some("c8f3a9e1".to_owned()),
//!     entries: vec![EntryRequest { key: "per-client".to_owned(), policy: None, policy_version: 3, limit, cost: 1 }],
//! };
//! let json = serde_json::to_string(&check).unwrap();
//! assert!(json.starts_with(r#"{"tag":"c8f3a9e1","entries":[{"key":"per-client""#));
//! # Ok::<(), sluice_protocol::SpecError>(())
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]
#![deny(missing_docs)]

pub mod errors;
pub mod limit;
pub mod overrides;
pub mod wire;

/// Entries one check carries at most, unless the service is started with another
/// `--max-entries`: the filter refuses a configuration whose requests could need more.
pub const DEFAULT_MAX_ENTRIES: u16 = 16;
/// The largest `--max-entries` the service accepts.
pub const MAX_ENTRIES_LIMIT: u16 = 256;
const _: () = assert!(DEFAULT_MAX_ENTRIES <= MAX_ENTRIES_LIMIT);
/// The most checks one `POST /v1/checks` carries: enough to share one callout among the
/// checks a busy worker has waiting, few enough that one call's answer stays small (each
/// check is bounded by `--max-entries`, the whole body by `--max-body-bytes`).
pub const MAX_CHECKS_PER_CALL: usize = 64;

pub use errors::ErrorCode;
pub use limit::{LimitSpec, MAX_AMOUNT, MAX_PERIOD_MS, MAX_SCALED_CAPACITY, SpecError, ValidLimit};
pub use overrides::{AppliedOverride, EntryOverride, OverrideId, OverrideKind};
pub use shared_store::Algorithm;
pub use wire::{
    CHARGE_ID_TTL_MS, ChargeRequest, ChargeResponse, CheckFailure, CheckRequest, CheckResponse, CheckResult,
    ChecksRequest, ChecksResponse, CreditRequest, CreditResponse, EntryRequest, EntryResponse, ErrorBody, ErrorDetail,
    LeaseRequest, LeaseResponse, MAX_CHARGE_ID_BYTES, MAX_KEY_BYTES, MAX_LEASE_TTL_MS, MAX_POLICY_BYTES, MAX_TAG_BYTES,
    MIN_ID_TTL_MS, VerdictName, is_policy_name, max_debt_bound,
};

//! Whether a request body is a valid request, and what the stores are to do with it:
//! strict parsing, validation into plans, and the API's errors.
//!
//! The bodies themselves are defined once, for the service and the filter, in
//! `sluice-protocol`. Every request body is parsed strictly (unknown fields are errors)
//! and validated completely before any store is touched, so a request that gets a 4xx
//! never changes a counter. Each route has its plan: [`CheckPlan`] (`/v1/check`),
//! [`LeasePlan`] (`/v1/lease`), [`ChargePlan`] (`/v1/charge`) and [`CreditPlan`]
//! (`/v1/credit`). See the crate README for the full protocol with examples.

use shared_store::Nanos;
use sluice_protocol::{
    Algorithm, CHARGE_ID_TTL_MS, ChargeRequest, CheckRequest, CreditRequest, ErrorCode, LeaseRequest, LimitSpec,
    MAX_AMOUNT, MAX_CHARGE_ID_BYTES, MAX_KEY_BYTES, MAX_LEASE_TTL_MS, MAX_POLICY_BYTES, MAX_TAG_BYTES, MIN_ID_TTL_MS,
    SpecError,
};

use crate::spec::StoreLimit;

/// An API error: a stable code, the HTTP status, and a message naming what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// What is wrong, for a human.
    pub message: String,
}

impl ApiError {
    /// An error with `code`, answered with its status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { status: code.status(), code, message: message.into() }
    }

    /// A 400 with `code`.
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(code, message)
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        Self::bad_request(e.code(), e.to_string())
    }
}

impl ApiError {
    /// `413 body_too_large`.
    pub(crate) fn body_too_large(limit: usize) -> Self {
        Self {
            status: 413,
            code: ErrorCode::BodyTooLarge,
            message: format!("the request body is larger than {limit} bytes"),
        }
    }

    /// `404 not_found`.
    pub(crate) fn not_found(path: &str) -> Self {
        Self { status: 404, code: ErrorCode::NotFound, message: format!("no route for {path}") }
    }

    /// `405 method_not_allowed`.
    pub(crate) fn method_not_allowed(method: &str, path: &str) -> Self {
        Self { status: 405, code: ErrorCode::MethodNotAllowed, message: format!("{method} is not allowed on {path}") }
    }

    /// The JSON body this error is answered with.
    pub fn body(&self) -> sluice_protocol::ErrorBody {
        sluice_protocol::ErrorBody::new(self.code.name(), self.message.clone())
    }
}

/// A validated entry: where its counter lives and what to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEntry {
    /// The storage key: `sluice:{tag}:v<version>:<key>` (the limit's numbers are not in
    /// it: a counter decided under other numbers is carried over to these, see
    /// [`shared_store::Limit::adopt`]).
    pub storage_key: String,
    /// The validated limit, as the stores run it.
    pub limit: StoreLimit,
    /// The cost.
    pub cost: u64,
    /// Which policy and key it is, as the request named them: what operators' overrides
    /// are matched against ([`crate::enforce`]).
    pub scope: Scope,
    /// When the counter may be forgotten whatever it holds (Unix ns): `None` for a
    /// policy's counter; a clamp's counter ends with its override ([`clamp_key`]).
    pub expires: Option<Nanos>,
}

impl PlannedEntry {
    /// The counter of the clamp `override_id` for this entry: the clamp's `limit`, the
    /// entry's cost, a key of its own in the entry's hash tag ([`clamp_key`]), forgotten
    /// at `expires` (the override's end).
    pub fn clamp(&self, override_id: &str, limit: StoreLimit, expires: Nanos) -> Self {
        Self {
            storage_key: clamp_key(&self.storage_key, override_id),
            limit,
            cost: self.cost,
            scope: self.scope.clone(),
            expires: Some(expires),
        }
    }
}

/// An entry's policy and key, as its request named them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The filter policy's name, when the request gave it.
    pub policy: Option<String>,
    /// The policy version.
    pub version: u64,
    /// The key (the filter's 32-hex hash of the caller).
    pub key: String,
}

/// A validated check: entries with distinct storage keys sharing one hash tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckPlan {
    /// The entries, in request order.
    pub entries: Vec<PlannedEntry>,
}

/// A validated lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeasePlan {
    /// The key's storage key and limit (cost unused).
    pub entry: PlannedEntry,
    /// Tokens asked for.
    pub tokens: u64,
    /// The fewest worth granting (1..=`tokens`): with fewer left, nothing is granted.
    pub min_tokens: u64,
    /// Lease duration (ms).
    pub ttl_ms: u64,
    /// An operator's clamp on the entry: a second counter, granted from together with
    /// the entry's (a grant is at most what both allow).
    pub clamp: Option<PlannedEntry>,
}

/// A validated charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargePlan {
    /// The key's storage key, limit, and the cost to charge (which may exceed the
    /// capacity: what does not fit is forgiven).
    pub entry: PlannedEntry,
    /// How far below empty the counter may go, in the limit's units (≤ capacity).
    pub max_debt: u64,
    /// Where the charge's id is remembered ([`charge_key`]), when it has one.
    pub charge_key: Option<String>,
    /// How long the id is remembered, in milliseconds ([`MIN_ID_TTL_MS`] to
    /// [`CHARGE_ID_TTL_MS`], the default); unused without an id.
    pub id_ttl_ms: u64,
    /// An operator's clamp on the entry: a second counter, charged the same units.
    pub clamp: Option<PlannedEntry>,
}

/// A validated credit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreditPlan {
    /// The key's storage key, limit (one that can be credited: a token bucket, fixed
    /// window or sliding window), and the units to give back (its `cost`, 0..=2^40).
    pub entry: PlannedEntry,
    /// When the units were spent (Unix ns): a window is credited only if this falls in
    /// the window its counter holds, or (sliding) the one before it.
    pub spent_at: Nanos,
    /// Where the credit's id is remembered ([`credit_key`]), when it has one.
    pub credit_key: Option<String>,
    /// How long the id is remembered, as a charge's ([`ChargePlan::id_ttl_ms`]).
    pub id_ttl_ms: u64,
    /// An operator's clamp on the entry whose counter counted the spend: a second
    /// counter, credited the same units.
    pub clamp: Option<PlannedEntry>,
}

/// The storage key of one counter: its tag, policy version and key, and not the limit's
/// numbers, so that a policy whose numbers change without a version bump keeps its
/// counters (carried over to the new numbers when next decided). Injective: the tag
/// cannot contain braces and the version is digits, so the key (last) is unambiguous.
pub fn storage_key(tag: &str, version: u64, key: &str) -> String {
    format!("sluice:{{{tag}}}:v{version}:{key}")
}

/// The counter of clamp `override_id` on the counter at `storage_key`: the same hash tag
/// (one Redis Cluster slot with the counter it clamps), `clamp:` and the override's id
/// after it, then the rest of the storage key. Injective: override ids have one form
/// (`ovr-` and 16 hex digits) and no storage key has `clamp` after its tag.
pub fn clamp_key(storage_key: &str, override_id: &str) -> String {
    match storage_key.split_once("}:") {
        Some((tagged, rest)) => format!("{tagged}}}:clamp:{override_id}:{rest}"),
        None => format!("{storage_key}:clamp:{override_id}"),
    }
}

/// Where a charge id is remembered: within the counter's tag (one Redis Cluster slot
/// with the counter), version and key. Injective: the id's length says where it ends
/// (ids and keys may both hold colons), and no storage key has `charge` after its tag.
pub fn charge_key(tag: &str, version: u64, key: &str, id: &str) -> String {
    format!("sluice:{{{tag}}}:charge:{}:{id}:v{version}:{key}", id.len())
}

/// Where a credit id is remembered: as a charge id is ([`charge_key`]), under `credit`
/// instead of `charge`, so that a credit and a charge whose ids have the same text are
/// two ids. Injective for the same reasons.
pub fn credit_key(tag: &str, version: u64, key: &str, id: &str) -> String {
    format!("sluice:{{{tag}}}:credit:{}:{id}:v{version}:{key}", id.len())
}

/// An id that makes a charge or a credit idempotent: `field` (`charge_id`, `credit_id`)
/// is refused with `code` unless it is 1 to [`MAX_CHARGE_ID_BYTES`] visible ASCII bytes.
fn check_id(field: &str, code: ErrorCode, id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_CHARGE_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(
            code,
            format!(
                "{field}: must be 1 to {MAX_CHARGE_ID_BYTES} visible ASCII characters without spaces \
                 ({} bytes given)",
                id.len()
            ),
        ));
    }
    Ok(())
}

/// How long the id of a charge or a credit is remembered: `id_ttl_ms` when given
/// ([`MIN_ID_TTL_MS`] to [`CHARGE_ID_TTL_MS`], and only beside an id, `id_field`), else
/// [`CHARGE_ID_TTL_MS`]. Refused with `invalid_id_ttl` otherwise: a shorter time could
/// not outlast a retry, a longer one is more than the service promises to hold, and
/// a time for no id would mean nothing.
fn check_id_ttl(id_field: &str, has_id: bool, id_ttl_ms: Option<u64>) -> Result<u64, ApiError> {
    let Some(ttl) = id_ttl_ms else { return Ok(CHARGE_ID_TTL_MS) };
    if !has_id {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidIdTtl,
            format!("id_ttl_ms: given without a {id_field} (it says how long the id is remembered)"),
        ));
    }
    if !(MIN_ID_TTL_MS..=CHARGE_ID_TTL_MS).contains(&ttl) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidIdTtl,
            format!("id_ttl_ms: {ttl} is not between {MIN_ID_TTL_MS} and {CHARGE_ID_TTL_MS}"),
        ));
    }
    Ok(ttl)
}

/// `field` (a charge's `cost`, a credit's `units`) within the largest amount a charge or a
/// credit may carry, [`MAX_AMOUNT`].
fn check_amount(field: &str, amount: u64, what: &str) -> Result<(), ApiError> {
    if amount > MAX_AMOUNT {
        return Err(ApiError::bad_request(
            ErrorCode::OutsideEnvelope,
            format!(
                "{field}: {amount} is above the largest {what}, {MAX_AMOUNT} (numeric envelope: see the counter \
                 service's README)"
            ),
        ));
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), ApiError> {
    if tag.is_empty() {
        return Err(ApiError::bad_request(ErrorCode::InvalidTag, "tag: must not be empty"));
    }
    if tag.len() > MAX_TAG_BYTES {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidTag,
            format!("tag: {} bytes is longer than {MAX_TAG_BYTES}", tag.len()),
        ));
    }
    if tag.contains(['{', '}']) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidTag,
            "tag: must not contain '{' or '}' (it becomes the Redis Cluster hash tag)",
        ));
    }
    Ok(())
}

fn check_key(field: &str, key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::bad_request(ErrorCode::InvalidKey, format!("{field}: must not be empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidKey,
            format!("{field}: {} bytes is longer than {MAX_KEY_BYTES}", key.len()),
        ));
    }
    Ok(())
}

fn with_index(index: usize, e: ApiError) -> ApiError {
    ApiError { message: format!("entries[{index}].{}", e.message), ..e }
}

/// A `policy` name: 1 to [`MAX_POLICY_BYTES`] bytes of `A-Z a-z 0-9 _ . -`.
pub(crate) fn check_policy(policy: &str) -> Result<(), ApiError> {
    if !sluice_protocol::is_policy_name(policy) {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidPolicy,
            format!(
                "policy: must be 1 to {MAX_POLICY_BYTES} characters among A-Z a-z 0-9 _ . - ({} bytes given)",
                policy.len()
            ),
        ));
    }
    Ok(())
}

fn plan_entry(
    tag: &str,
    (policy, key, version): (Option<&String>, &str, u64),
    limit: LimitSpec,
    cost: u64,
) -> Result<PlannedEntry, ApiError> {
    if let Some(policy) = policy {
        check_policy(policy)?;
    }
    check_key("key", key)?;
    let store_limit = StoreLimit::new(limit)?;
    if cost > store_limit.capacity() {
        return Err(ApiError::bad_request(
            ErrorCode::CostExceedsCapacity,
            format!("cost: {cost} is more than this limit can ever hold ({})", store_limit.capacity()),
        ));
    }
    let scope = Scope { policy: policy.cloned(), version, key: key.to_owned() };
    Ok(PlannedEntry { storage_key: storage_key(tag, version, key), limit: store_limit, cost, scope, expires: None })
}

impl CheckPlan {
    /// Validates `request` into a plan.
    ///
    /// # Errors
    /// A 400 [`ApiError`] naming the first problem found.
    pub fn new(request: &CheckRequest, max_entries: usize) -> Result<Self, ApiError> {
        if request.entries.is_empty() {
            return Err(ApiError::bad_request(ErrorCode::NoEntries, "entries: must hold at least one entry"));
        }
        if request.entries.len() > max_entries {
            return Err(ApiError::bad_request(
                ErrorCode::TooManyEntries,
                format!("entries: {} entries, at most {max_entries} per check", request.entries.len()),
            ));
        }
        let tag = match (&request.tag, request.entries.as_slice()) {
            (Some(tag), _) => tag.as_str(),
            (None, [only]) => only.key.as_str(),
            (None, _) => {
                return Err(ApiError::bad_request(
                    ErrorCode::TagRequired,
                    "tag: required when a check has several entries, so that one Redis node decides them atomically",
                ));
            }
        };
        check_tag(tag)?;
        let mut entries = Vec::with_capacity(request.entries.len());
        for (index, e) in request.entries.iter().enumerate() {
            let planned = plan_entry(tag, (e.policy.as_ref(), &e.key, e.policy_version), e.limit, e.cost)
                .map_err(|err| with_index(index, err))?;
            if entries.iter().any(|p: &PlannedEntry| p.storage_key == planned.storage_key) {
                return Err(ApiError::bad_request(
                    ErrorCode::DuplicateEntry,
                    format!("entries[{index}]: same key and version as an earlier entry (one counter)"),
                ));
            }
            entries.push(planned);
        }
        Ok(Self { entries })
    }
}

impl LeasePlan {
    /// The counters it grants from: the entry's, then its clamp's.
    pub fn counters(&self) -> impl Iterator<Item = &PlannedEntry> {
        std::iter::once(&self.entry).chain(&self.clamp)
    }
}

impl ChargePlan {
    /// The counters it charges: the entry's, then its clamp's.
    pub fn counters(&self) -> impl Iterator<Item = &PlannedEntry> {
        std::iter::once(&self.entry).chain(&self.clamp)
    }
}

impl CreditPlan {
    /// The counters it credits: the entry's, then its clamp's.
    pub fn counters(&self) -> impl Iterator<Item = &PlannedEntry> {
        std::iter::once(&self.entry).chain(&self.clamp)
    }
}

impl LeasePlan {
    /// Validates `request` into a plan.
    ///
    /// # Errors
    /// A 400 [`ApiError`] naming the first problem found.
    pub fn new(request: &LeaseRequest) -> Result<Self, ApiError> {
        let tag = request.tag.as_deref().unwrap_or(&request.key);
        check_tag(tag)?;
        let entry = plan_entry(tag, (request.policy.as_ref(), &request.key, request.policy_version), request.limit, 0)?;
        if !entry.limit.leasable() {
            return Err(ApiError::bad_request(
                ErrorCode::LeaseUnsupported,
                format!(
                    "limit.algorithm: a {} cannot be leased: only a {} can",
                    request.limit.algorithm(),
                    LimitSpec::names_of(Algorithm::leasable)
                ),
            ));
        }
        if request.tokens == 0 || request.tokens > entry.limit.capacity() {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidTokens,
                format!(
                    "tokens: {} is not between 1 and the limit's capacity ({})",
                    request.tokens,
                    entry.limit.capacity()
                ),
            ));
        }
        if request.min_tokens == 0 || request.min_tokens > request.tokens {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidTokens,
                format!("min_tokens: {} is not between 1 and tokens ({})", request.min_tokens, request.tokens),
            ));
        }
        if request.ttl_ms == 0 || request.ttl_ms > MAX_LEASE_TTL_MS {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidTtl,
                format!("ttl_ms: {} is not between 1 and {MAX_LEASE_TTL_MS}", request.ttl_ms),
            ));
        }
        Ok(Self { entry, tokens: request.tokens, min_tokens: request.min_tokens, ttl_ms: request.ttl_ms, clamp: None })
    }
}

impl ChargePlan {
    /// Validates `request` into a plan.
    ///
    /// `max_debt` is at most the limit's capacity: a counter then holds at most twice
    /// its capacity, which keeps the Redis script's integers inside the numeric envelope
    /// (and a debt larger than a full limit would keep a client out for longer than the
    /// limit's own period).
    ///
    /// # Errors
    /// A 400 [`ApiError`] naming the first problem found.
    pub fn new(request: &ChargeRequest) -> Result<Self, ApiError> {
        let tag = request.tag.as_deref().unwrap_or(&request.key);
        check_tag(tag)?;
        let mut entry =
            plan_entry(tag, (request.policy.as_ref(), &request.key, request.policy_version), request.limit, 0)?;
        if !entry.limit.chargeable() {
            return Err(ApiError::bad_request(
                ErrorCode::NotChargeable,
                format!(
                    "limit.algorithm: a {} cannot be charged: only a {} can",
                    request.limit.algorithm(),
                    LimitSpec::names_of(Algorithm::chargeable)
                ),
            ));
        }
        check_amount("cost", request.cost, "charge")?;
        let capacity = entry.limit.capacity();
        if request.max_debt > sluice_protocol::max_debt_bound(capacity) {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidMaxDebt,
                format!("max_debt: {} is more than the limit's capacity ({capacity})", request.max_debt),
            ));
        }
        let charge_key = match &request.charge_id {
            Some(id) => {
                check_id("charge_id", ErrorCode::InvalidChargeId, id)?;
                Some(charge_key(tag, request.policy_version, &request.key, id))
            }
            None => None,
        };
        let id_ttl_ms = check_id_ttl("charge_id", charge_key.is_some(), request.id_ttl_ms)?;
        entry.cost = request.cost;
        Ok(Self { entry, max_debt: request.max_debt, charge_key, id_ttl_ms, clamp: None })
    }
}

impl CreditPlan {
    /// Validates `request` into a plan: the tag and key, the limit (which must be one
    /// that can be credited: `400 not_creditable` naming `limit.algorithm` otherwise),
    /// `units` within 2^40 (`outside_envelope`), the `credit_id`, as a charge's
    /// `charge_id` is (`invalid_credit_id`), and its `id_ttl_ms`, as a charge's is
    /// (`invalid_id_ttl`).
    ///
    /// # Errors
    /// A 400 [`ApiError`] naming the first problem found.
    pub fn new(request: &CreditRequest) -> Result<Self, ApiError> {
        let tag = request.tag.as_deref().unwrap_or(&request.key);
        check_tag(tag)?;
        let mut entry =
            plan_entry(tag, (request.policy.as_ref(), &request.key, request.policy_version), request.limit, 0)?;
        if !entry.limit.creditable() {
            return Err(ApiError::bad_request(ErrorCode::NotCreditable, not_creditable(&request.limit)));
        }
        check_amount("units", request.units, "credit")?;
        let credit_key = match &request.credit_id {
            Some(id) => {
                check_id("credit_id", ErrorCode::InvalidCreditId, id)?;
                Some(credit_key(tag, request.policy_version, &request.key, id))
            }
            None => None,
        };
        let id_ttl_ms = check_id_ttl("credit_id", credit_key.is_some(), request.id_ttl_ms)?;
        entry.cost = request.units;
        Ok(Self { entry, spent_at: Nanos(request.spent_at_ns), credit_key, id_ttl_ms, clamp: None })
    }
}

/// Why `limit` cannot be credited (`shared_store::Limit::credit`), naming the field.
fn not_creditable(limit: &LimitSpec) -> String {
    let why = match limit.kind() {
        Algorithm::LeakyBucket => "a leaky_bucket's state is its queue of delays, which the request has left",
        Algorithm::SlidingLog => "a sliding_log's entries are not addressable by request",
        Algorithm::TokenBucket | Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::Concurrency => {
            "this algorithm cannot give units back"
        }
    };
    format!("limit.algorithm: {why}: only a {} can be credited", LimitSpec::names_of(Algorithm::creditable))
}

/// Classifies a JSON parsing failure into a stable code and a message with its path.
pub fn json_error(err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = err.path().to_string();
    let inner = err.inner();
    let detail = inner.to_string();
    let code = match inner.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof | serde_json::error::Category::Io => {
            ErrorCode::MalformedJson
        }
        serde_json::error::Category::Data if detail.starts_with("unknown field") => ErrorCode::UnknownField,
        serde_json::error::Category::Data if detail.starts_with("missing field") => ErrorCode::MissingField,
        serde_json::error::Category::Data if detail.starts_with("unknown variant") => ErrorCode::UnknownAlgorithm,
        serde_json::error::Category::Data => ErrorCode::InvalidValue,
    };
    let message = if path == "." { detail } else { format!("{path}: {detail}") };
    ApiError::bad_request(code, message)
}

/// Parses a JSON body strictly.
///
/// # Errors
/// A 400 [`ApiError`] from [`json_error`].
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // The fast path parses without tracking paths; only a failure is parsed again, with
    // serde_path_to_error, to name where the problem is.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(json_error)?;
    de.end().map_err(|e| {
        ApiError::bad_request(ErrorCode::MalformedJson, format!("trailing characters after the JSON body: {e}"))
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_field_inside_a_limit_is_named_with_its_path() {
        let body =
            br#"{"entries":[{"key":"k","limit":{"algorithm":"fixed_window","limit":1,"window_ms":1000,"burst":3}}]}"#;

        let err = parse::<CheckRequest>(body).unwrap_err();

        assert_eq!(err.code.name(), "unknown_field", "{err:?}");
        assert!(err.message.contains("entries[0].limit"), "{err:?}");
    }

    #[test]
    fn a_negative_number_is_an_invalid_value() {
        let body =
            br#"{"entries":[{"key":"k","cost":-1,"limit":{"algorithm":"fixed_window","limit":1,"window_ms":1000}}]}"#;

        let err = parse::<CheckRequest>(body).unwrap_err();

        assert_eq!(err.code.name(), "invalid_value", "{err:?}");
        assert!(err.message.contains("entries[0].cost"), "{err:?}");
    }

    #[test]
    fn charge_keys_tell_where_the_id_ends_whatever_colons_the_id_and_key_hold() {
        assert_eq!(charge_key("t", 1, "a:b", "c"), "sluice:{t}:charge:1:c:v1:a:b");
        assert_ne!(charge_key("t", 1, "b", "a:v1"), charge_key("t", 1, "v1:b", "a"));
    }

    #[test]
    fn a_credit_id_and_a_charge_id_with_the_same_text_are_remembered_under_two_keys() {
        assert_eq!(credit_key("t", 1, "a:b", "c"), "sluice:{t}:credit:1:c:v1:a:b");
        assert_ne!(credit_key("t", 1, "k", "c"), charge_key("t", 1, "k", "c"));
    }

    fn credit(limit: LimitSpec, units: u64, credit_id: Option<&str>) -> CreditRequest {
        CreditRequest {
            tag: None,
            policy: None,
            key: "k".to_owned(),
            policy_version: 0,
            limit,
            units,
            spent_at_ns: 7,
            credit_id: credit_id.map(str::to_owned),
            id_ttl_ms: None,
        }
    }

    #[test]
    fn a_credit_of_a_leaky_bucket_or_a_sliding_log_is_refused_naming_the_field() {
        let leaky = LimitSpec::LeakyBucket { amount: 1, per_ms: 1000, max_queue: 5, max_wait_ms: 100 };
        let log = LimitSpec::SlidingLog { limit: 5, window_ms: 1000 };

        for limit in [leaky, log] {
            let err = CreditPlan::new(&credit(limit, 1, None)).unwrap_err();

            assert_eq!((err.status, err.code.name()), (400, "not_creditable"), "{err:?}");
            assert!(err.message.starts_with("limit.algorithm: "), "{err:?}");
        }
    }

    #[test]
    fn a_credit_id_is_held_to_a_charge_ids_bounds_and_named_as_credit_id() {
        let bucket = LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 5 };

        for id in ["", "a b", &"x".repeat(65), "é"] {
            let err = CreditPlan::new(&credit(bucket, 1, Some(id))).unwrap_err();

            assert_eq!(err.code.name(), "invalid_credit_id", "{id:?}");
            assert!(err.message.starts_with("credit_id: "), "{err:?}");
        }
        let longest = CreditPlan::new(&credit(bucket, 1 << 40, Some(&"x".repeat(64)))).unwrap();
        let too_many = CreditPlan::new(&credit(bucket, (1 << 40) + 1, None)).unwrap_err();

        assert_eq!(longest.credit_key.as_deref(), Some(credit_key("k", 0, "k", &"x".repeat(64)).as_str()));
        assert_eq!((longest.entry.cost, longest.spent_at), (1 << 40, Nanos(7)));
        assert_eq!(too_many.code.name(), "outside_envelope");
        assert!(too_many.message.starts_with("units: "), "{too_many:?}");
    }

    #[test]
    fn an_id_is_remembered_for_the_ttl_asked_from_a_second_to_ten_minutes_and_ten_minutes_unless_asked() {
        let bucket = LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 5 };
        let with_ttl =
            |id: Option<&str>, id_ttl_ms| CreditPlan::new(&CreditRequest { id_ttl_ms, ..credit(bucket, 1, id) });
        let charge = |id_ttl_ms| {
            let request = ChargeRequest {
                tag: None,
                policy: None,
                key: "k".to_owned(),
                policy_version: 0,
                limit: bucket,
                cost: 1,
                max_debt: 0,
                charge_id: Some("c".to_owned()),
                id_ttl_ms,
            };
            ChargePlan::new(&request).map(|plan| plan.id_ttl_ms)
        };

        assert_eq!(with_ttl(Some("c"), None).map(|p| p.id_ttl_ms), Ok(CHARGE_ID_TTL_MS));
        assert_eq!(with_ttl(None, None).map(|p| p.id_ttl_ms), Ok(CHARGE_ID_TTL_MS));
        assert_eq!(with_ttl(Some("c"), Some(MIN_ID_TTL_MS)).map(|p| p.id_ttl_ms), Ok(1_000));
        assert_eq!((charge(None), charge(Some(90_000)), charge(Some(600_000))), (Ok(600_000), Ok(90_000), Ok(600_000)));
        for ttl in [0, 999, 600_001, u64::MAX] {
            let err = charge(Some(ttl)).unwrap_err();

            assert_eq!((err.status, err.code.name()), (400, "invalid_id_ttl"));
            assert_eq!(err.message, format!("id_ttl_ms: {ttl} is not between 1000 and 600000"));
        }
        let without_id = with_ttl(None, Some(90_000)).unwrap_err();
        assert_eq!(
            (without_id.code.name(), without_id.message.as_str()),
            ("invalid_id_ttl", "id_ttl_ms: given without a credit_id (it says how long the id is remembered)")
        );
    }

    #[test]
    fn storage_keys_share_the_tag_as_a_redis_hash_tag_and_leave_the_numbers_out() {
        assert_eq!(storage_key("t", 2, "a:b"), "sluice:{t}:v2:a:b");
    }

    #[test]
    fn one_counter_cannot_be_checked_twice_in_one_check_even_under_two_limits() {
        let entry = |limit| sluice_protocol::EntryRequest {
            policy: None,
            key: "k".to_owned(),
            policy_version: 1,
            limit,
            cost: 1,
        };
        let request = CheckRequest {
            tag: Some("t".to_owned()),
            entries: vec![
                entry(LimitSpec::FixedWindow { limit: 1, window_ms: 1000 }),
                entry(LimitSpec::FixedWindow { limit: 2, window_ms: 1000 }),
            ],
        };

        assert_eq!(CheckPlan::new(&request, 16).unwrap_err().code.name(), "duplicate_entry");
    }
}

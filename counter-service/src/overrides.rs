//! Operator overrides: what one is, and whether a request to set one is valid.
//!
//! An override names a global policy (by the name the filter configuration gives it)
//! and either admits its callers without spending (`bypass`) or lowers its numbers
//! (`clamp`, with the lowered [`LimitSpec`]), for every caller or for the callers whose
//! key parts hash to one key. It always expires (at most [`MAX_OVERRIDE_TTL_MS`] after
//! it is set), and carries why and who. Key values are hashed on the way in exactly as
//! the filter hashes them ([`key_hash`]); the raw values are never stored, logged or
//! answered.
//!
//! This module only validates and describes overrides; the stores keep them
//! ([`crate::store::CounterStore::set_override`]), the admin routes serve them. Nothing
//! enforces them yet: checks and leases do not read them.

use serde::{Deserialize, Serialize};
use shared_store::HashKey;
use sluice_protocol::{ErrorCode, LimitSpec};

use crate::api::{ApiError, check_policy};
use crate::spec::StoreLimit;

/// The shortest override: one second.
pub const MIN_OVERRIDE_TTL_MS: u64 = 1_000;
/// The longest override: 24 hours. No override is permanent.
pub const MAX_OVERRIDE_TTL_MS: u64 = 86_400_000;
/// The longest policy name (the filter's policy names are at most this long).
pub use sluice_protocol::MAX_POLICY_BYTES;
/// The longest reason.
pub const MAX_REASON_BYTES: usize = 512;
/// The longest operator name.
pub const MAX_OPERATOR_BYTES: usize = 128;
/// The most key values in a keyed override (one per key part of the policy).
pub const MAX_KEY_VALUES: usize = 16;
/// The longest key value, in bytes.
pub const MAX_KEY_VALUE_BYTES: usize = 1024;
/// The most overrides live at once; more are refused (`409 too_many_overrides`).
pub const MAX_OVERRIDES: usize = 1_000;

pub use sluice_protocol::OverrideKind;

/// `POST /admin/v1/overrides`: an override to set. Unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    /// `bypass` or `clamp`.
    pub kind: String,
    /// The policy's name in the filter configuration.
    pub policy: String,
    /// A clamp's lowered numbers (required for a clamp, refused for a bypass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitSpec>,
    /// The values of the policy's key parts, in order: the override then applies to
    /// these callers only. Hashed on the way in, never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<String>>,
    /// The policy's version the key is hashed under (default 0; only with `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// How long it lasts, in milliseconds ([`MIN_OVERRIDE_TTL_MS`] to
    /// [`MAX_OVERRIDE_TTL_MS`]).
    pub ttl_ms: u64,
    /// Why (1 to [`MAX_REASON_BYTES`] bytes).
    pub reason: String,
    /// Who (1 to [`MAX_OPERATOR_BYTES`] bytes).
    pub operator: String,
}

/// Which callers a keyed override applies to: the key's hash, as the filter sends it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyScope {
    /// The policy version the key was hashed under.
    pub policy_version: u64,
    /// The keyed hash of the policy name, version and values: 32 lower-case hex digits,
    /// what the filter sends as an entry's `key`.
    pub hash: String,
}

/// An override as the service holds and answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    /// Its id: `ovr-` and 16 hex digits, made by the service.
    pub id: String,
    /// What it does.
    pub kind: OverrideKind,
    /// The policy it applies to.
    pub policy: String,
    /// A clamp's numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitSpec>,
    /// The callers it applies to; all of the policy's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyScope>,
    /// When it was set (Unix ms).
    pub created_at_ms: u64,
    /// When it ends (Unix ms).
    pub expires_at_ms: u64,
    /// Why.
    pub reason: String,
    /// Who set it.
    pub operator: String,
}

/// The optional body of `DELETE /admin/v1/overrides/{id}`: who removes it, and why, for
/// the audit line. Unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemovalRequest {
    /// Who removes it (1 to [`MAX_OPERATOR_BYTES`] bytes).
    pub operator: String,
    /// Why (optional, 1 to [`MAX_REASON_BYTES`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl RemovalRequest {
    /// Validates the removal's operator and reason.
    ///
    /// # Errors
    /// A 400 [`ApiError`] naming `operator` or `reason`.
    pub fn validate(&self) -> Result<(), ApiError> {
        check_text("operator", ErrorCode::InvalidOperator, &self.operator, MAX_OPERATOR_BYTES)?;
        if let Some(reason) = &self.reason {
            check_text("reason", ErrorCode::InvalidReason, reason, MAX_REASON_BYTES)?;
        }
        Ok(())
    }
}

/// `GET /admin/v1/overrides`: the live overrides, by expiry then id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideList {
    /// The overrides.
    pub overrides: Vec<Override>,
}

impl Override {
    /// Validates `request` into an override with `id`, set at `now_ms`; key values are
    /// hashed with `hash_key` (the filters' global hash key).
    ///
    /// # Errors
    /// A 400 [`ApiError`] whose message starts with the field it is about.
    pub fn new(
        request: OverrideRequest,
        id: String,
        now_ms: u64,
        hash_key: Option<&HashKey>,
    ) -> Result<Self, ApiError> {
        let OverrideRequest { kind, policy, limit, key, policy_version, ttl_ms, reason, operator } = request;
        let kind = match kind.as_str() {
            "bypass" => OverrideKind::Bypass,
            "clamp" => OverrideKind::Clamp,
            other => {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidKind,
                    format!("kind: {other:?} is neither \"bypass\" nor \"clamp\""),
                ));
            }
        };
        check_policy(&policy)?;
        let limit = match (kind, limit) {
            (OverrideKind::Clamp, Some(limit)) => {
                StoreLimit::new(limit)?;
                Some(limit)
            }
            (OverrideKind::Clamp, None) => {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidLimit,
                    "limit: required for a clamp (its lowered numbers)",
                ));
            }
            (OverrideKind::Bypass, Some(_)) => {
                return Err(ApiError::bad_request(ErrorCode::InvalidLimit, "limit: a bypass carries no limit"));
            }
            (OverrideKind::Bypass, None) => None,
        };
        let key = match (key, policy_version) {
            (Some(values), version) => {
                let policy_version = version.unwrap_or(0);
                Some(KeyScope { policy_version, hash: key_scope(&policy, policy_version, &values, hash_key)? })
            }
            (None, Some(_)) => {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidKey,
                    "policy_version: only with key (it is the version the key is hashed under)",
                ));
            }
            (None, None) => None,
        };
        if !(MIN_OVERRIDE_TTL_MS..=MAX_OVERRIDE_TTL_MS).contains(&ttl_ms) {
            return Err(ApiError::bad_request(
                ErrorCode::InvalidTtl,
                format!(
                    "ttl_ms: {ttl_ms} is not between {MIN_OVERRIDE_TTL_MS} and {MAX_OVERRIDE_TTL_MS} (24 h): \
                     every override expires"
                ),
            ));
        }
        check_text("reason", ErrorCode::InvalidReason, &reason, MAX_REASON_BYTES)?;
        check_text("operator", ErrorCode::InvalidOperator, &operator, MAX_OPERATOR_BYTES)?;
        Ok(Self {
            id,
            kind,
            policy,
            limit,
            key,
            created_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            reason,
            operator,
        })
    }

    /// Whether it still applies at `now_ms`.
    pub const fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms > now_ms
    }

    /// The key's hash, or `none`, for the audit line.
    pub fn key_hash(&self) -> &str {
        self.key.as_ref().map_or("none", |k| k.hash.as_str())
    }
}

/// An override id from 64 random bits: `ovr-` and 16 lower-case hex digits.
pub fn override_id(random: u64) -> String {
    format!("ovr-{random:016x}")
}

/// Whether `id` has the form of an override id (checked before it reaches a store key).
pub fn is_override_id(id: &str) -> bool {
    id.strip_prefix("ovr-").is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The hash of `values` as the filter computes a global policy's key: the keyed
/// fingerprint of the policy name, version and values under `hash_key`, in 32
/// lower-case hex digits.
pub fn key_hash(hash_key: &HashKey, policy: &str, policy_version: u64, values: &[String]) -> String {
    let mut hasher = hash_key.fingerprinter(policy, policy_version);
    for value in values {
        hasher.part(value.as_bytes());
    }
    format!("{:032x}", hasher.finish())
}

fn key_scope(policy: &str, version: u64, values: &[String], hash_key: Option<&HashKey>) -> Result<String, ApiError> {
    let bad = |message: String| ApiError::bad_request(ErrorCode::InvalidKey, message);
    if values.is_empty() || values.len() > MAX_KEY_VALUES {
        return Err(bad(format!(
            "key: {} values; give 1 to {MAX_KEY_VALUES}, one per key part of the policy, in order",
            values.len()
        )));
    }
    if let Some(index) = values.iter().position(|v| v.len() > MAX_KEY_VALUE_BYTES) {
        return Err(bad(format!("key[{index}]: longer than {MAX_KEY_VALUE_BYTES} bytes")));
    }
    let Some(hash_key) = hash_key else {
        return Err(ApiError::bad_request(
            ErrorCode::NoHashKey,
            "key: this service has no hash key (--hash-key-env), so it cannot hash a key as the filters do",
        ));
    };
    Ok(key_hash(hash_key, policy, version, values))
}

/// Free text of 1 to `max` bytes without control characters (it goes into log lines).
fn check_text(field: &str, code: ErrorCode, text: &str, max: usize) -> Result<(), ApiError> {
    if text.trim().is_empty() || text.len() > max {
        return Err(ApiError::bad_request(code, format!("{field}: required, 1 to {max} bytes ({} given)", text.len())));
    }
    if text.chars().any(char::is_control) {
        return Err(ApiError::bad_request(code, format!("{field}: must not contain control characters")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> OverrideRequest {
        OverrideRequest {
            kind: "bypass".to_owned(),
            policy: "per-tenant".to_owned(),
            limit: None,
            key: None,
            policy_version: None,
            ttl_ms: 60_000,
            reason: "partner locked out".to_owned(),
            operator: "alice".to_owned(),
        }
    }

    #[test]
    fn a_valid_bypass_expires_ttl_ms_after_it_is_set() {
        let made = Override::new(request(), override_id(0xabc), 1_000, None).unwrap();

        assert_eq!(made.id, "ovr-0000000000000abc");
        assert_eq!((made.created_at_ms, made.expires_at_ms), (1_000, 61_000));
        assert!(made.is_live(60_999) && !made.is_live(61_000));
    }

    #[test]
    fn a_key_is_hashed_as_the_filter_hashes_it_and_needs_a_hash_key() {
        let secret = HashKey::global(b"0123456789abcdef");
        let keyed = OverrideRequest { key: Some(vec!["tenant-a".to_owned()]), policy_version: Some(3), ..request() };
        let mut expected = secret.fingerprinter("per-tenant", 3);
        expected.part(b"tenant-a");

        let made = Override::new(keyed.clone(), override_id(1), 0, Some(&secret)).unwrap();
        let refused = Override::new(keyed, override_id(1), 0, None).unwrap_err();

        assert_eq!(made.key, Some(KeyScope { policy_version: 3, hash: format!("{:032x}", expected.finish()) }));
        assert!(refused.message.starts_with("key: "), "{refused:?}");
    }

    #[test]
    fn ids_are_recognized_only_in_their_own_form() {
        assert!(is_override_id(&override_id(u64::MAX)));
        for bad in ["ovr-123", "ovr-000000000000000g", "x-0000000000000000", "ovr-0000000000000000:x"] {
            assert!(!is_override_id(bad), "{bad}");
        }
    }
}

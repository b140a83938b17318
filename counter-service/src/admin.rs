//! What the admin API does with operator overrides: set, list, remove, and the sweep that
//! finds expired ones, each change audited and counted.
//!
//! **Audit.** Every change is one `info` log line on the target `sluice_counter::audit`
//! (one JSON object under `--log-format json`), with `event` (`override_set`,
//! `override_removed`, `override_expired`), the override's `id`, `kind`, `policy`,
//! `keyed`, `key_hash` (the key's hash, or `none`; never a raw value), `expires_at_ms`,
//! `reason` and `operator` (who set it); a removal adds `removed_by` and
//! `removal_reason` (`unknown` and `none` when the request did not say). An expiry is
//! logged once, by the sweep that claims it.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::api::{self, ApiError};
use crate::app::App;
use crate::overrides::{MAX_OVERRIDES, Override, OverrideRequest, RemovalRequest, is_override_id, override_id};
use crate::store::{CounterStore, Stored};
use sluice_protocol::ErrorCode;

/// The target of the audit lines.
pub const AUDIT_TARGET: &str = "sluice_counter::audit";

/// Attempts at a fresh id before giving up (a collision of 64 random bits is unheard of).
const ID_ATTEMPTS: usize = 3;

/// One audit line for `event` on `item`; a removal also says who removed it and why
/// (`removal`: the operator and the reason).
fn audit(event: &'static str, item: &Override, removal: Option<(&str, &str)>) {
    tracing::info!(
        target: AUDIT_TARGET,
        event,
        id = %item.id,
        kind = item.kind.name(),
        policy = %item.policy,
        keyed = item.key.is_some(),
        key_hash = item.key_hash(),
        expires_at_ms = item.expires_at_ms,
        reason = %item.reason,
        operator = %item.operator,
        removed_by = removal.map(|(by, _)| by),
        removal_reason = removal.map(|(_, why)| why),
        "{event}"
    );
}

/// 64 bits no one can guess: std's randomly keyed SipHash of a counter and the time.
fn random_u64() -> u64 {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::hash::RandomState::new().hash_one((SEQUENCE.fetch_add(1, Ordering::Relaxed), now))
}

impl App {
    /// `POST /admin/v1/overrides`: validates `body` and stores the override.
    ///
    /// # Errors
    /// `400` naming the field, `409 too_many_overrides` at the bound, `503` when the
    /// store fails. Nothing is stored on an error.
    pub async fn set_override(&self, body: &[u8]) -> Result<Override, ApiError> {
        let request: OverrideRequest = api::parse(body)?;
        let store = self.store();
        let now_ms = store.now_ms();
        for _ in 0..ID_ATTEMPTS {
            let item = Override::new(request.clone(), override_id(random_u64()), now_ms, self.hash_key())?;
            self.known_policies().check(&item)?;
            match self.timed(store.set_override(&item, now_ms, MAX_OVERRIDES)).await? {
                Stored::Set { active } => {
                    self.overrides_seen.store(true, Ordering::Relaxed);
                    audit("override_set", &item, None);
                    self.metrics().override_set(item.kind, active);
                    self.refresh_overrides().await;
                    return Ok(item);
                }
                Stored::Full { active } => {
                    self.metrics().overrides_active(active);
                    return Err(ApiError {
                        status: 409,
                        code: ErrorCode::TooManyOverrides,
                        message: format!(
                            "{active} overrides are live, the most this service keeps ({MAX_OVERRIDES}); remove one \
                             or wait for one to expire"
                        ),
                    });
                }
                Stored::Exists => {}
            }
        }
        Err(ApiError {
            status: 500,
            code: ErrorCode::Internal,
            message: "could not make a fresh override id".to_owned(),
        })
    }

    /// `GET /admin/v1/overrides`: the live overrides, by expiry.
    ///
    /// # Errors
    /// `503` when the store fails.
    pub async fn list_overrides(&self) -> Result<Vec<Override>, ApiError> {
        let live = self.timed(self.store().list_overrides(self.store().now_ms())).await?;
        if !live.is_empty() {
            self.overrides_seen.store(true, Ordering::Relaxed);
        }
        self.metrics().overrides_active(live.len());
        Ok(live)
    }

    /// `DELETE /admin/v1/overrides/{id}`: removes a live override. `body` is empty or a
    /// [`RemovalRequest`] (who removes it and why, for the audit line).
    ///
    /// # Errors
    /// `400` naming the field of a bad body; `404 override_not_found` when no live
    /// override has this id; `503` when the store fails.
    pub async fn remove_override(&self, id: &str, body: &[u8]) -> Result<Override, ApiError> {
        let removal = if body.trim_ascii().is_empty() {
            None
        } else {
            let removal: RemovalRequest = api::parse(body)?;
            removal.validate()?;
            Some(removal)
        };
        let not_found = || ApiError {
            status: 404,
            code: ErrorCode::OverrideNotFound,
            message: "id: no live override has this id (it may have expired)".to_owned(),
        };
        if !is_override_id(id) {
            return Err(not_found());
        }
        let store = self.store();
        let removed = self.timed(store.remove_override(id, store.now_ms())).await?.ok_or_else(not_found)?;
        self.overrides_seen.store(true, Ordering::Relaxed);
        let (by, why) = removal
            .as_ref()
            .map_or(("unknown", "none"), |r| (r.operator.as_str(), r.reason.as_deref().unwrap_or("none")));
        audit("override_removed", &removed, Some((by, why)));
        self.metrics().override_removed();
        self.refresh_overrides().await;
        Ok(removed)
    }

    /// Claims the overrides that expired, audits and counts each; returns how many. The
    /// server's sweeper calls it every `--sweep-interval-ms`: always on the memory store;
    /// on Redis once this instance has seen an override (set, listed or removed one), so
    /// that a service without overrides sends Redis nothing more than it did.
    ///
    /// Unlike a request, a sweep is not counted in the store's latency or error metrics;
    /// a failure is logged at `debug` and the next sweep tries again.
    pub async fn expire_overrides(&self) -> usize {
        let store = self.store();
        if matches!(store, CounterStore::Redis(_)) && !self.overrides_seen.load(Ordering::Relaxed) {
            return 0;
        }
        let expired = match store.expire_overrides(store.now_ms()).await {
            Ok(expired) => expired,
            Err(error) => {
                tracing::debug!(%error, "override sweep failed; retrying at the next sweep");
                return 0;
            }
        };
        for item in &expired.overrides {
            audit("override_expired", item, None);
        }
        self.metrics().overrides_expired(expired.overrides.len(), expired.active);
        expired.overrides.len()
    }

    /// Reads the live overrides from the store and applies them from now on
    /// ([`App::enforce`]), after each change made through this instance. When the store
    /// fails, the overrides read last stay (each still ends at its expiry), and the next
    /// sweep tries again. A read applies only if no read that began after it was applied
    /// first ([`App::apply_overrides`]): overrides are applied in the order they were read.
    pub async fn refresh_overrides(&self) {
        self.read_overrides(None).await;
    }

    /// The sweep's refresh: on Redis, that is how an override another instance set or
    /// removed reaches this one, so `--sweep-interval-ms` bounds how late it is obeyed
    /// here. It first reads the store's overrides version (one `GET` of one small key on
    /// Redis) and lists the overrides only when that changed since the snapshot applied.
    pub async fn sweep_overrides(&self) {
        let store = self.store();
        let ticket = self.overrides_ticket();
        let version = match store.overrides_version().await {
            Ok(version) => version,
            Err(error) => {
                tracing::debug!(%error, "cannot read the overrides' version; retrying at the next sweep");
                return;
            }
        };
        if version.is_some() && version == self.applied_overrides_version() {
            return;
        }
        self.read_overrides(Some((ticket, version))).await;
    }

    /// Lists the live overrides and applies them with `read` (the ticket and version
    /// taken before; fresh ones when `None`).
    async fn read_overrides(&self, read: Option<(u64, Option<u64>)>) {
        let store = self.store();
        let (ticket, version) = match read {
            Some(read) => read,
            None => {
                let ticket = self.overrides_ticket();
                match store.overrides_version().await {
                    Ok(version) => (ticket, version),
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the overrides; applying the ones read last");
                        return;
                    }
                }
            }
        };
        match store.list_overrides(store.now_ms()).await {
            Ok(live) => {
                if !live.is_empty() {
                    self.overrides_seen.store(true, Ordering::Relaxed);
                }
                self.apply_overrides(ticket, version, live);
            }
            Err(error) => tracing::warn!(%error, "cannot read the overrides; applying the ones read last"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::store::{CounterStore, MemoryConfig, MemoryCounters};
    use crate::{App, auth::Auth};
    use sluice_protocol::LimitSpec;

    fn app() -> App {
        let store = CounterStore::Memory(MemoryCounters::new(MemoryConfig::default()));
        App::new(store, &Config::defaults(), Auth::Open)
    }

    fn named_entry(policy: &str) -> crate::call::Call {
        let request = sluice_protocol::CheckRequest {
            tag: None,
            entries: vec![sluice_protocol::EntryRequest {
                policy: Some(policy.to_owned()),
                key: "k".to_owned(),
                policy_version: 0,
                limit: LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 5 },
                cost: 0,
            }],
        };
        crate::call::Call::Check(crate::api::CheckPlan::new(&request, 8).unwrap())
    }

    #[tokio::test]
    async fn a_read_of_the_overrides_that_began_before_an_override_was_set_never_undoes_it() {
        let app = app();
        let call = named_entry("per-tenant");
        app.enforce(&call);
        // A sweep begins its read: nothing is set yet.
        let ticket = app.overrides_ticket();
        let stale = app.store().list_overrides(app.store().now_ms()).await.unwrap();
        // Meanwhile an operator sets a bypass through this instance.
        let body = br#"{"kind": "bypass", "policy": "per-tenant", "ttl_ms": 60000, "reason": "r", "operator": "o"}"#;
        app.set_override(body).await.unwrap();

        let applied = app.apply_overrides(ticket, None, stale);

        assert!(!applied, "the stale read is not applied");
        assert_eq!(app.enforce(&call).all_applied().count(), 1, "the bypass still applies");
    }
}

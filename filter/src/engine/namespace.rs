//! Where everything lives in shared data: one namespace per plugin, keys derived from
//! the plugin's identity, the policy and its version, never from request data.
//!
//! ```text
//! sluice/<plugin_name>/<root_id>/secret            the per-proxy hash secret
//! sluice/<plugin_name>/<root_id>/anchor            written to obtain fresh CAS tokens
//! sluice/<plugin_name>/<root_id>/breaker           the counter service's circuit breaker
//! sluice/<plugin_name>/<root_id>/p/<policy>/v<n>/  a local policy's slot table, `missing`, `meta`
//! sluice/<plugin_name>/<root_id>/e/<policy>/v<n>/  a global policy's emergency-cap table
//! sluice/<plugin_name>/<root_id>/l/<policy>/v<n>/  a lease policy's lease records
//! ```

use shared_store::{Change, HashKey, Store, UpdateError};

/// Encodes a plugin identity (name and root id, any bytes) into a key prefix that
/// cannot collide with another identity: bytes outside `A-Z a-z 0-9 _ . -` are
/// percent-encoded, and `/` separates the parts.
pub fn plugin_prefix(plugin_name: &[u8], root_id: &[u8]) -> String {
    fn encode(out: &mut String, bytes: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        for &b in bytes {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
                out.push(char::from(b));
            } else {
                out.push('%');
                out.push(char::from(HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0')));
                out.push(char::from(HEX.get(usize::from(b & 15)).copied().unwrap_or(b'0')));
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

/// The key of the counter service's circuit breaker.
pub fn breaker_key(prefix: &str) -> String {
    format!("{prefix}breaker")
}

/// The prefix of a local policy's keys.
pub fn local_table(prefix: &str, policy: &str, version: u64) -> String {
    format!("{prefix}p/{policy}/v{version}/")
}

/// The prefix of a global policy's emergency-cap keys.
pub fn emergency_table(prefix: &str, policy: &str, version: u64) -> String {
    format!("{prefix}e/{policy}/v{version}/")
}

/// The prefix of a lease policy's lease records.
pub fn lease_table(prefix: &str, policy: &str, version: u64) -> String {
    format!("{prefix}l/{policy}/v{version}/")
}

/// Establishes the hash secret all workers of a proxy share: the first worker to get
/// here stores `candidate`; every other worker, racing or later, adopts the stored one
/// (created with [`shared_store::create`], so a second creator conflicts instead of
/// overwriting).
///
/// # Errors
/// When the store fails, or keeps conflicting.
pub fn establish_secret(store: &impl Store, prefix: &str, candidate: [u8; 16]) -> Result<HashKey, UpdateError> {
    let landed = shared_store::update(
        store,
        &anchor_key(prefix),
        &secret_key(prefix),
        shared_store::DEFAULT_MAX_ATTEMPTS,
        |current| match current.map(<[u8; 16]>::try_from) {
            Some(Ok(stored)) => Change::Keep(stored),
            // Missing, or damaged: offer ours; a racing creator or repair wins instead.
            None | Some(Err(_)) => Change::Write(candidate, candidate),
        },
    )?;
    Ok(HashKey::new(landed.result))
}

/// A 128-bit fingerprint as 32 lower-case hex digits: how global keys and tags reach the
/// counter service.
///
/// Written from the two 64-bit halves: on wasm32 a shift of a `u128` is a call
/// (`__lshrti3`), and this runs for every key of every check.
pub fn hex128(value: u128) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let halves = [(value >> 64) as u64, value as u64];
    let mut text = String::with_capacity(32);
    for half in halves {
        for i in (0..16).rev() {
            text.push(char::from(HEX.get(((half >> (i * 4)) & 15) as usize).copied().unwrap_or(b'0')));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::hex128;

    #[test]
    fn a_fingerprint_is_written_as_32_hex_digits_high_half_first() {
        assert_eq!(hex128(0), "0".repeat(32));
        assert_eq!(hex128(u128::MAX), "f".repeat(32));
        assert_eq!(hex128(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210), "0123456789abcdeffedcba9876543210");
        assert_eq!(hex128(1 << 64), "00000000000000010000000000000000");
    }
}

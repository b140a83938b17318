//! Which counter a request's descriptor counts in: a hash of its domain and entries,
//! each part length-prefixed so that no two descriptors share one (envoyproxy/ratelimit
//! joins them with `_`, so `(a, b_c)` and `(a_b, c)` share its counter).

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

/// Keys of the identity hash: fixed, since the identity must be the same on every
/// instance and across restarts (it is not a secret: it names counters, it does not
/// hide callers, and every part is length-prefixed).
const KEYS: (u64, u64) = (0x736c_7569_6365_2d72, 0x6c73_2d63_6f75_6e74);

/// 32 hex digits naming `parts` (a 128-bit SipHash of each part's length and bytes).
pub fn hash(parts: &[&[u8]]) -> String {
    let mut hasher = SipHasher13::new_with_keys(KEYS.0, KEYS.1);
    for part in parts {
        hasher.write_u64(part.len() as u64);
        hasher.write(part);
    }
    format!("{:032x}", hasher.finish128().as_u128())
}

/// The counter of `domain`'s descriptor with these `(key, value)` entries (a value may be
/// the wildcard pattern that stands for many under `share_threshold`).
pub fn counter(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + 2 * entries.len());
    parts.push(domain.as_bytes());
    for (key, value) in entries {
        parts.push(key.as_bytes());
        parts.push(value.as_bytes());
    }
    hash(&parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_that_join_to_the_same_text_are_different_counters() {
        assert_ne!(counter("d", &[("a", "b_c")]), counter("d", &[("a_b", "c")]));
        assert_ne!(counter("d", &[("a", "b"), ("c", "")]), counter("d", &[("a", "b_c")]));
        assert_ne!(counter("d_a", &[("b", "c")]), counter("d", &[("a_b", "c")]));
    }

    #[test]
    fn the_same_descriptor_is_always_the_same_counter() {
        assert_eq!(counter("d", &[("a", "1")]), counter("d", &[("a", "1")]));
        assert_eq!(counter("d", &[("a", "1")]).len(), 32);
    }
}

//! Keys: from a request's identity to a bounded set of shared-data keys, with no raw
//! identity anywhere.
//!
//! 1. [`descriptor`] encodes (policy, policy version, descriptor values) canonically and
//!    injectively: every part is length-prefixed, so no choice of values (separators,
//!    NUL, non-UTF-8, empty) can make two different tuples encode alike.
//! 2. [`HashKey::fingerprint`] hashes that encoding with a secret key (SipHash-1-3,
//!    128 bits), so keys, logs and metrics never carry an API key or an address, and an
//!    attacker who does not know the secret cannot aim many identities at one slot.
//! 3. [`SlotTable::place`] maps the fingerprint to one of a fixed number of slots per
//!    policy, and keeps the rest of the fingerprint as the slot's *owner*.
//!
//! # Why a table, and what happens when it is full
//!
//! Envoy never deletes shared data, so a key per client would grow without bound under
//! a flood of distinct identities. A policy instead owns `slots` keys, created on first
//! use. A slot belongs to one owner at a time. Another client may take the slot only
//! when the owner's state carries no information (the bucket is full again, the
//! windows are empty, see [`crate::limit::Limit::is_idle`]): forgetting such a client is
//! exact, so flooding the table can never reset anyone's bucket.
//!
//! When a client's slot is held by an active owner, the request is decided on the
//! policy's **overflow bucket**: one shared bucket with the policy's own numbers. Clients
//! that spill over share it, so under a flood of identities new clients are limited
//! together (more strictly than alone) while every tracked client keeps its own bucket.
//! When a client takes a slot while the overflow bucket is in use, the slot starts from
//! the overflow bucket's state rather than from full: a client that spilled over never
//! gains allowance by moving back to a slot of its own (during a flood, a new client
//! therefore starts as strict as the overflow bucket, never looser).
//!
//! One race is left, and bounded: a request that a worker decides on the overflow
//! bucket at the very moment another worker moves the same client into a freed slot is
//! counted in the overflow bucket only. The excess is at most the cost of the requests
//! in flight for that client on the other workers, once per move.

use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;
use std::num::NonZeroU32;
use std::sync::Arc;

/// The owner recorded on a policy's overflow bucket; table owners are never zero.
pub const OVERFLOW_OWNER: u64 = 0;

/// Encodes a policy's descriptor canonically: the same tuple always gives the same bytes,
/// and different tuples never do.
pub fn descriptor<'a>(policy: &str, version: u64, values: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    push_part(&mut out, policy.as_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    for value in values {
        push_part(&mut out, value);
    }
    out
}

fn push_part(out: &mut Vec<u8>, part: &[u8]) {
    // u64 lengths: no input size can be truncated into an ambiguity.
    out.extend_from_slice(&(part.len() as u64).to_le_bytes());
    out.extend_from_slice(part);
}

/// The secret key of the keyed hash. All workers of one proxy must use the same key so
/// that they agree on slots.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HashKey([u8; 16]);

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(..)")
    }
}

impl HashKey {
    /// A key from 16 secret bytes.
    pub const fn new(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The keyed 128-bit hash of a [`descriptor`].
    pub fn fingerprint(&self, descriptor: &[u8]) -> u128 {
        let mut hasher = SipHasher13::new_with_key(&self.0);
        hasher.write(descriptor);
        hasher.finish128().as_u128()
    }

    /// Starts the fingerprint of a descriptor of `policy` at `version`; add its values
    /// with [`Fingerprinter::part`].
    pub fn fingerprinter(&self, policy: &str, version: u64) -> Fingerprinter {
        let mut hasher = Fingerprinter(SipHasher13::new_with_key(&self.0));
        hasher.part(policy.as_bytes());
        hasher.0.write(&version.to_le_bytes());
        hasher
    }

    /// The key global counters' keys are hashed with, derived from the operator's
    /// `secret` (the filter's `hash_key_env`): the same on every proxy and counter service
    /// given the same secret, and unrelated to it for anyone who is not. A change here
    /// would give every caller a new global counter: the derivation is fixed.
    pub fn global(secret: &[u8]) -> Self {
        // SipHash keyed with zeros is a fixed public function here: what makes the result
        // secret is the operator's input (at least 128 bits, enforced by the filter's
        // configuration).
        let mut input = b"sluice/global-hash-key/v1\0".to_vec();
        input.extend_from_slice(secret);
        Self::new(Self::new([0; 16]).fingerprint(&input).to_le_bytes())
    }
}

/// Hashes a [`descriptor`] part by part, without building it: the result equals
/// [`HashKey::fingerprint`] of the descriptor of the same parts. Made by
/// [`HashKey::fingerprinter`]; this is what runs on every request.
#[derive(Clone)]
pub struct Fingerprinter(SipHasher13);

impl std::fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The hasher's state holds the secret key: never print it (as `HashKey`).
        f.write_str("Fingerprinter(..)")
    }
}

impl Fingerprinter {
    /// Adds the next descriptor value.
    pub fn part(&mut self, value: &[u8]) {
        self.0.write(&(value.len() as u64).to_le_bytes());
        self.0.write(value);
    }

    /// The fingerprint of the policy, version and parts given so far.
    pub fn finish(self) -> u128 {
        self.0.finish128().as_u128()
    }
}

/// Where one client's state lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    /// The shared-data key of the client's slot.
    pub key: String,
    /// The fingerprint that marks the slot as this client's.
    pub owner: u64,
    /// The policy's overflow bucket, used while the slot is held by an active owner.
    /// `None` for a key that is not shared (one key, one client). Shared with the table,
    /// so placing a request allocates only its slot key.
    pub overflow: Option<Arc<str>>,
}

impl Placement {
    /// A key that belongs to one client and is never shared: no owner check, no overflow.
    pub fn dedicated(key: impl Into<String>) -> Self {
        Self { key: key.into(), owner: OVERFLOW_OWNER, overflow: None }
    }
}

/// A fixed number of slots for one policy: `{prefix}{index}` for `index < slots`, plus
/// `{prefix}overflow`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotTable {
    prefix: String,
    slots: NonZeroU32,
    overflow: Arc<str>,
}

impl SlotTable {
    /// A table of `slots` keys under `prefix`.
    pub fn new(prefix: impl Into<String>, slots: NonZeroU32) -> Self {
        let prefix = prefix.into();
        let overflow = Arc::from(format!("{prefix}overflow"));
        Self { prefix, slots, overflow }
    }

    /// The number of slots.
    pub const fn slots(&self) -> u32 {
        self.slots.get()
    }

    /// The most shared-data keys this table ever creates (its slots and the overflow).
    pub const fn max_keys(&self) -> u64 {
        self.slots.get() as u64 + 1
    }

    /// The key of the overflow bucket.
    pub fn overflow_key(&self) -> &str {
        &self.overflow
    }

    /// The key of slot `index` (for a sweep over the table; `index < slots`).
    pub fn slot_key(&self, index: u32) -> String {
        let mut key = String::with_capacity(self.prefix.len() + MAX_DECIMAL_DIGITS);
        key.push_str(&self.prefix);
        push_decimal(&mut key, u64::from(index));
        key
    }

    /// Where the client with this [`HashKey::fingerprint`] lives.
    pub fn place(&self, fingerprint: u128) -> Placement {
        // Low half picks the slot, high half identifies the owner: independent bits.
        let index = (fingerprint as u64) % u64::from(self.slots.get());
        let owner = ((fingerprint >> 64) as u64) | 1;
        // Built by hand: `format!` costs more than the rest of placing (it is on every
        // request, and the formatting machinery is slow in wasm).
        let mut key = String::with_capacity(self.prefix.len() + MAX_DECIMAL_DIGITS);
        key.push_str(&self.prefix);
        push_decimal(&mut key, index);
        Placement { key, owner, overflow: Some(Arc::clone(&self.overflow)) }
    }
}

/// Digits in `u64::MAX`.
const MAX_DECIMAL_DIGITS: usize = 20;

/// Appends `n` in decimal: what `write!(out, "{n}")` does, through `itoa`, without the
/// formatting machinery, which is slow in wasm (callers build keys and headers per
/// request).
pub fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_hash_key_is_a_fixed_derivation_of_the_operators_secret() {
        let key = HashKey::global(b"0123456789abcdef-operator-key");
        // Pinned: proxies and services of different builds must agree on every key.
        assert_eq!(key.fingerprint(b"probe"), 0xa9b7_3649_4516_c2eb_fc04_2201_c3e0_132a);
        assert_ne!(HashKey::global(b"another secret").fingerprint(b"probe"), key.fingerprint(b"probe"));
    }

    #[test]
    fn descriptors_that_differ_only_in_where_a_value_splits_encode_differently() {
        let a = descriptor("p", 1, [b"ab".as_slice(), b"c".as_slice()]);
        let b = descriptor("p", 1, [b"a".as_slice(), b"bc".as_slice()]);
        let c = descriptor("p", 1, [b"abc".as_slice()]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
    }

    #[test]
    fn the_policy_version_is_part_of_the_descriptor() {
        assert_ne!(descriptor("p", 1, [b"x".as_slice()]), descriptor("p", 2, [b"x".as_slice()]));
    }

    #[test]
    fn the_same_descriptor_lands_in_the_same_slot_with_the_same_owner() {
        let table = SlotTable::new("t/", NonZeroU32::new(64).unwrap());
        let key = HashKey::new([7; 16]);
        let fp = key.fingerprint(&descriptor("p", 1, [b"alice".as_slice()]));
        assert_eq!(table.place(fp), table.place(fp));
        assert_ne!(table.place(fp).owner, OVERFLOW_OWNER);
    }

    #[test]
    fn hashing_part_by_part_gives_the_fingerprint_of_the_whole_descriptor() {
        let key = HashKey::new([9; 16]);
        let parts: [&[u8]; 3] = [b"tenant-1", b"", b"\xff\x00/a"];
        for n in 0..=parts.len() {
            let mut hasher = key.fingerprinter("policy", 7);
            parts.iter().take(n).for_each(|p| hasher.part(p));
            assert_eq!(hasher.finish(), key.fingerprint(&descriptor("policy", 7, parts.iter().take(n).copied())));
        }
    }

    #[test]
    fn debug_output_never_shows_the_secret() {
        let key = HashKey::new([0xab; 16]);
        assert_eq!(format!("{key:?}"), "HashKey(..)");
        assert_eq!(format!("{:?}", key.fingerprinter("p", 1)), "Fingerprinter(..)");
    }

    #[test]
    fn a_different_secret_gives_different_fingerprints() {
        let d = descriptor("p", 1, [b"alice".as_slice()]);
        assert_ne!(HashKey::new([1; 16]).fingerprint(&d), HashKey::new([2; 16]).fingerprint(&d));
    }

    #[test]
    fn slot_keys_are_the_prefix_and_the_decimal_index() {
        for n in [0, 7, 10, 99, 4_294_967_295, u64::MAX] {
            let mut key = String::from("t/");
            push_decimal(&mut key, n);
            assert_eq!(key, format!("t/{n}"));
        }
        let table = SlotTable::new("t/", NonZeroU32::new(1000).unwrap());
        let placement = table.place(123_456);
        assert_eq!(placement.key, format!("t/{}", 123_456 % 1000));
    }

    #[test]
    fn no_raw_identity_appears_in_a_key() {
        let table = SlotTable::new("sluice/p/", NonZeroU32::new(1024).unwrap());
        let fp = HashKey::new([0; 16]).fingerprint(&descriptor("p", 1, [b"secret-api-key".as_slice()]));
        let placement = table.place(fp);
        assert!(!placement.key.contains("secret"));
        assert!(placement.key.starts_with("sluice/p/"));
    }
}

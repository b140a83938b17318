//! How an operator override reaches the filter: the answers to checks, leases, charges
//! and credits name the override that decided an entry, so that a proxy can count it,
//! name it in a header and log it. Overrides themselves are set on the counter service
//! (its admin API); the wire carries only which one applied.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What an override does to its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverrideKind {
    /// The policy admits the matching callers without spending.
    Bypass,
    /// The policy's numbers are lowered to the override's limit.
    Clamp,
}

impl OverrideKind {
    /// Both kinds, in the order metrics show them.
    pub const ALL: [Self; 2] = [Self::Bypass, Self::Clamp];

    /// Its name on the wire, in logs, headers and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Bypass => "bypass",
            Self::Clamp => "clamp",
        }
    }
}

/// An override's id: 64 bits, written `ovr-` and 16 lower-case hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OverrideId(pub u64);

impl OverrideId {
    /// The id written `text`, if it has the form `ovr-` and 16 hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix("ovr-")?;
        if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(hex, 16).ok().map(Self)
    }
}

impl fmt::Display for OverrideId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ovr-{:016x}", self.0)
    }
}

impl Serialize for OverrideId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OverrideId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text).ok_or_else(|| serde::de::Error::custom("an override id is `ovr-` and 16 hex digits"))
    }
}

/// The override that decided an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AppliedOverride {
    /// Which override.
    pub id: OverrideId,
    /// What it did: a bypass admitted without spending; a clamp decided under its own,
    /// lower numbers.
    pub kind: OverrideKind,
}

/// The override that decided one entry of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EntryOverride {
    /// The entry's position in the request.
    pub entry: usize,
    /// Which override.
    pub id: OverrideId,
    /// What it did.
    pub kind: OverrideKind,
}

impl EntryOverride {
    /// The override, without its entry.
    pub const fn applied(&self) -> AppliedOverride {
        AppliedOverride { id: self.id, kind: self.kind }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_written_and_read_as_ovr_and_sixteen_hex_digits() {
        let id = OverrideId(0x00ab_cdef_0123_4567);
        let json = serde_json::to_string(&AppliedOverride { id, kind: OverrideKind::Clamp }).unwrap();

        assert_eq!(json, r#"{"id":"ovr-00abcdef01234567","kind":"clamp"}"#);
        assert_eq!(serde_json::from_str::<AppliedOverride>(&json).unwrap().id, id);
        for bad in ["ovr-123", "ovr-000000000000000g", "x-0000000000000000", "ovr-00000000000000000"] {
            assert_eq!(OverrideId::parse(bad), None, "{bad}");
        }
    }
}

//! How the string forms people write by hand are read: a rate (`"100/minute"`), a
//! duration (`"500ms"`) and an algorithm's name (`"token_bucket"`), each with an error
//! that says what was expected and a schema with the same pattern or list.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use shared_store::{Algorithm, MAX_LOG_ENTRIES};
use std::borrow::Cow;
use std::fmt;

/// A rate as written: `"<n>/<second|minute|hour|day>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSpec {
    /// `<n>`.
    pub amount: u64,
    /// The unit in seconds.
    pub per_secs: u64,
    /// The unit's name.
    pub unit: &'static str,
}

const RATE_EXPECTED: &str = "\"<n>/<second|minute|hour|day>\"";

impl RateSpec {
    /// Parses `"<n>/<unit>"`.
    pub fn parse(text: &str) -> Option<Self> {
        let (amount, unit) = text.split_once('/')?;
        let amount = parse_decimal(amount)?;
        let (per_secs, unit) = match unit {
            "second" => (1, "second"),
            "minute" => (60, "minute"),
            "hour" => (3600, "hour"),
            "day" => (86_400, "day"),
            _ => return None,
        };
        Some(Self { amount, per_secs, unit })
    }
}

/// A decimal integer with no sign, spaces or leading `+`.
fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl<'de> Deserialize<'de> for RateSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RateVisitor;
        impl Visitor<'_> for RateVisitor {
            type Value = RateSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(RATE_EXPECTED)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RateSpec, E> {
                RateSpec::parse(text).ok_or_else(|| E::custom(format!("expected {RATE_EXPECTED}, got {text:?}")))
            }
        }
        deserializer.deserialize_str(RateVisitor)
    }
}

impl Serialize for RateSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{}/{}", self.amount, self.unit))
    }
}

impl JsonSchema for RateSpec {
    fn schema_name() -> Cow<'static, str> {
        "Rate".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A rate: \"<n>/<second|minute|hour|day>\", such as \"100/minute\".",
            "pattern": "^[0-9]+/(second|minute|hour|day)$"
        })
    }
}

/// A duration as written: `"<n><ms|s|m|h|d>"`, kept in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSpec {
    /// The length in milliseconds (saturating; validation rejects what does not fit).
    pub millis: u128,
    /// As written, for messages.
    pub amount: u64,
    /// The unit as written.
    pub unit: &'static str,
}

const DURATION_EXPECTED: &str = "a duration \"<n><ms|s|m|h|d>\" such as \"500ms\" or \"1m\"";

impl DurationSpec {
    /// Parses `"<n><unit>"`.
    pub fn parse(text: &str) -> Option<Self> {
        let split = text.find(|c: char| !c.is_ascii_digit())?;
        let (amount, unit) = text.split_at(split);
        let amount = parse_decimal(amount)?;
        let (factor, unit): (u128, &'static str) = match unit {
            "ms" => (1, "ms"),
            "s" => (1_000, "s"),
            "m" => (60_000, "m"),
            "h" => (3_600_000, "h"),
            "d" => (86_400_000, "d"),
            _ => return None,
        };
        Some(Self { millis: u128::from(amount) * factor, amount, unit })
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = DurationSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(DURATION_EXPECTED)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<DurationSpec, E> {
                DurationSpec::parse(text)
                    .ok_or_else(|| E::custom(format!("expected {DURATION_EXPECTED}, got {text:?}")))
            }
        }
        deserializer.deserialize_str(DurationVisitor)
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{}{}", self.amount, self.unit))
    }
}

impl JsonSchema for DurationSpec {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A duration: \"<n><ms|s|m|h|d>\", such as \"500ms\", \"10s\" or \"1m\".",
            "pattern": "^[0-9]+(ms|s|m|h|d)$"
        })
    }
}

/// A policy's algorithm, by its name: the names, and the list an unknown name is told,
/// are [`Algorithm`]'s (`shared_store`'s one list); the filter adds what each means to
/// a policy ([`meaning`]). Default `token_bucket`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawAlgorithm(pub Algorithm);

impl Default for RawAlgorithm {
    fn default() -> Self {
        Self(Algorithm::TokenBucket)
    }
}

/// What an algorithm does with a policy's numbers, for the schema.
fn meaning(algorithm: Algorithm) -> String {
    match algorithm {
        Algorithm::TokenBucket => "Token bucket (GCRA): `rate` and `burst`.".to_owned(),
        Algorithm::LeakyBucket => {
            "Shaping: requests leave at `rate`, waiting up to `max_wait` in a queue of `queue` units.".to_owned()
        }
        Algorithm::FixedWindow => "At most `limit` per clock-aligned `window`.".to_owned(),
        Algorithm::SlidingWindow => "Weighted two-window estimate of the trailing `window`.".to_owned(),
        Algorithm::SlidingLog => {
            format!("Exact count over the trailing `window` (`limit` at most {MAX_LOG_ENTRIES}).")
        }
        Algorithm::Concurrency => "At most `limit` requests in flight at once per key, across the proxy's workers; a\n\
                                   slot is given back when the request's stream ends. Local only: no `global`,\n\
                                   `cost`, `unit` or `shadow`."
            .to_owned(),
    }
}

impl<'de> Deserialize<'de> for RawAlgorithm {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AlgorithmVisitor;
        impl Visitor<'_> for AlgorithmVisitor {
            type Value = RawAlgorithm;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an algorithm's name")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawAlgorithm, E> {
                Algorithm::from_name(text).map(RawAlgorithm).ok_or_else(|| {
                    let names: Vec<String> = Algorithm::ALL.iter().map(|a| format!("`{a}`")).collect();
                    E::custom(format!("unknown variant `{text}`, expected one of {}", names.join(", ")))
                })
            }
        }
        deserializer.deserialize_str(AlgorithmVisitor)
    }
}

impl Serialize for RawAlgorithm {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.name())
    }
}

impl JsonSchema for RawAlgorithm {
    fn schema_name() -> Cow<'static, str> {
        "RawAlgorithm".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let one_of: Vec<serde_json::Value> = Algorithm::ALL
            .iter()
            .map(|a| serde_json::json!({ "const": a.name(), "description": meaning(*a), "type": "string" }))
            .collect();
        json_schema!({ "description": "The admission algorithm.", "oneOf": one_of })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_every_unit() {
        assert_eq!(RateSpec::parse("100/minute").map(|r| (r.amount, r.per_secs)), Some((100, 60)));
        assert_eq!(RateSpec::parse("1/day").map(|r| r.per_secs), Some(86_400));
        assert_eq!(RateSpec::parse("10/fortnight"), None);
        assert_eq!(RateSpec::parse("-1/second"), None);
        assert_eq!(RateSpec::parse(" 1/second"), None);
        assert_eq!(RateSpec::parse("1/seconds"), None);
    }

    #[test]
    fn every_algorithm_is_read_by_its_name_and_an_unknown_name_is_told_the_list() {
        for algorithm in Algorithm::ALL {
            let read: RawAlgorithm = serde_json::from_value(serde_json::json!(algorithm.name())).unwrap();
            assert_eq!(read, RawAlgorithm(algorithm));
            assert_eq!(serde_json::to_value(read).unwrap(), serde_json::json!(algorithm.name()));
        }
        let error = serde_json::from_str::<RawAlgorithm>("\"gcra\"").unwrap_err().to_string();
        for algorithm in Algorithm::ALL {
            assert!(error.contains(&format!("`{algorithm}`")), "{error}");
        }
    }

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(DurationSpec::parse("500ms").map(|d| d.millis), Some(500));
        assert_eq!(DurationSpec::parse("2m").map(|d| d.millis), Some(120_000));
        assert_eq!(DurationSpec::parse("1d").map(|d| d.millis), Some(86_400_000));
        assert_eq!(DurationSpec::parse("1"), None);
        assert_eq!(DurationSpec::parse("ms"), None);
        assert_eq!(DurationSpec::parse("1.5s"), None);
    }
}

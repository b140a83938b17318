//! How the string forms people write by hand are read: a rate (`"100/minute"`) and a
//! duration (`"500ms"`), each with an error that says what was expected and a schema
//! with the same pattern.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
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
    fn durations_parse_in_every_unit() {
        assert_eq!(DurationSpec::parse("500ms").map(|d| d.millis), Some(500));
        assert_eq!(DurationSpec::parse("2m").map(|d| d.millis), Some(120_000));
        assert_eq!(DurationSpec::parse("1d").map(|d| d.millis), Some(86_400_000));
        assert_eq!(DurationSpec::parse("1"), None);
        assert_eq!(DurationSpec::parse("ms"), None);
        assert_eq!(DurationSpec::parse("1.5s"), None);
    }
}

//! Durations as scenarios write them: `250ms`, `2s`, `1m30s` (humantime's syntax), and a
//! signed form for clock steps (`-2s`).

use serde::{Deserialize, Deserializer, de};
use std::time::Duration;

/// A non-negative duration (`"250ms"`, `"10s"`, `"2m"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span(pub Duration);

impl Span {
    /// Nanoseconds, saturating.
    pub fn nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Seconds, as a float (for rates).
    pub fn secs(self) -> f64 {
        self.0.as_secs_f64()
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(text.trim())
            .map(Span)
            .map_err(|e| de::Error::custom(format!("{text:?} is not a duration such as \"250ms\" or \"2s\": {e}")))
    }
}

/// A signed duration (`"-2s"`, `"+500ms"`, `"3s"`), in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step(pub i64);

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let trimmed = text.trim();
        let (sign, rest) = match trimmed.strip_prefix('-') {
            Some(rest) => (-1, rest),
            None => (1, trimmed.strip_prefix('+').unwrap_or(trimmed)),
        };
        let span = humantime::parse_duration(rest)
            .map_err(|e| de::Error::custom(format!("{text:?} is not a signed duration such as \"-2s\": {e}")))?;
        let nanos = i64::try_from(span.as_nanos()).map_err(|_| de::Error::custom(format!("{text:?} is too long")))?;
        Ok(Self(sign * nanos))
    }
}

//! How a policy's cost is written: a constant, a request header's value, or a cost the
//! response reports with the estimate spent before it; one object whose fields say which
//! form it is, so that a mistake names the form the author meant.

use schemars::JsonSchema;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A request's cost: a constant, read from a request header, or known only from the
/// response (a language model's token usage), with an estimate spent at admission.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RawCost {
    /// Every request costs this much (at least 1).
    Constant(u64),
    /// The cost is read from a request header.
    Header(RawHeaderCost),
    /// The cost is read from the response; an estimate is spent at admission and settled
    /// to it when the response has been read.
    Response(RawResponseCost),
}

const COST_EXPECTED: &str = "a positive integer, an object {\"header\", \"max\", \"min\", \"default\"}, or an \
                             object {\"response_header\" or \"response_json\", \"estimate\", \"max\", \"on_unknown\"}";

impl<'de> Deserialize<'de> for RawCost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> Visitor<'de> for CostVisitor {
            type Value = RawCost;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(COST_EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, cost: u64) -> Result<RawCost, E> {
                Ok(RawCost::Constant(cost))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawCost, A::Error> {
                RawCostFields::deserialize(de::value::MapAccessDeserializer::new(map))?.into_cost()
            }
        }
        deserializer.deserialize_any(CostVisitor)
    }
}

/// Every field a cost object may have; which ones are present says which form it is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCostFields {
    header: Option<String>,
    default: Option<u64>,
    min: Option<u64>,
    max: Option<u64>,
    response_header: Option<String>,
    response_json: Option<String>,
    estimate: Option<Box<RawCost>>,
    on_unknown: Option<RawOnUnknown>,
}

impl RawCostFields {
    fn into_cost<E: de::Error>(self) -> Result<RawCost, E> {
        let Self { header, default, min, max, response_header, response_json, estimate, on_unknown } = self;
        let max = max.ok_or_else(|| E::missing_field("max"))?;
        if response_header.is_none() && response_json.is_none() {
            let header = header.ok_or_else(|| {
                E::custom("expected one of `header` (a request header), `response_header` or `response_json`")
            })?;
            if estimate.is_some() || on_unknown.is_some() {
                return Err(E::custom("`estimate` and `on_unknown` belong to a cost read from the response"));
            }
            return Ok(RawCost::Header(RawHeaderCost { header, default, min, max }));
        }
        if header.is_some() || default.is_some() || min.is_some() {
            return Err(E::custom(
                "a cost read from the response takes `estimate`, `max` and `on_unknown`, not `header`, `min` or \
                 `default` (put a request header in `estimate`)",
            ));
        }
        let estimate = estimate.ok_or_else(|| E::missing_field("estimate"))?;
        Ok(RawCost::Response(RawResponseCost { response_header, response_json, estimate, max, on_unknown }))
    }
}

/// A cost read from a request header as a decimal integer, clamped to `[min, max]`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderCost {
    /// Lower-case header name.
    pub header: String,
    /// The cost when the header is missing or not a decimal integer. Default: `min`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<u64>,
    /// The smallest cost (at least 1). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// The largest cost; at most the policy's capacity.
    pub max: u64,
}

/// A cost the response reports (exactly one of `response_header` and `response_json`):
/// `estimate` is spent at admission (a request is admitted only if it fits), and when the
/// response has been read the spend is settled to the reported cost, clamped to `max`:
/// the difference is charged (into debt, if the budget has run out meanwhile) or given
/// back. `token_bucket`, `fixed_window` and `sliding_window` policies, local only.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawResponseCost {
    /// Lower-case name of a response header holding the cost as a decimal integer
    /// (`x-usage-total-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header: Option<String>,
    /// Dotted path of a number in the JSON response body (`usage.total_tokens`, the OpenAI
    /// schema). A `text/event-stream` response is read event by event as it passes, and
    /// the last event carrying the path gives the cost (OpenAI's
    /// `stream_options.include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_json: Option<String>,
    /// What is spent at admission: a constant, or a request header clamped (`{"header":
    /// "x-max-tokens", "max": 4096}`).
    pub estimate: Box<RawCost>,
    /// The most one request can be charged, whatever the response says.
    pub max: u64,
    /// When the response never reports the cost (no such header or field, a body that is
    /// not JSON or too long to read, a stream that ended early): `"estimate"` (default)
    /// keeps what was spent at admission, a number settles to that cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unknown: Option<RawOnUnknown>,
}

/// What a response-reported cost is when the response does not report it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RawOnUnknown {
    /// `"estimate"`: what was spent at admission stands.
    Estimate(RawEstimateWord),
    /// This cost.
    Cost(u64),
}

/// The word `estimate`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawEstimateWord {
    /// What was spent at admission stands.
    Estimate,
}

impl<'de> Deserialize<'de> for RawOnUnknown {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UnknownVisitor;
        impl Visitor<'_> for UnknownVisitor {
            type Value = RawOnUnknown;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"estimate\" or a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, cost: u64) -> Result<RawOnUnknown, E> {
                Ok(RawOnUnknown::Cost(cost))
            }
            fn visit_str<E: de::Error>(self, word: &str) -> Result<RawOnUnknown, E> {
                match word {
                    "estimate" => Ok(RawOnUnknown::Estimate(RawEstimateWord::Estimate)),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(UnknownVisitor)
    }
}

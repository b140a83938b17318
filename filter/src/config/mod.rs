//! Configuration: one JSON document, parsed strictly ([`raw`]) and validated into the
//! compiled form ([`Config`]) that the request path uses.
//!
//! Every error names the field it is about and what was expected, for example
//! `policies[1].rate: expected "<n>/<second|minute|hour|day>", got "10/fortnight"`.
//! Parsing stops at the first malformed value (the JSON cannot be read past it);
//! validation then reports every semantic problem it finds, one per line. Values the
//! admission arithmetic cannot represent are rejected here, never discovered per request.
//!
//! # Layout
//!
//! One job a module, importing only downwards (`filter/tests/layers.rs` checks it):
//!
//! * at the bottom, the two forms and the error: `model` (the validated configuration,
//!   re-exported here, with [`global`] for global policies), [`raw`] (the JSON as
//!   written, and its schema) and `error` ([`ConfigError`]);
//! * above them, the two steps: `parse` (JSON → raw, [`parse()`]) and `validate` (raw →
//!   model, per policy, limit, cost, key, match, response and global settings);
//! * on top, this module: the map, the re-exports, and [`Config::from_json`].

mod error;
mod model;
mod parse;
pub mod raw;
mod validate;

pub use error::{ConfigError, Issue};
pub use model::Config;
pub use model::bounds::{self, Written};
pub use model::global::{self, Breaker, CounterService, Global, Lease, Secret, SecretSource, Strategy};
pub use model::policy::{
    DEFAULT_FAILURE_STATUS, DEFAULT_SLOTS, FailureOutcome, MAX_CONFIGURED_AMOUNT, MAX_SLOTS, MAX_WAIT, Policy,
};
pub use model::request::{Cost, HeaderCondition, KeyPart, Matcher, MissingKey, ResponseCost, Usage};
pub use model::response::{
    DEFAULT_MAX_PAUSED, DEFAULT_STATUS, DEFAULT_TICK_MS, HeaderSets, MAX_BODY, Response, Shaping,
};
pub use parse::parse;
pub use raw::json_schema;

impl Config {
    /// Parses and validates a configuration.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] with the path of the first malformed value, or
    /// [`ConfigError::Invalid`] listing every semantic problem.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let raw = parse(bytes)?;
        validate::validate(raw)
    }
}

#[cfg(test)]
mod tests;

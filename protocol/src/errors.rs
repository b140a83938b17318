//! Every error the counter service answers with: one [`ErrorCode`] per cause, its name on
//! the wire (`{"error": {"code": "store_full", …}}`) and its HTTP status. The service
//! answers only these, the filter and the lab read them back through the same enum, and
//! the service's README lists them (a test holds the list to this one).

use std::fmt;

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = ($name:literal, $status:literal),)*) => {
        /// A stable, machine-readable reason for an error answer.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, once.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            /// Its name on the wire.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The HTTP status it is answered with.
            pub const fn status(self) -> u16 {
                match self {
                    $(Self::$variant => $status,)*
                }
            }
        }
    };
}

error_codes! {
    /// Not JSON, truncated, trailing characters.
    MalformedJson = ("malformed_json", 400),
    /// A field the API does not have.
    UnknownField = ("unknown_field", 400),
    /// A required field is absent.
    MissingField = ("missing_field", 400),
    /// A wrong type or a number out of range.
    InvalidValue = ("invalid_value", 400),
    /// `limit.algorithm` names no algorithm the service decides.
    UnknownAlgorithm = ("unknown_algorithm", 400),
    /// A limit whose numbers mean nothing (a zero rate, burst or window).
    InvalidLimit = ("invalid_limit", 400),
    /// Numbers outside the numeric envelope.
    OutsideEnvelope = ("outside_envelope", 400),
    /// A cost no state of the limit could ever admit.
    CostExceedsCapacity = ("cost_exceeds_capacity", 400),
    /// A check without entries.
    NoEntries = ("no_entries", 400),
    /// More entries than `--max-entries`.
    TooManyEntries = ("too_many_entries", 400),
    /// A batch (`POST /v1/checks`) without checks.
    NoChecks = ("no_checks", 400),
    /// A batch of more checks than one call carries (`MAX_CHECKS_PER_CALL`).
    TooManyChecks = ("too_many_checks", 400),
    /// Several entries without a tag.
    TagRequired = ("tag_required", 400),
    /// A tag empty, too long or with braces.
    InvalidTag = ("invalid_tag", 400),
    /// A key empty or too long; a keyed override's values out of bounds.
    InvalidKey = ("invalid_key", 400),
    /// The same counter twice in one check.
    DuplicateEntry = ("duplicate_entry", 400),
    /// A lease of an algorithm that cannot be leased.
    LeaseUnsupported = ("lease_unsupported", 400),
    /// A lease's `tokens` or `min_tokens` out of range.
    InvalidTokens = ("invalid_tokens", 400),
    /// A lease's or an override's `ttl_ms` out of range.
    InvalidTtl = ("invalid_ttl", 400),
    /// A charge of an algorithm that cannot be charged.
    NotChargeable = ("not_chargeable", 400),
    /// A charge's `max_debt` above the limit's capacity.
    InvalidMaxDebt = ("invalid_max_debt", 400),
    /// A `charge_id` of the wrong form.
    InvalidChargeId = ("invalid_charge_id", 400),
    /// A credit of an algorithm that cannot be credited.
    NotCreditable = ("not_creditable", 400),
    /// A `credit_id` of the wrong form.
    InvalidCreditId = ("invalid_credit_id", 400),
    /// An `id_ttl_ms` out of range, or without an id.
    InvalidIdTtl = ("invalid_id_ttl", 400),
    /// The body could not be read.
    BodyUnreadable = ("body_unreadable", 400),
    /// An override's `kind` is neither `bypass` nor `clamp`.
    InvalidKind = ("invalid_kind", 400),
    /// A policy name of the wrong form.
    InvalidPolicy = ("invalid_policy", 400),
    /// An override for a policy no proxy has named.
    UnknownPolicy = ("unknown_policy", 400),
    /// A clamp its policy cannot be decided with.
    InvalidClamp = ("invalid_clamp", 400),
    /// A keyed override on a service without the filters' hash key.
    NoHashKey = ("no_hash_key", 400),
    /// An override's `reason` empty, too long or with control characters.
    InvalidReason = ("invalid_reason", 400),
    /// An override's `operator` empty, too long or with control characters.
    InvalidOperator = ("invalid_operator", 400),
    /// The request lacks the proxies' bearer token.
    Unauthorized = ("unauthorized", 401),
    /// The admin request lacks the admin token.
    AdminUnauthorized = ("admin_unauthorized", 401),
    /// No such route.
    NotFound = ("not_found", 404),
    /// The admin API is not enabled.
    AdminDisabled = ("admin_disabled", 404),
    /// No live override has this id.
    OverrideNotFound = ("override_not_found", 404),
    /// A method the route does not serve.
    MethodNotAllowed = ("method_not_allowed", 405),
    /// The body did not arrive in time.
    RequestTimeout = ("request_timeout", 408),
    /// As many overrides are live as the service keeps.
    TooManyOverrides = ("too_many_overrides", 409),
    /// The body is larger than `--max-body-bytes`.
    BodyTooLarge = ("body_too_large", 413),
    /// A bug: the service could not make its answer.
    Internal = ("internal", 500),
    /// The store did not answer within its deadline, or failed.
    StoreUnavailable = ("store_unavailable", 503),
    /// The memory store is full of active keys, or of live charge and credit ids.
    StoreFull = ("store_full", 503),
    /// More requests in flight than `--max-in-flight`.
    Overloaded = ("overloaded", 503),
}

impl ErrorCode {
    /// The code named `name`, if the service answers one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|code| code.name() == name)
    }

    /// Whether the failure is of this one request, not of the service: another request
    /// may well succeed now (a full store refuses new keys only; `overloaded` sheds some).
    /// A proxy's circuit breaker does not count these.
    pub const fn is_per_request(self) -> bool {
        matches!(self, Self::StoreFull | Self::Overloaded)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_name_of_its_own_and_is_found_by_it() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(code.name()), Some(*code));
            assert!((400..600).contains(&code.status()), "{code}");
        }
    }
}

//! What a policy reads from a request: the parts of the caller's key, the conditions
//! that decide whether it applies, its cost, and what a missing key part does.

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// A request header's value.
    Header(String),
    /// The host's `source.address`, masked to these prefix lengths.
    ClientAddress {
        /// IPv4 prefix length.
        ipv4_prefix: u8,
        /// IPv6 prefix length.
        ipv6_prefix: u8,
    },
    /// `:authority`.
    Authority,
    /// `:path` without the query.
    Path,
    /// `:method`.
    Method,
    /// A query parameter's value.
    QueryParameter(String),
    /// A host property.
    Property(Vec<String>),
    /// A constant.
    Constant(String),
}

/// When a policy applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// Path (without query) must equal this.
    pub path_exact: Option<String>,
    /// Path (without query) must start with this.
    pub path_prefix: Option<String>,
    /// Method must be one of these.
    pub methods: Option<Vec<String>>,
    /// Header conditions.
    pub headers: Vec<HeaderCondition>,
}

/// A header condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderCondition {
    /// Present (`true`) or absent (`false`).
    Present(String, bool),
    /// Equal to these bytes.
    Equals(String, String),
}

/// Cost of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Always this.
    Constant(u64),
    /// From a header, clamped.
    Header {
        /// Header name.
        name: String,
        /// When missing or unparsable.
        default: u64,
        /// Lower bound.
        min: u64,
        /// Upper bound.
        max: u64,
    },
    /// Reported by the response: an estimate is spent at admission and settled to it.
    Response(ResponseCost),
}

impl Cost {
    /// The most one request spends at admission.
    pub fn max(&self) -> u64 {
        match self {
            Self::Constant(cost) => *cost,
            Self::Header { max, .. } => *max,
            Self::Response(response) => response.estimate.max(),
        }
    }

    /// The settlement rule, when the response reports the cost.
    pub const fn settled(&self) -> Option<&ResponseCost> {
        match self {
            Self::Response(response) => Some(response),
            Self::Constant(_) | Self::Header { .. } => None,
        }
    }
}

/// A cost the response reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    /// Where the response reports it.
    pub usage: Usage,
    /// What admission spends: a constant or a request header (never another response cost).
    pub estimate: Box<Cost>,
    /// The most a request is charged, whatever the response says.
    pub max: u64,
    /// The cost when the response does not report it; `None`: the estimate stands.
    pub on_unknown: Option<u64>,
}

/// Where a response reports its cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    /// A response header's decimal value.
    Header(String),
    /// A number at this path of the JSON body (or of a server-sent event's JSON data).
    Json(Vec<String>),
}

/// What a missing key part does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingKey {
    /// One bucket for every request missing the key.
    Shared,
    /// The policy does not apply.
    Skip,
    /// Reject the request.
    Reject,
}

//! The validated configuration, the form the request path uses: every number in it has
//! been checked, so nothing here is discovered wrong per request.
//!
//! Inside, only downwards: [`bounds`] (every bound and default) at the bottom, then
//! [`request`] (what a policy reads from a request), then [`global`], then [`policy`]
//! and [`response`], and [`Config`] here.

pub mod bounds;
pub mod global;
pub mod policy;
pub mod request;
pub mod response;

use global::CounterService;
use policy::Policy;
use response::{Response, Shaping};

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Policies, in configuration order.
    pub policies: Vec<Policy>,
    /// Rejection response and header choices.
    pub response: Response,
    /// Pausing of shaped requests.
    pub shaping: Shaping,
    /// Metric name prefix.
    pub stat_prefix: String,
    /// How often counts kept in the VM are handed to the proxy; `None`: each at once.
    pub metrics_flush_ms: Option<u32>,
    /// The counter service, for global policies.
    pub counter_service: Option<CounterService>,
}

//! wasm-host (docs to come).

mod abi;
pub mod callout;
pub mod clock;
pub mod headers;
pub mod host;
pub mod logs;
pub mod metrics;
pub mod request;
pub mod serve;
pub mod shared_data;
mod state;
pub mod worker;

pub use callout::{Answer, CalloutFailures, CalloutRequest, Cluster};
pub use clock::{Clock, SystemClock, VirtualClock};
pub use headers::Headers;
pub use host::{FailurePolicy, Host, HostBuilder, HostError, TrapReport, Wasm};
pub use logs::{LogLevel, LogRecord, LogSource};
pub use metrics::{Histogram, MetricKind, MetricValue};
pub use request::{ClientResponse, Exchange, Message, Outcome, Request, Response, ResponseSource, StreamId};
pub use shared_data::{SetOutcome, SharedData};
pub use worker::Worker;

//! sluice-lab: try a rate-limit configuration on traffic and faults before it reaches
//! production. A scenario (YAML) names a fleet, its callers and a timeline of faults; the
//! lab runs the compiled `sluice.wasm`, unchanged, in wasm-host on one virtual clock,
//! several proxies with several workers each, against the counter service's real decision
//! code and memory store ([`service`], shared with the fleet tests in `tests/src/fleet`). Only
//! time and the network are simulated. The report is one self-contained HTML page (inline
//! SVG) and the same data as CSV.
//!
//! # Layout
//!
//! Modules import only downwards, from the bottom:
//!
//! * [`duration`]: durations as scenarios write them.
//! * [`scenario`]: the YAML model, parsed strictly; every error names its line and field.
//! * [`access_log`]: Envoy access logs (the default text format and JSON) as arrivals.
//! * [`service`]: the simulated counter service (the real one's synchronous entry,
//!   `App::handle_now`, no socket).
//! * [`traffic`]: callers → arrivals and retries, from the seed.
//! * [`record`]: what happened, per interval: the filter's own counters, and what each
//!   caller class saw.
//! * [`overshoot`]: the fleet's admissions replayed through an exact reference bucket.
//! * [`run`]: the fleet on the virtual clock.
//! * [`report`]: the verdict, the CSV and the HTML page.

pub mod access_log;
pub mod duration;
pub mod overshoot;
pub mod record;
pub mod report;
pub mod run;
pub mod scenario;
pub mod service;
pub mod traffic;

pub use run::{Lab, Outcome};
pub use scenario::{Scenario, ScenarioError};

//! The engine's unit tests, by the policies they drive: local, check-mode and
//! lease-mode, each in two files (the common path, then failures and stress).

mod check;
mod check_failures;
mod lease;
mod lease_checks;
mod lease_demand;
mod lease_more;
mod lease_returns;
mod local;
mod local_failures;
mod overrides;

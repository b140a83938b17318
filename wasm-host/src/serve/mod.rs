//! placeholder
pub(crate) enum Command {}

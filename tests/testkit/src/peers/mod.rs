//! Which loopback peers the tests talk to: a scripted peer that answers fixed bytes,
//! late, never, or breaks the connection ([`Peer`]); the accept loop test-specific
//! servers are built on ([`AcceptLoop`]); the HTTP/1.1 request reader they share
//! ([`read_request`]); and ports without a listener ([`free_port`], [`refused`]).
//!
//! Every peer binds a port the OS picks (tests read it back with `addr()`), serves each
//! connection on a thread of its own and stops when dropped.

mod accept;
mod http;
mod scripted;

pub use accept::{AcceptLoop, free_port, refused};
pub use http::{Received, read_request};
pub use scripted::{HOLD_LIMIT, Peer, Step};

//! Where a test's loopback peer listens: a port the OS picks, an accept loop on a thread
//! that serves each connection on a thread of its own and stops when dropped, and the
//! ports a test needs without a listener (a free one, a refused one).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// An accept loop on a loopback port (see the module docs).
#[derive(Debug)]
pub struct AcceptLoop {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl AcceptLoop {
    /// Binds a loopback port the OS picks and hands every connection to `serve` on a
    /// thread of its own, with the flag that is set once the loop is dropped (a
    /// connection held open should look at it).
    ///
    /// # Panics
    /// When no loopback port can be bound; the message names `what` listens.
    pub fn start<F>(what: &str, serve: F) -> Self
    where
        F: Fn(TcpStream, &AtomicBool) + Send + Sync + 'static,
    {
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind a loopback port for {what}: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("the address of {what}: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let (stop_, serve) = (Arc::clone(&stop), Arc::new(serve));
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (stop, serve) = (Arc::clone(&stop_), Arc::clone(&serve));
                thread::spawn(move || serve(stream, &stop));
            }
        });
        Self { addr, stop }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AcceptLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// A loopback port that was free a moment ago (bound, then released), for a server that
/// cannot bind port 0 itself.
///
/// # Panics
/// When no loopback port can be bound.
pub fn free_port() -> u16 {
    refused().port()
}

/// A loopback address where nothing listens: connecting to it is refused (the port was
/// free a moment ago and is closed again).
///
/// # Panics
/// When no loopback port can be bound.
pub fn refused() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind a loopback port")
}

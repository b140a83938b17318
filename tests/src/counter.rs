//! A real `sluice-counter` for one test, in this process: its own tokio runtime, a
//! loopback port the OS picks, the memory store or a Redis the test started. It can be
//! killed and started again on the same address, as a crashed service would be
//! restarted behind an Envoy whose cluster points at it.

use sluice_counter::config::{Config, Secret, StoreKind};
use sluice_counter::{Running, store};
use std::net::SocketAddr;

/// A running (or killed) counter service.
pub struct Counter {
    runtime: tokio::runtime::Runtime,
    running: Option<Running>,
    addr: SocketAddr,
    config: Config,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter").field("addr", &self.addr).field("running", &self.running.is_some()).finish()
    }
}

/// The memory store's settings, with the defaults.
pub fn memory() -> Config {
    Config::defaults()
}

/// A Redis store at `url`.
pub fn redis(url: &str) -> Config {
    Config { store: StoreKind::Redis, redis_url: vec![url.to_owned()], ..Config::defaults() }
}

/// `config` requiring `token` from callers.
pub fn with_token(config: Config, token: &str) -> Config {
    Config { token: Some(Secret::from(token.to_owned())), ..config }
}

impl Counter {
    /// Starts a service with `config` on a loopback port the OS picks.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start(config: Config) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the counter service");
        let (running, addr) = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
            let running = Running::start(listener, config.clone()).await.expect("sluice-counter starts");
            let addr = running.addr;
            (running, addr)
        });
        Self { runtime, running: Some(running), addr, config }
    }

    /// Where it listens (also after a kill: a restart listens there again).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The store, to inspect counters.
    ///
    /// # Panics
    /// When the service is not running.
    pub fn store(&self) -> &store::CounterStore {
        self.running.as_ref().expect("the counter service is running").app.store()
    }

    /// One of its Prometheus metrics without labels (such as
    /// `sluice_counter_leased_tokens_total`); 0 when absent or not running.
    pub fn metric(&self, name: &str) -> u64 {
        let Some(running) = &self.running else { return 0 };
        let text = running.app.metrics().render(running.app.store());
        text.lines()
            .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .next()
            .unwrap_or(0)
    }

    /// Stops it abruptly, as a crash would: connections dropped, nothing drained.
    pub fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = self.runtime.block_on(running.kill());
        }
    }

    /// Starts it again on the same address, with the same configuration.
    ///
    /// # Panics
    /// When the address cannot be bound again.
    pub fn restart(&mut self) {
        self.kill();
        let (addr, config) = (self.addr, self.config.clone());
        let running = self.runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.expect("bind the counter's address again");
            Running::start(listener, config).await.expect("sluice-counter restarts")
        });
        self.running = Some(running);
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.kill();
    }
}

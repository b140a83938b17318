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
    /// Where it reads the variables its configuration names (also on a restart).
    env: Env,
}

type Env = std::sync::Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

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

/// The environment variables [`Counter::start_with_admin`]'s service reads its admin
/// token and the filters' hash key from.
pub const ADMIN_TOKEN_ENV: &str = "TEST_SLUICE_ADMIN_TOKEN";
/// See [`ADMIN_TOKEN_ENV`].
pub const HASH_KEY_ENV: &str = "TEST_SLUICE_HASH_KEY";

/// `config` serving the admin API (its token and the filters' hash key read from
/// [`ADMIN_TOKEN_ENV`] and [`HASH_KEY_ENV`]), sweeping every `sweep_ms`.
pub fn with_admin(config: Config, sweep_ms: u64) -> Config {
    Config {
        admin_token_env: Some(ADMIN_TOKEN_ENV.to_owned()),
        hash_key_env: Some(HASH_KEY_ENV.to_owned()),
        sweep_interval_ms: sweep_ms,
        ..config
    }
}

/// `sluice-counter override ...`, parsed as the binary parses it.
#[derive(Debug, clap::Parser)]
struct OverrideCli {
    #[command(subcommand)]
    command: sluice_counter::cli::OverrideCommand,
}

impl Counter {
    /// Starts a service with `config` ([`with_admin`]) whose admin token is `admin_token`
    /// and whose filters hash keys with `hash_key`.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start_with_admin(config: Config, admin_token: &str, hash_key: &str) -> Self {
        let (admin_token, hash_key) = (admin_token.to_owned(), hash_key.to_owned());
        Self::start_with(config, move |name| match name {
            ADMIN_TOKEN_ENV => Some(admin_token.clone()),
            HASH_KEY_ENV => Some(hash_key.clone()),
            _ => None,
        })
    }

    /// Runs `sluice-counter override <args>` against this service, with `token` as the
    /// admin token: what it prints, or its error.
    ///
    /// # Errors
    /// What the CLI reports: the service's refusal (`401 admin_unauthorized: ...`), or a
    /// connection failure.
    pub fn override_cli(&self, args: &[&str], token: &str) -> anyhow::Result<String> {
        let url = format!("http://{}", self.addr);
        let argv = std::iter::once("override").chain(args.iter().copied()).chain(["--url", &url]);
        let argv = argv.chain(["--admin-token-env", "CLI_ADMIN_TOKEN"]);
        let cli = <OverrideCli as clap::Parser>::try_parse_from(argv)?;
        let token = token.to_owned();
        self.runtime.block_on(cli.command.run(move |name| (name == "CLI_ADMIN_TOKEN").then(|| token.clone())))
    }

    /// Starts a service with `config` on a loopback port the OS picks.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start(config: Config) -> Self {
        Self::start_with(config, |name| std::env::var(name).ok())
    }

    fn start_with(config: Config, env: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        let env: Env = std::sync::Arc::new(env);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the counter service");
        let (running, addr) = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
            let lookup = env.clone();
            let running = Running::start_with_env(listener, config.clone(), move |name| lookup(name))
                .await
                .expect("sluice-counter starts");
            let addr = running.addr;
            (running, addr)
        });
        Self { runtime, running: Some(running), addr, config, env }
    }

    /// Starts a memory-store service with `config` whose counters read `clock` (a
    /// [`shared_store::ManualClock`] holds every window still), on a loopback port the OS
    /// picks. It cannot be restarted.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start_on_clock(config: Config, clock: std::sync::Arc<dyn shared_store::Clock + Send + Sync>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the counter service");
        let store = store::CounterStore::Memory(store::MemoryCounters::with_clock(config.memory(), clock));
        let (running, addr) = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
            let running =
                Running::start_with_store(listener, config.clone(), store).expect("sluice-counter starts on the clock");
            let addr = running.addr;
            (running, addr)
        });
        Self { runtime, running: Some(running), addr, config, env: std::sync::Arc::new(|_| None) }
    }

    /// Where its RLS front door listens, when it serves one (`--rls-config`).
    pub fn rls_addr(&self) -> Option<SocketAddr> {
        self.running.as_ref()?.rls.as_ref().map(|front| front.addr)
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

    /// One of its Prometheus series, by its name and labels as rendered (such as
    /// `sluice_counter_leased_tokens_total`, or `sluice_counter_decisions_total{outcome="admitted"}`);
    /// 0 when absent or not running.
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
        let (addr, config, env) = (self.addr, self.config.clone(), self.env.clone());
        let running = self.runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.expect("bind the counter's address again");
            Running::start_with_env(listener, config, move |name| env(name)).await.expect("sluice-counter restarts")
        });
        self.running = Some(running);
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.kill();
    }
}

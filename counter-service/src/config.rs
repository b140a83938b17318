//! How the service is configured: its command-line flags and environment variables.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use shared_store::HashKey;
use sluice_protocol::{DEFAULT_MAX_ENTRIES, MAX_ENTRIES_LIMIT};

use crate::auth::{Auth, Token};
use crate::store::memory::DEFAULT_MAX_CHARGE_IDS;
use crate::store::{MemoryConfig, RedisConfig, RedisUrl, Topology};

/// The default listen address: loopback only, port 8710.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8710";
/// The default RLS listen address (with `--rls-config`): loopback, envoyproxy/ratelimit's
/// gRPC port.
pub const DEFAULT_RLS_LISTEN: &str = "127.0.0.1:8081";

/// Which store holds the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// In this process (one instance, no setup).
    Memory,
    /// A standalone Redis server.
    Redis,
    /// A Redis Cluster (give one or more seed nodes).
    RedisCluster,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// The shortest hash key, as the filter requires of its `hash_key`.
pub const MIN_HASH_KEY_BYTES: usize = 16;
/// The longest hash key, as the filter allows.
pub const MAX_HASH_KEY_BYTES: usize = 4096;

/// What the admin API is served with ([`Config::admin`]).
#[derive(Clone, Debug, Default)]
pub struct AdminAccess {
    /// The admin token; `None`: the admin API is not served.
    pub token: Option<Token>,
    /// The filters' global hash key (derived from `--hash-key-env` as the filter derives
    /// it); `None`: overrides cannot be keyed.
    pub hash_key: Option<HashKey>,
}

/// A secret as given on the command line or in the environment: kept as is until
/// [`Config::auth`] validates it, and never shown by `Debug` (nor echoed by a parse
/// error, since parsing it cannot fail).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// sluice-counter: the central counter service for Sluice's global rate-limit policies.
///
/// Every flag can also be set from the environment variable named beside it.
///
/// Its `Debug` form hides the token and the Redis URLs' credentials (as `--help` hides
/// both variables' values).
#[derive(Clone, PartialEq, Eq, Parser)]
#[command(name = "sluice-counter", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "SLUICE_COUNTER_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Where counters live.
    #[arg(long, env = "SLUICE_COUNTER_STORE", value_enum, default_value_t = StoreKind::Memory)]
    pub store: StoreKind,

    /// Redis URL(s), comma-separated: one for `redis`, seed nodes for `redis-cluster`.
    /// A password (`redis://user:password@host`) is never shown: not by `--help`, in a
    /// log line, an error or a `Debug` print (each shows `redis://***@host`).
    #[arg(
        long,
        env = "SLUICE_COUNTER_REDIS_URL",
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: Vec<String>,

    /// Redis connections in the pool (per node on a cluster); each is multiplexed.
    #[arg(long, env = "SLUICE_COUNTER_REDIS_POOL_SIZE", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub redis_pool_size: u16,

    /// Deadline of one call to Redis, in milliseconds; past it the request gets 503
    /// `store_unavailable`.
    #[arg(long, env = "SLUICE_COUNTER_REDIS_TIMEOUT_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub redis_timeout_ms: u64,

    /// Deadline of one connection attempt to Redis, in milliseconds.
    #[arg(long, env = "SLUICE_COUNTER_REDIS_CONNECT_TIMEOUT_MS", default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub redis_connect_timeout_ms: u64,

    /// Requests served at once; more get 503 `overloaded` at once.
    #[arg(long, env = "SLUICE_COUNTER_MAX_IN_FLIGHT", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_in_flight: u32,

    /// Client connections held at once; more are closed as soon as they are accepted.
    #[arg(long, env = "SLUICE_COUNTER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// How long a request's body may take to arrive once its headers are in, in
    /// milliseconds; past it the request gets 408 `request_timeout` (and an HTTP/1.1
    /// connection is closed). A request takes a `--max-in-flight` permit only once its
    /// body is whole.
    #[arg(long, env = "SLUICE_COUNTER_REQUEST_TIMEOUT_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub request_timeout_ms: u64,

    /// Largest request body, in bytes.
    #[arg(long, env = "SLUICE_COUNTER_MAX_BODY_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
    pub max_body_bytes: u32,

    /// Most entries in one check (the filter refuses configurations that could need more
    /// than the default).
    #[arg(
        long,
        env = "SLUICE_COUNTER_MAX_ENTRIES",
        default_value_t = DEFAULT_MAX_ENTRIES,
        value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_ENTRIES_LIMIT))
    )]
    pub max_entries: u16,

    /// Memory store: most keys held at once.
    #[arg(long, env = "SLUICE_COUNTER_MEMORY_MAX_KEYS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub memory_max_keys: u64,

    /// Memory store: most charge and credit ids remembered at once (47 to 94 bytes each).
    #[arg(long, env = "SLUICE_COUNTER_MEMORY_MAX_CHARGE_IDS", default_value_t = DEFAULT_MAX_CHARGE_IDS as u64, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub memory_max_charge_ids: u64,

    /// Memory store: number of shards.
    #[arg(long, env = "SLUICE_COUNTER_MEMORY_SHARDS", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub memory_shards: u16,

    /// Memory store: how often idle keys are dropped, in milliseconds.
    #[arg(long, env = "SLUICE_COUNTER_SWEEP_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub sweep_interval_ms: u64,

    /// Longest wait for requests in flight at shutdown, in milliseconds.
    #[arg(long, env = "SLUICE_COUNTER_SHUTDOWN_GRACE_MS", default_value_t = 5000)]
    pub shutdown_grace_ms: u64,

    /// File holding the bearer token callers must present on `/v1/*` (`authorization:
    /// Bearer <token>`; trailing line breaks are ignored). Without a token (or
    /// `--token`), anyone who can connect may call the service.
    #[arg(long, env = "SLUICE_COUNTER_TOKEN_FILE", value_name = "PATH", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,

    /// The bearer token itself. Prefer `--token-file` or the environment variable:
    /// a flag's value shows in `ps`.
    #[arg(long, env = "SLUICE_COUNTER_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<Secret>,

    /// The environment variable holding the admin token: the bearer token of the admin
    /// API (`/admin/v1/overrides`), which must differ from the proxies' token. Without
    /// it, the admin API is not served (`404 admin_disabled`).
    #[arg(long, env = "SLUICE_COUNTER_ADMIN_TOKEN_ENV", value_name = "NAME")]
    pub admin_token_env: Option<String>,

    /// The environment variable holding the hash key the filters hash global keys with
    /// (their `counter_service.hash_key_env`): the admin API hashes an override's key
    /// values with it, as the filters do. Without it, overrides cannot be keyed.
    #[arg(long, env = "SLUICE_COUNTER_HASH_KEY_ENV", value_name = "NAME")]
    pub hash_key_env: Option<String>,

    /// A directory of envoyproxy/ratelimit YAML files: serve Envoy's rate limit service
    /// protocol (RLS v3, `ShouldRateLimit` over h2c gRPC) on `--rls-listen` under them.
    /// A file that does not load stops the start; changes are picked up without a
    /// restart (see `--rls-reload-ms`). Without it, RLS is not served.
    #[arg(long, env = "SLUICE_COUNTER_RLS_CONFIG", value_name = "DIR")]
    pub rls_config: Option<PathBuf>,

    /// Where RLS is served (its own port: envoyproxy/ratelimit's gRPC port is 8081), with
    /// `--rls-config`.
    #[arg(long, env = "SLUICE_COUNTER_RLS_LISTEN", default_value = DEFAULT_RLS_LISTEN)]
    pub rls_listen: SocketAddr,

    /// How often the RLS directory is read again for changes, in milliseconds.
    #[arg(long, env = "SLUICE_COUNTER_RLS_RELOAD_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub rls_reload_ms: u64,

    /// Let several RLS files add to one domain (envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG`); otherwise a domain defined twice is a load error.
    #[arg(long, env = "SLUICE_COUNTER_RLS_MERGE_DOMAINS")]
    pub rls_merge_domains: bool,

    /// Headers RLS answers ask Envoy to add, comma-separated: `ietf` (`RateLimit-Policy`,
    /// `RateLimit`), `retry-after` (the exact wait, when over the limit), `ratelimit`
    /// (envoyproxy/ratelimit's `RateLimit-Limit`/`-Remaining`/`-Reset`), or `none`.
    #[arg(long, env = "SLUICE_COUNTER_RLS_RESPONSE_HEADERS", default_value = "none")]
    pub rls_response_headers: String,

    /// Answer RLS requests with `dynamic_metadata` (envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA`): the domain, the descriptors, and the `metadata:` of
    /// the rules that passed, which Envoy stores under its filter's `metadata_namespace`.
    #[arg(long, env = "SLUICE_COUNTER_RLS_RESPONSE_DYNAMIC_METADATA")]
    pub rls_response_dynamic_metadata: bool,

    /// Threads that serve calls. By default, the CPUs this process may run on (its
    /// affinity, as `taskset` sets it); with one, the service runs on a current-thread
    /// runtime.
    #[arg(long, env = "SLUICE_COUNTER_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: Option<u16>,

    /// Log filter (tracing `EnvFilter` syntax).
    #[arg(long, env = "SLUICE_COUNTER_LOG", default_value = "info")]
    pub log: String,

    /// Log line format.
    #[arg(long, env = "SLUICE_COUNTER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every field, by name: a field added later cannot be forgotten here.
        let Self {
            listen,
            store,
            redis_url,
            redis_pool_size,
            redis_timeout_ms,
            redis_connect_timeout_ms,
            max_in_flight,
            max_connections,
            request_timeout_ms,
            max_body_bytes,
            max_entries,
            memory_max_keys,
            memory_max_charge_ids,
            memory_shards,
            sweep_interval_ms,
            shutdown_grace_ms,
            token_file,
            token,
            admin_token_env,
            hash_key_env,
            rls_config,
            rls_listen,
            rls_reload_ms,
            rls_merge_domains,
            rls_response_headers,
            rls_response_dynamic_metadata,
            worker_threads,
            log,
            log_format,
        } = self;
        let redis_url: Vec<RedisUrl> = redis_url.iter().map(|u| RedisUrl::new(u.as_str())).collect();
        f.debug_struct("Config")
            .field("listen", listen)
            .field("store", store)
            .field("redis_url", &redis_url)
            .field("redis_pool_size", redis_pool_size)
            .field("redis_timeout_ms", redis_timeout_ms)
            .field("redis_connect_timeout_ms", redis_connect_timeout_ms)
            .field("max_in_flight", max_in_flight)
            .field("max_connections", max_connections)
            .field("request_timeout_ms", request_timeout_ms)
            .field("max_body_bytes", max_body_bytes)
            .field("max_entries", max_entries)
            .field("memory_max_keys", memory_max_keys)
            .field("memory_max_charge_ids", memory_max_charge_ids)
            .field("memory_shards", memory_shards)
            .field("sweep_interval_ms", sweep_interval_ms)
            .field("shutdown_grace_ms", shutdown_grace_ms)
            .field("token_file", token_file)
            .field("token", token)
            .field("admin_token_env", admin_token_env)
            .field("hash_key_env", hash_key_env)
            .field("rls_config", rls_config)
            .field("rls_listen", rls_listen)
            .field("rls_reload_ms", rls_reload_ms)
            .field("rls_merge_domains", rls_merge_domains)
            .field("rls_response_headers", rls_response_headers)
            .field("rls_response_dynamic_metadata", rls_response_dynamic_metadata)
            .field("worker_threads", worker_threads)
            .field("log", log)
            .field("log_format", log_format)
            .finish()
    }
}

impl Config {
    /// The defaults, ignoring the environment (for tests and embedding).
    pub fn defaults() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8710))),
            store: StoreKind::Memory,
            redis_url: vec!["redis://127.0.0.1:6379".to_owned()],
            redis_pool_size: 4,
            redis_timeout_ms: 100,
            redis_connect_timeout_ms: 250,
            max_in_flight: 1024,
            max_connections: 4096,
            request_timeout_ms: 5000,
            max_body_bytes: 65_536,
            max_entries: DEFAULT_MAX_ENTRIES,
            memory_max_keys: 1_000_000,
            memory_max_charge_ids: DEFAULT_MAX_CHARGE_IDS as u64,
            memory_shards: 64,
            sweep_interval_ms: 1000,
            shutdown_grace_ms: 5000,
            token_file: None,
            token: None,
            admin_token_env: None,
            hash_key_env: None,
            rls_config: None,
            rls_listen: DEFAULT_RLS_LISTEN.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8081))),
            rls_reload_ms: 1000,
            rls_merge_domains: false,
            rls_response_headers: "none".to_owned(),
            rls_response_dynamic_metadata: false,
            worker_threads: None,
            log: "info".to_owned(),
            log_format: LogFormat::Text,
        }
    }

    /// Who may call the service: reads `--token-file` or validates `--token`.
    ///
    /// # Errors
    /// A message naming the flag when the file cannot be read, or the token is empty or
    /// not a single run of visible ASCII characters. It never includes the token.
    pub fn auth(&self) -> Result<Auth, String> {
        match (&self.token_file, &self.token) {
            (Some(path), _) => Token::from_file(path).map(Auth::Bearer),
            (None, Some(Secret(text))) => Token::new(text, "--token").map(Auth::Bearer),
            (None, None) => Ok(Auth::Open),
        }
    }

    /// What the admin API is served with: the admin token and the filters' hash key,
    /// read from the environment variables `--admin-token-env` and `--hash-key-env` name
    /// (looked up with `env`); `proxies` is the proxies' auth ([`Config::auth`]), which the
    /// admin token must differ from.
    ///
    /// # Errors
    /// A message naming the flag and the variable when one is missing or malformed, or
    /// the admin token is the proxies' token. It never includes a secret.
    pub fn admin(&self, proxies: &Auth, env: impl Fn(&str) -> Option<String>) -> Result<AdminAccess, String> {
        let read = |flag: &str, name: &str| {
            let source = format!("{flag} {name}");
            env(name)
                .filter(|v| !v.is_empty())
                .map(|v| (v, source.clone()))
                .ok_or_else(|| format!("{source}: the environment variable is not set or empty"))
        };
        let token = match &self.admin_token_env {
            Some(name) => {
                let (text, source) = read("--admin-token-env", name)?;
                let token = Token::new(text.trim_end_matches(['\n', '\r']), &source)?;
                if *proxies == Auth::Bearer(token.clone()) {
                    return Err(format!(
                        "{source}: the admin token must differ from the proxies' token (a proxy must not set overrides)"
                    ));
                }
                Some(token)
            }
            None => None,
        };
        let hash_key = match &self.hash_key_env {
            Some(name) => {
                let (text, source) = read("--hash-key-env", name)?;
                if !(MIN_HASH_KEY_BYTES..=MAX_HASH_KEY_BYTES).contains(&text.len()) {
                    return Err(format!(
                        "{source}: the hash key must be {MIN_HASH_KEY_BYTES} to {MAX_HASH_KEY_BYTES} bytes, as the \
                         filters' hash_key"
                    ));
                }
                if !text.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(format!("{source}: the hash key must be visible ASCII characters, without spaces"));
                }
                Some(shared_store::HashKey::global(text.as_bytes()))
            }
            None => None,
        };
        Ok(AdminAccess { token, hash_key })
    }

    /// The memory store's settings.
    pub fn memory(&self) -> MemoryConfig {
        MemoryConfig {
            shards: usize::from(self.memory_shards),
            max_keys: usize::try_from(self.memory_max_keys).unwrap_or(usize::MAX),
            max_charge_ids: usize::try_from(self.memory_max_charge_ids).unwrap_or(usize::MAX),
        }
    }

    /// The Redis store's settings.
    pub fn redis(&self) -> RedisConfig {
        RedisConfig {
            urls: self.redis_url.iter().map(|u| RedisUrl::new(u.as_str())).collect(),
            topology: if self.store == StoreKind::RedisCluster { Topology::Cluster } else { Topology::Standalone },
            pool_size: usize::from(self.redis_pool_size),
            timeout: Duration::from_millis(self.redis_timeout_ms),
            connect_timeout: Duration::from_millis(self.redis_connect_timeout_ms),
        }
    }
}

/// The CPUs this process may run on: its affinity mask where the platform tells, else 1.
#[must_use]
pub fn cpus_available() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_never_shows_in_the_debug_form_of_the_config() {
        let config = Config::try_parse_from(["sluice-counter", "--token", "hunter2-abc"]).unwrap();

        let shown = format!("{config:?}");

        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(config.auth().unwrap().is_required());
    }

    #[test]
    fn a_redis_password_never_shows_in_the_debug_form_of_the_config() {
        let config =
            Config::try_parse_from(["sluice-counter", "--redis-url", "redis://:hunter2@127.0.0.1:1/0,redis://n2:7000"])
                .unwrap();

        let shown = format!("{config:?} {:?}", config.redis());

        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://***@127.0.0.1:1/0") && shown.contains("redis://n2:7000"), "{shown}");
        assert_eq!(config.redis().urls[0].expose(), "redis://:hunter2@127.0.0.1:1/0", "connections still use it");
    }

    #[test]
    fn a_token_file_and_a_token_cannot_both_be_given() {
        let err =
            Config::try_parse_from(["sluice-counter", "--token", "hunter2-abc", "--token-file", "/t"]).unwrap_err();

        let message = err.to_string();
        assert!(message.contains("--token-file") && !message.contains("hunter2"), "{message}");
    }

    #[test]
    fn an_empty_token_refuses_to_start_naming_the_flag() {
        let config = Config::try_parse_from(["sluice-counter", "--token", ""]).unwrap();

        assert_eq!(config.auth().unwrap_err(), "--token: the token is empty");
    }

    #[test]
    fn max_entries_defaults_to_and_is_bounded_by_the_protocol_constants() {
        let default = Config::try_parse_from(["sluice-counter"]).unwrap();
        let largest = MAX_ENTRIES_LIMIT.to_string();
        let above = (MAX_ENTRIES_LIMIT + 1).to_string();

        assert_eq!(default.max_entries, DEFAULT_MAX_ENTRIES);
        assert_eq!(Config::try_parse_from(["sluice-counter", "--max-entries", &largest]).unwrap().max_entries, 256);
        let err = Config::try_parse_from(["sluice-counter", "--max-entries", &above]).unwrap_err().to_string();
        assert!(err.contains("--max-entries") && err.contains("1..=256"), "{err}");
    }

    #[test]
    fn the_documented_defaults_are_the_flag_defaults() {
        let parsed = Config::try_parse_from(["sluice-counter"]).unwrap();

        assert_eq!(parsed, Config::defaults());
        assert_eq!(parsed.listen.to_string(), DEFAULT_LISTEN);
    }
}

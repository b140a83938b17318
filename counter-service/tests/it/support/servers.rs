//! Which Redis the tests run against: the workspace's `redis-server` processes and
//! 3-master clusters (`sluice_testkit::redis`), the one cluster the behavioural suite
//! shares, and the store configuration that points at them.

use std::sync::OnceLock;
use std::time::Duration;

use sluice_counter::store::{RedisConfig, RedisUrl, Topology};

pub use sluice_testkit::redis::{RedisCluster, RedisServer};

/// The one cluster the behavioural suite shares (creating one takes seconds); tests
/// use distinct tags, and the watchdog stops it when the test process exits.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

pub fn redis_config(urls: Vec<String>, topology: Topology) -> RedisConfig {
    RedisConfig {
        urls: urls.into_iter().map(RedisUrl::new).collect(),
        topology,
        pool_size: 2,
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
    }
}

//! Operator overrides in Redis (see [`crate::store::overrides`] for the layout): each
//! change is one short script on the node owning the `{overrides}` slot.

use super::RedisCounters;
use super::pool::Conn;
use crate::overrides::Override;
use crate::store::CounterStoreError;
use crate::store::overrides::{Expired, INDEX_GRACE_MS, Stored};

/// The index of every override, scored by expiry (Unix ms).
pub const INDEX_KEY: &str = "sluice:{overrides}:index";
/// The overrides' version: changed by every set and removal.
pub const VERSION_KEY: &str = "sluice:{overrides}:version";

/// The Lua that moves the version (KEYS[3]) on: to the later of its value plus one and
/// the time (ARGV[n], ms), with the index's TTL (ARGV[m]).
macro_rules! bump_version {
    ($now:literal, $keep:literal) => {
        concat!(
            "local version = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, tonumber(ARGV[",
            $now,
            "]))\nredis.call('SET', KEYS[3], string.format('%.0f', version), 'PX', ARGV[",
            $keep,
            "])\n"
        )
    };
}

/// Most expired overrides one sweep claims (the next sweep claims the rest).
const SWEEP_BATCH: usize = 100;

/// Stores an override unless the live ones reach the bound or its id is taken; keeps the
/// index's TTL beyond the latest expiry. Replies `{status, live}`: 1 stored, 0 full, -1 id
/// taken.
const SET: &str = concat!(
    r"
local live = redis.call('ZCOUNT', KEYS[2], '(' .. ARGV[3], '+inf')
if live >= tonumber(ARGV[4]) then return {0, live} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, live} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
local keep = tonumber(ARGV[6])
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
",
    bump_version!("3", "6"),
    "return {1, live + 1}\n"
);

/// Removes an override still live at ARGV[1] (an ended one is left to the sweep, so that
/// a removal and a sweep never both claim it); replies its JSON, or nil.
const REMOVE: &str = concat!(
    r"
local value = redis.call('GET', KEYS[1])
if not value then return false end
local score = redis.call('ZSCORE', KEYS[2], value)
if not score or tonumber(score) <= tonumber(ARGV[1]) then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], value)
",
    bump_version!("1", "2"),
    "return value\n"
);

/// Claims up to ARGV[2] overrides expired at ARGV[1]; replies `{live, {json...}}`.
const EXPIRE: &str = r"
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, value in ipairs(gone) do redis.call('ZREM', KEYS[1], value) end
return {redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[1], '+inf'), gone}
";

/// Where override `id` is kept.
pub fn override_key(id: &str) -> String {
    format!("sluice:{{overrides}}:{id}")
}

fn protocol(what: &str, e: impl std::fmt::Display) -> CounterStoreError {
    CounterStoreError::Protocol(format!("{what}: {e}"))
}

fn decode(json: &str) -> Result<Override, CounterStoreError> {
    serde_json::from_str(json).map_err(|e| protocol("a stored override", e))
}

fn count(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

impl RedisCounters {
    async fn eval(&self, script: &str, keys: &[&str], args: &[String]) -> Result<redis::Value, CounterStoreError> {
        self.call(async |conn: &mut Conn| {
            let mut eval = redis::cmd("EVAL");
            eval.arg(script).arg(keys.len()).arg(keys).arg(args);
            conn.query(&eval).await
        })
        .await
    }

    /// See [`crate::store::CounterStore::set_override`].
    pub(crate) async fn set_override(
        &self,
        item: &Override,
        now_ms: u64,
        max: usize,
    ) -> Result<Stored, CounterStoreError> {
        let json = serde_json::to_string(item).map_err(|e| protocol("encoding an override", e))?;
        let ttl_ms = item.expires_at_ms.saturating_sub(now_ms).max(1);
        let key = override_key(&item.id);
        let args = [
            json,
            item.expires_at_ms.to_string(),
            now_ms.to_string(),
            max.to_string(),
            ttl_ms.to_string(),
            (ttl_ms + INDEX_GRACE_MS).to_string(),
        ];
        let reply = self.eval(SET, &[&key, INDEX_KEY, VERSION_KEY], &args).await?;
        let (status, live): (i64, i64) = redis::from_redis_value(reply).map_err(|e| protocol("set reply", e))?;
        Ok(match status {
            1 => Stored::Set { active: count(live) },
            0 => Stored::Full { active: count(live) },
            _ => Stored::Exists,
        })
    }

    /// See [`crate::store::CounterStore::list_overrides`].
    pub(crate) async fn list_overrides(&self, now_ms: u64) -> Result<Vec<Override>, CounterStoreError> {
        let reply = self
            .call(async |conn: &mut Conn| {
                let mut range = redis::cmd("ZRANGEBYSCORE");
                range.arg(INDEX_KEY).arg(format!("({now_ms}")).arg("+inf");
                conn.query(&range).await
            })
            .await?;
        let values: Vec<String> = redis::from_redis_value(reply).map_err(|e| protocol("list reply", e))?;
        let mut live = values.iter().map(|v| decode(v)).collect::<Result<Vec<_>, _>>()?;
        live.sort_by(|a, b| (a.expires_at_ms, &a.id).cmp(&(b.expires_at_ms, &b.id)));
        Ok(live)
    }

    /// See [`crate::store::CounterStore::remove_override`].
    pub(crate) async fn remove_override(&self, id: &str, now_ms: u64) -> Result<Option<Override>, CounterStoreError> {
        let key = override_key(id);
        let keep = (INDEX_GRACE_MS + crate::overrides::MAX_OVERRIDE_TTL_MS).to_string();
        let reply = self.eval(REMOVE, &[&key, INDEX_KEY, VERSION_KEY], &[now_ms.to_string(), keep]).await?;
        let value: Option<String> = redis::from_redis_value(reply).map_err(|e| protocol("remove reply", e))?;
        value.map(|v| decode(&v)).transpose()
    }

    /// See [`crate::store::CounterStore::overrides_version`]: 0 before any was set.
    pub(crate) async fn overrides_version(&self) -> Result<u64, CounterStoreError> {
        let reply = self
            .call(async |conn: &mut Conn| {
                let mut get = redis::cmd("GET");
                get.arg(VERSION_KEY);
                conn.query(&get).await
            })
            .await?;
        let version: Option<u64> = redis::from_redis_value(reply).map_err(|e| protocol("version reply", e))?;
        Ok(version.unwrap_or(0))
    }

    /// See [`crate::store::CounterStore::expire_overrides`].
    pub(crate) async fn expire_overrides(&self, now_ms: u64) -> Result<Expired, CounterStoreError> {
        let reply = self.eval(EXPIRE, &[INDEX_KEY], &[now_ms.to_string(), SWEEP_BATCH.to_string()]).await?;
        let (live, gone): (i64, Vec<String>) =
            redis::from_redis_value(reply).map_err(|e| protocol("expire reply", e))?;
        let overrides = gone.iter().map(|v| decode(v)).collect::<Result<Vec<_>, _>>()?;
        Ok(Expired { overrides, active: count(live) })
    }
}

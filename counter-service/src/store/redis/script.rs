//! What the Redis store sends and reads back: the decision script (`decide.lua`), run by
//! hash with a fallback to its body, its arguments, and the parsing of its reply.

use std::sync::atomic::Ordering;

use redis::{ErrorKind, ServerErrorKind};
use shared_store::{Decision, Nanos, Verdict};

use super::RedisCounters;
use super::pool::Conn;
use crate::api::PlannedEntry;
use crate::store::CounterStoreError;

/// The decision script.
pub const SCRIPT: &str = include_str!("../decide.lua");

impl RedisCounters {
    /// `EVALSHA`, and `EVAL` only when Redis answers `NOSCRIPT` (the script did not run).
    pub(super) async fn run_script(&self, keys: &[&str], args: &[String]) -> Result<Vec<i64>, CounterStoreError> {
        let value = self
            .call(async |conn: &mut Conn| {
                let mut evalsha = redis::cmd("EVALSHA");
                evalsha.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
                match conn.query(&evalsha).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        self.stats.script_reloads.fetch_add(1, Ordering::Relaxed);
                        let mut eval = redis::cmd("EVAL");
                        eval.arg(self.script.as_ref()).arg(keys.len()).arg(keys).arg(args);
                        conn.query(&eval).await
                    }
                    other => other,
                }
            })
            .await?;
        redis::from_redis_value::<Vec<i64>>(value)
            .map_err(|e| CounterStoreError::Protocol(format!("script reply: {e}")))
    }

    /// The script's arguments; each entry travels with its number (the cost of a check's
    /// entry or a charge, the `min_tokens` of a lease, the units of a credit) and its
    /// expiry (a clamp's counter's, in us; 0 for none). `tokens` is a lease's tokens, a
    /// charge's `max_debt` or when a credit's units were spent (us).
    pub(super) fn script_args(
        op: &str,
        tokens: u64,
        entries: &[(&PlannedEntry, u64)],
        at: Option<Nanos>,
    ) -> Vec<String> {
        let mut args = Vec::with_capacity(4 + 7 * entries.len());
        args.push(at.map_or_else(String::new, |t| (t.as_u64() / 1000).to_string()));
        args.push(op.to_owned());
        args.push(tokens.to_string());
        args.push(entries.len().to_string());
        for (e, number) in entries {
            let s = &e.limit.script;
            args.push(s.code.to_owned());
            args.extend(s.args.iter().map(u64::to_string));
            args.push(number.to_string());
            args.push(e.expires.map_or(0, |end| end.as_u64() / 1000).to_string());
        }
        args
    }

    pub(super) async fn decide(
        &self,
        op: &str,
        tokens: u64,
        entries: &[(&PlannedEntry, u64)],
        at: Option<Nanos>,
    ) -> Result<Reply, CounterStoreError> {
        let keys: Vec<&str> = entries.iter().map(|(e, _)| e.storage_key.as_str()).collect();
        let reply = self.run_script(&keys, &Self::script_args(op, tokens, entries, at)).await?;
        parse_reply(&reply, entries.len())
    }
}

/// A wait in the script's reply: nanoseconds, -1 for never.
fn wait(ns: i64) -> Nanos {
    Nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

fn verdict(code: i64, wait_ns: i64) -> Result<Verdict, CounterStoreError> {
    let wait = wait(wait_ns);
    match code {
        0 => Ok(Verdict::Allowed),
        1 => Ok(Verdict::Delayed(wait)),
        2 => Ok(Verdict::Rejected { retry_after: wait }),
        3 => Ok(Verdict::Exceeds),
        other => Err(CounterStoreError::Protocol(format!("unknown verdict {other}"))),
    }
}

fn non_negative(v: i64, what: &str) -> Result<u64, CounterStoreError> {
    u64::try_from(v).map_err(|_| CounterStoreError::Protocol(format!("negative {what}: {v}")))
}

/// What the script answered.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Reply {
    /// Redis' time (or the override).
    pub(super) at: Nanos,
    /// A check: every entry admitted.
    pub(super) admitted: bool,
    /// A lease: tokens granted; a charge: units charged; a credit: units credited (the
    /// first time, for a duplicate).
    pub(super) granted: u64,
    /// A charge or a credit: its id was applied before.
    pub(super) duplicate: bool,
    /// A charge or a credit: units forgiven (the first time, for a duplicate).
    pub(super) forgiven: u64,
    /// A lease: the wait until `min_tokens` could be granted again, when the grant left
    /// fewer ([`Nanos::MAX`] for never); zero otherwise.
    pub(super) refill_after: Nanos,
    /// Units of debt the call's carry-overs could not keep.
    pub(super) carry_forgiven: u64,
    /// One per entry.
    pub(super) decisions: Vec<Decision>,
}

/// Parses `{sec, usec, admitted, granted, duplicate, forgiven, refill_after,
/// carry_forgiven, (verdict, limit, remaining, reset, wait)*}`.
pub(super) fn parse_reply(reply: &[i64], entries: usize) -> Result<Reply, CounterStoreError> {
    let (head, rest) = reply
        .split_first_chunk::<8>()
        .ok_or_else(|| CounterStoreError::Protocol(format!("script reply has {} values", reply.len())))?;
    if rest.len() != 5 * entries {
        return Err(CounterStoreError::Protocol(format!(
            "script reply has {} values for {entries} entries",
            reply.len()
        )));
    }
    let [sec, usec, admitted, granted, duplicate, forgiven, refill_after, carry_forgiven] = *head;
    let at = Nanos::from_secs(non_negative(sec, "time")?)
        .saturating_add(Nanos(non_negative(usec, "time")?.saturating_mul(1000)));
    let mut decisions = Vec::with_capacity(entries);
    for chunk in rest.chunks_exact(5) {
        if let [code, limit, remaining, reset, wait] = *chunk {
            decisions.push(Decision {
                verdict: verdict(code, wait)?,
                limit: non_negative(limit, "limit")?,
                remaining: non_negative(remaining, "remaining")?,
                reset_after: Nanos(non_negative(reset, "reset")?),
            });
        }
    }
    Ok(Reply {
        at,
        admitted: admitted == 1,
        granted: non_negative(granted, "grant")?,
        duplicate: duplicate == 1,
        forgiven: non_negative(forgiven, "forgiven")?,
        refill_after: wait(refill_after),
        carry_forgiven: non_negative(carry_forgiven, "carry_forgiven")?,
        decisions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_of_the_wrong_shape_is_a_protocol_error() {
        assert!(matches!(parse_reply(&[1, 2, 3], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[1, 2, 1, 0, 0, 0, 0, 0, 0, 5, 4, 0], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[1, 2, 1, 0, 0, 0, 0, 0, 5, 4, 0, 0], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(
            parse_reply(&[1, 2, 1, 0, 0, 0, 0, 0, 9, 5, 4, 0, 0], 1),
            Err(CounterStoreError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(&[-1, 2, 1, 0, 0, 0, 0, 0, 0, 5, 4, 0, 0], 1),
            Err(CounterStoreError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(&[1, 2, 1, 0, 0, -3, 0, 0, 0, 5, 4, 0, 0], 1),
            Err(CounterStoreError::Protocol(_))
        ));
    }

    #[test]
    fn a_reply_is_read_into_decisions_and_the_redis_time() {
        let reply = parse_reply(&[7, 5, 0, 3, 1, 2, 0, 0, 2, 5, 0, 900, -1], 1).unwrap();

        assert_eq!((reply.at, reply.admitted, reply.granted), (Nanos(7_000_005_000), false, 3));
        assert_eq!((reply.duplicate, reply.forgiven, reply.refill_after), (true, 2, Nanos::ZERO));
        assert_eq!(reply.decisions[0].verdict, Verdict::Rejected { retry_after: Nanos::MAX });
        assert_eq!((reply.decisions[0].limit, reply.decisions[0].reset_after), (5, Nanos(900)));
    }

    #[test]
    fn a_lease_reply_carries_the_wait_until_its_minimum_is_back_with_minus_one_for_never() {
        let soon = parse_reply(&[7, 5, 1, 2, 0, 0, 1_500_000_000, 0, 0, 5, 0, 4_500_000_000, 0], 1).unwrap();
        let never = parse_reply(&[7, 5, 1, 2, 0, 0, -1, 0, 0, 5, 0, 4_500_000_000, 0], 1).unwrap();

        assert_eq!((soon.granted, soon.refill_after), (2, Nanos(1_500_000_000)));
        assert_eq!(never.refill_after, Nanos::MAX);
    }
}

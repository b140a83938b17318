//! The `mixed` group (issue 39): the lab's per-user lease policy (`lab/bench/speed.json`,
//! `per-user-global`: 300 a minute, burst 20, leases of 5 for 2 s, failing closed) in real
//! Envoy, under one hot caller and 10 000 cold ones at a fixed rate, in check mode and in
//! lease mode, side by side in one run; with `BASELINE_WASM`, the older build's lease and
//! check modes too ("before").
//!
//! The load is paced, not saturating: `MIXED_RATE` requests a second in all (default
//! 2 000) over 16 keep-alive connections, each request's `x-user` the hot caller one time
//! in ten, else one of `u0` … `u9999` drawn at random (a fixed seed per connection). The
//! hot caller asks for 40 times its budget, so most of its requests are the service's
//! 429; a cold caller is seen about once a run.
//!
//! Callouts are Envoy's own count of requests sent to the `sluice-counter` cluster
//! (`cluster.sluice-counter.upstream_rq_total`), which does not depend on the build's
//! metric names. A degraded decision is a `503` (the policy fails closed): the service
//! answered every call.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sluice_tests::counter::{self, Counter};
use sluice_tests::envoy::{Envoy, cluster, sluice};

use super::{TOKEN, base, baseline_wasm, median};

/// Connections the paced load is spread over.
const CONNECTIONS: usize = 16;
/// Cold callers.
const COLD: u64 = 10_000;
/// One request in this many is the hot caller's.
const HOT_EVERY: u64 = 10;

/// What one paced run saw, by status.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    ok: u64,
    limited: u64,
    degraded: u64,
    other: u64,
}

impl Tally {
    fn add(&mut self, other: Self) {
        self.ok += other.ok;
        self.limited += other.limited;
        self.degraded += other.degraded;
        self.other += other.other;
    }

    const fn total(&self) -> u64 {
        self.ok + self.limited + self.degraded + self.other
    }
}

/// The policy, in `strategy` (`lease` or `check`), as `lab/bench/speed.json` has it.
fn policy(strategy: &str) -> String {
    let global = if strategy == "lease" {
        r#"{"strategy":"lease","lease":{"size":5,"duration":"2s"}}"#
    } else {
        r#"{"strategy":"check"}"#
    };
    format!(
        r#"{{"counter_service":{{"cluster":"sluice-counter","hash_key_env":"H","token_env":"T","timeout":"50ms"}},
           "policies":[{{"name":"per-user-global","key":[{{"header":"x-user"}}],"rate":"300/minute","burst":20,
                        "slots":32768,"global":{global},"on_failure":{{"action":"deny"}}}}]}}"#
    )
}

fn envoy(mode: &str, service: &Counter) -> Envoy {
    let strategy = mode.strip_prefix("before: ").unwrap_or(mode);
    let filter = sluice(&policy(strategy)).env("H", "bench-hash-key-0123456789abcdef").env("T", TOKEN);
    let filter = match (mode.starts_with("before: "), baseline_wasm()) {
        (true, Some(before)) => filter.wasm(before),
        _ => filter,
    };
    base(2)
        .cluster(cluster("sluice-counter", service.addr(), true))
        .sluice(filter)
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The status of one answer on `reader`'s connection, its body read and dropped.
fn status(reader: &mut BufReader<TcpStream>) -> Option<u16> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some(status)
}

/// One connection's share of the paced load: `rate` requests a second until `until`.
fn paced(addr: SocketAddr, index: usize, rate: f64, until: Instant) -> Tally {
    let stream = TcpStream::connect(addr).expect("connects to Envoy");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let mut writer = stream.try_clone().expect("a second handle");
    let mut reader = BufReader::new(stream);
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (index as u64 + 1);
    let mut next = || {
        // xorshift64*: a fixed sequence per connection.
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut tally = Tally::default();
    for sent in 0u32.. {
        let due = start + gap * sent;
        if due >= until {
            break;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let draw = next();
        let user = if draw % HOT_EVERY == 0 { "hot".to_owned() } else { format!("u{}", (draw / HOT_EVERY) % COLD) };
        let request = format!("GET / HTTP/1.1\r\nHost: bench\r\nx-user: {user}\r\n\r\n");
        if writer.write_all(request.as_bytes()).is_err() {
            tally.other += 1;
            break;
        }
        match status(&mut reader) {
            Some(200) => tally.ok += 1,
            Some(429) => tally.limited += 1,
            Some(503) => tally.degraded += 1,
            _ => {
                tally.other += 1;
                break;
            }
        }
    }
    tally
}

/// `rate` requests a second over [`CONNECTIONS`] connections for `seconds`.
fn load(addr: SocketAddr, rate: f64, seconds: u64) -> Tally {
    let until = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|i| std::thread::spawn(move || paced(addr, i, rate / CONNECTIONS as f64, until)))
        .collect();
    let mut tally = Tally::default();
    for thread in threads {
        tally.add(thread.join().expect("a load thread"));
    }
    tally
}

pub(crate) fn mixed_group(rounds: u64, seconds: u64) {
    let rate = super::env_or("MIXED_RATE", 2000) as f64;
    let mut modes = vec!["check", "lease"];
    if baseline_wasm().is_some() {
        modes.extend(["before: check", "before: lease"]);
    }
    let mut per_thousand: std::collections::BTreeMap<&str, Vec<f64>> = std::collections::BTreeMap::new();
    let mut tallies: std::collections::BTreeMap<&str, Tally> = std::collections::BTreeMap::new();
    for round in 1..=rounds {
        for &mode in &modes {
            // A fresh service and Envoy per run: no bucket carries over between modes.
            let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
            let envoy = envoy(mode, &service);
            let calls =
                |envoy: &Envoy| envoy.stats().get("cluster.sluice-counter.upstream_rq_total").copied().unwrap_or(0);
            let before = envoy.stats();
            let tally = load(envoy.addr(), rate, seconds);
            let after = envoy.stats();
            let callouts = calls(&envoy) - before.get("cluster.sluice-counter.upstream_rq_total").copied().unwrap_or(0);
            if std::env::var_os("MIXED_VERBOSE").is_some() {
                // What the filter counted meanwhile (its own names: this build's or the baseline's).
                for (name, value) in &after {
                    let delta = value.saturating_sub(before.get(name).copied().unwrap_or(0));
                    if delta > 0
                        && (name.starts_with("wasmcustom.") || name.starts_with("cluster.sluice-counter.upstream_rq"))
                    {
                        eprintln!("  {name} +{delta}");
                    }
                }
            }
            let thousand = callouts as f64 * 1000.0 / tally.total().max(1) as f64;
            eprintln!(
                "round {round}: {mode:14} {} requests: {} admitted, {} refused 429, {} degraded 503, {} other; {callouts} callouts, {thousand:.0} per 1000",
                tally.total(),
                tally.ok,
                tally.limited,
                tally.degraded,
                tally.other
            );
            per_thousand.entry(mode).or_default().push(thousand);
            tallies.entry(mode).or_default().add(tally);
        }
    }
    println!(
        "\n## one hot caller and {COLD} cold ones at {rate:.0} requests a second ({rounds} rounds of {seconds} s)\n\n| mode | median callouts per 1000 requests | admitted | refused 429 | degraded 503 | other |\n|---|---:|---:|---:|---:|---:|"
    );
    for (mode, values) in &mut per_thousand {
        let t = tallies[mode];
        println!("| {mode} | {:.0} | {} | {} | {} | {} |", median(values), t.ok, t.limited, t.degraded, t.other);
    }
}

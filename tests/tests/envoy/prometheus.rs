//! Operated as the teams that run Envoy operate it: a real Prometheus scrapes Envoy (the
//! shipped bootstrap, its `stats_tags` and all) and `sluice-counter` under traffic that
//! admits, rejects, shapes, falls back and is overridden; then every panel of the shipped
//! Grafana dashboard and every rule of the shipped rule file is evaluated through
//! Prometheus' HTTP API. Each must return the series it shows, with the values the
//! traffic implies.

use super::*;
use serde_json::Value;
use sluice::host::Counter as Metric;
use sluice_testkit::wait;
use sluice_tests::counter::{self, Counter};
use sluice_tests::deploy::{Local, local_bootstrap};
use sluice_tests::prometheus::{Job, Prometheus, SCRAPE};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

const HASH_KEY: &str = "prometheus-hash-key-0123456789ab";
const TOKEN: &str = "prometheus-token-0123";
const ADMIN: &str = "prometheus-admin-4567";
/// How long the counter service is down: the fallback decides meanwhile.
const OUTAGE: Duration = Duration::from_secs(3);
/// The spacing of the requests sent during the outage.
const SPACING: Duration = Duration::from_millis(50);

/// One policy of each kind the dashboard shows: a local limit, a shaper, a global check
/// that fails open, a lease, and a shadow candidate over all of them.
const CONFIG: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "timeout": "100ms", "token_env": "SLUICE_COUNTER_TOKEN",
                      "hash_key_env": "SLUICE_HASH_KEY", "circuit_breaker": {"failures": 3, "cooldown": "1s"}},
  "policies": [
    {"name": "edge", "match": {"path_prefix": "/edge"}, "key": ["client_address"], "rate": "1/minute", "burst": 5},
    {"name": "export", "match": {"path_prefix": "/export"}, "key": [{"constant": "export"}],
     "algorithm": "leaky_bucket", "rate": "20/second", "queue": 20, "max_wait": "2s", "overflow": "queue"},
    {"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "6000/minute", "burst": 1000,
     "global": {"strategy": "check"}, "on_failure": {"action": "allow"}},
    {"name": "leased", "match": {"path_prefix": "/leased"}, "key": [{"header": "x-tenant"}], "rate": "600/minute",
     "burst": 50, "global": {"strategy": "lease", "lease": {"size": 5, "duration": "2s"}}},
    {"name": "candidate", "key": [{"header": "x-tenant"}], "rate": "1/minute", "burst": 1, "shadow": true}
  ],
  "shaping": {"max_paused": 256, "tick_ms": 10}
}"#;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository").to_path_buf()
}

/// Every panel query of the shipped dashboard, with its variables set to everything
/// (`$policy`, `$proxy`: `.*`; `$__rate_interval`: `1m`).
fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo().join("deploy/grafana/sluice-dashboard.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard")).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    let mut panels: Vec<Value> = dashboard["panels"].as_array().cloned().unwrap_or_default();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().cloned().unwrap_or_default());
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let expr = expr
                    .replace("$__rate_interval", "1m")
                    .replace("${policy:regex}", ".*")
                    .replace("${proxy:regex}", ".*")
                    .replace("$policy", ".*")
                    .replace("$proxy", ".*");
                queries.push((panel["title"].as_str().unwrap_or("?").to_owned(), expr));
            }
        }
    }
    queries
}

/// Draws the shipped dashboard from what `prometheus` scraped since `began` into `png`
/// (deploy/grafana/render.py; `deploy/grafana/snapshot.sh` asks for it).
fn draw_dashboard(prometheus: &Prometheus, began: SystemTime, png: &Path) {
    let unix = |t: SystemTime| t.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64();
    let output = std::process::Command::new("python3")
        .arg(repo().join("deploy/grafana/render.py"))
        .args(["--prometheus", &prometheus.url(), "--rate", "5s"])
        .args(["--start", &format!("{:.3}", unix(began) - 5.0), "--end", &format!("{:.3}", unix(SystemTime::now()))])
        .arg("--out")
        .arg(png)
        .output()
        .expect("python3 runs render.py");
    assert!(output.status.success(), "render.py: {}", String::from_utf8_lossy(&output.stderr));
    eprintln!("{}", String::from_utf8_lossy(&output.stdout).trim());
}

/// Sends `n` requests to `path` for tenant acme on one connection: their statuses.
fn send_n(envoy: &Envoy, path: &str, n: usize) -> Vec<u16> {
    let mut connection = envoy.connect();
    (0..n).map(|_| connection.send(&Request::get(path).header("x-tenant", "acme")).expect("an answer").status).collect()
}

#[test]
fn every_dashboard_panel_and_recording_rule_returns_what_the_traffic_implies_in_a_real_prometheus() {
    // Envoy (the shipped bootstrap through local.py) in front of an upstream, with the
    // service it calls; Prometheus scrapes both once a second and runs the shipped rules.
    let upstream = sluice_tests::upstream::Upstream::start(&[]);
    let mut service = Counter::start_with_admin(
        counter::with_admin(counter::with_token(counter::memory(), TOKEN), 50),
        ADMIN,
        HASH_KEY,
    );
    let dir = std::env::temp_dir().join(format!("sluice-prometheus-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("sluice.json");
    std::fs::write(&config, CONFIG).unwrap();
    let bootstrap = local_bootstrap(&Local {
        listen: "127.0.0.1:0",
        admin: "127.0.0.1:0",
        backend: upstream.addr(),
        counter: service.addr(),
        config: Some(&config),
    });
    let envoy = Envoy::builder()
        .bootstrap(bootstrap)
        .workers(1)
        .process_env("SLUICE_HASH_KEY", HASH_KEY)
        .process_env("SLUICE_COUNTER_TOKEN", TOKEN)
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let rules = repo().join("deploy/prometheus/sluice-rules.yaml");
    let prometheus = Prometheus::start(
        &[
            Job { name: "envoy".to_owned(), path: "/stats/prometheus".to_owned(), targets: vec![envoy.admin()] },
            Job { name: "sluice-counter".to_owned(), path: "/metrics".to_owned(), targets: vec![service.addr()] },
        ],
        &[&rules],
    );
    // Prometheus takes its static targets up a few seconds after it starts: the traffic
    // begins once it scrapes both, so that it sees the outage as it happens.
    prometheus.wait_scraped_after(SystemTime::now(), Duration::from_secs(30));

    let began = SystemTime::now();
    // Admissions and rejections (edge: 5 of 12), shaping (export), leases, a shadow
    // candidate that would reject, and an operator's bypass on the global policy.
    let edge = send_n(&envoy, "/edge", 12);
    let exported = send_n(&envoy, "/export", 10);
    let leased = send_n(&envoy, "/leased", 10);
    let set =
        ["set", "--kind", "bypass", "--policy", "tenant", "--ttl-ms", "600000", "--reason", "r", "--operator", "o"];
    service.override_cli(&set, ADMIN).unwrap_or_else(|e| panic!("override set: {e}"));
    wait::until(Duration::from_secs(10), "the bypass to be obeyed", || {
        send_n(&envoy, "/bypassed", 1);
        envoy.metric("tenant", Metric::OverrideBypassed) > 0
    });
    send_n(&envoy, "/bypassed", 4);
    let bypassed = envoy.metric("tenant", Metric::OverrideBypassed);
    assert!(bypassed >= 5, "{bypassed}");
    assert_eq!(edge.iter().filter(|s| **s == 200).count(), 5, "{edge:?}");
    assert!(exported.iter().chain(&leased).all(|s| *s == 200), "{exported:?} {leased:?}");

    // The service goes away for OUTAGE: the fallback decides (fail open), a spell as long
    // as the outage.
    service.kill();
    let mut connection = envoy.connect();
    let first = Instant::now();
    let spell_began = SystemTime::now();
    let mut last = first;
    // At least OUTAGE, and until Prometheus has scraped Envoy mid-spell: the gauge's 1 is
    // seen by a scrape the test waits for, not by one that happens to fall in time.
    while first.elapsed() < OUTAGE || !prometheus.job_scraped_after(Some("envoy"), spell_began) {
        assert!(first.elapsed() < OUTAGE * 10, "no scrape during the outage:\n{}", prometheus.log());
        let response = connection.send(&Request::get("/outage").header("x-tenant", "acme")).expect("an answer");
        assert_eq!(response.status, 200, "the failure rule allows");
        last = Instant::now();
        std::thread::sleep(SPACING);
    }
    let outage_ms = last.duration_since(first).as_millis() as f64;
    let during = envoy.metric("tenant", Metric::FallbackActive);
    service.restart();
    wait::until(Duration::from_secs(10), "the spell to end once the service decides again", || {
        send_n(&envoy, "/after", 1);
        envoy.metric("tenant", Metric::FallbackActive) == 0
    });
    assert_eq!(during, 1, "one worker was deciding by a fallback");
    // The restarted service (a memory store) lost the bypass: an operator sets it again,
    // so that an override is in force when the dashboard is read.
    service.override_cli(&set, ADMIN).unwrap_or_else(|e| panic!("override set again: {e}"));
    let expires = SystemTime::now() + Duration::from_millis(600_000);
    wait::until(Duration::from_secs(10), "the shaped requests to be released", || {
        envoy.metric("export", Metric::Queued) == 0
    });

    // Prometheus has what Envoy has once it scraped both after the traffic.
    let stats = envoy.stats();
    let since = SystemTime::now();
    prometheus.wait_scraped_after(since, Duration::from_secs(30));
    std::thread::sleep(SCRAPE * 2); // the rules evaluated on those scrapes too

    if let Some(png) = std::env::var_os("SLUICE_DASHBOARD_PNG") {
        draw_dashboard(&prometheus, began, Path::new(&png));
    }

    // The accounting line, per policy: what Prometheus shows is what Envoy counted.
    for policy in ["edge", "export", "tenant", "leased", "candidate"] {
        let offered = sluice_tests::envoy::policy_stat(&stats, policy, Metric::Offered) as f64;
        let scraped = prometheus.value(&format!(r#"sum(sluice_offered_total{{policy="{policy}"}})"#));
        let line = prometheus.value(&format!(
            r#"sum(sluice_requests_total{{policy="{policy}"}}) + sum(sluice_queued{{policy="{policy}"}})"#
        ));
        assert_eq!((scraped, line), (offered, offered), "{policy}: offered = allowed + rejected + queued");
    }
    assert_eq!(prometheus.value(r#"sum(sluice_requests_total{policy="edge",outcome="rejected"})"#), 7.0);
    assert!(prometheus.value(r#"sum(sluice_shadow_rejected_total{policy="candidate"})"#) > 0.0);
    assert_eq!(prometheus.value(r#"sum(sluice_overridden_total{policy="tenant",kind="bypass"})"#), bypassed as f64);
    assert!(prometheus.value(r#"sum(sluice_lease_granted_tokens_total{policy="leased"})"#) >= 10.0);
    assert!(prometheus.value(r#"sum(sluice_degraded_total{policy="tenant"})"#) > 0.0);
    // The fallback-mode duration is a query, within a second of the outage caused.
    let spell = prometheus.value(r#"sum(sluice_fallback_milliseconds_total{policy="tenant"})"#);
    assert!((spell - outage_ms).abs() <= 1_000.0, "a spell of {spell} ms for an outage of {outage_ms} ms");
    assert_eq!(prometheus.value(r#"max_over_time(sluice_fallback_active{policy="tenant"}[5m])"#), 1.0);
    assert_eq!(prometheus.value(r#"sum(sluice_fallback_active)"#), 0.0, "the spell ended");
    assert!(prometheus.value("sum(sluice_counter_decisions_total)") > 0.0, "the service's own series");
    let soonest = prometheus.value("sluice_counter_overrides_soonest_expiry_timestamp_seconds");
    let expected = expires.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!((soonest - expected).abs() <= 5.0, "the bypass expires at {soonest}, about {expected}");

    // Every panel's query returns series.
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "the dashboard's queries: {queries:?}");
    let empty: Vec<&(String, String)> = queries.iter().filter(|(_, expr)| prometheus.query(expr).is_empty()).collect();
    assert!(empty.is_empty(), "panels whose query returned nothing: {empty:#?}");

    // Every rule loaded and evaluated without error; every recording rule has series.
    let groups = prometheus.api("/api/v1/rules");
    let rules: Vec<Value> = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(!rules.is_empty(), "the rule file loaded: {groups}\n{}", prometheus.log());
    let unhealthy: Vec<&Value> = rules.iter().filter(|r| r["health"] != "ok").collect();
    assert!(unhealthy.is_empty(), "rules that failed to evaluate: {unhealthy:#?}");
    let recorded: Vec<&str> =
        rules.iter().filter(|r| r["type"] == "recording").filter_map(|r| r["name"].as_str()).collect();
    assert!(!recorded.is_empty(), "recording rules: {rules:?}");
    let silent: Vec<&&str> = recorded.iter().filter(|name| prometheus.query(name).is_empty()).collect();
    assert!(silent.is_empty(), "recording rules with no series: {silent:?}");
    // The accounting-line gap the rules record is 0 for every policy.
    let gaps = prometheus.query("sluice:accounting_gap:sum");
    assert!(gaps.iter().all(|g| g["value"][1] == "0"), "the accounting line the rules record: {gaps:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

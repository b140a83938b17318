//! Operators' overrides, end to end: set from the counter service's CLI, obeyed by Envoy
//! proxies in check and lease mode within the stated bound (also for a caller a lease-mode
//! proxy holds locked out), named in the override header, audited when set and when they
//! expire, gone by themselves at their expiry; a bypass reaches only its callers; a
//! proxy's token cannot set one.

use super::*;
use sluice::host::Counter as Metric;
use sluice_tests::counter::{self, Counter};
use sluice_tests::envoy::{SluiceFilter, cluster};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const HASH_KEY: &str = "fleet-hash-key-0123456789abcdef";
const TOKEN: &str = "proxy-token-0123";
const ADMIN: &str = "admin-token-4567";
/// How often the service sweeps (and, on Redis, reads overrides set elsewhere).
const SWEEP_MS: u64 = 50;
/// The lease's life: a lease-mode proxy obeys a clamp at most this long (plus a sweep)
/// after it is set.
const LEASE_LIFE: Duration = Duration::from_secs(1);
/// The clamp: 1 a second, bursts of 2 (the policies allow 10 a second, bursts of 20).
const CLAMP: &str = r#"{"algorithm":"token_bucket","amount":1,"per_ms":1000,"burst":2}"#;
const CLAMP_TTL_MS: &str = "6000";

fn config(name: &str, global: &str) -> String {
    config_with(name, r#""rate": "600/minute", "burst": 20"#, global)
}

/// One policy named `name`, with `numbers`, global as `global`.
fn config_with(name: &str, numbers: &str, global: &str) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "500ms"}},
            "policies": [{{"name": "{name}", "key": [{{"header": "x-tenant"}}], {numbers},
                           "global": {global}}}],
            "response": {{"override_header": "x-sluice-override"}}}}"#
    )
}

fn envoy(config: &str, service: SocketAddr) -> Envoy {
    let filter: SluiceFilter = sluice(config).env("SLUICE_HASH_KEY", HASH_KEY).env("SLUICE_COUNTER_TOKEN", TOKEN);
    Envoy::builder()
        .workers(2)
        .cluster(cluster("sluice-counter", service, false))
        .sluice(filter)
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tenant(name: &str) -> Request {
    Request::get("/").header("x-tenant", name)
}

/// Sends `n` requests for `name` one after the other: the responses.
fn burst(envoy: &Envoy, name: &str, n: usize) -> Vec<Response> {
    let mut connection = envoy.connect();
    (0..n).map(|_| connection.send(&tenant(name)).expect("Envoy answers")).collect()
}

fn admitted(responses: &[Response]) -> usize {
    responses.iter().filter(|r| r.status == 200).count()
}

/// The audit lines the services of this test binary logged (JSON, as `--log-format json`
/// writes them), captured by a process-wide subscriber installed on first use.
fn audit_lines() -> Vec<serde_json::Value> {
    static CAPTURED: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    #[derive(Clone)]
    struct Writer(Arc<Mutex<Vec<u8>>>);
    impl Write for Writer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("the log buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = CAPTURED.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Writer(buffer.clone());
        let _ = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
            .with_writer(move || writer.clone())
            .try_init();
        buffer
    });
    let text = String::from_utf8_lossy(&buffer.lock().expect("the log buffer")).into_owned();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["target"] == "sluice_counter::audit")
        .map(|l| l["fields"].clone())
        .collect()
}

fn audited(event: &str, id: &str) -> bool {
    audit_lines().iter().any(|l| l["event"] == event && l["id"] == id)
}

fn set(service: &Counter, args: &[&str]) -> String {
    let printed = service.override_cli(args, ADMIN).unwrap_or_else(|e| panic!("override set: {e}"));
    let stored: serde_json::Value = serde_json::from_str(&printed).expect("the CLI prints the override");
    stored["id"].as_str().expect("an id").to_owned()
}

fn clamp(service: &Counter, policy: &str) -> String {
    let args = ["set", "--kind", "clamp", "--policy", policy, "--limit", CLAMP, "--ttl-ms", CLAMP_TTL_MS];
    set(service, &[&args[..], &["--reason", "downstream degraded (INC-7)", "--operator", "oncall"]].concat())
}

#[test]
fn a_clamp_set_from_the_cli_is_obeyed_in_check_and_lease_mode_audited_and_gone_at_its_expiry_and_a_bypass_reaches_only_its_callers()
 {
    audit_lines();
    let service = Counter::start_with_admin(
        counter::with_admin(counter::with_token(counter::memory(), TOKEN), SWEEP_MS),
        ADMIN,
        HASH_KEY,
    );
    let checked = envoy(&config("tenant", r#"{"strategy": "check"}"#), service.addr());
    let leased =
        envoy(&config("leased", r#"{"strategy": "lease", "lease": {"size": 5, "duration": "1s"}}"#), service.addr());
    // The service learns policy names from the proxies' requests; "busy" holds a lease.
    assert_eq!(admitted(&burst(&checked, "warm", 1)), 1);
    assert_eq!(admitted(&burst(&leased, "busy", 1)), 1);

    let refused = service.override_cli(
        &["set", "--kind", "bypass", "--policy", "tenant", "--ttl-ms", "60000", "--reason", "r", "--operator", "o"],
        TOKEN,
    );
    let refused = refused.expect_err("a proxy's token cannot set an override").to_string();
    assert!(refused.contains("401 admin_unauthorized"), "{refused}");

    let set_at = Instant::now();
    let tenant_clamp = clamp(&service, "tenant");
    let leased_clamp = clamp(&service, "leased");

    // Check mode obeys on the next request.
    let clamped = burst(&checked, "acme", 10);
    let elapsed = set_at.elapsed().as_secs() + 1;
    let named = format!("clamp; id={tenant_clamp}; policy=tenant");
    assert!(admitted(&clamped) as u64 <= 2 + elapsed, "the clamp's burst of 2, not 20: {}", admitted(&clamped));
    assert!(clamped.iter().all(|r| r.header("x-sluice-override") == Some(named.as_str())), "{:?}", clamped[0]);
    assert!(checked.metric("tenant", Metric::OverrideClamped) >= 10);

    // Lease mode obeys once its lease has run out: within LEASE_LIFE and a sweep.
    std::thread::sleep((LEASE_LIFE + Duration::from_millis(2 * SWEEP_MS)).saturating_sub(set_at.elapsed()));
    let drive_start = Instant::now();
    let mut leased_admitted = 0;
    let mut named_leased = 0;
    let leased_named = format!("clamp; id={leased_clamp}; policy=leased");
    while drive_start.elapsed() < Duration::from_secs(3) {
        let responses = burst(&leased, "busy", 5);
        leased_admitted += admitted(&responses);
        named_leased +=
            responses.iter().filter(|r| r.header("x-sluice-override") == Some(leased_named.as_str())).count();
        std::thread::sleep(Duration::from_millis(20));
    }
    let drove = drive_start.elapsed().as_secs() + 1;
    assert!(
        leased_admitted as u64 <= 2 + drove,
        "lease mode under the clamp: at most its burst and 1 a second, {leased_admitted} in {drove} s"
    );
    assert!(leased_admitted >= 1, "the clamp lowers the numbers, it does not stop the policy");
    assert!(named_leased >= 1, "requests spending a lease granted under the clamp name it");
    assert!(leased.metric("leased", Metric::OverrideClamped) >= 1);

    // A bypass for one caller: it passes, the others stay clamped.
    let bypass = set(
        &service,
        &[
            "set",
            "--kind",
            "bypass",
            "--policy",
            "tenant",
            "--key",
            "partner",
            "--ttl-ms",
            CLAMP_TTL_MS,
            "--reason",
            "partner locked out",
            "--operator",
            "oncall",
        ],
    );
    let partner = burst(&checked, "partner", 30);
    let other = burst(&checked, "other", 30);
    assert_eq!(admitted(&partner), 30, "the bypassed caller is never limited");
    let named = format!("bypass; id={bypass}; policy=tenant");
    assert!(partner.iter().all(|r| r.header("x-sluice-override") == Some(named.as_str())), "{:?}", partner[0]);
    assert!(admitted(&other) <= 4, "everyone else is still clamped: {}", admitted(&other));
    assert!(checked.metric("tenant", Metric::OverrideBypassed) >= 30);

    for id in [&tenant_clamp, &leased_clamp, &bypass] {
        assert!(audited("override_set", id), "{id} set, audited: {:?}", audit_lines());
    }

    // The clamps expire by themselves: audited, and traffic returns to the policy's numbers.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(audited("override_expired", &tenant_clamp) && audited("override_expired", &leased_clamp)) {
        assert!(Instant::now() < deadline, "the clamps' expiry is audited: {:?}", audit_lines());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(LEASE_LIFE + Duration::from_millis(500));
    let after = burst(&checked, "acme", 15);
    assert!(admitted(&after) >= 10, "10 a second again, refilled for 1.5 s: {}", admitted(&after));
    assert!(after.iter().all(|r| r.header("x-sluice-override").is_none()), "{:?}", after[0]);
    let mut leased_after = 0;
    let drive_start = Instant::now();
    while drive_start.elapsed() < Duration::from_secs(2) {
        leased_after += admitted(&burst(&leased, "busy", 5));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(leased_after >= 10, "lease mode back at 10 a second: {leased_after} in 2 s");
}

#[test]
fn a_caller_locked_out_in_lease_mode_is_let_through_by_a_bypass_within_a_sweep_and_a_lease_duration() {
    let service = Counter::start_with_admin(
        counter::with_admin(counter::with_token(counter::memory(), TOKEN), SWEEP_MS),
        ADMIN,
        HASH_KEY,
    );
    // One unit an hour: once the caller has spent it, the service's next grant is an
    // hour away.
    let lease = r#"{"strategy": "lease", "lease": {"size": 1, "duration": "1s"}}"#;
    let leased = envoy(&config_with("locked", r#""rate": "1/hour", "burst": 1"#, lease), service.addr());
    let mut connection = leased.connect();
    let mut send = || connection.send(&tenant("victim")).expect("Envoy answers");
    assert_eq!(send().status, 200, "the caller's one unit");
    let locked_out = send();
    assert_eq!(locked_out.status, 429, "{locked_out:?}");
    let wait: u64 = locked_out.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(wait >= 30, "locked out for long (the service's wait, held to a minute): {locked_out:?}");

    let set_at = Instant::now();
    let bypass = set(
        &service,
        &[
            &["set", "--kind", "bypass", "--policy", "locked", "--key", "victim", "--ttl-ms", "60000"][..],
            &["--reason", "victim locked out (INC-9)", "--operator", "oncall"],
        ]
        .concat(),
    );
    // Obeyed within the service's sweep and one lease duration (the bound the READMEs
    // state), with a margin for a loaded machine; before the fix it waited out the
    // minute the lease record held the empty budget for.
    let bound = Duration::from_millis(SWEEP_MS) + LEASE_LIFE + Duration::from_secs(2);
    let let_through = loop {
        let response = send();
        if response.status == 200 {
            break response;
        }
        assert!(
            set_at.elapsed() < bound,
            "still {} after {:?}, Retry-After {:?}",
            response.status,
            set_at.elapsed(),
            response.header("retry-after")
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    eprintln!("the locked-out caller was let through {:?} after the bypass was set", set_at.elapsed());
    let named = format!("bypass; id={bypass}; policy=locked");
    assert_eq!(let_through.header("x-sluice-override"), Some(named.as_str()));
    assert!(burst(&leased, "victim", 10).iter().all(|r| r.status == 200), "the bypassed caller passes");
    assert_eq!(admitted(&burst(&leased, "other", 2)), 1, "everyone else keeps the policy's numbers");
    assert!(leased.metric("locked", Metric::OverrideBypassed) >= 11);
}

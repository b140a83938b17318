//! Whether callers are authenticated: with a token configured, every route but the probes
//! needs `authorization: Bearer <token>`; the token shows in no answer, metric or Debug
//! form.

use serde_json::json;
use sluice_counter::config::Config;

use crate::api::start;
use crate::support::{Http, Protocol};

const TOKEN: &str = "t0k-3f9a61c2d8e4b7a5";

fn limit() -> serde_json::Value {
    json!({"algorithm": "token_bucket", "amount": 1, "per_ms": 86_400_000, "burst": 10})
}

/// Every route a caller uses, with a valid body.
fn calls() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("/v1/check", json!({"entries": [{"key": "k", "limit": limit()}]})),
        ("/v1/lease", json!({"key": "k", "tokens": 1, "ttl_ms": 1000, "limit": limit()})),
        ("/v1/charge", json!({"key": "k", "cost": 1, "max_debt": 0, "limit": limit()})),
    ]
}

async fn with_token_file() -> (sluice_counter::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).expect("write the token");
    let (running, _) = start(Config { token_file: Some(path), ..Config::defaults() }).await;
    (running, dir)
}

async fn callers_without_the_token_get_401_and_with_it_their_answer(protocol: Protocol) {
    let (running, _dir) = with_token_file().await;
    let anonymous = Http::with(running.addr, protocol);
    let wrong = Http::with(running.addr, protocol).header("authorization", "Bearer t0k-3f9a61c2d8e4b7a6");
    let basic = Http::with(running.addr, protocol).header("authorization", &format!("Basic {TOKEN}"));
    let caller = Http::with(running.addr, protocol).header("authorization", &format!("Bearer {TOKEN}"));
    let mut refusals = 0;

    for (path, body) in calls().into_iter().chain([("/v1/unknown", json!({}))]) {
        for (who, client, rule) in
            [("anonymous", &anonymous, "needs"), ("wrong", &wrong, "not the one"), ("basic", &basic, "scheme")]
        {
            let (status, headers, answer) = client.exchange("POST", path, body.to_string()).await;
            let answer: serde_json::Value = serde_json::from_slice(&answer).expect("a JSON error");

            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (401, Some("unauthorized")),
                "{who} {path}: {answer}"
            );
            assert!(answer["error"]["message"].as_str().unwrap_or_default().contains(rule), "{who} {path}: {answer}");
            assert!(!answer.to_string().contains(TOKEN), "{who} {path}: {answer}");
            assert_eq!(headers["www-authenticate"], "Bearer realm=\"sluice-counter\"");
            refusals += 1;
        }
    }
    let mut answered = Vec::new();
    for (path, body) in calls() {
        answered.push(caller.post(path, &body).await.0);
    }
    let probes =
        [anonymous.get("/healthz").await.0, anonymous.get("/readyz").await.0, anonymous.get("/metrics").await.0];
    let (_, metrics) = anonymous.get("/metrics").await;

    assert_eq!(answered, [200, 200, 200]);
    assert_eq!(probes, [200, 200, 200], "probes and scrapers need no token");
    assert!(metrics.lines().any(|l| l == format!("sluice_counter_unauthorized_total {refusals}")), "{metrics}");
    assert!(metrics.lines().any(|l| l == format!("sluice_counter_responses_total{{status=\"401\"}} {refusals}")));
    assert!(!metrics.contains(TOKEN));
    let Some(counters) = (match running.app.store() {
        sluice_counter::store::CounterStore::Memory(m) => Some(m.len()),
        sluice_counter::store::CounterStore::Redis(_) => None,
    }) else {
        unreachable!()
    };
    assert_eq!(counters, 1, "refused requests touched no counter; the three answered ones share one");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn callers_without_the_token_get_401_and_with_it_their_answer_over_http1() {
    let _shared = crate::support::HEAVY.read().await;
    callers_without_the_token_get_401_and_with_it_their_answer(Protocol::Http1).await;
}

#[tokio::test]
async fn callers_without_the_token_get_401_and_with_it_their_answer_over_h2c() {
    let _shared = crate::support::HEAVY.read().await;
    callers_without_the_token_get_401_and_with_it_their_answer(Protocol::H2c).await;
}

#[tokio::test]
async fn the_token_shows_in_no_debug_form_of_the_config_or_the_running_service() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, dir) = with_token_file().await;
    let config = Config { token: Some(TOKEN.to_owned().into()), ..Config::defaults() };

    let shown = format!("{running:?} {config:?} {:?}", config.auth());

    assert!(!shown.contains(TOKEN), "{shown}");
    running.stop().await.expect("clean stop");
    drop(dir);
}

#[tokio::test]
async fn an_empty_or_unreadable_token_file_refuses_to_start_naming_the_flag() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    let listener = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind") };

    let empty_err =
        sluice_counter::Running::start(listener().await, Config { token_file: Some(empty), ..Config::defaults() })
            .await
            .expect_err("an empty token file is refused");
    let missing_err = sluice_counter::Running::start(
        listener().await,
        Config { token_file: Some(dir.path().join("missing")), ..Config::defaults() },
    )
    .await
    .expect_err("a missing token file is refused");

    assert!(empty_err.to_string().starts_with("--token-file "), "{empty_err}");
    assert!(missing_err.to_string().starts_with("--token-file "), "{missing_err}");
}

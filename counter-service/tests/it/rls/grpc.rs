//! The RLS front door over gRPC, as Envoy calls it: answers, errors as gRPC statuses
//! (never `overall_code: UNKNOWN`), the bearer token, response headers, metrics, and a
//! configuration directory that changes under a running service.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_counter::Running;
use sluice_counter::config::{Config, StoreKind};
use tonic::transport::Channel;

use crate::support::{Http, RedisServer};

const RULES: &str =
    "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2, name: per-user}\n";

fn rls_config(dir: &Path) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        rls_config: Some(dir.to_owned()),
        rls_listen: "127.0.0.1:0".parse().expect("addr"),
        rls_reload_ms: 10,
        ..Config::defaults()
    }
}

async fn start(config: Config) -> (Running, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let running = Running::start(listener, config).await.expect("the service starts");
    let rls = running.rls.as_ref().expect("rls is served").addr;
    (running, rls)
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}")).await.expect("connects")
}

fn request(domain: &str, user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "user".to_owned(), value: user.to_owned() }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn ask(client: &mut RateLimitServiceClient<Channel>, request: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(request).await.expect("answered").into_inner()
}

/// Replaces `shop.yaml` in `dir` at once (a rename), as a ConfigMap update does: the
/// service never reads half a file.
fn replace(dir: &Path, rules: &str) {
    let staged = dir.join(".shop.yaml.next");
    std::fs::write(&staged, rules).expect("write");
    std::fs::rename(&staged, dir.join("shop.yaml")).expect("rename");
}

fn dir_with(rules: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("shop.yaml"), rules).expect("write");
    dir
}

#[tokio::test]
async fn envoys_call_is_answered_with_one_status_per_descriptor_and_the_limit_it_met() {
    let dir = dir_with(RULES);
    let (running, addr) = start(rls_config(dir.path())).await;
    let mut rls = client(addr).await;

    let answers = [ask(&mut rls, request("shop", "ann")).await, ask(&mut rls, request("shop", "ann")).await];
    let third = ask(&mut rls, request("shop", "ann")).await;

    let codes: Vec<(i32, u32)> = answers.iter().map(|a| (a.overall_code, a.statuses[0].limit_remaining)).collect();
    assert_eq!(codes, [(Code::Ok as i32, 1), (Code::Ok as i32, 0)]);
    assert_eq!(third.overall_code, Code::OverLimit as i32);
    let status = &third.statuses[0];
    let limit = status.current_limit.as_ref().expect("the limit it met");
    assert_eq!((limit.requests_per_unit, limit.name.as_str()), (2, "per-user"));
    let reset = status.duration_until_reset.expect("a reset").seconds;
    assert!((1..=3600).contains(&reset), "{reset}");
    assert!(third.response_headers_to_add.is_empty(), "no headers unless asked for");
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn a_malformed_request_is_invalid_argument_and_never_unknown() {
    let dir = dir_with(RULES);
    let (running, addr) = start(rls_config(dir.path())).await;
    let mut rls = client(addr).await;

    let no_domain = rls.should_rate_limit(request("", "ann")).await.expect_err("refused");
    let no_descriptors = rls
        .should_rate_limit(RateLimitRequest { descriptors: vec![], ..request("shop", "ann") })
        .await
        .expect_err("refused");

    assert_eq!(no_domain.code(), tonic::Code::InvalidArgument);
    assert_eq!(no_domain.message(), "rate limit domain must not be empty");
    assert_eq!(no_descriptors.code(), tonic::Code::InvalidArgument);
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn a_caller_without_the_bearer_token_is_unauthenticated() {
    let dir = dir_with(RULES);
    let config = Config { token: Some("s3cret-token".to_owned().into()), ..rls_config(dir.path()) };
    let (running, addr) = start(config).await;
    let mut rls = client(addr).await;

    let without = rls.should_rate_limit(request("shop", "ann")).await.expect_err("refused");
    let mut with = tonic::Request::new(request("shop", "ann"));
    with.metadata_mut().insert("authorization", "Bearer s3cret-token".parse().expect("metadata"));
    let answered = rls.should_rate_limit(with).await.expect("answered").into_inner();

    assert_eq!(without.code(), tonic::Code::Unauthenticated);
    assert_eq!(answered.overall_code, Code::Ok as i32);
    running.stop().await.expect("stops");
}

/// The service on `redis` with the rules of [`RULES`] and Redis calls bounded by
/// `timeout_ms`; the rules' directory lives as long as the returned handle.
async fn start_on_redis(redis: &RedisServer, timeout_ms: u64) -> (Running, SocketAddr, tempfile::TempDir) {
    let dir = dir_with(RULES);
    let config = Config {
        store: StoreKind::Redis,
        redis_url: vec![redis.url()],
        redis_timeout_ms: timeout_ms,
        ..rls_config(dir.path())
    };
    let (running, addr) = start(config).await;
    (running, addr, dir)
}

#[tokio::test]
async fn a_store_past_its_deadline_is_unavailable_so_envoys_failure_mode_decides() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let (running, addr, _dir) = start_on_redis(&redis, 100).await;
    let mut rls = client(addr).await;
    ask(&mut rls, request("shop", "ann")).await;

    redis.signal("STOP");
    let stalled = rls.should_rate_limit(request("shop", "ann")).await;
    redis.signal("CONT");

    let error = stalled.expect_err("not decided");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    assert!(error.message().contains("did not answer within 100 ms"), "{}", error.message());
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn headers_asked_for_carry_the_limit_and_the_exact_wait() {
    let dir = dir_with(RULES);
    let config = Config { rls_response_headers: "ietf,retry-after,ratelimit".to_owned(), ..rls_config(dir.path()) };
    let (running, addr) = start(config).await;
    let mut rls = client(addr).await;

    let ok = ask(&mut rls, request("shop", "bo")).await;
    ask(&mut rls, request("shop", "bo")).await;
    let over = ask(&mut rls, request("shop", "bo")).await;

    let header = |r: &RateLimitResponse, name: &str| {
        r.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.clone())
    };
    let reset = over.statuses[0].duration_until_reset.expect("a reset").seconds;
    assert_eq!(header(&ok, "RateLimit-Policy").as_deref(), Some("\"per-user\";q=2;w=3600"));
    assert_eq!(header(&ok, "RateLimit-Remaining").as_deref(), Some("1"));
    assert_eq!(header(&ok, "Retry-After"), None, "only when over");
    assert_eq!(header(&over, "Retry-After"), Some(reset.to_string()));
    assert_eq!(header(&over, "RateLimit").as_deref(), Some(format!("\"per-user\";r=0;t={reset}").as_str()));
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn a_changed_directory_applies_without_a_restart_and_a_bad_one_leaves_the_last_good_in_force() {
    let dir = dir_with(RULES);
    let (running, addr) = start(rls_config(dir.path())).await;
    let mut rls = client(addr).await;
    let limit_of = |r: &RateLimitResponse| r.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit);

    replace(dir.path(), &RULES.replace("requests_per_unit: 2", "requests_per_unit: 7"));
    let mut raised = None;
    for _ in 0..500 {
        raised = limit_of(&ask(&mut rls, request("shop", "cy")).await);
        if raised == Some(7) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    replace(dir.path(), "domain: shop\nbroken: [\n");
    let http = Http::new(running.addr);
    let mut errors = 0;
    for _ in 0..500 {
        let (_, metrics) = http.get("/metrics").await;
        errors = metric(&metrics, "sluice_counter_rls_config_loads_total{outcome=\"error\"}");
        if errors > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kept = limit_of(&ask(&mut rls, request("shop", "cy")).await);

    assert_eq!(raised, Some(7), "the new numbers apply without a restart");
    assert_eq!(errors, 1, "the bad directory is counted once");
    assert_eq!(kept, Some(7), "the last good configuration stays in force");
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn a_directory_that_does_not_load_stops_the_start_naming_the_file() {
    let dir = dir_with("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: eon}\n");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");

    let error = Running::start(listener, rls_config(dir.path())).await.expect_err("refused").to_string();

    assert!(error.contains("shop.yaml: shop.user: invalid rate limit unit 'eon'"), "{error}");
}

#[tokio::test]
async fn each_rules_hits_are_counted_under_its_path_never_under_a_callers_value() {
    let dir = dir_with(RULES);
    let (running, addr) = start(rls_config(dir.path())).await;
    let mut rls = client(addr).await;
    for user in ["a", "a", "a", "b"] {
        ask(&mut rls, request("shop", user)).await;
    }
    ask(&mut rls, request("elsewhere", "a")).await;

    let (_, metrics) = Http::new(running.addr).get("/metrics").await;

    assert_eq!(metric(&metrics, "sluice_counter_rls_total_hits_total{rule=\"shop.user\"}"), 4);
    assert_eq!(metric(&metrics, "sluice_counter_rls_over_limit_total{rule=\"shop.user\"}"), 1);
    assert_eq!(metric(&metrics, "sluice_counter_rls_within_limit_total{rule=\"shop.user\"}"), 3);
    assert_eq!(metric(&metrics, "sluice_counter_rls_domain_not_found_total"), 1);
    assert_eq!(metric(&metrics, "sluice_counter_rls_requests_total{outcome=\"ok\"}"), 5);
    assert!(!metrics.contains("user_a"), "no caller's value in a label");
    running.stop().await.expect("stops");
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0)
}

#[tokio::test]
async fn an_operators_bypass_set_on_a_rules_policy_lets_its_rls_traffic_through_and_says_so() {
    let dir = dir_with(RULES);
    let config = crate::overrides::admin_config(rls_config(dir.path()));
    let running = crate::overrides::start(config).await;
    let mut rls = client(running.rls.as_ref().expect("rls").addr).await;
    let authorized = |user: &str| {
        let mut request = tonic::Request::new(request("shop", user));
        let bearer = format!("Bearer {}", crate::overrides::PROXY);
        request.metadata_mut().insert("authorization", bearer.parse().expect("metadata"));
        request
    };
    for _ in 0..2 {
        rls.should_rate_limit(authorized("fay")).await.expect("answered");
    }

    let bypass = serde_json::json!({"kind": "bypass", "policy": "per-user", "ttl_ms": 60_000, "reason": "incident", "operator": "ops"});
    let (created, body) = crate::overrides::admin(&running).post(crate::overrides::OVERRIDES, &bypass).await;
    let after = rls.should_rate_limit(authorized("fay")).await.expect("answered").into_inner();

    assert_eq!(created, 201, "{body}");
    assert_eq!(after.overall_code, Code::Ok as i32, "over its limit, but bypassed");
    let named = after.response_headers_to_add.iter().find(|h| h.key == "x-sluice-override").map(|h| h.value.clone());
    assert_eq!(named.as_deref(), body["id"].as_str());
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn a_rule_that_asks_for_detailed_metrics_labels_them_with_the_request_values() {
    let rules = "domain: shop\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let dir = dir_with(rules);
    let (running, addr) = start(rls_config(dir.path())).await;
    let mut rls = client(addr).await;
    for user in ["ann", "ann", "bob"] {
        ask(&mut rls, request("shop", user)).await;
    }

    let (_, metrics) = Http::new(running.addr).get("/metrics").await;

    assert_eq!(metric(&metrics, "sluice_counter_rls_total_hits_total{rule=\"shop.user_ann\"}"), 2);
    assert_eq!(metric(&metrics, "sluice_counter_rls_total_hits_total{rule=\"shop.user_bob\"}"), 1);
    running.stop().await.expect("stops");
}

/// envoyproxy/ratelimit's quota-based choice of upstream: two services in `quota_mode`,
/// each with the name Envoy should route to as its `metadata`; an unlimited rule whose
/// metadata must never be returned.
const QUOTAS: &str = "domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}, tier: gold}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2, zone: b}}
  - key: health
    rate_limit: {unlimited: true}
    metadata: {never: returned}
";

/// Starts the service on the memory store at a frozen instant (no window ends during the
/// test), serving `dir`.
async fn start_frozen(config: Config) -> (Running, SocketAddr) {
    let clock = shared_store::ManualClock::at(shared_store::Nanos::from_secs(1_750_000_020));
    let store = sluice_counter::store::CounterStore::Memory(sluice_counter::store::MemoryCounters::with_clock(
        config.memory(),
        std::sync::Arc::new(clock),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let running = Running::start_with_store(listener, config, store).expect("the service starts");
    let rls = running.rls.as_ref().expect("rls is served").addr;
    (running, rls)
}

fn quota_request() -> RateLimitRequest {
    let descriptor = |key: &str, value: &str| RateLimitDescriptor {
        entries: vec![Entry { key: key.to_owned(), value: value.to_owned() }],
        ..RateLimitDescriptor::default()
    };
    RateLimitRequest {
        domain: "rl".to_owned(),
        descriptors: vec![
            descriptor("service", "service_1"),
            descriptor("service", "service_2"),
            descriptor("health", "x"),
        ],
        hits_addend: 0,
    }
}

/// The answer's `dynamic_metadata`, as JSON (numbers as Envoy reads them: doubles).
fn metadata_json(response: &RateLimitResponse) -> Option<serde_json::Value> {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    fn value(v: &Value) -> serde_json::Value {
        match &v.kind {
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::StructValue(s)) => object(s),
            Some(Kind::ListValue(l)) => serde_json::Value::Array(l.values.iter().map(value).collect()),
            Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
        }
    }
    fn object(s: &Struct) -> serde_json::Value {
        serde_json::Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect())
    }
    response.dynamic_metadata.as_ref().map(object)
}

#[tokio::test]
async fn dynamic_metadata_returns_the_metadata_of_the_quotas_that_passed_so_envoy_can_route_to_one_with_room() {
    let dir = dir_with(QUOTAS);
    let config = Config { rls_response_dynamic_metadata: true, ..rls_config(dir.path()) };
    let (running, addr) = start_frozen(config).await;
    let mut rls = client(addr).await;

    let mut answers = Vec::new();
    for _ in 0..3 {
        let answer = ask(&mut rls, quota_request()).await;
        let code = Code::try_from(answer.overall_code).expect("a code");
        answers.push((code, metadata_json(&answer).expect("dynamic_metadata is asked for")));
    }

    let picked: Vec<Option<&serde_json::Value>> =
        answers.iter().map(|(_, m)| m.pointer("/metadata/service_with_quota/name")).collect();
    let (service_1, service_2) = (serde_json::json!("service_1"), serde_json::json!("service_2"));
    assert_eq!(
        picked,
        [Some(&service_1), Some(&service_2), None],
        "the first quota with room wins: each request spends on both, so service_1 (1) is spent by the first and \
         service_2 (2) by the second"
    );
    assert_eq!(
        answers.iter().map(|(code, _)| *code).collect::<Vec<_>>(),
        [Code::Ok, Code::Ok, Code::OverLimit],
        "quota mode: over only when every quota is"
    );
    let first = &answers[0].1;
    assert_eq!(first["metadata"]["service_with_quota"]["zone"], "b", "mappings under one key merge, depth by depth");
    assert_eq!(first["metadata"]["tier"], "gold");
    assert!(
        answers.iter().all(|(_, m)| m.pointer("/metadata/never").is_none()),
        "an unlimited rule's is never returned"
    );
    assert_eq!(first["domain"], "rl");
    assert_eq!(
        first["descriptors"],
        serde_json::json!([
            {"entries": ["service=service_1"]},
            {"entries": ["service=service_2"]},
            {"entries": ["health=x"]},
        ])
    );
    assert!(first.get("hitsAddend").is_none(), "an unset hits_addend is not written");
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn without_the_flag_an_answer_carries_no_dynamic_metadata() {
    let dir = dir_with(QUOTAS);
    let (running, addr) = start_frozen(rls_config(dir.path())).await;
    let mut rls = client(addr).await;

    let answer = ask(&mut rls, quota_request()).await;

    assert_eq!(answer.dynamic_metadata, None);
    assert_eq!(answer.overall_code, Code::Ok as i32);
    running.stop().await.expect("stops");
}

#[tokio::test]
async fn rls_connections_count_against_the_services_one_bound_on_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = dir_with(RULES);
    let (running, addr) = start(Config { max_connections: 2, ..rls_config(dir.path()) }).await;
    // One connection on each front door: the bound is reached.
    let mut rls = client(addr).await;
    assert_eq!(ask(&mut rls, request("shop", "ann")).await.overall_code, Code::Ok as i32);
    let mut json = tokio::net::TcpStream::connect(running.addr).await.expect("connect");
    json.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut answer = [0u8; 12];
    json.read_exact(&mut answer).await.expect("an answer on a held connection");
    assert_eq!(&answer, b"HTTP/1.1 200");

    let third = tokio::time::timeout(Duration::from_secs(5), async {
        let mut late = RateLimitServiceClient::connect(format!("http://{addr}")).await.map_err(|e| e.to_string())?;
        late.should_rate_limit(request("shop", "bob")).await.map_err(|e| e.to_string())
    })
    .await
    .expect("the third connection is answered or closed within 5 s");
    drop(json);
    let mut metrics = String::new();
    for _ in 0..100 {
        // The JSON connection closes asynchronously; poll until its slot is free again.
        let attempt = tokio::time::timeout(Duration::from_millis(500), Http::new(running.addr).get("/metrics")).await;
        if let Ok((200, body)) = attempt {
            metrics = body;
            break;
        }
    }

    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_counter_refused_connections_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);

    assert!(third.is_err(), "a third connection, on the RLS port, is closed without an answer: {third:?}");
    // At least the RLS one (a client may try twice; a poll for the metrics may be refused too).
    assert!(refused >= 1, "{metrics}");
    assert_eq!(ask(&mut rls, request("shop", "ann")).await.overall_code, Code::Ok as i32, "the held one still serves");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_graceful_stop_closes_the_rls_front_door_and_ends_its_connections() {
    let dir = dir_with(RULES);
    let (running, addr) = start(rls_config(dir.path())).await;
    let mut rls = client(addr).await;
    assert_eq!(ask(&mut rls, request("shop", "ann")).await.overall_code, Code::Ok as i32);

    tokio::time::timeout(Duration::from_secs(10), running.stop())
        .await
        .expect("an idle RLS connection does not hold the stop")
        .expect("clean stop");

    let after = tokio::time::timeout(Duration::from_secs(5), rls.should_rate_limit(request("shop", "ann")))
        .await
        .expect("a call after the stop fails at once");
    assert!(after.is_err(), "{after:?}");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "nothing listens on the RLS port any more");
}

#[tokio::test]
async fn a_graceful_stop_answers_an_rls_call_still_waiting_on_a_slow_store_and_takes_no_new_connection() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let (running, addr, _dir) = start_on_redis(&redis, 10_000).await;
    let json = Http::new(running.addr);
    let mut rls = client(addr).await;
    assert_eq!(ask(&mut rls, request("shop", "ann")).await.overall_code, Code::Ok as i32);
    redis.signal("STOP");
    let call = tokio::spawn(async move { rls.should_rate_limit(request("shop", "ann")).await });
    // The call waits on the stopped store once the service counts it in flight.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&json.get("/metrics").await.1, "sluice_counter_in_flight_requests") < 1 {
        assert!(std::time::Instant::now() < deadline, "the call never reached the store");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let stopping = tokio::spawn(running.stop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "the RLS port still takes connections while draining");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting_for_the_call = !stopping.is_finished();
    redis.signal("CONT");
    let answered = tokio::time::timeout(Duration::from_secs(10), call).await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), stopping).await;

    assert!(waiting_for_the_call, "the stop waits for the call in flight");
    let answered =
        answered.expect("answered once the store is back").expect("the task").expect("an answer, not an error");
    assert_eq!(answered.into_inner().overall_code, Code::Ok as i32, "the second of two an hour");
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "then the stop completes: {stopped:?}");
}

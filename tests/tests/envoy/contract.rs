//! The caller contract in Envoy: status, body, content type, `Retry-After`, the IETF
//! `RateLimit-Policy` / `RateLimit` fields, the legacy `X-RateLimit-*`, headers on allowed
//! responses, and `Cache-Control: private` merged into the upstream's.

use super::*;
use sluice::host::Counter;
use sluice_tests::envoy::cluster;
use sluice_tests::upstream::Upstream;

const CONTRACT: &str = r#"{"policies":[{"name":"api","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":2}],
  "response":{"body":"{\"error\":\"rate_limited\"}","content_type":"application/json",
              "headers_on_rejected":["retry_after","ratelimit","x_ratelimit"],
              "headers_on_allowed":["ratelimit","x_ratelimit"]}}"#;

fn envoy(upstream: &Upstream) -> Envoy {
    Envoy::builder()
        .workers(2)
        .cluster(cluster("backend", upstream.addr(), false))
        .route_to("backend")
        .sluice(sluice(CONTRACT))
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn allowed_responses_carry_the_quota_and_a_private_cache_control() {
    let upstream = Upstream::start(&[("cache-control", "public, max-age=60")]);
    let envoy = envoy(&upstream);

    let first = send(&envoy, &Request::get("/").header("x-api-key", "alice"));

    assert_eq!(first.status, 200);
    assert_eq!(first.text(), "upstream saw /\n");
    assert_eq!(first.header("ratelimit-policy"), Some(r#""api";q=2;w=120"#));
    assert_eq!(first.header("ratelimit"), Some(r#""api";r=1;t=60"#));
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(first.header("cache-control"), Some("private, max-age=60"), "public is dropped, max-age kept");
}

#[test]
fn a_rejection_has_the_configured_status_body_and_every_header_family() {
    let upstream = Upstream::start(&[]);
    let envoy = envoy(&upstream);
    for _ in 0..2 {
        assert_eq!(send(&envoy, &Request::get("/").header("x-api-key", "bob")).status, 200);
    }

    let rejected = send(&envoy, &Request::get("/").header("x-api-key", "bob"));

    assert_eq!(rejected.status, 429);
    assert_eq!(rejected.text(), r#"{"error":"rate_limited"}"#);
    assert_eq!(rejected.header("content-type"), Some("application/json"));
    assert_eq!(rejected.header("retry-after"), Some("60"));
    assert_eq!(rejected.header("ratelimit-policy"), Some(r#""api";q=2;w=120"#));
    assert_eq!(rejected.header("ratelimit"), Some(r#""api";r=0;t=60"#));
    assert_eq!(rejected.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(rejected.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(rejected.header("cache-control"), Some("private"));
    assert_eq!(upstream.served(), 2, "the rejection never reached the upstream");
    assert_eq!(envoy.metric("api", Counter::OverLimit), 1);
}

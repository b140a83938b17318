//! A policy of N/second with burst B admits exactly B, then N per second; the headers
//! carry exact values.

use super::*;
use sluice::host::Counter;

const CONFIG: &str = r#"{"policies":[{"name":"api","key":[{"header":"x-api-key"}],"rate":"5/second","burst":10}],
  "response":{"headers_on_rejected":["retry_after","ratelimit","x_ratelimit"],"headers_on_allowed":["ratelimit"]}}"#;

fn request() -> Request {
    Request::get("/").header("x-api-key", "alice")
}

#[test]
fn a_burst_of_b_is_admitted_then_exactly_n_per_second() {
    let mut host = host(CONFIG);

    let burst = (0..25).filter(|_| status(&mut host, request()) == 200).count();
    let mut per_second = Vec::new();
    for _ in 0..10 {
        host.advance(secs(1));
        per_second.push((0..25).filter(|_| status(&mut host, request()) == 200).count());
    }

    assert_eq!(burst, 10);
    assert_eq!(per_second, vec![5; 10]);
    assert_accounting(&host, "api");
    assert_eq!(metric(&host, "api", Counter::Allowed), 60);
    assert_eq!(metric(&host, "api", Counter::Rejected), 215);
}

#[test]
fn one_token_refills_every_fifth_of_a_second_and_not_a_nanosecond_earlier() {
    let mut host = host(CONFIG);
    for _ in 0..10 {
        send(&mut host, request());
    }

    host.advance(Duration::from_nanos(199_999_999));
    let early = status(&mut host, request());
    host.advance(Duration::from_nanos(1));
    let on_time = status(&mut host, request());
    let after = status(&mut host, request());

    assert_eq!((early, on_time, after), (429, 200, 429));
}

#[test]
fn a_rejection_carries_exact_retry_after_and_ratelimit_fields() {
    let mut host = host(CONFIG);
    for _ in 0..10 {
        send(&mut host, request());
    }
    host.advance(millis(50));

    let rejected = send(&mut host, request());

    assert_eq!(rejected.status(), Some(429));
    // The next token is 150 ms away: Retry-After rounds up to 1 s, never early.
    assert_eq!(rejected.header_str("retry-after"), Some("1"));
    assert_eq!(rejected.header_str("ratelimit-policy"), Some("\"api\";q=10;w=2"));
    assert_eq!(rejected.header_str("ratelimit"), Some("\"api\";r=0;t=1"));
    assert_eq!(rejected.header_str("x-ratelimit-limit"), Some("10"));
    assert_eq!(rejected.header_str("x-ratelimit-remaining"), Some("0"));
    assert_eq!(rejected.header_str("x-ratelimit-reset"), Some("1"));
    assert_eq!(rejected.header_str("cache-control"), Some("private"));
    assert!(rejected.response.as_ref().unwrap().is_local());
}

#[test]
fn allowed_responses_carry_the_remaining_quota_and_are_kept_out_of_shared_caches() {
    let mut host = host(CONFIG);

    let first =
        host.worker(0).exchange(request(), Response::ok().header("cache-control", "public, max-age=60")).unwrap();
    let second = send(&mut host, request());

    assert_eq!(first.header_str("ratelimit"), Some("\"api\";r=9;t=1"));
    assert_eq!(first.header_str("ratelimit-policy"), Some("\"api\";q=10;w=2"));
    assert_eq!(first.header_str("cache-control"), Some("private, max-age=60"));
    assert_eq!(first.header_str("retry-after"), None);
    assert_eq!(second.header_str("ratelimit"), Some("\"api\";r=8;t=1"));
    assert_eq!(second.header_str("cache-control"), Some("private"));
}

#[test]
fn no_rate_limit_headers_are_sent_when_none_are_configured() {
    let mut host = host(
        r#"{"policies":[{"name":"api","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":1}],
        "response":{"headers_on_rejected":[],"body":"nope","status":503}}"#,
    );

    let allowed = send(&mut host, request());
    let rejected = send(&mut host, request());

    assert_eq!(allowed.header_str("ratelimit"), None);
    assert_eq!(allowed.header_str("cache-control"), None);
    assert_eq!(rejected.status(), Some(503));
    assert_eq!(rejected.header_str("retry-after"), None);
    assert_eq!(rejected.header_str("ratelimit"), None);
    assert_eq!(rejected.header_str("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(rejected.response.unwrap().body_text(), "nope");
}

#[test]
fn a_clock_that_steps_backwards_never_refills_a_bucket() {
    let mut host = host(CONFIG);
    for _ in 0..10 {
        send(&mut host, request());
    }
    host.advance(secs(10));
    let refilled = (0..25).filter(|_| status(&mut host, request()) == 200).count();

    host.clock().unwrap().rewind(secs(5));
    let after_rewind = (0..25).filter(|_| status(&mut host, request()) == 200).count();
    host.advance(secs(6));
    let after_catching_up = (0..25).filter(|_| status(&mut host, request()) == 200).count();

    assert_eq!(refilled, 10);
    assert_eq!(after_rewind, 0);
    // Back at the time of the last admissions plus one second: 5 tokens.
    assert_eq!(after_catching_up, 5);
    assert!(host.traps().is_empty());
}

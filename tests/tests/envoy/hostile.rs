//! Hostile requests within Envoy's own limits (non-UTF-8 values, long values, many
//! headers, odd paths and query strings) through every kind of key part: every request
//! gets an answer from the filter, and no VM fails (no `FAIL_CLOSED` 503, no VM lost).

use super::*;
use sluice::host::Counter;
use sluice_tests::http::Connection;

const EVERY_KEY_PART: &str = r#"{"policies":[
  {"name":"header","key":[{"header":"x-api-key"}],"rate":"1000/second","cost":{"header":"x-cost","max":5}},
  {"name":"query","key":[{"query_parameter":"user"},"method"],"rate":"1000/second"},
  {"name":"path","key":["path","authority"],"rate":"1000/second","match":{"path_prefix":"/"}},
  {"name":"client","key":[{"masked_client_address":{"ipv4_prefix":24}}],"rate":"1000/second"},
  {"name":"property","key":[{"property":["request","useragent"]}],"rate":"1000/second",
   "match":{"headers":[{"name":"x-match","equals":"\u00ff"}]}}
],"response":{"headers_on_allowed":["ratelimit"]}}"#;

fn hostile_requests() -> Vec<Vec<u8>> {
    let mut requests: Vec<Vec<u8>> = Vec::new();
    let raw = |head: &[u8]| {
        let mut r = head.to_vec();
        r.extend_from_slice(b"\r\n\r\n");
        r
    };
    let mut binary = b"GET / HTTP/1.1\r\nhost: h\r\nx-api-key: ".to_vec();
    binary.extend((0x80u8..=0xff).collect::<Vec<u8>>());
    binary.extend_from_slice(b"\r\nx-cost: \xff\xfe9\r\nx-match: \xc3\xbf");
    requests.push(raw(&binary));
    let long = "v".repeat(50 * 1024);
    requests.push(raw(format!("GET / HTTP/1.1\r\nhost: h\r\nx-api-key: {long}").as_bytes()));
    let many: String = (0..90).map(|i| format!("\r\nx-h{i}: {i}")).collect();
    requests.push(raw(format!("GET / HTTP/1.1\r\nhost: h{many}\r\nx-api-key: many").as_bytes()));
    for path in
        ["/%ZZ%00%", "//a/../../b", "/?user=%FF%FE&user=&&==&user", "/?", "/a?user=\u{7f}", "*", "/x?user=1#frag"]
    {
        requests.push(raw(format!("GET {path} HTTP/1.1\r\nhost: h\r\nx-cost: 99999999999999999999999").as_bytes()));
    }
    let long_path = format!("/{}", "p".repeat(8000));
    requests.push(raw(format!(
        "POST {long_path}?user={} HTTP/1.1\r\nhost: H.Example.COM\r\ncontent-length: 0",
        "u".repeat(4000)
    )
    .as_bytes()));
    requests.push(raw(b"GET / HTTP/1.1\r\nhost: h\r\nuser-agent: \xff\xff\r\nx-match: \xff"));
    requests.push(raw(b"GET / HTTP/1.1\r\nhost: \xe2\x82\xac\r\nx-api-key:\r\nx-cost: -1"));
    requests
}

#[test]
fn hostile_requests_get_answers_and_no_vm_fails() {
    let envoy = Envoy::with_sluice(EVERY_KEY_PART, 2);
    let before = envoy.stats();
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();

    for _ in 0..20 {
        for request in hostile_requests() {
            let mut connection = Connection::connect(envoy.addr()).unwrap();
            let status = connection.send_raw(&request, false).map_or(0, |r| r.status);
            *statuses.entry(status).or_default() += 1;
        }
    }

    let after = envoy.stats();
    eprintln!("statuses: {statuses:?}");
    assert!(!statuses.contains_key(&503), "a FAIL_CLOSED 503 means a VM failed: {statuses:?}");
    assert!(!statuses.contains_key(&0), "every request got an answer: {statuses:?}");
    assert!(statuses.get(&200).copied().unwrap_or(0) > 0);
    let active = |stats: &sluice_tests::envoy::Stats| stats.get("wasm.envoy.wasm.runtime.v8.active").copied();
    assert_eq!(active(&after), active(&before), "no VM was lost");
    assert!(envoy.log().lines().all(|l| !l.contains("sluice: panic")));
    for policy in ["header", "query", "path", "client"] {
        assert!(envoy.metric(policy, Counter::Offered) > 0, "{policy} saw the requests");
    }
}

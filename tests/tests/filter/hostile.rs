//! Hostile requests get a decision, never a trap: non-UTF-8 bytes, 64 KiB values,
//! 1 000 headers, generated at random.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use sluice::host::Counter;
use std::cell::RefCell;
use wasm_host::Headers;

/// A configuration that reads every kind of request input there is.
const READS_EVERYTHING: &str = r#"{"policies":[
  {"name":"all","match":{"headers":[{"name":"x-tenant","present":true}]},
   "key":[{"header":"x-api-key"},{"query_parameter":"user"},"authority","path","method",
          {"masked_client_address":{"ipv4_prefix":24,"ipv6_prefix":48}},{"property":["request","id"]}],
   "rate":"100/second","burst":100,"cost":{"header":"x-cost","max":5}},
  {"name":"equals","match":{"path_prefix":"/","methods":["GET","POST"],"headers":[{"name":"x-api-key","equals":"k"}]},
   "key":[{"header":"x-api-key"}],"rate":"1/second","burst":1,"on_missing_key":"reject"}],
  "response":{"headers_on_rejected":["retry_after","ratelimit","x_ratelimit"],"headers_on_allowed":["ratelimit","x_ratelimit"]}}"#;

fn decided(host: &mut Host, request: Request) {
    let exchange = send(host, request);
    assert!(matches!(exchange.status(), Some(200 | 429)), "{:?}", exchange.status());
    assert!(host.traps().is_empty(), "{:?}", host.traps());
}

#[test]
fn a_thousand_headers_of_64_kib_of_non_utf8_bytes_get_a_decision() {
    let mut host = host(READS_EVERYTHING);
    let mut headers = Headers::from_pairs([
        (b":method".as_slice(), b"GET".as_slice()),
        (b":path".as_slice(), b"/\xff\xfe?user=\xc3\x28&user=x".as_slice()),
        (b":authority".as_slice(), b"\xe2\x82".as_slice()),
        (b"x-tenant".as_slice(), b"\x80".as_slice()),
    ]);
    let big = vec![0xffu8; 64 * 1024];
    headers.add("x-api-key", &big);
    headers.add("x-cost", b"\xff99999999999999999999999");
    for i in 0..1000 {
        headers.add(format!("x-junk-{i}"), &big[..if i % 10 == 0 { big.len() } else { 64 }]);
    }

    for _ in 0..3 {
        decided(&mut host, Request::from_headers(headers.clone()));
    }
}

#[test]
fn requests_without_pseudo_headers_get_a_decision() {
    let mut host = host(READS_EVERYTHING);

    decided(&mut host, Request::from_headers(Headers::from_pairs([(b"x-tenant".as_slice(), b"t".as_slice())])));
    decided(&mut host, Request::from_headers(Headers::new()));
}

fn header_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"x-api-key".to_vec()),
        Just(b"x-tenant".to_vec()),
        Just(b"x-cost".to_vec()),
        Just(b":authority".to_vec()),
        Just(b"x-forwarded-for".to_vec()),
        prop::collection::vec(any::<u8>(), 1..24),
    ]
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (any::<u8>(), 1usize..65536).prop_map(|(b, n)| vec![b; n]),
        1 => Just(b"k".to_vec()),
    ]
}

fn hostile_request() -> impl Strategy<Value = Request> {
    let method = prop_oneof![Just(b"GET".to_vec()), Just(b"POST".to_vec()), prop::collection::vec(any::<u8>(), 0..10)];
    let path = prop::collection::vec(any::<u8>(), 0..300);
    let headers = prop::collection::vec((header_name(), header_value()), 0..200);
    (method, path, headers, any::<u16>(), any::<bool>()).prop_map(|(method, path, headers, port, v6)| {
        let mut pairs =
            Headers::from_pairs([(b":method".as_slice(), method.as_slice()), (b":path".as_slice(), path.as_slice())]);
        for (name, value) in &headers {
            pairs.add(name, value);
        }
        let source = if v6 {
            format!("[2001:db8::{port:x}]:{port}")
        } else {
            format!("10.{}.{}.1:{port}", port >> 8, port & 0xff)
        };
        Request::from_headers(pairs).source(source.parse().unwrap())
    })
}

#[test]
fn generated_hostile_requests_never_trap() {
    // One VM for every case, as in a proxy: a trap would also poison later requests.
    let host = RefCell::new(host(READS_EVERYTHING));
    let mut runner =
        TestRunner::new(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() });

    let result = runner.run(&hostile_request(), |request| {
        let mut host = host.borrow_mut();
        let exchange = send(&mut host, request);
        prop_assert!(matches!(exchange.status(), Some(200 | 429)), "status {:?}", exchange.status());
        prop_assert!(host.traps().is_empty(), "{:?}", host.traps());
        Ok(())
    });

    result.unwrap();
    assert!(metric(&host.borrow(), "all", Counter::Offered) > 0, "no generated request reached the policy");
}

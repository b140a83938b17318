//! Policy behaviour through the compiled module: shadow mode, missing keys, costs,
//! layered policies, client identity, reconfiguration, plugin isolation.

use super::*;
use sluice::host::Counter;
use std::net::SocketAddr;
use std::sync::Arc;

fn admitted(host: &mut Host, count: usize, request: impl Fn(usize) -> Request) -> usize {
    (0..count).filter(|i| status(host, request(*i)) == 200).count()
}

fn from(addr: &str) -> Request {
    Request::get("/").source(addr.parse::<SocketAddr>().unwrap())
}

#[test]
fn a_shadow_policy_counts_what_it_would_reject_and_rejects_nothing() {
    let mut host = host(
        r#"{"policies":[
          {"name":"current","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":6},
          {"name":"candidate","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":2,"shadow":true}]}"#,
    );

    let count = admitted(&mut host, 10, |_| Request::get("/").header("x-api-key", "k"));

    assert_eq!(count, 6);
    assert_eq!(metric(&host, "candidate", Counter::ShadowRejected), 4);
    assert_eq!(metric(&host, "current", Counter::OverLimit), 4);
    assert_accounting(&host, "current");
    assert_accounting(&host, "candidate");
}

#[test]
fn requests_without_the_key_share_one_bucket_by_default() {
    let mut host = host(r#"{"policies":[{"name":"k","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":3}]}"#);

    let anonymous = admitted(&mut host, 10, |_| Request::get("/"));
    let keyed = admitted(&mut host, 10, |_| Request::get("/").header("x-api-key", "a"));

    assert_eq!((anonymous, keyed), (3, 3));
    assert_eq!(metric(&host, "k", Counter::MissingKey), 10);
}

#[test]
fn requests_without_the_key_are_rejected_or_skipped_as_configured() {
    let mut reject = host(
        r#"{"policies":[{"name":"k","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":3,"on_missing_key":"reject"}]}"#,
    );
    let mut skip = host(
        r#"{"policies":[{"name":"k","key":[{"header":"x-api-key"}],"rate":"1/minute","burst":3,"on_missing_key":"skip"}]}"#,
    );

    assert_eq!(admitted(&mut reject, 5, |_| Request::get("/")), 0);
    assert_eq!(admitted(&mut skip, 5, |_| Request::get("/")), 5);
    assert_eq!(metric(&skip, "k", Counter::Offered), 0);
}

#[test]
fn a_cost_header_spends_its_clamped_value() {
    let mut host = host(
        r#"{"policies":[{"name":"c","key":[{"constant":"all"}],"rate":"1/minute","burst":10,
        "cost":{"header":"x-cost","min":1,"max":4}}]}"#,
    );

    let costly = admitted(&mut host, 5, |_| Request::get("/").header("x-cost", "1000"));

    // 4 + 4 fit in 10; the third (4 more) does not, but two unit requests do.
    assert_eq!(costly, 2);
    assert_eq!(admitted(&mut host, 5, |_| Request::get("/")), 2);
}

#[test]
fn layered_policies_spend_all_or_nothing() {
    let mut host = host(include_str!("../../../examples/tenant-operation.json"));
    let report = || Request::post("/reports/export", "").header("x-tenant-id", "acme");

    let reports = admitted(&mut host, 15, |_| report());
    let reads = admitted(&mut host, 400, |_| Request::get("/items").header("x-tenant-id", "acme"));

    assert_eq!(reports, 10);
    // The tenant's burst of 200 lost only the 10 admitted reports to the operation limit.
    assert_eq!(reads, 190);
    assert_eq!(metric(&host, "tenant-operation", Counter::OverLimit), 5);
    for policy in ["tenant", "tenant-operation", "all-traffic"] {
        assert_accounting(&host, policy);
    }
}

#[test]
fn a_rotating_forwarded_for_header_grants_no_extra_requests() {
    let mut host = host(include_str!("../../../examples/per-client-ip.json"));

    let count = admitted(&mut host, 500, |i| {
        from("203.0.113.9:4000")
            .header("x-forwarded-for", format!("198.51.100.{}", i % 250))
            .header("x-real-ip", format!("10.0.{}.1", i % 250))
    });

    assert_eq!(count, 50);
}

#[test]
fn ipv6_clients_in_one_64_share_a_bucket_and_other_64s_do_not() {
    let mut host = host(include_str!("../../../examples/per-client-ip.json"));

    let same_64 = admitted(&mut host, 200, |i| from(&format!("[2001:db8:1:2::{:x}]:443", i + 1)));
    let other_64 = admitted(&mut host, 200, |i| from(&format!("[2001:db8:1:3::{:x}]:443", i + 1)));

    assert_eq!((same_64, other_64), (50, 50));
}

#[test]
fn the_login_example_limits_each_user_per_address() {
    let mut host = host(include_str!("../../../examples/login.json"));
    let attempt =
        |user: &str| Request::post("/login", "").source("192.0.2.1:1000".parse().unwrap()).header("x-login-user", user);

    let alice = admitted(&mut host, 8, |_| attempt("alice"));
    let bob = admitted(&mut host, 8, |_| attempt("bob"));
    let anonymous = status(&mut host, Request::post("/login", ""));

    assert_eq!((alice, bob), (5, 5));
    assert_eq!(anonymous, 429);
}

#[test]
fn a_raised_burst_carries_buckets_over_and_a_version_bump_starts_fresh() {
    let config = |burst: u32, version: u32| {
        format!(
            r#"{{"policies":[{{"name":"k","key":[{{"constant":"x"}}],"rate":"1/hour","burst":{burst},"version":{version}}}]}}"#
        )
    };
    let mut host = host(&config(3, 0));
    assert_eq!(admitted(&mut host, 5, |_| Request::get("/")), 3);

    host.reconfigure(config(10, 0)).unwrap();
    let after_raise = admitted(&mut host, 20, |_| Request::get("/"));
    host.reconfigure(config(10, 1)).unwrap();
    let after_bump = admitted(&mut host, 20, |_| Request::get("/"));

    assert_eq!(after_raise, 0);
    assert_eq!(after_bump, 10);
}

#[test]
fn a_slot_table_cannot_be_resized_without_a_version_bump() {
    let mut host = host(r#"{"policies":[{"name":"k","key":["client_address"],"rate":"1/second","slots":64}]}"#);

    let error = host
        .reconfigure(r#"{"policies":[{"name":"k","key":["client_address"],"rate":"1/second","slots":128}]}"#)
        .unwrap_err();

    let message = error.to_string();
    assert!(message.contains("policies[0].slots: policy \"k\" version 0 already has 64 slots"), "{message}");
    assert!(
        host.reconfigure(
            r#"{"policies":[{"name":"k","key":["client_address"],"rate":"1/second","slots":128,"version":1}]}"#
        )
        .is_ok()
    );
}

#[test]
fn two_plugins_sharing_a_vm_id_keep_separate_buckets() {
    let store = Arc::new(wasm_host::SharedDataStore::new());
    let config = r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":2}]}"#;
    let mut first = builder(config).plugin_name("first").shared_store(Arc::clone(&store)).build().unwrap();
    let mut second = builder(config).plugin_name("second").shared_store(Arc::clone(&store)).build().unwrap();

    let a = admitted(&mut first, 5, |_| Request::get("/"));
    let b = admitted(&mut second, 5, |_| Request::get("/"));

    assert_eq!((a, b), (2, 2));
    let keys: Vec<Vec<u8>> = first.shared_data().entries().into_iter().map(|(k, _)| k).collect();
    assert!(keys.iter().any(|k| k.starts_with(b"sluice/first/sluice/p/k/")));
    assert!(keys.iter().any(|k| k.starts_with(b"sluice/second/sluice/p/k/")));
}

#[test]
fn workers_of_one_proxy_share_buckets_and_the_hash_secret() {
    let mut host = builder(r#"{"policies":[{"name":"k","key":[{"header":"x-api-key"}],"rate":"1/hour","burst":4}]}"#)
        .workers(2)
        .build()
        .unwrap();

    let mut admitted = 0;
    for i in 0..10 {
        let exchange = host.worker(i % 2).exchange(Request::get("/").header("x-api-key", "k"), Response::ok()).unwrap();
        admitted += usize::from(exchange.status() == Some(200));
    }

    assert_eq!(admitted, 4);
}

#[test]
fn an_undecodable_bucket_is_repaired_conservatively_and_counted() {
    let mut host = host(r#"{"policies":[{"name":"k","key":[{"constant":"x"}],"rate":"1/hour","burst":5}]}"#);
    assert_eq!(status(&mut host, Request::get("/")), 200);
    let data = host.shared_data();
    let slot = data
        .entries()
        .into_iter()
        .map(|(k, _)| k)
        .find(|k| k.starts_with(b"sluice/sluice/sluice/p/k/v0/") && !k.ends_with(b"meta"))
        .unwrap();
    let (_, cas) = data.get(&slot).unwrap();
    let _ = data.set(&slot, b"garbage", cas);

    let after = admitted(&mut host, 5, |_| Request::get("/"));

    assert_eq!(after, 0);
    assert_eq!(metric(&host, "k", Counter::Repaired), 1);
}

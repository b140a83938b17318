//! Shared data (`proxy_{get,set}_shared_data`) in Envoy and in wasm-host, compared.
//!
//! wasm-host's `SharedDataStore` is written from Envoy's rules (proxy-wasm-cpp-host's
//! `SharedData::get` / `set`; see the `wasm_host::shared_data` docs), not taken from the
//! model the filter's own tests trust, so that a mistake in one does not pass in both.
//! These tests hold it to Envoy: the same get / set / CAS sequences, run by the test
//! guest's `shared-script` operation with the raw host calls, in a fresh Envoy process
//! and in wasm-host (one fresh store), give the same status for every call and the same
//! value and cas for every read. In Envoy the request then goes to an echo upstream,
//! which sends back the `x-shared-step-<i>` headers the guest added.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_artifacts::TEST_GUEST_WASM;
use sluice_tests::echo::{self, Echo};
use sluice_tests::envoy::{Envoy, cluster, sluice};
use sluice_tests::http::Request;
use wasm_host::{Host, Outcome, SharedDataStore};

/// One request: the plugin (by `vm_id`) that runs the script, and the script.
struct Script {
    vm: &'static str,
    steps: String,
}

fn script(vm: &'static str, steps: &str) -> Script {
    Script { vm, steps: steps.to_owned() }
}

/// What the guest reported: `x-shared-step-<i>` → `<status> [<cas> <value>]`, by step.
type Seen = BTreeMap<usize, String>;

fn observations<'a>(headers: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Seen {
    headers
        .filter_map(|(name, value)| {
            let name = String::from_utf8_lossy(name).to_ascii_lowercase();
            let step = name.strip_prefix("x-shared-step-")?.parse().ok()?;
            Some((step, String::from_utf8_lossy(value.trim_ascii()).into_owned()))
        })
        .collect()
}

fn headers(script: &Script) -> [(&'static str, String); 3] {
    [
        ("x-test-op", "shared-script".to_owned()),
        ("x-shared-vm", script.vm.to_owned()),
        ("x-shared-script", script.steps.clone()),
    ]
}

/// Runs `scripts` one after the other through one Envoy with one test-guest plugin per
/// `vm_id` in `vms` (one worker); what the guest reported for each.
fn in_envoy(vms: &[&str], scripts: &[Script]) -> Vec<Seen> {
    let echo = Echo::start();
    let builder =
        vms.iter().fold(Envoy::builder().workers(1), |b, vm| b.sluice(sluice("").wasm(TEST_GUEST_WASM).named(vm)));
    let envoy =
        builder.cluster(cluster("echo", echo.addr(), false)).route_to("echo").start().unwrap_or_else(|e| panic!("{e}"));
    scripts
        .iter()
        .map(|script| {
            let request = headers(script).iter().fold(Request::get("/shared"), |r, (n, v)| r.header(n, v));
            let response = envoy.send(&request);
            assert_eq!(response.status, 200, "{}", response.text());
            let echoed = echo::headers(&response.body);
            observations(echoed.iter().map(|(n, v)| (n.as_bytes(), v.as_slice())))
        })
        .collect()
}

/// The same scripts in wasm-host: one host per `vm_id`, all on one store, as the
/// plugins of one Envoy process.
fn in_wasm_host(vms: &[&'static str], scripts: &[Script]) -> Vec<Seen> {
    let store = Arc::new(SharedDataStore::new());
    let mut hosts: BTreeMap<&str, Host> = vms
        .iter()
        .map(|vm| {
            let builder = Host::builder(TEST_GUEST_WASM).vm_id(*vm).root_id(*vm).plugin_name(*vm);
            (*vm, builder.shared_store(Arc::clone(&store)).build().unwrap())
        })
        .collect();
    scripts
        .iter()
        .map(|script| {
            let host = hosts.get_mut(script.vm).unwrap();
            let request = headers(script).iter().fold(wasm_host::Request::get("/shared"), |r, (n, v)| r.header(n, v));
            let worker = host.worker(0);
            let stream = worker.request(request);
            let seen = match worker.outcome(stream).unwrap() {
                Outcome::Forwarded(message) => observations(message.headers.iter()),
                other => panic!("wasm-host did not forward the request: {other:?}"),
            };
            worker.respond(stream, wasm_host::Response::ok()).unwrap();
            worker.finish(stream).unwrap();
            seen
        })
        .collect()
}

/// Runs `scripts` in both hosts and asserts that every step got the same answer; returns
/// Envoy's.
fn compare(vms: &[&'static str], scripts: &[Script]) -> Vec<Seen> {
    let envoy = in_envoy(vms, scripts);
    let wasm_host = in_wasm_host(vms, scripts);
    for (index, (script, (envoy, wasm_host))) in scripts.iter().zip(envoy.iter().zip(&wasm_host)).enumerate() {
        assert_eq!(
            envoy.len(),
            script.steps.split(';').filter(|s| !s.trim().is_empty()).count(),
            "request {index}: not every step was reported in Envoy: {envoy:#?}"
        );
        assert_eq!(
            wasm_host, envoy,
            "request {index} (vm {}: {}): wasm-host (left) and Envoy (right) disagree",
            script.vm, script.steps
        );
    }
    envoy
}

fn reports(seen: &Seen) -> Vec<&str> {
    seen.values().map(String::as_str).collect()
}

#[test]
fn get_set_and_cas_follow_the_same_rules_in_both_hosts() {
    let scripts = [
        script(
            "a",
            "get k; set k v1 0; get k; set k v2 @2+1; get k; set k v2 @2; get k; set k v3 @2; \
             set fresh x 777; get fresh; set k ~ 0; get k; set ~ empty-key 0; get ~; set k z @9; set fresh w @9",
        ),
        script("a", "get k; get fresh; get ~; get never"),
    ];

    let envoy = compare(&["a"], &scripts);

    // What Envoy answered, spelled out: NOT_FOUND is 1, CAS_MISMATCH 8; tokens start at
    // 1 and come from one counter for every key; a mismatch changes nothing and uses no
    // token; a missing key is created whatever the cas; the empty key and value are keys
    // and values like any other.
    assert_eq!(
        reports(&envoy[0]),
        [
            "1",
            "0",
            "0 1 v1",
            "8",
            "0 1 v1",
            "0",
            "0 2 v2",
            "8",
            "0",
            "0 3 x",
            "0",
            "0 4 ~",
            "0",
            "0 5 empty-key",
            "8",
            "0"
        ]
    );
    assert_eq!(reports(&envoy[1]), ["0 4 ~", "0 6 w", "0 5 empty-key", "1"]);
}

#[test]
fn keys_are_scoped_by_vm_id_and_tokens_are_process_wide_in_both_hosts() {
    let scripts = [
        script("a", "set k from-a 0; get k"),
        script("b", "get k; set k from-b 1; get k"),
        script("a", "get k; set k again 2; set k again 1; get k"),
        script("b", "get k; set k b2 3; get k"),
    ];

    let envoy = compare(&["a", "b"], &scripts);

    assert_eq!(reports(&envoy[0]), ["0", "0 1 from-a"]);
    assert_eq!(reports(&envoy[1]), ["1", "0", "0 2 from-b"]);
    assert_eq!(reports(&envoy[2]), ["0 1 from-a", "8", "0", "0 3 again"]);
    assert_eq!(reports(&envoy[3]), ["0 2 from-b", "8", "0 2 from-b"]);
}

/// Deterministic scripts over three keys (one of them empty): reads, and writes with
/// cas 0, a token just read, a token just read plus one, or a number near the counter.
fn random_scripts(seed: u64, requests: usize, steps: usize) -> Vec<Script> {
    let mut state = seed;
    let mut next = move |bound: usize| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(state >> 33).unwrap_or(0) % bound
    };
    let keys = ["a", "b", "~"];
    let values = ["x", "yy", "~"];
    (0..requests)
        .map(|_| {
            let mut gets = Vec::new();
            let mut script = Vec::new();
            for index in 0..steps {
                let key = keys[next(keys.len())];
                if next(2) == 0 {
                    gets.push(index);
                    script.push(format!("get {key}"));
                    continue;
                }
                let value = values[next(values.len())];
                let cas = match (next(4), gets.is_empty()) {
                    (0, _) => "0".to_owned(),
                    (1, false) => format!("@{}", gets[next(gets.len())]),
                    (2, false) => format!("@{}+1", gets[next(gets.len())]),
                    _ => next(40).to_string(),
                };
                script.push(format!("set {key} {value} {cas}"));
            }
            Script { vm: "sluice", steps: script.join("; ") }
        })
        .collect()
}

#[test]
fn a_long_generated_sequence_gets_the_same_answers_in_both_hosts() {
    let scripts = random_scripts(0x5eed, 12, 25);

    let envoy = compare(&["sluice"], &scripts);

    // The sequence exercised every outcome.
    let all: Vec<&str> = envoy.iter().flat_map(reports).collect();
    for outcome in ["0", "1", "8"] {
        assert!(all.contains(&outcome), "no step answered {outcome}: {all:?}");
    }
    assert!(all.iter().any(|r| r.starts_with("0 ")), "no read found a key: {all:?}");
}

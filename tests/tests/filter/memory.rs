//! Bounded state: a flood of distinct clients leaves shared data within the policy's
//! slot budget and the VM's memory flat, and a tracked client's limit still holds.

use super::*;
use sluice::host::Counter;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

const SLOTS: u64 = 1024;

/// Linear memory the filter may use, whatever the traffic: a fixed bound, far below
/// what a leak of one allocation per client (1 000 000 of them) would need.
const MEMORY_BOUND: usize = 4 * 1024 * 1024;

#[test]
fn a_million_distinct_clients_stay_within_the_slot_budget_and_a_tracked_client_keeps_its_limit() {
    let config = format!(
        r#"{{"policies":[{{"name":"ip","key":["client_address"],"rate":"1/hour","burst":5,"slots":{SLOTS}}}],
          "response":{{"headers_on_rejected":[]}}}}"#
    );
    let mut host = builder(&config).log_level(wasm_host::LogLevel::Warn).capture_logs(false).build().unwrap();
    let tracked = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 1);
    let mut tracked_admitted = 0;
    let mut memory_after_warmup = 0;

    for i in 0..1_000_000u32 {
        if i % 1000 == 0 {
            let exchange = host.worker(0).exchange(Request::get("/").source(tracked), Response::ok()).unwrap();
            tracked_admitted += usize::from(exchange.status() == Some(200));
        }
        if i == 10_000 {
            memory_after_warmup = host.memory_sizes()[0];
        }
        // Distinct addresses: 10.0.0.0/8 plus the top bits in the port.
        let source = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (i & 0x00ff_ffff))), 1 + (i >> 24) as u16);
        host.worker(0).exchange(Request::get("/").source(source), Response::ok()).unwrap();
    }

    // Slots, the overflow bucket, the missing-key bucket, the table record, the hash
    // secret and the anchor.
    let keys = host.shared_data().entries().len() as u64;
    assert!(keys <= SLOTS + 5, "{keys} shared-data keys for {SLOTS} slots");
    assert_eq!(tracked_admitted, 5);
    let memory = host.memory_sizes()[0];
    assert!(memory <= MEMORY_BOUND, "linear memory grew to {memory} bytes");
    assert_eq!(memory, memory_after_warmup, "linear memory kept growing after warm-up");
    assert!(host.traps().is_empty());
    assert!(metric(&host, "ip", Counter::Overflowed) > 0);
}

//! Shared queues: named per vm_id, shared by workers; the last registrant is notified.

use std::time::Duration;

use wasm_host::LogLevel;

use crate::common::{forward, guest, ops, text};

#[test]
fn an_item_enqueued_on_one_worker_is_delivered_to_the_last_registrant() {
    let mut host = guest().plugin_configuration("queue=1").workers(2).build().unwrap();

    let forwarded = forward(host.worker(0), ops("enqueue").header("x-value", "hello"));
    host.advance(Duration::ZERO);

    assert_eq!(text(&forwarded, "x-enqueue"), "ok");
    assert_eq!(text(&forwarded, "x-resolve-missing"), "none");
    let dequeued: Vec<usize> = host
        .logs()
        .into_iter()
        .filter(|r| r.level == LogLevel::Info && r.message == "root 1 dequeued hello")
        .map(|r| r.worker)
        .collect();
    assert_eq!(dequeued, [1]);
    assert!(host.logs_at(LogLevel::Info).contains(&"root 1 found queue 1 empty".to_owned()));
    assert_eq!(host.metric("test_guest.dequeued"), Some(1));
}

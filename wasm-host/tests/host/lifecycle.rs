//! VM and plugin lifecycle: start, configure, context ids, done/log/delete, ticks.

use std::time::Duration;

use wasm_host::{Host, HostError, LogLevel, Outcome, Request, Response, Wasm};

use crate::common::{forward, guest, host, ops, text};

#[test]
fn a_configuration_the_plugin_rejects_fails_the_build_with_the_plugins_reason() {
    let result = guest().plugin_configuration("reject=limits[0].capacity: must be at least 1").build();

    let error = result.expect_err("the plugin rejects its configuration");
    assert!(
        matches!(&error, HostError::ConfigurationRejected { worker: 0, logs } if logs == &["limits[0].capacity: must be at least 1"]),
        "{error:?}"
    );
    assert!(error.to_string().contains("limits[0].capacity: must be at least 1"), "{error}");
}

#[test]
fn a_vm_configuration_the_plugin_refuses_fails_the_build() {
    let result = guest().vm_configuration("vm_start=reject").build();

    let error = result.expect_err("the plugin refuses to start");
    assert!(
        matches!(&error, HostError::VmStartRejected { logs, .. } if logs.iter().any(|l| l.contains("refusing to start"))),
        "{error:?}"
    );
}

#[test]
fn a_panic_while_configuring_is_a_start_trap_with_the_panic_message() {
    let result = guest().plugin_configuration("panic_on_configure=1").build();

    let error = result.expect_err("the plugin panics");
    let HostError::StartTrapped { callback, message, .. } = &error else { panic!("{error:?}") };
    assert_eq!(*callback, "proxy_on_configure");
    assert!(message.contains("test guest panics in on_configure"), "{message}");
}

#[test]
fn a_missing_wasm_file_is_reported_with_its_path() {
    let result = Host::builder("/nonexistent/plugin.wasm").build();

    let error = result.expect_err("no such file");
    assert!(matches!(error, HostError::ReadWasm { .. }));
    assert!(error.to_string().contains("/nonexistent/plugin.wasm"));
}

#[test]
fn bytes_that_are_not_webassembly_are_refused() {
    let result = Host::builder(Wasm::bytes(b"\0asm garbage".to_vec())).build();

    assert!(matches!(result, Err(HostError::InvalidModule { .. })), "{result:?}");
}

#[test]
fn a_module_without_the_proxy_wasm_abi_marker_is_refused() {
    let result = Host::builder(Wasm::bytes(r#"(module (memory (export "memory") 1))"#)).build();

    let error = result.expect_err("not proxy-wasm");
    assert!(error.to_string().contains("proxy_abi_version_0_2_1"), "{error}");
}

#[test]
fn the_plugin_configuration_is_readable_only_while_configuring() {
    let mut host = guest().plugin_configuration("generation=1").vm_configuration("vm=settings").build().unwrap();

    let forwarded = forward(host.worker(0), ops("config"));

    assert_eq!(text(&forwarded, "x-plugin-config"), "none");
    assert_eq!(text(&forwarded, "x-vm-config"), "vm=settings");
    assert!(host.logs_at(LogLevel::Info).contains(&"configure: root 1 got 12 bytes".to_owned()));
    assert!(
        host.logs_at(LogLevel::Info).contains(&"vm start: root 1 vm configuration (11 bytes): vm=settings".to_owned())
    );
}

#[test]
fn streams_get_fresh_context_ids_under_the_root_context() {
    let mut host = host("");
    let worker = host.worker(0);

    let first = forward(worker, ops("ids"));
    let second = forward(worker, ops("ids"));

    assert_eq!(text(&first, "x-root-id"), "1");
    assert_eq!(text(&first, "x-context-id"), "2");
    assert_eq!(text(&second, "x-context-id"), "3");
    assert_eq!(worker.root_context_id(), 1);
}

#[test]
fn finishing_a_stream_runs_on_done_then_on_log_with_headers_readable_then_on_delete() {
    let mut host = host("");

    let exchange = host.worker(0).exchange(ops("log-phase").header(":path", "/ignored"), Response::new(201)).unwrap();

    assert_eq!(exchange.status(), Some(201));
    let info = host.logs_at(LogLevel::Info);
    let on_log = info.iter().position(|l| l == "on_log 2: path=/test status=201").expect("on_log ran");
    let deleted = info.iter().position(|l| l == "deleted stream 2").expect("on_delete ran");
    assert!(on_log < deleted);
    assert_eq!(host.worker(0).open_streams(), 0);
}

#[test]
fn a_stream_whose_on_done_returns_false_lives_until_proxy_done() {
    let mut host = host("tick_ms=100");
    let worker = host.worker(0);
    let stream = worker.request(ops("done-later,log-phase"));
    worker.respond(stream, Response::ok()).unwrap();

    worker.finish(stream).unwrap();
    let open_before = worker.open_streams();
    host.advance(Duration::from_millis(100));

    assert_eq!(open_before, 1);
    assert_eq!(host.worker(0).open_streams(), 0);
    assert!(host.logs_at(LogLevel::Info).contains(&"deleted stream 2".to_owned()));
}

#[test]
fn ticks_fire_every_period_on_every_workers_root_context() {
    let mut host = guest().plugin_configuration("tick_ms=100").workers(2).build().unwrap();

    host.advance(Duration::from_secs(1));

    assert_eq!(host.metric("test_guest.ticks"), Some(20));
}

#[test]
fn ticks_do_not_fire_before_their_period() {
    let mut host = host("tick_ms=100");

    host.advance(Duration::from_millis(99));

    assert_eq!(host.metric("test_guest.ticks"), Some(0));
}

#[test]
fn a_paused_request_resumes_when_a_tick_continues_it_through_its_effective_context() {
    let mut host = host("tick_ms=50");
    let stream = host.worker(0).request(ops("pause"));
    let paused = host.worker(0).outcome(stream).unwrap().is_paused();

    host.advance(Duration::from_millis(50));

    assert!(paused);
    assert!(matches!(host.worker(0).outcome(stream).unwrap(), Outcome::Forwarded(_)));
}

#[test]
fn a_paused_response_resumes_when_a_tick_continues_it() {
    let mut host = host("tick_ms=50");
    let stream = host.worker(0).request(ops("resp-pause"));
    let held = host.worker(0).respond(stream, Response::new(204)).unwrap() == Outcome::ResponsePaused;

    host.advance(Duration::from_millis(50));

    assert!(held);
    assert_eq!(host.worker(0).outcome(stream).unwrap().response().map(|r| r.status), Some(204));
}

#[test]
fn closing_the_stream_resets_it() {
    let mut host = host("");

    let stream = host.worker(0).request(ops("reset"));

    assert_eq!(host.worker(0).outcome(stream).unwrap(), Outcome::Reset);
    assert_eq!(host.worker(0).exchange(ops("reset"), Response::ok()).unwrap().status(), None);
}

#[test]
fn an_unknown_stream_is_an_error_not_a_panic() {
    let mut host = host("");
    let worker = host.worker(0);
    let stream = worker.request(Request::get("/"));
    worker.finish(stream).unwrap();

    assert!(matches!(worker.outcome(stream), Err(HostError::UnknownStream { .. })));
    assert!(matches!(worker.respond(stream, Response::ok()), Err(HostError::UnknownStream { .. })));
}

#[test]
fn a_response_for_a_request_that_did_not_go_upstream_is_refused() {
    let mut host = host("");
    let worker = host.worker(0);
    let stream = worker.request(ops("local"));

    let result = worker.respond(stream, Response::ok());

    assert!(matches!(result, Err(HostError::NotForwarded { .. })), "{result:?}");
}

#[test]
fn each_workers_linear_memory_size_is_reported_in_whole_pages() {
    let mut host = guest().workers(2).build().unwrap();

    forward(host.worker(0), ops("headers,props"));
    let sizes = host.memory_sizes();

    assert_eq!(sizes.len(), 2);
    assert!(sizes.iter().all(|size| *size > 0 && size % 65_536 == 0), "{sizes:?}");
    assert_eq!(sizes[1], host.worker(1).memory_size());
}

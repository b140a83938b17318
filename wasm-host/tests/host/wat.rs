//! Low-level ABI behaviour, with tiny hand-written modules.

use std::time::Duration;

use wasm_host::{Host, Request, Response, Wasm};

/// A module whose `proxy_on_request_headers` runs `body` (which leaves an i32 status on
/// the stack) and answers with a local response of status 200 + that status.
fn module(imports: &str, allocator: &str, body: &str) -> Wasm {
    Wasm::bytes(format!(
        r#"(module
  (import "env" "proxy_send_local_response" (func $reply (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  {imports}
  (memory (export "memory") 1)
  (data (i32.const 0) ":path")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32) {allocator})
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $reply (i32.add (i32.const 200) {body}) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const -1)))
    (i32.const 1)))"#
    ))
}

fn status_of(wasm: Wasm) -> Option<u16> {
    let mut host = Host::builder(wasm).build().unwrap();
    host.worker(0).exchange(Request::get("/p"), Response::ok()).unwrap().status()
}

const GET_PATH: &str = "(call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 64) (i32.const 68))";

#[test]
fn a_host_call_that_returns_data_uses_the_guests_allocator() {
    let status = status_of(module("", "(i32.const 1024)", GET_PATH));

    assert_eq!(status, Some(200));
}

#[test]
fn an_allocator_that_returns_null_makes_the_call_fail_with_invalid_memory_access() {
    let status = status_of(module("", "(i32.const 0)", GET_PATH));

    assert_eq!(status, Some(206));
}

#[test]
fn an_allocation_outside_linear_memory_is_invalid_memory_access() {
    let status = status_of(module("", "(i32.const 65535)", GET_PATH));

    assert_eq!(status, Some(206));
}

#[test]
fn host_calls_from_inside_the_allocator_fail_the_vm() {
    let allocator =
        "(drop (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 64) (i32.const 68))) (i32.const 1024)";
    let mut host = Host::builder(module("", allocator, GET_PATH)).build().unwrap();

    let exchange = host.worker(0).exchange(Request::get("/"), Response::ok()).unwrap();

    assert_eq!(exchange.status(), Some(503));
    let traps = host.traps();
    assert!(traps[0].message.contains("inside its allocator"), "{}", traps[0].message);
}

#[test]
fn an_unimplemented_host_function_fails_loudly_with_its_name() {
    let imports = r#"(import "env" "proxy_made_up" (func $made_up (result i32)))"#;
    let mut host = Host::builder(module(imports, "(i32.const 1024)", "(call $made_up)")).build().unwrap();

    let exchange = host.worker(0).exchange(Request::get("/"), Response::ok()).unwrap();

    assert_eq!(exchange.status(), Some(503));
    let traps = host.traps();
    assert!(traps[0].message.contains("`env.proxy_made_up`"), "{}", traps[0].message);
    assert!(host.logs().iter().any(|r| r.message.contains("env.proxy_made_up")));
}

#[test]
fn proc_exit_fails_the_vm_with_a_clear_message() {
    let imports = r#"(import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))"#;
    let mut host =
        Host::builder(module(imports, "(i32.const 1024)", "(call $exit (i32.const 3)) (i32.const 0)")).build().unwrap();

    host.worker(0).exchange(Request::get("/"), Response::ok()).unwrap();

    assert!(host.traps()[0].message.contains("proc_exit(3)"), "{}", host.traps()[0].message);
}

#[test]
fn a_module_importing_memory_cannot_be_instantiated() {
    let wasm = Wasm::bytes(
        r#"(module (import "env" "memory" (memory 1)) (func (export "proxy_abi_version_0_2_1"))
             (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 0)))"#,
    );

    let error = Host::builder(wasm).build().expect_err("no memory export");

    assert!(error.to_string().contains("memory"), "{error}");
}

#[test]
fn a_guest_stuck_in_a_loop_is_interrupted_at_its_call_time_limit() {
    let wasm = module("", "(i32.const 1024)", "(loop $forever (br $forever)) (i32.const 0)");
    let mut host = Host::builder(wasm).call_time_limit(Some(Duration::from_millis(50))).build().unwrap();

    let exchange = host.worker(0).exchange(Request::get("/"), Response::ok()).unwrap();

    assert_eq!(exchange.status(), Some(503));
    assert!(host.traps()[0].message.contains("interrupted"), "{}", host.traps()[0].message);
}

/// A module whose `proxy_on_request_headers` runs a loop of `n` turns, then answers.
fn looping(n: u32) -> Wasm {
    let body = format!(
        "(local.set 0 (i32.const {n})) (block $done (loop $again (br_if $done (i32.eqz (local.get 0))) \
         (local.set 0 (i32.sub (local.get 0) (i32.const 1))) (br $again))) (i32.const 0)"
    );
    module("", "(i32.const 1024)", &body)
}

fn instructions_of(wasm: Wasm, counted: bool) -> u64 {
    let builder = Host::builder(wasm);
    let mut host = if counted { builder.count_instructions() } else { builder }.build().unwrap();
    let before = host.call_counts();
    let _ = host.worker(0).exchange(Request::get("/p"), Response::ok()).unwrap();
    (&host.call_counts() - &before).instructions
}

#[test]
fn a_counted_host_counts_each_instruction_the_guest_runs_and_the_same_on_every_run() {
    let ten = instructions_of(looping(10), true);
    let hundred = instructions_of(looping(100), true);

    assert!(ten > 0);
    assert_eq!(instructions_of(looping(10), true), ten, "the same work, the same count");
    // Each turn of the loop runs the same instructions: 90 more turns, 90 times one turn.
    let per_turn = (hundred - ten) / 90;
    assert_eq!(hundred - ten, 90 * per_turn);
    assert!(per_turn >= 5, "a turn runs at least its test, branch, get, sub and set: {per_turn}");
    assert_eq!(instructions_of(looping(100), false), 0, "nothing is counted unless asked");
}

//! Stream and context control: `proxy_send_local_response`, `proxy_continue_stream`,
//! `proxy_close_stream`, `proxy_set_effective_context`, `proxy_done`, and
//! `proxy_call_foreign_function`.
//!
//! As in Envoy, a local response, a continue and a close take effect after the running
//! callback returns (`addAfterVmCallAction`), and a local response turns the callback's
//! result into `Pause` (`stopNextIteration`). `proxy_continue_stream` releases the
//! request's headers, body and trailers at once, whichever direction it names (Envoy's
//! `continueStream` clears them in both cases).

use wasmtime::{Caller, Linker};

use super::{HostResult, fail, read, register, status};
use crate::headers;
use crate::logs::{LogLevel, LogRecord, LogSource};
use crate::state::{Deferred, Direction, HostState, LocalReply};

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_send_local_response", send_local_response, (code: u32, details: u32, details_size: u32, body: u32, body_size: u32, headers: u32, headers_size: u32, grpc_status: u32));
    register!(linker, "env", "proxy_continue_stream", continue_stream, (stream_type: u32));
    register!(linker, "env", "proxy_close_stream", close_stream, (stream_type: u32));
    register!(linker, "env", "proxy_continue_request", continue_request, ());
    register!(linker, "env", "proxy_continue_response", continue_response, ());
    register!(linker, "env", "proxy_set_effective_context", set_effective_context, (context_id: u32));
    register!(linker, "env", "proxy_done", done, ());
    register!(linker, "env", "proxy_call_foreign_function", call_foreign_function, (name: u32, name_size: u32, args: u32, args_size: u32, results_ptr: u32, results_size_ptr: u32));
    Ok(())
}

const STREAM_REQUEST: u32 = 0;
const STREAM_RESPONSE: u32 = 1;
const STREAM_DOWNSTREAM: u32 = 2;
const STREAM_UPSTREAM: u32 = 3;

#[allow(clippy::too_many_arguments, reason = "the ABI's signature")]
fn send_local_response(
    caller: &mut Caller<'_, HostState>,
    code: u32,
    details: u32,
    details_size: u32,
    body: u32,
    body_size: u32,
    headers: u32,
    headers_size: u32,
    _grpc_status: u32,
) -> HostResult {
    let details = read(caller, details, details_size)?;
    let body = read(caller, body, body_size)?;
    let headers = headers::deserialize(&read(caller, headers, headers_size)?);
    // Envoy casts any number to an HTTP code; a code outside 100..=999 cannot be put on
    // the wire, so this host refuses it instead of producing an invalid response.
    let Some(status) = u16::try_from(code).ok().filter(|c| (100..=999).contains(c)) else {
        return fail(status::BAD_ARGUMENT);
    };
    let state = caller.data_mut();
    let acting = state.vm.acting_context();
    let Some(stream) = state.vm.streams.get_mut(&acting) else {
        // A root context has no stream to answer: Envoy accepts and does nothing.
        return Ok(());
    };
    if stream.local_reply_requested {
        let message = format!(
            "context {acting}: a second proxy_send_local_response ({status}) on the same stream was ignored; the first one stands"
        );
        state.shared.logs.write(LogRecord {
            worker: state.worker,
            level: LogLevel::Warn,
            source: LogSource::Host,
            message,
        });
        return Ok(());
    }
    stream.local_reply_requested = true;
    let details = String::from_utf8_lossy(&details).into_owned();
    state.vm.stop_iteration = true;
    state
        .vm
        .deferred
        .push_back(Deferred::LocalReply { stream: acting, reply: LocalReply { status, details, body, headers } });
    Ok(())
}

fn continue_stream(caller: &mut Caller<'_, HostState>, stream_type: u32) -> HostResult {
    let direction = match stream_type {
        STREAM_REQUEST => Direction::Request,
        STREAM_RESPONSE => Direction::Response,
        STREAM_DOWNSTREAM => return Ok(()),
        STREAM_UPSTREAM => return fail(status::UNIMPLEMENTED),
        _ => return fail(status::BAD_ARGUMENT),
    };
    let vm = &mut caller.data_mut().vm;
    let acting = vm.acting_context();
    if let Some(stream) = vm.streams.get_mut(&acting) {
        stream.live.request_headers = false;
        stream.live.request_body = false;
        stream.live.request_trailers = false;
        vm.deferred.push_back(Deferred::Continue { stream: acting, direction });
    }
    Ok(())
}

fn continue_request(caller: &mut Caller<'_, HostState>) -> HostResult {
    continue_stream(caller, STREAM_REQUEST)
}

fn continue_response(caller: &mut Caller<'_, HostState>) -> HostResult {
    continue_stream(caller, STREAM_RESPONSE)
}

fn close_stream(caller: &mut Caller<'_, HostState>, stream_type: u32) -> HostResult {
    // Envoy resets the whole HTTP stream whichever direction is named.
    match stream_type {
        STREAM_REQUEST | STREAM_RESPONSE => {}
        STREAM_DOWNSTREAM | STREAM_UPSTREAM => return Ok(()),
        _ => return fail(status::BAD_ARGUMENT),
    }
    let vm = &mut caller.data_mut().vm;
    let acting = vm.acting_context();
    if vm.streams.contains_key(&acting) {
        vm.deferred.push_back(Deferred::Close { stream: acting });
    }
    Ok(())
}

fn set_effective_context(caller: &mut Caller<'_, HostState>, context_id: u32) -> HostResult {
    let vm = &mut caller.data_mut().vm;
    if !vm.roots.contains_key(&context_id) && !vm.streams.contains_key(&context_id) {
        return fail(status::BAD_ARGUMENT);
    }
    vm.effective = context_id;
    Ok(())
}

/// Finishes a context whose `proxy_on_done` returned false: `proxy_on_log` and
/// `proxy_on_delete` follow once the callback returns.
fn done(caller: &mut Caller<'_, HostState>) -> HostResult {
    let vm = &mut caller.data_mut().vm;
    let acting = vm.acting_context();
    match vm.streams.get_mut(&acting) {
        Some(stream) if stream.pending_done => {
            stream.pending_done = false;
            vm.deferred.push_back(Deferred::Done { context: acting });
            Ok(())
        }
        _ => fail(status::NOT_FOUND),
    }
}

/// No foreign function is registered in this host: every name is `NOT_FOUND`.
fn call_foreign_function(
    caller: &mut Caller<'_, HostState>,
    name: u32,
    name_size: u32,
    args: u32,
    args_size: u32,
    _results_ptr: u32,
    _results_size_ptr: u32,
) -> HostResult {
    read(caller, name, name_size)?;
    read(caller, args, args_size)?;
    fail(status::NOT_FOUND)
}

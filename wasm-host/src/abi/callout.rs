//! `proxy_http_call` and `proxy_get_status` (see [`crate::callout`] for the semantics).
//!
//! Dispatch only: `proxy_http_call` checks the call as Envoy does, records it, and
//! leaves a `PendingCallout` in the VM state (a scripted answer scheduled on the clock,
//! or a real request in flight whose end arrives in the worker's mailbox). Delivering
//! the answer to `proxy_on_http_call_response` is the worker's (`worker/callout.rs`).

use std::time::Duration;

use wasmtime::{Caller, Linker};

use super::{HostResult, check_writable, copy_out, fail, read, register, status, write_u32};
use crate::callout::{CalloutRequest, Cluster, Plan, send};
use crate::headers::{self, Headers};
use crate::services::Inbox;
use crate::state::{Delivery, HostState, PendingCallout};

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_http_call", http_call, (upstream: u32, upstream_size: u32, headers: u32, headers_size: u32, body: u32, body_size: u32, trailers: u32, trailers_size: u32, timeout_ms: u32, token_ptr: u32));
    register!(linker, "env", "proxy_get_status", get_status, (code_ptr: u32, ptr_ptr: u32, size_ptr: u32));
    Ok(())
}

#[allow(clippy::too_many_arguments, reason = "the ABI's signature")]
fn http_call(
    caller: &mut Caller<'_, HostState>,
    upstream: u32,
    upstream_size: u32,
    headers: u32,
    headers_size: u32,
    body: u32,
    body_size: u32,
    trailers: u32,
    trailers_size: u32,
    timeout_ms: u32,
    token_ptr: u32,
) -> HostResult {
    let cluster_name = read(caller, upstream, upstream_size)?;
    let headers = read(caller, headers, headers_size)?;
    let body = read(caller, body, body_size)?;
    let trailers = read(caller, trailers, trailers_size)?;
    // Envoy writes the token slot first, so that a bad pointer fails before anything
    // is sent.
    write_u32(caller, token_ptr, 0)?;
    // The ABI passes the timeout as a C `int`.
    if timeout_ms.cast_signed() < 0 {
        return fail(status::BAD_ARGUMENT);
    }
    let state = caller.data_mut();
    let cluster_name = String::from_utf8_lossy(&cluster_name).into_owned();
    let Some(cluster) = state.shared.clusters.get(&cluster_name).cloned() else {
        return fail(status::BAD_ARGUMENT);
    };
    let headers = Headers::from_pairs(headers::deserialize(&headers));
    if [":method", ":path", ":authority"].iter().any(|name| !headers.contains(name)) {
        return fail(status::BAD_ARGUMENT);
    }
    let Some(root) = state.vm.root_of(state.vm.acting_context()) else {
        return fail(status::BAD_ARGUMENT);
    };
    let timeout = (timeout_ms > 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
    let request = CalloutRequest {
        worker: state.worker,
        cluster: cluster_name,
        headers,
        body,
        trailers: Headers::from_pairs(headers::deserialize(&trailers)),
        timeout,
    };
    state.shared.record_callout(&request);
    let now = state.shared.clock.monotonic_nanos();
    let deadline = timeout
        .filter(|_| !state.shared.ignore_callout_timeouts)
        .map(|t| now.saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)));
    let token = state.vm.next_callout_token();
    let delivery = match cluster {
        Cluster::Scripted(script) => {
            let (delay, plan) = script(&request).plan();
            let at = now.saturating_add(u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX));
            match plan {
                Plan::Ends(ending) => Delivery::Scheduled { at, ending },
                Plan::Stalls { head } => Delivery::Stalled { head_at: head.then_some(at) },
                Plan::Deferred => Delivery::Deferred { dispatched: now, request: Some(request) },
            }
        }
        Cluster::Http(addr) => {
            let Some(runtime) = state.shared.io_runtime() else {
                return fail(status::INTERNAL_FAILURE);
            };
            let inbox = state.inbox.clone();
            let generation = state.generation;
            let task = runtime.spawn(async move {
                let head_inbox = inbox.clone();
                let on_head = move || head_inbox.send(Inbox::CalloutHead { generation, token });
                let ending = send(addr, &request, on_head).await;
                inbox.send(Inbox::Callout { generation, token, ending });
            });
            Delivery::InFlight { task: task.abort_handle(), head_arrived: false }
        }
    };
    state.vm.callouts.insert(token, PendingCallout { root, deadline, delivery });
    write_u32(caller, token_ptr, token)
}

/// The status of the last callout of the calling context's root context: Envoy's
/// `status_code_` and `status_message_`.
fn get_status(caller: &mut Caller<'_, HostState>, code_ptr: u32, ptr_ptr: u32, size_ptr: u32) -> HostResult {
    check_writable(caller, code_ptr, 4)?;
    let vm = &caller.data().vm;
    let (code, message) = vm
        .root_of(vm.acting_context())
        .and_then(|root| vm.roots.get(&root))
        .map(|root| (root.status_code, root.status_message.clone()))
        .unwrap_or_default();
    write_u32(caller, code_ptr, code)?;
    copy_out(caller, &message, ptr_ptr, size_ptr)
}

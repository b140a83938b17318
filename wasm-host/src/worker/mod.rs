//! [`Worker`]: one VM, as one Envoy worker thread runs it, and the HTTP streams on it.
//!
//! The worker delivers a stream's events to the guest the way Envoy's filter manager
//! does:
//! * `proxy_on_context_create`, then `proxy_on_request_headers`, then (if there is a
//!   body) `proxy_on_request_body` at once, even if the headers callback paused, then
//!   `proxy_on_request_trailers` if any. The last callback decides: `Continue` forwards
//!   the whole request (a body callback that continues also releases paused headers, as
//!   Envoy's `FilterDataStatus::Continue` does), `Pause` holds it until
//!   `proxy_continue_stream`.
//! * A local response sent from the request path goes through the filter's own
//!   response callbacks (Envoy encodes it through the filter chain); one sent from the
//!   response path replaces the response directly.
//! * `proxy_on_done`, `proxy_on_log` and `proxy_on_delete` when the stream finishes.
//!
//! A trap fails the VM: the host reports it, applies the failure policy to every open
//! stream, drops the VM's timers and callouts, and (with `FAIL_RELOAD`) starts a fresh
//! VM on the next request.
//!
//! # Layout
//!
//! Layer: the worker uses the host functions (`crate::abi`, linked by `crate::engine`),
//! the VM state (`crate::state`) and the shared services; the facade (`crate::host`) and
//! `serve` use the worker. One file per job:
//!
//! * `lifecycle.rs`: a VM's life: instantiation, boot and root contexts, calling a guest
//!   export, traps, the failure policy and `FAIL_RELOAD`.
//! * `stream.rs`: the stream state machine: requests and responses through the filter
//!   (one delivery path for both directions), deferred actions, local replies, finishing.
//! * `schedule.rs`: what is due when: ticks, scripted answers and timeouts on the clock,
//!   messages from other threads, waiting for real callouts.
//! * `callout.rs`: delivering a callout's answer (or failure) to
//!   `proxy_on_http_call_response`.
//! * `deferred.rs`: callouts whose answers the driver decides after dispatch.
//! * `reconfigure.rs`: a new configuration as a new root context, and retiring the old.

mod callout;
mod deferred;
mod lifecycle;
mod reconfigure;
mod schedule;
mod stream;

pub use deferred::DeferredCallout;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use wasmtime::{Global, Instance, InstancePre, Store, TypedFunc, WasmParams, WasmResults};

use crate::counts::CallCounts;
use crate::error::HostError;
use crate::probe;
use crate::services::{Inbox, Mailbox, Shared};
use crate::state::{HostState, Plugin, StreamContext};

/// A guest export; shared so that calling it costs a reference count, not a clone of
/// its registered type.
type Func<P, R> = Option<Arc<TypedFunc<P, R>>>;

/// The guest's callbacks; each is optional, as the ABI says.
struct Exports {
    initialize: Func<(), ()>,
    start: Func<(), ()>,
    on_context_create: Func<(u32, u32), ()>,
    on_vm_start: Func<(u32, u32), u32>,
    on_configure: Func<(u32, u32), u32>,
    on_done: Func<u32, u32>,
    on_log: Func<u32, ()>,
    on_delete: Func<u32, ()>,
    on_tick: Func<u32, ()>,
    on_request_headers: Func<(u32, u32, u32), u32>,
    on_request_body: Func<(u32, u32, u32), u32>,
    on_request_trailers: Func<(u32, u32), u32>,
    on_response_headers: Func<(u32, u32, u32), u32>,
    on_response_body: Func<(u32, u32, u32), u32>,
    on_response_trailers: Func<(u32, u32), u32>,
    on_http_call_response: Func<(u32, u32, u32, u32, u32), ()>,
    on_queue_ready: Func<(u32, u32), ()>,
    /// The probed functions' counters ([`crate::probe`]), by function name.
    probes: Vec<(String, Global)>,
    /// Each function's own instructions ([`crate::profile`]), by function name.
    profile: Vec<(String, Global)>,
}

impl Exports {
    fn new(store: &mut Store<HostState>, instance: &Instance) -> Result<Self, String> {
        fn get<P: WasmParams, R: WasmResults>(
            store: &mut Store<HostState>,
            instance: &Instance,
            name: &str,
        ) -> Result<Func<P, R>, String> {
            match instance.get_func(&mut *store, name) {
                None => Ok(None),
                Some(func) => func
                    .typed::<P, R>(&*store)
                    .map(|typed| Some(Arc::new(typed)))
                    .map_err(|e| format!("its export `{name}` has the wrong signature: {e:#}")),
            }
        }
        Ok(Self {
            initialize: get(store, instance, "_initialize")?,
            start: get(store, instance, "_start")?,
            on_context_create: get(store, instance, "proxy_on_context_create")?,
            on_vm_start: get(store, instance, "proxy_on_vm_start")?,
            on_configure: get(store, instance, "proxy_on_configure")?,
            on_done: get(store, instance, "proxy_on_done")?,
            on_log: get(store, instance, "proxy_on_log")?,
            on_delete: get(store, instance, "proxy_on_delete")?,
            on_tick: get(store, instance, "proxy_on_tick")?,
            on_request_headers: get(store, instance, "proxy_on_request_headers")?,
            on_request_body: get(store, instance, "proxy_on_request_body")?,
            on_request_trailers: get(store, instance, "proxy_on_request_trailers")?,
            on_response_headers: get(store, instance, "proxy_on_response_headers")?,
            on_response_body: get(store, instance, "proxy_on_response_body")?,
            on_response_trailers: get(store, instance, "proxy_on_response_trailers")?,
            on_http_call_response: get(store, instance, "proxy_on_http_call_response")?,
            on_queue_ready: get(store, instance, "proxy_on_queue_ready")?,
            probes: probes(store, instance)?,
            profile: profile(store, instance)?,
        })
    }
}

/// The counters the profile rewrite exported, one per function the guest defines.
fn profile(store: &mut Store<HostState>, instance: &Instance) -> Result<Vec<(String, Global)>, String> {
    let names = store.data().shared.profiled.clone();
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| match instance.get_global(&mut *store, &crate::profile::export_name(i)) {
            Some(global) => Ok((name, global)),
            None => Err(format!("the profile's counter of `{name}` is missing from the rewritten module")),
        })
        .collect()
}

/// The counters the probe rewrite exported, one per name the host was asked to count.
fn probes(store: &mut Store<HostState>, instance: &Instance) -> Result<Vec<(String, Global)>, String> {
    let names = store.data().shared.probes.clone();
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            instance
                .get_global(&mut *store, &probe::export_name(i))
                .map(|global| (name.clone(), global))
                .ok_or_else(|| format!("the counter of calls to `{name}` is missing from the rewritten module"))
        })
        .collect()
}

/// What became of a guest call.
enum Invoked<R> {
    Returned(R),
    /// The guest does not export this callback.
    Missing,
    /// The guest trapped; the VM is failed and the policy applied.
    Trapped,
}

/// One VM and its streams. `Send`, so a test can drive each worker on its own thread.
pub struct Worker {
    index: usize,
    shared: Arc<Shared>,
    /// The compiled module, instantiated again by `FAIL_RELOAD`.
    pre: InstancePre<HostState>,
    plugin: Arc<Plugin>,
    store: Store<HostState>,
    exports: Exports,
    /// The root context new streams attach to.
    root: u32,
    failed: bool,
    generation: u64,
    inbox: Receiver<Inbox>,
    sender: Mailbox,
    /// Streams of a VM that was replaced (`FAIL_RELOAD`), kept until finished.
    detached: HashMap<u32, StreamContext>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("index", &self.index).field("failed", &self.failed).finish_non_exhaustive()
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Worker {
    /// Starts worker `index`: instantiates the module and boots the VM with `plugin`
    /// (`_initialize`, then the root context).
    ///
    /// # Errors
    /// [`HostError`] when the VM cannot be instantiated or the plugin refuses to start.
    pub(crate) fn start(
        shared: Arc<Shared>,
        pre: InstancePre<HostState>,
        index: usize,
        plugin: Arc<Plugin>,
    ) -> Result<Self, HostError> {
        let (sender, inbox) = Mailbox::channel();
        let (store, exports) = lifecycle::instantiate(&shared, &pre, index, 1, sender.clone(), 0)?;
        let mut worker = Self {
            index,
            shared,
            pre,
            plugin,
            store,
            exports,
            root: 0,
            failed: false,
            generation: 1,
            inbox,
            sender,
            detached: HashMap::new(),
        };
        worker.boot()?;
        Ok(worker)
    }

    /// This worker's index in its host.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether the VM has failed (trapped) and not been reloaded.
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// The size of the VM's linear memory, in bytes.
    pub fn memory_size(&self) -> usize {
        self.store.data().memory.map_or(0, |memory| memory.data_size(&self.store))
    }

    /// The context id of the root context new streams attach to.
    pub fn root_context_id(&self) -> u32 {
        self.root
    }

    /// What the VM counted since it started: its calls to each host function, the host's
    /// re-entries into its allocator, entries into the probed functions
    /// ([`crate::HostBuilder::count_calls_to`]), and the instructions it ran
    /// ([`crate::HostBuilder::count_instructions`]).
    pub fn call_counts(&mut self) -> CallCounts {
        let host = self.store.data().calls.by_name();
        let guest = self
            .exports
            .probes
            .iter()
            .map(|(name, global)| {
                let count = global.get(&mut self.store).i64().and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
                (name.clone(), count)
            })
            .collect();
        let mut profile = std::collections::BTreeMap::new();
        for (name, global) in &self.exports.profile {
            let count = global.get(&mut self.store).i64().and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
            if count > 0 {
                *profile.entry(name.clone()).or_default() += count;
            }
        }
        // Fuel left from what it was given: the instructions run (0 unless counted).
        let instructions = self.store.get_fuel().map_or(0, |left| u64::MAX - left);
        CallCounts { host, guest, instructions, profile }
    }

    /// How many streams are open (not yet finished) on this worker.
    pub fn open_streams(&self) -> usize {
        self.store.data().vm.streams.len() + self.detached.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_can_move_to_another_thread() {
        fn assert_send<T: Send>() {}

        assert_send::<Worker>();
        assert_send::<&mut Worker>();
    }
}

//! A VM's life on its worker: instantiation, boot (`_initialize`, then a root context
//! with `proxy_on_vm_start` and `proxy_on_configure`, as cpp-host's `WasmBase::start`
//! and `configure`), calling a guest export, and what a trap does: the host reports it,
//! applies the failure policy to every open stream, drops the VM's timers and callouts,
//! and (with `FAIL_RELOAD`) starts a fresh VM on the next request, keeping shared data.

use std::sync::Arc;

use wasmtime::{InstancePre, Store, StoreLimitsBuilder, WasmParams, WasmResults};

use super::stream::{complete, fail_closed};
use super::{Exports, Func, Invoked, Worker, to_u32};
use crate::engine::EPOCH_TICK;
use crate::error::{FailurePolicy, HostError, TrapReport};
use crate::logs::LogLevel;
use crate::services::{Mailbox, Shared};
use crate::state::{Callback, Delivery, Flow, HostState, Live, Plugin, RootContext, Vm};

/// A fresh VM for worker `index`: a store (with its memory limit and call deadline) and
/// an instance of the module, its memory and allocator found, its callbacks looked up.
/// `first_context_id` continues the context ids of the VM it replaces.
pub(super) fn instantiate(
    shared: &Arc<Shared>,
    pre: &InstancePre<HostState>,
    index: usize,
    generation: u64,
    sender: Mailbox,
    first_context_id: u32,
) -> Result<(Store<HostState>, Exports), HostError> {
    let mut vm = Vm::new(Arc::clone(&shared.vm_configuration), shared.shared_data());
    vm.next_context_id = first_context_id;
    let state = HostState {
        shared: Arc::clone(shared),
        worker: index,
        generation,
        memory: None,
        allocate: None,
        in_allocator: false,
        limits: StoreLimitsBuilder::new().memory_size(shared.max_memory).build(),
        inbox: sender,
        vm,
        calls: crate::counts::Tally::default(),
    };
    let mut store = Store::new(pre.module().engine(), state);
    store.limiter(|state| &mut state.limits);
    store.set_epoch_deadline(shared.call_ticks);
    if shared.count_instructions {
        // Fuel only counts here: no guest runs out of it.
        store.set_fuel(u64::MAX).map_err(|e| HostError::Instantiate { worker: index, reason: format!("{e:#}") })?;
    }
    let fail = |reason: String| HostError::Instantiate { worker: index, reason };
    let instance = pre.instantiate(&mut store).map_err(|e| fail(format!("{e:#}")))?;
    let memory = instance.get_memory(&mut store, "memory");
    let allocate = ["proxy_on_memory_allocate", "malloc"]
        .into_iter()
        .find_map(|name| instance.get_typed_func::<i32, i32>(&mut store, name).ok())
        .map(Arc::new);
    if allocate.is_none() {
        return Err(fail("the allocator export (proxy_on_memory_allocate or malloc) is not `(i32) -> i32`".to_owned()));
    }
    store.data_mut().memory = memory;
    store.data_mut().allocate = allocate;
    let exports = Exports::new(&mut store, &instance).map_err(fail)?;
    Ok((store, exports))
}

/// wasmtime's account of a trap, with the wasm backtrace; a runaway call says so.
fn describe_trap(error: &wasmtime::Error, call_ticks: u64) -> String {
    if error.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
        let limit = EPOCH_TICK.saturating_mul(u32::try_from(call_ticks).unwrap_or(u32::MAX));
        return format!("the guest ran for more than {limit:?} in one callback and was interrupted: {error:?}");
    }
    format!("{error:?}")
}

impl Worker {
    /// Runs the module's initializer, then starts the root context for the current
    /// configuration.
    pub(super) fn boot(&mut self) -> Result<(), HostError> {
        let init = if self.exports.initialize.is_some() {
            (Callback::Initialize, self.exports.initialize.clone())
        } else {
            (Callback::Initialize, self.exports.start.clone())
        };
        if let Some(func) = init.1 {
            self.store.set_epoch_deadline(self.shared.call_ticks);
            self.store.data_mut().vm.callback = init.0;
            let result = func.call(&mut self.store, ());
            self.store.data_mut().vm.callback = Callback::None;
            if let Err(error) = result {
                self.failed = true;
                let guest = self.store.data_mut().vm.last_critical.take();
                return Err(self.start_trap(Callback::Initialize, &error, guest));
            }
        }
        self.root = self.start_root(Arc::clone(&self.plugin))?;
        Ok(())
    }

    fn start_trap(&self, callback: Callback, error: &wasmtime::Error, guest: Option<String>) -> HostError {
        let guest = guest.map(|m| format!(" (the guest said: {m})")).unwrap_or_default();
        HostError::StartTrapped {
            worker: self.index,
            callback: callback.export_name(),
            message: format!("{error:#}{guest}"),
        }
    }

    /// Creates a root context for `plugin` and runs `proxy_on_vm_start` and
    /// `proxy_on_configure` on it, as cpp-host's `WasmBase::start` and `configure` do.
    pub(super) fn start_root(&mut self, plugin: Arc<Plugin>) -> Result<u32, HostError> {
        let vm = &mut self.store.data_mut().vm;
        let id = vm.next_context_id();
        vm.roots.insert(id, RootContext::new(Arc::clone(&plugin)));
        let on_context_create = self.exports.on_context_create.clone();
        self.start_call(Callback::ContextCreate, id, &on_context_create, (id, 0))?;
        let vm_configuration_size = to_u32(self.shared.vm_configuration.len());
        let on_vm_start = self.exports.on_vm_start.clone();
        if self.start_call(Callback::VmStart, id, &on_vm_start, (id, vm_configuration_size))? == Some(0) {
            let logs = std::mem::take(&mut self.store.data_mut().vm.callback_lines);
            self.finish_root(id);
            return Err(HostError::VmStartRejected { worker: self.index, logs });
        }
        self.store.data_mut().vm.plugin_configuration = Some(Arc::clone(&plugin.configuration));
        let on_configure = self.exports.on_configure.clone();
        let configured =
            self.start_call(Callback::Configure, id, &on_configure, (id, to_u32(plugin.configuration.len())));
        self.store.data_mut().vm.plugin_configuration = None;
        if configured? == Some(0) {
            let logs = std::mem::take(&mut self.store.data_mut().vm.callback_lines);
            self.shared.host_log(
                self.index,
                LogLevel::Error,
                format!(
                    "the plugin rejected its configuration on worker {} (proxy_on_configure returned false)",
                    self.index
                ),
            );
            self.finish_root(id);
            return Err(HostError::ConfigurationRejected { worker: self.index, logs });
        }
        Ok(id)
    }

    /// A start-up callback: a trap is an error for the caller (and fails the VM).
    fn start_call<P: WasmParams, R: WasmResults>(
        &mut self,
        callback: Callback,
        context: u32,
        func: &Func<P, R>,
        params: P,
    ) -> Result<Option<R>, HostError> {
        if self.failed {
            return Err(HostError::StartTrapped {
                worker: self.index,
                callback: callback.export_name(),
                message: "the VM has already failed".to_owned(),
            });
        }
        let guest_before = self.shared.traps_len();
        match self.invoke(callback, context, func, params) {
            Invoked::Returned(value) => {
                self.run_deferred();
                Ok(Some(value))
            }
            Invoked::Missing => Ok(None),
            Invoked::Trapped => {
                let report = self.shared.trap_since(guest_before);
                let message = report.map_or_else(
                    || "trap".to_owned(),
                    |r| {
                        let guest = r.guest_message.map(|m| format!(" (the guest said: {m})")).unwrap_or_default();
                        format!("{}{guest}", r.message)
                    },
                );
                Err(HostError::StartTrapped { worker: self.index, callback: callback.export_name(), message })
            }
        }
    }

    /// Calls a guest export for `context`. Host calls made meanwhile act on `context`
    /// (or on the context the guest makes effective).
    pub(super) fn invoke<P: WasmParams, R: WasmResults>(
        &mut self,
        callback: Callback,
        context: u32,
        func: &Func<P, R>,
        params: P,
    ) -> Invoked<R> {
        if self.failed {
            return Invoked::Trapped;
        }
        let Some(func) = func.clone() else {
            return Invoked::Missing;
        };
        let vm = &mut self.store.data_mut().vm;
        vm.current = context;
        vm.effective = 0;
        vm.callback = callback;
        vm.stop_iteration = false;
        vm.last_critical = None;
        vm.callback_lines.clear();
        self.store.set_epoch_deadline(self.shared.call_ticks);
        let result = func.call(&mut self.store, params);
        let vm = &mut self.store.data_mut().vm;
        vm.current = 0;
        vm.effective = 0;
        vm.callback = Callback::None;
        match result {
            Ok(value) => Invoked::Returned(value),
            Err(error) => {
                self.trap(callback, context, &error);
                Invoked::Trapped
            }
        }
    }

    fn trap(&mut self, callback: Callback, context: u32, error: &wasmtime::Error) {
        let guest_message = self.store.data_mut().vm.last_critical.take();
        self.shared.report_trap(TrapReport {
            worker: self.index,
            callback: callback.export_name(),
            context_id: context,
            message: describe_trap(error, self.shared.call_ticks),
            guest_message,
            policy: self.shared.failure_policy,
        });
        self.fail_vm();
    }

    /// Marks the VM failed: nothing more is delivered to it; every open stream gets the
    /// failure policy now.
    fn fail_vm(&mut self) {
        self.failed = true;
        let vm = &mut self.store.data_mut().vm;
        for (_, callout) in vm.callouts.drain() {
            if let Delivery::InFlight { task, .. } = callout.delivery {
                task.abort();
            }
        }
        for root in vm.roots.values_mut() {
            root.tick_period = None;
            root.next_tick = None;
        }
        vm.deferred.clear();
        vm.call_response = None;
        vm.plugin_configuration = None;
        let ids: Vec<u32> = vm.streams.keys().copied().collect();
        for id in ids {
            self.apply_policy(id);
        }
    }

    /// What the failure policy does to a stream the filter can no longer process.
    pub(super) fn apply_policy(&mut self, id: u32) {
        let open = self.shared.failure_policy == FailurePolicy::FailOpen;
        let Some(stream) = self.stream_mut(id) else { return };
        stream.live = Live::default();
        if stream.client_response.is_some() || stream.reset {
            return;
        }
        let awaiting_upstream = stream.forwarded && stream.response_flow == Flow::NotStarted;
        if awaiting_upstream {
            // Decided when the upstream answers (see `respond`).
            return;
        }
        if open {
            if !stream.forwarded && stream.request_flow != Flow::Done {
                stream.request_flow = Flow::Done;
                stream.forwarded = true;
            } else {
                complete(stream);
            }
            self.shared.metrics.count("wasm_host.fail_open_streams");
        } else {
            fail_closed(stream);
            self.shared.metrics.count("wasm_host.fail_closed_streams");
        }
    }

    /// Fails closed every stream on a VM that is replaced, then starts a fresh VM with
    /// the current configuration (`FAIL_RELOAD`). Shared data is kept: it lives in the
    /// host, not in the VM.
    pub(super) fn restart(&mut self) {
        let generation = self.generation + 1;
        let first_context_id = self.store.data().vm.next_context_id;
        match instantiate(&self.shared, &self.pre, self.index, generation, self.sender.clone(), first_context_id) {
            Ok((store, exports)) => {
                let mut old = std::mem::replace(&mut self.store, store);
                self.detached.extend(old.data_mut().vm.streams.drain());
                self.exports = exports;
                self.generation = generation;
                self.failed = false;
                match self.boot() {
                    Ok(()) => {
                        self.shared.metrics.count("wasm_host.vm_reloads");
                        self.shared.host_log(
                            self.index,
                            LogLevel::Info,
                            format!("started a fresh VM on worker {} after a failure (FAIL_RELOAD)", self.index),
                        );
                    }
                    Err(error) => {
                        self.failed = true;
                        self.shared.host_log(
                            self.index,
                            LogLevel::Error,
                            format!("reloading the VM on worker {} failed: {error}", self.index),
                        );
                    }
                }
            }
            Err(error) => self.shared.host_log(
                self.index,
                LogLevel::Error,
                format!("reloading the VM on worker {} failed: {error}", self.index),
            ),
        }
    }
}

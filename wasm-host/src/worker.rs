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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Instant;

use wasmtime::{Instance, Store, StoreLimitsBuilder, TypedFunc, WasmParams, WasmResults};

use crate::abi::status;
use crate::callout::Ending;
use crate::headers::Headers;
use crate::host::{FailurePolicy, HostError, Shared, TrapReport};
use crate::logs::LogLevel;
use crate::request::{ClientResponse, Exchange, Message, Outcome, Request, Response, ResponseSource, StreamId};
use crate::state::{
    Callback, Deferred, Delivery, Direction, Flow, HostState, Live, LiveCallResponse, LocalReply, Plugin, RootContext,
    StreamContext, Vm,
};

/// Where other threads send a worker's messages; wakes `serve`'s event loop, if any.
#[derive(Clone)]
pub(crate) struct Mailbox {
    sender: Sender<Inbox>,
    waker: Option<Arc<tokio::sync::Notify>>,
}

impl Mailbox {
    pub(crate) fn send(&self, message: Inbox) {
        if self.sender.send(message).is_ok()
            && let Some(waker) = &self.waker
        {
            waker.notify_one();
        }
    }
}

/// Messages a worker receives from other threads.
pub(crate) enum Inbox {
    /// A real callout's response head arrived.
    CalloutHead { generation: u64, token: u32 },
    /// A real callout ended.
    Callout { generation: u64, token: u32, ending: Ending },
    /// An item was enqueued on a shared queue this worker's root context registered.
    QueueReady { generation: u64, root: u32, token: u32 },
}

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
        })
    }
}

/// What became of a guest call.
enum Invoked<R> {
    Returned(R),
    /// The guest does not export this callback.
    Missing,
    /// The guest trapped; the VM is failed and the policy applied.
    Trapped,
}

/// What a stream callback decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Continue,
    Pause,
    /// The stream left this direction during the callback (local reply, reset, trap).
    Stopped,
}

/// Something due at a point of monotonic time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Answer(u32),
    Timeout(u32),
    Tick(u32),
}

/// One VM and its streams. `Send`, so a test can drive each worker on its own thread.
pub struct Worker {
    index: usize,
    shared: Arc<Shared>,
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

fn instantiate(
    shared: &Arc<Shared>,
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
    };
    let mut store = Store::new(&shared.engine, state);
    store.limiter(|state| &mut state.limits);
    store.set_epoch_deadline(shared.call_ticks);
    let fail = |reason: String| HostError::Instantiate { worker: index, reason };
    let instance = shared.pre.instantiate(&mut store).map_err(|e| fail(format!("{e:#}")))?;
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
        let limit = crate::host::EPOCH_TICK.saturating_mul(u32::try_from(call_ticks).unwrap_or(u32::MAX));
        return format!("the guest ran for more than {limit:?} in one callback and was interrupted: {error:?}");
    }
    format!("{error:?}")
}

fn is_pause_for_headers(action: u32) -> bool {
    // 0 Continue, 2 ContinueAndEndStream; 1 StopIteration, 3-4 StopAllIteration*.
    action != 0 && action != 2
}

fn status_of(headers: &Headers) -> u16 {
    headers.get_str(":status").and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Worker {
    pub(crate) fn start(shared: Arc<Shared>, index: usize, plugin: Arc<Plugin>) -> Result<Self, HostError> {
        let (sender, inbox) = mpsc::channel();
        let sender = Mailbox { sender, waker: None };
        let (store, exports) = instantiate(&shared, index, 1, sender.clone(), 0)?;
        let mut worker = Self {
            index,
            shared,
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

    /// Runs the module's initializer, then starts the root context for the current
    /// configuration.
    fn boot(&mut self) -> Result<(), HostError> {
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
    fn start_root(&mut self, plugin: Arc<Plugin>) -> Result<u32, HostError> {
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
    fn invoke<P: WasmParams, R: WasmResults>(
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

    fn stream_mut(&mut self, id: u32) -> Option<&mut StreamContext> {
        match self.store.data_mut().vm.streams.get_mut(&id) {
            Some(stream) => Some(stream),
            None => self.detached.get_mut(&id),
        }
    }

    fn stream_ref(&self, id: u32) -> Option<&StreamContext> {
        self.store.data().vm.streams.get(&id).or_else(|| self.detached.get(&id))
    }

    /// What the failure policy does to a stream the filter can no longer process.
    fn apply_policy(&mut self, id: u32) {
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

    /// Sends a request through the filter. Returns at once with the stream's id; read
    /// what happened with [`Worker::outcome`]. With the virtual clock, callouts answered
    /// without delay are delivered before this returns, and real callouts are waited
    /// for (see [`crate::HostBuilder::real_callout_wait`]).
    pub fn request(&mut self, request: Request) -> StreamId {
        if self.failed && self.shared.failure_policy == FailurePolicy::FailReload {
            self.restart();
        }
        let start_time = self.shared.clock.realtime_nanos();
        let connection_id = self.shared.next_connection_id();
        let root = self.root;
        let vm = &mut self.store.data_mut().vm;
        let id = vm.next_context_id();
        vm.streams.insert(
            id,
            StreamContext {
                root,
                created: false,
                source: request.source,
                destination: request.destination,
                protocol: request.protocol,
                connection_id,
                start_time,
                request: request.message,
                response: None,
                live: Live::default(),
                log_phase: false,
                properties: HashMap::new(),
                request_flow: Flow::NotStarted,
                forwarded: false,
                response_flow: Flow::NotStarted,
                response_source: None,
                client_response: None,
                reset: false,
                local_reply_requested: false,
                upstream: None,
                pending_done: false,
            },
        );
        if self.failed {
            self.apply_policy(id);
            return StreamId(id);
        }
        let on_context_create = self.exports.on_context_create.clone();
        if matches!(self.invoke(Callback::ContextCreate, id, &on_context_create, (id, root)), Invoked::Trapped) {
            return StreamId(id);
        }
        if let Some(stream) = self.stream_mut(id) {
            stream.created = true;
        }
        self.run_deferred();
        self.deliver_request(id);
        self.settle();
        StreamId(id)
    }

    /// Calls a stream callback, applies what the guest deferred, and says what the
    /// filter decided for `direction`.
    fn stream_step<P: WasmParams>(
        &mut self,
        id: u32,
        callback: Callback,
        direction: Direction,
        func: &Func<P, u32>,
        params: P,
        headers: bool,
    ) -> Step {
        let action = match self.invoke(callback, id, func, params) {
            Invoked::Returned(action) => action,
            Invoked::Missing => 0,
            Invoked::Trapped => return Step::Stopped,
        };
        let stop = std::mem::take(&mut self.store.data_mut().vm.stop_iteration);
        self.run_deferred();
        if self.failed {
            return Step::Stopped;
        }
        let Some(stream) = self.stream_ref(id) else { return Step::Stopped };
        let flow = match direction {
            Direction::Request => stream.request_flow,
            Direction::Response => stream.response_flow,
        };
        if flow != Flow::Running {
            return Step::Stopped;
        }
        let pause = if headers { is_pause_for_headers(action) } else { action != 0 };
        if stop || pause { Step::Pause } else { Step::Continue }
    }

    fn deliver_request(&mut self, id: u32) {
        let Some(stream) = self.stream_mut(id) else { return };
        let headers = to_u32(stream.request.headers.len());
        let body = stream.request.body.as_ref().filter(|b| !b.is_empty()).map(|b| to_u32(b.len()));
        let trailers = stream.request.trailers.as_ref().filter(|t| !t.is_empty()).map(|t| to_u32(t.len()));
        stream.request_flow = Flow::Running;
        stream.live.request_headers = true;
        let eos = u32::from(body.is_none() && trailers.is_none());
        let func = self.exports.on_request_headers.clone();
        let mut step =
            self.stream_step(id, Callback::RequestHeaders, Direction::Request, &func, (id, headers, eos), true);
        if step == Step::Continue
            && let Some(stream) = self.stream_mut(id)
        {
            stream.live.request_headers = false;
        }
        if let Some(size) = body
            && step != Step::Stopped
        {
            if let Some(stream) = self.stream_mut(id) {
                stream.live.request_body = true;
            }
            let func = self.exports.on_request_body.clone();
            let eos = u32::from(trailers.is_none());
            step = self.stream_step(id, Callback::RequestBody, Direction::Request, &func, (id, size, eos), false);
        }
        if let Some(count) = trailers
            && step != Step::Stopped
        {
            if let Some(stream) = self.stream_mut(id) {
                stream.live.request_trailers = true;
            }
            let func = self.exports.on_request_trailers.clone();
            step = self.stream_step(id, Callback::RequestTrailers, Direction::Request, &func, (id, count), false);
        }
        match step {
            Step::Stopped => {}
            Step::Pause => {
                if let Some(stream) = self.stream_mut(id) {
                    stream.request_flow = Flow::Paused;
                }
            }
            Step::Continue => self.forward_request(id),
        }
    }

    fn forward_request(&mut self, id: u32) {
        if let Some(stream) = self.stream_mut(id) {
            stream.request_flow = Flow::Done;
            stream.forwarded = true;
            stream.live.request_headers = false;
            stream.live.request_body = false;
            stream.live.request_trailers = false;
        }
    }

    fn deliver_response(&mut self, id: u32) {
        let Some(stream) = self.stream_mut(id) else { return };
        let Some(response) = stream.response.as_ref() else { return };
        let headers = to_u32(response.headers.len());
        let body = response.body.as_ref().filter(|b| !b.is_empty()).map(|b| to_u32(b.len()));
        let trailers = response.trailers.as_ref().filter(|t| !t.is_empty()).map(|t| to_u32(t.len()));
        stream.response_flow = Flow::Running;
        stream.live.response_headers = true;
        let eos = u32::from(body.is_none() && trailers.is_none());
        let func = self.exports.on_response_headers.clone();
        let mut step =
            self.stream_step(id, Callback::ResponseHeaders, Direction::Response, &func, (id, headers, eos), true);
        if step == Step::Continue
            && let Some(stream) = self.stream_mut(id)
        {
            stream.live.response_headers = false;
        }
        if let Some(size) = body
            && step != Step::Stopped
        {
            if let Some(stream) = self.stream_mut(id) {
                stream.live.response_body = true;
            }
            let func = self.exports.on_response_body.clone();
            let eos = u32::from(trailers.is_none());
            step = self.stream_step(id, Callback::ResponseBody, Direction::Response, &func, (id, size, eos), false);
        }
        if let Some(count) = trailers
            && step != Step::Stopped
        {
            if let Some(stream) = self.stream_mut(id) {
                stream.live.response_trailers = true;
            }
            let func = self.exports.on_response_trailers.clone();
            step = self.stream_step(id, Callback::ResponseTrailers, Direction::Response, &func, (id, count), false);
        }
        match step {
            Step::Stopped => {}
            Step::Pause => {
                if let Some(stream) = self.stream_mut(id) {
                    stream.response_flow = Flow::Paused;
                }
            }
            Step::Continue => {
                if let Some(stream) = self.stream_mut(id) {
                    complete(stream);
                }
            }
        }
    }

    /// Runs what the guest deferred to after its callback (Envoy's after-VM-call
    /// actions), in order.
    fn run_deferred(&mut self) {
        loop {
            if self.failed {
                self.store.data_mut().vm.deferred.clear();
                return;
            }
            let Some(action) = self.store.data_mut().vm.deferred.pop_front() else { return };
            match action {
                Deferred::Continue { stream, direction: Direction::Request } => {
                    if self.stream_ref(stream).is_some_and(|s| s.request_flow == Flow::Paused) {
                        self.forward_request(stream);
                    }
                }
                Deferred::Continue { stream, direction: Direction::Response } => {
                    if let Some(s) = self.stream_mut(stream)
                        && s.response_flow == Flow::Paused
                    {
                        complete(s);
                    }
                }
                Deferred::Close { stream, .. } => {
                    if let Some(s) = self.stream_mut(stream)
                        && s.client_response.is_none()
                    {
                        s.reset = true;
                        s.request_flow = Flow::Done;
                        s.response_flow = Flow::Done;
                        s.live = Live::default();
                    }
                }
                Deferred::LocalReply { stream, reply } => self.local_reply(stream, reply),
                Deferred::Done { context } => self.log_and_delete(context),
            }
        }
    }

    /// A `proxy_send_local_response`, once the callback that sent it has returned.
    fn local_reply(&mut self, id: u32, reply: LocalReply) {
        let Some(stream) = self.stream_mut(id) else { return };
        if stream.client_response.is_some() || stream.reset {
            return;
        }
        let mut headers = Headers::from_pairs([(":status", reply.status.to_string())]);
        for (name, value) in &reply.headers {
            headers.add(name, value);
        }
        if !reply.body.is_empty() {
            headers.replace("content-length", reply.body.len().to_string());
            if !headers.contains("content-type") {
                headers.add("content-type", "text/plain");
            }
        }
        let body = (!reply.body.is_empty()).then_some(reply.body);
        stream.response_source = Some(ResponseSource::Local { details: reply.details });
        stream.live.request_headers = false;
        stream.live.request_body = false;
        stream.live.request_trailers = false;
        let from_response_path = stream.response_flow != Flow::NotStarted;
        stream.response = Some(Message { headers, body, trailers: None });
        stream.request_flow = Flow::Done;
        if from_response_path || !stream.created {
            // Envoy sends a direct reply: the filter chain is not run again.
            complete(stream);
        } else {
            self.deliver_response(id);
        }
    }

    /// Passes the upstream's response for a forwarded request through the filter's
    /// response callbacks, and returns where the stream stands.
    ///
    /// # Errors
    /// [`HostError::UnknownStream`] for a stream this worker does not have;
    /// [`HostError::NotForwarded`] if its request did not go upstream or it already has
    /// a response.
    pub fn respond(&mut self, stream: StreamId, response: Response) -> Result<Outcome<'_>, HostError> {
        let id = stream.0;
        let host_only = self.failed || self.detached.contains_key(&id);
        let open = self.shared.failure_policy == FailurePolicy::FailOpen;
        let worker = self.index;
        let Some(s) = self.stream_mut(id) else {
            return Err(HostError::UnknownStream { worker, stream });
        };
        if !s.forwarded {
            return Err(HostError::NotForwarded {
                stream,
                reason: "its request did not go upstream (it is paused, was answered locally, or was reset)",
            });
        }
        if s.response_flow != Flow::NotStarted || s.client_response.is_some() {
            return Err(HostError::NotForwarded { stream, reason: "it already has a response" });
        }
        s.upstream = response.upstream;
        s.response = Some(response.message);
        s.response_source = Some(ResponseSource::Upstream);
        if host_only || !s.created {
            if open || !host_only {
                complete(s);
            } else {
                fail_closed(s);
            }
        } else {
            self.deliver_response(id);
            self.settle();
        }
        self.outcome(stream)
    }

    /// Where a stream stands.
    ///
    /// # Errors
    /// [`HostError::UnknownStream`] for a stream this worker does not have (never
    /// opened, or finished).
    pub fn outcome(&self, stream: StreamId) -> Result<Outcome<'_>, HostError> {
        let s = self.stream_ref(stream.0).ok_or(HostError::UnknownStream { worker: self.index, stream })?;
        Ok(if s.reset {
            Outcome::Reset
        } else if let Some(response) = &s.client_response {
            Outcome::Responded(response)
        } else if matches!(s.response_flow, Flow::Running | Flow::Paused) {
            Outcome::ResponsePaused
        } else if s.forwarded {
            Outcome::Forwarded(&s.request)
        } else {
            Outcome::Paused
        })
    }

    /// Ends a stream as Envoy does when it is destroyed: `proxy_on_done`, then (if that
    /// returned true) `proxy_on_log` with the headers readable, then `proxy_on_delete`.
    /// A stream whose `proxy_on_done` returned false stays until the guest calls
    /// `proxy_done`. A paused stream may be finished too (the client went away).
    ///
    /// # Errors
    /// [`HostError::UnknownStream`] for a stream this worker does not have.
    pub fn finish(&mut self, stream: StreamId) -> Result<(), HostError> {
        let id = stream.0;
        if self.detached.remove(&id).is_some() {
            return Ok(());
        }
        let worker = self.index;
        let s = self.store.data_mut().vm.streams.get_mut(&id).ok_or(HostError::UnknownStream { worker, stream })?;
        if s.pending_done {
            return Ok(());
        }
        s.live = Live::default();
        if self.failed || !s.created {
            let root = s.root;
            self.store.data_mut().vm.streams.remove(&id);
            self.maybe_retire_root(root);
            return Ok(());
        }
        let on_done = self.exports.on_done.clone();
        let done = match self.invoke(Callback::Done, id, &on_done, id) {
            Invoked::Returned(done) => done != 0,
            Invoked::Missing => true,
            Invoked::Trapped => {
                self.store.data_mut().vm.streams.remove(&id);
                return Ok(());
            }
        };
        self.run_deferred();
        if !done {
            if let Some(s) = self.store.data_mut().vm.streams.get_mut(&id) {
                s.pending_done = true;
            }
            return Ok(());
        }
        self.log_and_delete(id);
        Ok(())
    }

    fn log_and_delete(&mut self, id: u32) {
        let Some(stream) = self.store.data_mut().vm.streams.get_mut(&id) else { return };
        let root = stream.root;
        stream.log_phase = true;
        let on_log = self.exports.on_log.clone();
        let logged = self.invoke(Callback::Log, id, &on_log, id);
        if let Some(stream) = self.store.data_mut().vm.streams.get_mut(&id) {
            stream.log_phase = false;
        }
        if !matches!(logged, Invoked::Trapped) {
            self.run_deferred();
            let on_delete = self.exports.on_delete.clone();
            let _ = self.invoke(Callback::Delete, id, &on_delete, id);
            self.run_deferred();
        }
        self.store.data_mut().vm.streams.remove(&id);
        self.maybe_retire_root(root);
    }

    /// Sends a request and, if the filter forwards it, passes `upstream` back through
    /// the filter; then finishes the stream. What the client saw.
    ///
    /// # Errors
    /// [`HostError::Paused`] if the filter holds the request or the response (the
    /// stream stays open: drive it with the clock or callouts).
    pub fn exchange(&mut self, request: Request, upstream: Response) -> Result<Exchange, HostError> {
        let stream = self.request(request);
        let forwarded = match self.outcome(stream)? {
            Outcome::Paused | Outcome::ResponsePaused => return Err(HostError::Paused { stream }),
            Outcome::Forwarded(message) => Some(message.clone()),
            Outcome::Responded(_) | Outcome::Reset => None,
        };
        if forwarded.is_some() {
            self.respond(stream, upstream)?;
        }
        let response = match self.outcome(stream)? {
            Outcome::Paused | Outcome::ResponsePaused => return Err(HostError::Paused { stream }),
            Outcome::Responded(response) => Some(response.clone()),
            Outcome::Forwarded(_) | Outcome::Reset => None,
        };
        self.finish(stream)?;
        Ok(Exchange { forwarded, response })
    }

    /// Delivers everything due now: completed real callouts, scripted answers and
    /// timeouts, ticks. With the virtual clock, also waits for real callouts in flight
    /// (see [`crate::HostBuilder::real_callout_wait`]).
    pub fn run_pending(&mut self) {
        self.settle();
    }

    /// Delivers the real callouts that have completed, without waiting.
    pub(crate) fn drain_inbox(&mut self) {
        if self.shared.serve_mode {
            return;
        }
        self.handle_messages();
    }

    fn settle(&mut self) {
        if self.shared.serve_mode {
            self.fire_due();
            return;
        }
        let give_up = self.shared.wait_for_real_callouts.map(|wait| Instant::now() + wait);
        loop {
            self.drain_inbox();
            self.fire_due();
            let Some(give_up) = give_up else { return };
            if !self.has_real_callouts() {
                return;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.inbox.recv_timeout(left) {
                Ok(message) => self.handle_inbox(message),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn has_real_callouts(&self) -> bool {
        self.store.data().vm.callouts.values().any(|c| matches!(c.delivery, Delivery::InFlight { .. }))
    }

    /// Handles a message from another thread.
    pub(crate) fn handle_inbox(&mut self, message: Inbox) {
        match message {
            Inbox::CalloutHead { generation, token } => {
                if generation == self.generation
                    && let Some(Delivery::InFlight { head_arrived, .. }) =
                        self.store.data_mut().vm.callouts.get_mut(&token).map(|c| &mut c.delivery)
                {
                    *head_arrived = true;
                }
            }
            Inbox::Callout { generation, token, ending } => {
                if generation == self.generation {
                    self.deliver_callout(token, ending);
                }
            }
            Inbox::QueueReady { generation, root, token } => {
                if generation == self.generation && self.store.data().vm.roots.contains_key(&root) {
                    let func = self.exports.on_queue_ready.clone();
                    if let Invoked::Returned(()) = self.invoke(Callback::QueueReady, root, &func, (root, token)) {
                        self.run_deferred();
                    }
                }
            }
        }
    }

    /// For `serve`'s event loop: wakes it whenever a message arrives.
    pub(crate) fn set_waker(&mut self, waker: Arc<tokio::sync::Notify>) {
        self.sender.waker = Some(waker);
        self.store.data_mut().inbox = self.sender.clone();
    }

    /// For `serve`'s event loop: handles every message that has arrived.
    pub(crate) fn handle_messages(&mut self) {
        while let Ok(message) = self.inbox.try_recv() {
            self.handle_inbox(message);
        }
    }

    /// The host clock's monotonic time.
    pub(crate) fn clock_monotonic(&self) -> u64 {
        self.shared.clock.monotonic_nanos()
    }

    /// The earliest monotonic time at which something is due on this worker.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.next_event().map(|(at, _)| at)
    }

    fn next_event(&self) -> Option<(u64, Event)> {
        if self.failed {
            return None;
        }
        let vm = &self.store.data().vm;
        let ticks = vm.roots.iter().filter_map(|(id, root)| root.next_tick.map(|at| (at, Event::Tick(*id))));
        let callouts = vm.callouts.iter().flat_map(|(token, callout)| {
            let answer = match callout.delivery {
                Delivery::Scheduled { at, .. } => Some((at, Event::Answer(*token))),
                Delivery::Stalled { .. } | Delivery::InFlight { .. } => None,
            };
            let timeout = callout.deadline.map(|at| (at, Event::Timeout(*token)));
            answer.into_iter().chain(timeout)
        });
        ticks.chain(callouts).min()
    }

    /// Fires, in time order, everything due at the clock's current time.
    pub(crate) fn fire_due(&mut self) {
        loop {
            let now = self.shared.clock.monotonic_nanos();
            let Some((at, event)) = self.next_event() else { return };
            if at > now {
                return;
            }
            match event {
                Event::Tick(root) => self.tick(root, now),
                Event::Answer(token) => {
                    let ending = match self.store.data_mut().vm.callouts.get_mut(&token).map(|c| &mut c.delivery) {
                        Some(Delivery::Scheduled { ending, .. }) => std::mem::replace(ending, Ending::Reset),
                        _ => continue,
                    };
                    self.deliver_callout(token, ending);
                }
                Event::Timeout(token) => {
                    let Some(callout) = self.store.data().vm.callouts.get(&token) else { continue };
                    let ending = Ending::timed_out(callout.delivery.head_arrived(now));
                    self.deliver_callout(token, ending);
                }
            }
        }
    }

    fn tick(&mut self, root: u32, now: u64) {
        let Some(context) = self.store.data_mut().vm.roots.get_mut(&root) else { return };
        // As Envoy's timer: the next tick is one period after this one fired.
        context.next_tick = context.tick_period.map(|period| now.saturating_add(period));
        let on_tick = self.exports.on_tick.clone();
        if let Invoked::Returned(()) = self.invoke(Callback::Tick, root, &on_tick, root) {
            self.run_deferred();
        }
    }

    fn deliver_callout(&mut self, token: u32, ending: Ending) {
        if self.failed {
            return;
        }
        let vm = &mut self.store.data_mut().vm;
        let Some(pending) = vm.callouts.remove(&token) else { return };
        if let Delivery::InFlight { task, .. } = &pending.delivery {
            task.abort();
        }
        let root = pending.root;
        if !vm.roots.contains_key(&root) {
            return;
        }
        let response = ending.into_response();
        let counts = match &response {
            Some(response) => {
                (to_u32(response.headers.len()), to_u32(response.body.len()), to_u32(response.trailers.len()))
            }
            None => {
                // Envoy's `onHttpCallFailure`: the code stays for later calls, the
                // message only for this callback.
                if let Some(context) = vm.roots.get_mut(&root) {
                    context.status_code = status::BROKEN_CONNECTION;
                    context.status_message = b"reset".to_vec();
                }
                (0, 0, 0)
            }
        };
        let failed = response.is_none();
        vm.call_response = Some(LiveCallResponse { root, response });
        let func = self.exports.on_http_call_response.clone();
        let invoked = self.invoke(Callback::HttpCallResponse, root, &func, (root, token, counts.0, counts.1, counts.2));
        let vm = &mut self.store.data_mut().vm;
        vm.call_response = None;
        if failed && let Some(context) = vm.roots.get_mut(&root) {
            context.status_message.clear();
        }
        if let Invoked::Returned(()) = invoked {
            self.run_deferred();
        }
    }

    /// Fails closed every stream on a VM that is replaced, then starts a fresh VM with
    /// the current configuration (`FAIL_RELOAD`). Shared data is kept: it lives in the
    /// host, not in the VM.
    fn restart(&mut self) {
        let generation = self.generation + 1;
        let first_context_id = self.store.data().vm.next_context_id;
        match instantiate(&self.shared, self.index, generation, self.sender.clone(), first_context_id) {
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

    /// Starts a root context for a new configuration without switching to it yet.
    pub(crate) fn prepare_configuration(&mut self, plugin: Arc<Plugin>) -> Result<u32, HostError> {
        if self.failed {
            // A failed VM takes the configuration when (if) it restarts.
            return Ok(0);
        }
        self.start_root(plugin)
    }

    /// Switches new streams to the prepared root; the old root finishes with its
    /// streams.
    pub(crate) fn commit_configuration(&mut self, root: u32, plugin: Arc<Plugin>) {
        self.plugin = plugin;
        if root == 0 {
            return;
        }
        let old = std::mem::replace(&mut self.root, root);
        if let Some(context) = self.store.data_mut().vm.roots.get_mut(&old) {
            context.retiring = true;
        }
        self.maybe_retire_root(old);
    }

    /// Drops a prepared root after another worker rejected the configuration.
    pub(crate) fn abandon_configuration(&mut self, root: u32) {
        if root != 0 {
            self.finish_root(root);
        }
    }

    fn maybe_retire_root(&mut self, root: u32) {
        let vm = &self.store.data().vm;
        let retiring = vm.roots.get(&root).is_some_and(|r| r.retiring);
        if retiring && !vm.streams.values().any(|s| s.root == root) {
            self.finish_root(root);
        }
    }

    /// `proxy_on_done` and `proxy_on_delete` for a root context; its ticks and callouts
    /// die with it.
    fn finish_root(&mut self, root: u32) {
        let on_done = self.exports.on_done.clone();
        if !matches!(self.invoke(Callback::Done, root, &on_done, root), Invoked::Trapped) {
            let on_delete = self.exports.on_delete.clone();
            let _ = self.invoke(Callback::Delete, root, &on_delete, root);
        }
        let vm = &mut self.store.data_mut().vm;
        vm.roots.remove(&root);
        vm.callouts.retain(|_, callout| {
            let keep = callout.root != root;
            if !keep && let Delivery::InFlight { task, .. } = &callout.delivery {
                task.abort();
            }
            keep
        });
        vm.deferred.clear();
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

    /// How many streams are open (not yet finished) on this worker.
    pub fn open_streams(&self) -> usize {
        self.store.data().vm.streams.len() + self.detached.len()
    }
}

/// The response has passed the filter: the client receives it.
fn complete(stream: &mut StreamContext) {
    stream.response_flow = Flow::Done;
    stream.request_flow = Flow::Done;
    stream.live.response_headers = false;
    stream.live.response_body = false;
    stream.live.response_trailers = false;
    let Some(response) = stream.response.as_ref() else { return };
    stream.client_response = Some(ClientResponse {
        status: status_of(&response.headers),
        headers: response.headers.clone(),
        body: response.body.clone().unwrap_or_default(),
        trailers: response.trailers.clone(),
        source: stream.response_source.clone().unwrap_or(ResponseSource::Upstream),
    });
}

/// Envoy's `failStream`: a `503` local reply that no filter sees.
fn fail_closed(stream: &mut StreamContext) {
    stream.live = Live::default();
    stream.response = Some(Message { headers: Headers::from_pairs([(":status", "503")]), body: None, trailers: None });
    stream.response_source = Some(ResponseSource::FailurePolicy);
    complete(stream);
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

    #[test]
    fn only_continue_actions_release_headers() {
        assert!(!is_pause_for_headers(0));
        assert!(!is_pause_for_headers(2));
        assert!(is_pause_for_headers(1));
        assert!(is_pause_for_headers(3));
        assert!(is_pause_for_headers(4));
    }
}

//! The state of one VM that host functions read and write: its contexts, the callback
//! that is running, deferred actions, pending callouts and metric ids.
//!
//! It lives in the wasmtime `Store` of the worker, so a host function reaches it through
//! its `Caller`; nothing is global, and workers share only what `Shared` holds.
//!
//! Layer: above the shared services (`crate::services`), below the host functions
//! (`crate::abi`) that read and write it and the worker that drives it. It holds data and
//! the small rules that keep it consistent (context ids, callout tokens, which context a
//! host call acts on); what happens *next* is the worker's.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use wasmtime::{Memory, StoreLimits, TypedFunc};

use crate::callout::{CalloutRequest, CalloutResponse, Ending};
use crate::metrics::MetricIds;
use crate::request::{ClientResponse, Message, ResponseSource};
use crate::services::{Mailbox, Shared};
use crate::shared_data::SharedData;

/// Everything a host function can reach.
pub(crate) struct HostState {
    pub(crate) shared: Arc<Shared>,
    pub(crate) worker: usize,
    /// Bumped on every VM (re)start, so that late callout completions of a dead VM are
    /// recognised and dropped.
    pub(crate) generation: u64,
    pub(crate) memory: Option<Memory>,
    pub(crate) allocate: Option<Arc<TypedFunc<i32, i32>>>,
    /// Set while the guest's allocator runs: Envoy allows only logging and clocks then.
    pub(crate) in_allocator: bool,
    pub(crate) limits: StoreLimits,
    pub(crate) inbox: Mailbox,
    pub(crate) vm: Vm,
    /// The guest's calls to each host function, and the host's re-entries into its
    /// allocator, since the VM started (`crate::counts`).
    pub(crate) calls: crate::counts::Tally,
}

/// The contexts of one VM and the callback in progress.
pub(crate) struct Vm {
    pub(crate) next_context_id: u32,
    pub(crate) roots: BTreeMap<u32, RootContext>,
    pub(crate) streams: HashMap<u32, StreamContext>,
    /// The context whose callback is running (0 outside callbacks).
    pub(crate) current: u32,
    /// Set by `proxy_set_effective_context` for the rest of the callback (0 = none).
    pub(crate) effective: u32,
    pub(crate) callback: Callback,
    /// Set by `proxy_send_local_response`: the callback's result becomes `Pause`.
    pub(crate) stop_iteration: bool,
    /// Actions Envoy runs after the callback returns (`addAfterVmCallAction`).
    pub(crate) deferred: VecDeque<Deferred>,
    /// The callout response readable during `proxy_on_http_call_response`.
    pub(crate) call_response: Option<LiveCallResponse>,
    /// The plugin configuration, readable only during `proxy_on_configure`.
    pub(crate) plugin_configuration: Option<Arc<[u8]>>,
    pub(crate) vm_configuration: Arc<[u8]>,
    pub(crate) callouts: HashMap<u32, PendingCallout>,
    next_callout: u32,
    pub(crate) metric_ids: MetricIds,
    pub(crate) shared_data: SharedData,
    /// The last critical line the guest logged during the running callback: the Rust
    /// SDK's panic hook logs the panic message there just before the trap.
    pub(crate) last_critical: Option<String>,
    /// What the guest logged at warn level or above during the running callback: the
    /// reason a configuration was rejected.
    pub(crate) callback_lines: Vec<String>,
}

impl Vm {
    pub(crate) fn new(vm_configuration: Arc<[u8]>, shared_data: SharedData) -> Self {
        Self {
            next_context_id: 0,
            roots: BTreeMap::new(),
            streams: HashMap::new(),
            current: 0,
            effective: 0,
            callback: Callback::None,
            stop_iteration: false,
            deferred: VecDeque::new(),
            call_response: None,
            plugin_configuration: None,
            vm_configuration,
            callouts: HashMap::new(),
            next_callout: 0,
            metric_ids: MetricIds::default(),
            shared_data,
            last_critical: None,
            callback_lines: Vec::new(),
        }
    }

    /// A fresh context id: roots and streams share one counter per VM, as in Envoy.
    pub(crate) fn next_context_id(&mut self) -> u32 {
        loop {
            self.next_context_id = self.next_context_id.wrapping_add(1);
            let id = self.next_context_id;
            if id != 0 && !self.roots.contains_key(&id) && !self.streams.contains_key(&id) {
                return id;
            }
        }
    }

    /// A fresh callout token, never 0 and never one still pending.
    pub(crate) fn next_callout_token(&mut self) -> u32 {
        loop {
            self.next_callout = self.next_callout.wrapping_add(1);
            let token = self.next_callout;
            if token != 0 && !self.callouts.contains_key(&token) {
                return token;
            }
        }
    }

    /// The context host calls act on: the effective context if one was set and still
    /// exists, else the current one (cpp-host's `contextOrEffectiveContext`).
    pub(crate) fn acting_context(&self) -> u32 {
        if self.effective != 0
            && (self.roots.contains_key(&self.effective) || self.streams.contains_key(&self.effective))
        {
            self.effective
        } else {
            self.current
        }
    }

    /// The root context of `context` (itself for a root).
    pub(crate) fn root_of(&self, context: u32) -> Option<u32> {
        if self.roots.contains_key(&context) { Some(context) } else { self.streams.get(&context).map(|s| s.root) }
    }
}

/// The callback running in the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Callback {
    None,
    Initialize,
    ContextCreate,
    VmStart,
    Configure,
    Tick,
    HttpCallResponse,
    RequestHeaders,
    RequestBody,
    RequestTrailers,
    ResponseHeaders,
    ResponseBody,
    ResponseTrailers,
    Done,
    Log,
    Delete,
    QueueReady,
}

impl Callback {
    /// The guest export that implements it.
    pub(crate) fn export_name(self) -> &'static str {
        match self {
            Self::None => "(none)",
            Self::Initialize => "_initialize",
            Self::ContextCreate => "proxy_on_context_create",
            Self::VmStart => "proxy_on_vm_start",
            Self::Configure => "proxy_on_configure",
            Self::Tick => "proxy_on_tick",
            Self::HttpCallResponse => "proxy_on_http_call_response",
            Self::RequestHeaders => "proxy_on_request_headers",
            Self::RequestBody => "proxy_on_request_body",
            Self::RequestTrailers => "proxy_on_request_trailers",
            Self::ResponseHeaders => "proxy_on_response_headers",
            Self::ResponseBody => "proxy_on_response_body",
            Self::ResponseTrailers => "proxy_on_response_trailers",
            Self::Done => "proxy_on_done",
            Self::Log => "proxy_on_log",
            Self::Delete => "proxy_on_delete",
            Self::QueueReady => "proxy_on_queue_ready",
        }
    }
}

/// One plugin configuration applied to a VM: a root context.
#[derive(Debug)]
pub(crate) struct Plugin {
    pub(crate) name: String,
    pub(crate) root_id: String,
    pub(crate) configuration: Arc<[u8]>,
}

/// A root (plugin) context.
#[derive(Debug)]
pub(crate) struct RootContext {
    pub(crate) plugin: Arc<Plugin>,
    /// Tick period in nanoseconds; `None` when ticks are off.
    pub(crate) tick_period: Option<u64>,
    /// Monotonic time of the next tick.
    pub(crate) next_tick: Option<u64>,
    /// What `proxy_get_status` reports (Envoy's `status_code_`, `status_message_`).
    pub(crate) status_code: u32,
    pub(crate) status_message: Vec<u8>,
    /// Replaced by a newer configuration: finished once its streams are.
    pub(crate) retiring: bool,
}

impl RootContext {
    pub(crate) fn new(plugin: Arc<Plugin>) -> Self {
        Self { plugin, tick_period: None, next_tick: None, status_code: 0, status_message: Vec::new(), retiring: false }
    }
}

/// Which maps and buffers of a stream the guest may touch right now (Envoy keeps a
/// pointer to each only while the filter holds that part of the stream).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Live {
    pub(crate) request_headers: bool,
    pub(crate) request_body: bool,
    pub(crate) request_trailers: bool,
    pub(crate) response_headers: bool,
    pub(crate) response_body: bool,
    pub(crate) response_trailers: bool,
}

/// A part of one direction of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Headers,
    Body,
    Trailers,
}

impl Live {
    /// Makes `part` of `direction` readable (or not).
    pub(crate) fn set(&mut self, direction: Direction, part: Part, live: bool) {
        let flag = match (direction, part) {
            (Direction::Request, Part::Headers) => &mut self.request_headers,
            (Direction::Request, Part::Body) => &mut self.request_body,
            (Direction::Request, Part::Trailers) => &mut self.request_trailers,
            (Direction::Response, Part::Headers) => &mut self.response_headers,
            (Direction::Response, Part::Body) => &mut self.response_body,
            (Direction::Response, Part::Trailers) => &mut self.response_trailers,
        };
        *flag = live;
    }
}

/// Progress of one direction of a stream through the filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Not reached the filter yet.
    NotStarted,
    /// The filter's callbacks for it are being delivered.
    Running,
    /// The filter returned `Pause` and has not resumed it.
    Paused,
    /// Passed the filter (forwarded), or abandoned (local reply, reset).
    Done,
}

/// An HTTP stream context.
#[derive(Debug)]
pub(crate) struct StreamContext {
    pub(crate) root: u32,
    /// Whether `proxy_on_context_create` ran for it.
    pub(crate) created: bool,
    pub(crate) source: SocketAddr,
    pub(crate) destination: SocketAddr,
    pub(crate) protocol: &'static str,
    pub(crate) connection_id: u64,
    /// Wall-clock time at which the request arrived (`request.time`).
    pub(crate) start_time: u64,
    pub(crate) request: Message,
    pub(crate) response: Option<Message>,
    pub(crate) live: Live,
    /// `proxy_on_log` is running: request and response headers are readable.
    pub(crate) log_phase: bool,
    /// Values written with `proxy_set_property`.
    pub(crate) properties: HashMap<Vec<u8>, Vec<u8>>,
    pub(crate) request_flow: Flow,
    /// The request went upstream (as opposed to being answered locally or reset).
    pub(crate) forwarded: bool,
    pub(crate) response_flow: Flow,
    pub(crate) response_source: Option<ResponseSource>,
    pub(crate) client_response: Option<ClientResponse>,
    pub(crate) reset: bool,
    /// A local reply was already requested for this stream.
    pub(crate) local_reply_requested: bool,
    pub(crate) upstream: Option<SocketAddr>,
    /// `proxy_on_done` returned false: waiting for `proxy_done`.
    pub(crate) pending_done: bool,
}

impl StreamContext {
    /// The request, or the response if there is one yet.
    pub(crate) fn message(&self, direction: Direction) -> Option<&Message> {
        match direction {
            Direction::Request => Some(&self.request),
            Direction::Response => self.response.as_ref(),
        }
    }

    /// Where `direction` stands.
    pub(crate) fn flow(&self, direction: Direction) -> Flow {
        match direction {
            Direction::Request => self.request_flow,
            Direction::Response => self.response_flow,
        }
    }

    /// Where `direction` stands, to change it.
    pub(crate) fn flow_mut(&mut self, direction: Direction) -> &mut Flow {
        match direction {
            Direction::Request => &mut self.request_flow,
            Direction::Response => &mut self.response_flow,
        }
    }
}

/// Actions that run after the callback returns.
#[derive(Debug)]
pub(crate) enum Deferred {
    Continue { stream: u32, direction: Direction },
    Close { stream: u32 },
    LocalReply { stream: u32, reply: LocalReply },
    Done { context: u32 },
}

/// Request or response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Request,
    Response,
}

/// A `proxy_send_local_response` call.
#[derive(Debug, Clone)]
pub(crate) struct LocalReply {
    pub(crate) status: u16,
    pub(crate) details: String,
    pub(crate) body: Vec<u8>,
    pub(crate) headers: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The response of the callout being delivered.
#[derive(Debug)]
pub(crate) struct LiveCallResponse {
    pub(crate) root: u32,
    /// `None` for a failed call: maps read as absent, the body buffer is not found.
    pub(crate) response: Option<CalloutResponse>,
}

/// A dispatched callout waiting for its answer.
#[derive(Debug)]
pub(crate) struct PendingCallout {
    pub(crate) root: u32,
    /// Monotonic time at which it times out.
    pub(crate) deadline: Option<u64>,
    pub(crate) delivery: Delivery,
}

/// How a pending callout will end.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// A scripted answer that ends this way at this monotonic time.
    Scheduled { at: u64, ending: Ending },
    /// A scripted answer that never ends (only the deadline does); its response head
    /// arrives at `head_at`, or never.
    Stalled { head_at: Option<u64> },
    /// A real request in flight; its response head and its end arrive through the
    /// worker's inbox.
    InFlight { task: tokio::task::AbortHandle, head_arrived: bool },
    /// A scripted answer the driver gives later ([`crate::Answer::deferred`]): the
    /// request until the driver takes it.
    Deferred { dispatched: u64, request: Option<CalloutRequest> },
}

impl Delivery {
    /// Whether the response head had arrived by `now`: a timeout then resets the call
    /// instead of answering `504`.
    pub(crate) fn head_arrived(&self, now: u64) -> bool {
        match self {
            // A scripted ending is all or nothing: due later, nothing has arrived yet.
            Self::Scheduled { .. } | Self::Deferred { .. } => false,
            Self::Stalled { head_at } => head_at.is_some_and(|at| at <= now),
            Self::InFlight { head_arrived, .. } => *head_arrived,
        }
    }
}

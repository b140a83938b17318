//! `bench=batch`: the least any filter pays that asks a service about each request and
//! sends the questions that wait together, with the proxy-wasm SDK, as `sluice.wasm`'s
//! check mode does (its README, "Checks committed together").
//!
//! A request reads its key (`x-key`) and pauses. While fewer than `in_flight` calls are
//! out, it sends its own call from its own context at once; otherwise it waits. When a
//! call answers, every request it carried is resumed from the context the answer
//! reached, and if requests wait, the root is woken through the worker's shared queue to
//! send them in one call. The next call leaves from the root, not from the stream the
//! answer reached: the SDK routes an answer to the context that was running when the
//! call went out, and a stream may end before its call answers, which would strand the
//! requests the call carried. `sluice.wasm` wakes its root the same way.
//!
//! Each call is `GET /healthz` to the cluster `cluster`, with no body: the floor under a
//! check, which also writes its JSON question and reads the answer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{Action, MapType};

use crate::config::Config;

/// What this worker's batches hold.
#[derive(Default)]
struct Batches {
    /// Paused requests that wait for a call to carry them, by stream id.
    waiting: Vec<u32>,
    /// Calls out, by token: the streams each carries.
    calls: HashMap<u32, Vec<u32>>,
    /// The worker's shared queue that wakes its root.
    wake: Option<u32>,
}

thread_local! {
    static BATCHES: RefCell<Batches> = RefCell::new(Batches::default());
}

/// The root registers its queue (a name of its own: every worker's VM has the same root
/// context id, and a queue name is shared by the VMs of one `vm_id`).
pub(super) fn register(root: u32) {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    if let Ok(queue) = hostcalls::register_shared_queue(&format!("bench-batch/{root}/{nanos}")) {
        BATCHES.with(|b| b.borrow_mut().wake = Some(queue));
    }
}

/// Sends one call from the context that is running: its token, or `None` if the host
/// refused it.
fn dispatch(config: &Config) -> Option<u32> {
    let cluster = config.cluster.as_deref().unwrap_or("upstream");
    let headers = vec![(":method", "GET"), (":path", "/healthz"), (":authority", "sluice-counter")];
    hostcalls::dispatch_http_call(cluster, headers, None, vec![], Duration::from_secs(1)).ok()
}

fn resume(members: &[u32]) {
    for &id in members {
        if hostcalls::set_effective_context(id).is_ok() {
            let _ = hostcalls::resume_http_request();
        }
    }
}

/// Stream `id`'s request headers: read the key, pause, and go at once if a call may.
pub(super) fn begin(id: u32, config: &Config) -> Action {
    let _ = std::hint::black_box(hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, "x-key"));
    let room = BATCHES.with(|b| b.borrow().calls.len() < config.in_flight);
    if room {
        // Refused: the request goes on unpaused.
        let Some(token) = dispatch(config) else { return Action::Continue };
        BATCHES.with(|b| b.borrow_mut().calls.insert(token, vec![id]));
        return Action::Pause;
    }
    BATCHES.with(|b| b.borrow_mut().waiting.push(id));
    Action::Pause
}

/// Call `token` answered (or failed): its requests go on; if others wait, the root is
/// woken to send them.
pub(super) fn answered(token: u32) {
    let (members, wake) = BATCHES.with(|b| {
        let mut b = b.borrow_mut();
        let members = b.calls.remove(&token).unwrap_or_default();
        (members, if b.waiting.is_empty() { None } else { b.wake })
    });
    resume(&members);
    if let Some(queue) = wake {
        let _ = hostcalls::enqueue_shared_queue(queue, Some(b"send"));
    }
}

/// The root was woken: send what waits, in calls of as many requests as wait, while a
/// call may go.
pub(super) fn on_wake(queue: u32, config: &Config) {
    while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue) {}
    loop {
        let batch = BATCHES.with(|b| {
            let mut b = b.borrow_mut();
            if b.waiting.is_empty() || b.calls.len() >= config.in_flight {
                None
            } else {
                Some(std::mem::take(&mut b.waiting))
            }
        });
        let Some(members) = batch else { return };
        match dispatch(config) {
            Some(token) => {
                BATCHES.with(|b| b.borrow_mut().calls.insert(token, members));
            }
            // Refused: they go on at once; none is left paused.
            None => resume(&members),
        }
    }
}

/// Whether `queue` is the one that wakes the root for batches.
pub(super) fn is_wake(queue: u32) -> bool {
    BATCHES.with(|b| b.borrow().wake == Some(queue))
}

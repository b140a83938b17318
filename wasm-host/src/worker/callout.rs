//! Delivering a callout's end to the guest: `proxy_on_http_call_response` on the root
//! context that dispatched it, with the response readable during the callback. A failed
//! call (reset after the head) is delivered as `(0, 0, 0)` with `proxy_get_status`
//! reporting code 11 and message `reset`, as Envoy's `onHttpCallFailure` does: the code
//! stays for the root's later calls, the message only for this callback.
//!
//! Dispatch is in `abi::callout`; what reaches the guest from the wire (or a script) is
//! decided by `crate::callout`.

use super::{Invoked, Worker, to_u32};
use crate::abi::status;
use crate::callout::Ending;
use crate::state::{Callback, Delivery, LiveCallResponse};

impl Worker {
    /// Ends callout `token` as `ending` says: its entry leaves the VM (a real request
    /// still running is aborted) and, if its root context still exists, the guest hears
    /// of it. Nothing reaches a failed VM.
    pub(super) fn deliver_callout(&mut self, token: u32, ending: Ending) {
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
}

//! The stream state machine: a request and its response through the filter, with
//! Envoy's filter-manager rules (see the `worker` module docs).
//!
//! Both directions go through one path, `Worker::deliver`: headers, body, trailers,
//! each callback's answer read the same way. What differs is only where a direction goes
//! when the filter lets it pass: the request upstream (`forward_request`), the response
//! to the client (`complete`). Guest actions that take effect after the callback
//! (continue, close, local reply, deferred done) are run by `run_deferred`.

use std::collections::HashMap;

use wasmtime::WasmParams;

use super::{Exports, Func, Invoked, Worker, to_u32};
use crate::error::{FailurePolicy, HostError};
use crate::headers::Headers;
use crate::request::{ClientResponse, Exchange, Message, Outcome, Request, Response, ResponseSource, StreamId};
use crate::state::{Callback, Deferred, Direction, Flow, Live, LocalReply, Part, StreamContext};

/// What a stream callback decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Continue,
    Pause,
    /// The stream left this direction during the callback (local reply, reset, trap).
    Stopped,
}

fn is_pause_for_headers(action: u32) -> bool {
    // 0 Continue, 2 ContinueAndEndStream; 1 StopIteration, 3-4 StopAllIteration*.
    action != 0 && action != 2
}

fn status_of(headers: &Headers) -> u16 {
    headers.get_str(":status").and_then(|s| s.parse().ok()).unwrap_or(0)
}

impl Exports {
    /// The headers callback of `direction`.
    fn headers(&self, direction: Direction) -> (Callback, Func<(u32, u32, u32), u32>) {
        match direction {
            Direction::Request => (Callback::RequestHeaders, self.on_request_headers.clone()),
            Direction::Response => (Callback::ResponseHeaders, self.on_response_headers.clone()),
        }
    }

    /// The body callback of `direction`.
    fn body(&self, direction: Direction) -> (Callback, Func<(u32, u32, u32), u32>) {
        match direction {
            Direction::Request => (Callback::RequestBody, self.on_request_body.clone()),
            Direction::Response => (Callback::ResponseBody, self.on_response_body.clone()),
        }
    }

    /// The trailers callback of `direction`.
    fn trailers(&self, direction: Direction) -> (Callback, Func<(u32, u32), u32>) {
        match direction {
            Direction::Request => (Callback::RequestTrailers, self.on_request_trailers.clone()),
            Direction::Response => (Callback::ResponseTrailers, self.on_response_trailers.clone()),
        }
    }
}

impl Worker {
    /// A stream of this VM, or of the VM it replaced.
    pub(super) fn stream_mut(&mut self, id: u32) -> Option<&mut StreamContext> {
        match self.store.data_mut().vm.streams.get_mut(&id) {
            Some(stream) => Some(stream),
            None => self.detached.get_mut(&id),
        }
    }

    /// A stream of this VM, or of the VM it replaced.
    pub(super) fn stream_ref(&self, id: u32) -> Option<&StreamContext> {
        self.store.data().vm.streams.get(&id).or_else(|| self.detached.get(&id))
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
        self.deliver(id, Direction::Request);
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
        if stream.flow(direction) != Flow::Running {
            return Step::Stopped;
        }
        let pause = if headers { is_pause_for_headers(action) } else { action != 0 };
        if stop || pause { Step::Pause } else { Step::Continue }
    }

    /// Delivers one direction of a stream to the filter, as Envoy's filter manager
    /// does: the headers callback, then at once the body callback (even if the headers
    /// paused), then the trailers callback. The last callback decides: `Continue` lets
    /// the direction pass (the request goes upstream, the response to the client),
    /// `Pause` holds it until `proxy_continue_stream`.
    fn deliver(&mut self, id: u32, direction: Direction) {
        let Some(stream) = self.stream_mut(id) else { return };
        let Some(message) = stream.message(direction) else { return };
        let headers = to_u32(message.headers.len());
        let body = message.body.as_ref().filter(|b| !b.is_empty()).map(|b| to_u32(b.len()));
        let trailers = message.trailers.as_ref().filter(|t| !t.is_empty()).map(|t| to_u32(t.len()));
        *stream.flow_mut(direction) = Flow::Running;
        stream.live.set(direction, Part::Headers, true);
        let eos = u32::from(body.is_none() && trailers.is_none());
        let (callback, func) = self.exports.headers(direction);
        let mut step = self.stream_step(id, callback, direction, &func, (id, headers, eos), true);
        if step == Step::Continue
            && let Some(stream) = self.stream_mut(id)
        {
            stream.live.set(direction, Part::Headers, false);
        }
        if let Some(size) = body
            && step != Step::Stopped
        {
            if let Some(stream) = self.stream_mut(id) {
                stream.live.set(direction, Part::Body, true);
            }
            let (callback, func) = self.exports.body(direction);
            let eos = u32::from(trailers.is_none());
            step = self.stream_step(id, callback, direction, &func, (id, size, eos), false);
        }
        if let Some(count) = trailers
            && step != Step::Stopped
        {
            if let Some(stream) = self.stream_mut(id) {
                stream.live.set(direction, Part::Trailers, true);
            }
            let (callback, func) = self.exports.trailers(direction);
            step = self.stream_step(id, callback, direction, &func, (id, count), false);
        }
        match step {
            Step::Stopped => {}
            Step::Pause => {
                if let Some(stream) = self.stream_mut(id) {
                    *stream.flow_mut(direction) = Flow::Paused;
                }
            }
            Step::Continue => match direction {
                Direction::Request => self.forward_request(id),
                Direction::Response => {
                    if let Some(stream) = self.stream_mut(id) {
                        complete(stream);
                    }
                }
            },
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

    /// Runs what the guest deferred to after its callback (Envoy's after-VM-call
    /// actions), in order.
    pub(super) fn run_deferred(&mut self) {
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
            self.deliver(id, Direction::Response);
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
            self.deliver(id, Direction::Response);
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
}

/// The response has passed the filter: the client receives it.
pub(super) fn complete(stream: &mut StreamContext) {
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
pub(super) fn fail_closed(stream: &mut StreamContext) {
    stream.live = Live::default();
    stream.response = Some(Message { headers: Headers::from_pairs([(":status", "503")]), body: None, trailers: None });
    stream.response_source = Some(ResponseSource::FailurePolicy);
    complete(stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_continue_actions_release_headers() {
        assert!(!is_pause_for_headers(0));
        assert!(!is_pause_for_headers(2));
        assert!(is_pause_for_headers(1));
        assert!(is_pause_for_headers(3));
        assert!(is_pause_for_headers(4));
    }
}

//! What the callout operations do: `callout`, `callout-deny` and `callout-no-authority`
//! dispatch a callout and pause the request; its answer is reported as request headers,
//! and resumes the request (or, for `callout-deny` and a `429`, replies `429`).

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::{HttpStream, header_text};
use crate::operation::Operation;
use crate::raw;

impl HttpStream {
    /// Dispatches the callout: to `x-cluster` (default `upstream`), `x-callout-path`
    /// (default `/check`), with `x-timeout-ms` (default 1000), the header `x-extra` from
    /// `x-callout-header` and the body `x-callout-payload`. `Pause` when dispatched
    /// (`x-callout-token`); `None` with `x-dispatch-error` otherwise.
    pub(super) fn callout(&self, without_authority: bool) -> Option<Action> {
        let cluster = self.request_header("x-cluster").unwrap_or_else(|| "upstream".to_owned());
        let path = self.request_header("x-callout-path").unwrap_or_else(|| "/check".to_owned());
        let timeout = self.request_header("x-timeout-ms").and_then(|t| t.parse().ok()).unwrap_or(1000);
        let extra = self.request_header("x-callout-header").unwrap_or_default();
        let body = self.request_header("x-callout-payload");
        let mut headers = vec![(":method", "POST"), (":path", path.as_str()), ("x-extra", extra.as_str())];
        if !without_authority {
            headers.push((":authority", "counter"));
        }
        let trailers = vec![("x-callout-trailer", "t")];
        match self.dispatch_http_call(
            &cluster,
            headers,
            body.as_deref().map(str::as_bytes),
            trailers,
            Duration::from_millis(timeout),
        ) {
            Ok(token) => {
                self.put("x-callout-token", token.to_string());
                Some(Action::Pause)
            }
            Err(status) => {
                self.put("x-dispatch-error", format!("{status:?}"));
                None
            }
        }
    }

    /// `proxy_on_http_call_response` on the stream: reports what it saw (see the crate
    /// docs), then resumes the request or replies `429`.
    pub(super) fn callout_answered(&self, num_headers: usize, body_size: usize, num_trailers: usize) {
        self.put("x-callout-headers", num_headers.to_string());
        self.put("x-callout-body-size", body_size.to_string());
        self.put("x-callout-trailers", num_trailers.to_string());
        let (code, message) = hostcalls::get_grpc_status().unwrap_or((99, None));
        self.put("x-callout-status-code", code.to_string());
        self.put("x-callout-status-message", message.unwrap_or_else(|| "none".to_owned()));
        let mut status = None;
        if num_headers > 0 {
            status = header_text(self.get_http_call_response_header_bytes(":status"));
            self.put("x-callout-status", status.clone().unwrap_or_default());
            let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
            self.put("x-callout-body", body);
            if let Some(value) = self.get_http_call_response_header_bytes("x-from-upstream") {
                self.put("x-callout-x-from-upstream", value);
            }
            // Every pair in order, one request header each: `x-callout-response-<i>: <name>: <value>`.
            for (index, (name, value)) in self.get_http_call_response_headers_bytes().into_iter().enumerate() {
                let mut pair = name.into_bytes();
                pair.extend_from_slice(b": ");
                pair.extend_from_slice(&value);
                self.put(&format!("x-callout-response-{index}"), pair);
            }
        } else {
            let (read_status, _) = raw::header_value(6, ":status");
            self.put("x-callout-read-status", read_status.to_string());
            let pairs = self.get_http_call_response_headers_bytes().len();
            self.put("x-callout-pairs", pairs.to_string());
            self.put("x-callout-body-read-status", raw::buffer_status(4).to_string());
        }
        if self.has(Operation::CalloutDeny) && status.as_deref() == Some("429") {
            self.send_http_response(429, vec![("x-denied-by", "callout")], Some(b"rate limited"));
        } else {
            self.resume_http_request();
        }
    }
}

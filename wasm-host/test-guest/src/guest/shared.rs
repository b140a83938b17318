//! What the shared-data and shared-queue operations do: `shared-get`, `shared-set` and
//! `cas-incr` through the SDK, `shared-script` through the raw calls, and `enqueue`.

use proxy_wasm::traits::Context;

use super::{HttpStream, header_text};
use crate::raw;

impl HttpStream {
    /// The key the shared-data operations use: `x-key`, default `key`.
    fn shared_key(&self) -> String {
        self.request_header("x-key").unwrap_or_else(|| "key".to_owned())
    }

    /// `shared-get`: `x-shared-value` and `x-shared-cas`, or `x-shared-value: missing`.
    pub(super) fn shared_get(&self) {
        let key = self.shared_key();
        match self.get_shared_data(&key) {
            (None, None) => self.put("x-shared-value", "missing"),
            (value, cas) => {
                self.put("x-shared-value", value.unwrap_or_default());
                self.put("x-shared-cas", cas.unwrap_or(0).to_string());
            }
        }
    }

    /// `shared-set`: writes `x-value` with the cas `x-cas` (none if absent or 0);
    /// `x-shared-set` is `ok` or the status.
    pub(super) fn shared_set(&self) {
        let key = self.shared_key();
        let value = self.request_header("x-value").unwrap_or_default();
        let cas = self.request_header("x-cas").and_then(|c| c.parse::<u32>().ok()).filter(|c| *c != 0);
        let result = match self.set_shared_data(&key, Some(value.as_bytes()), cas) {
            Ok(()) => "ok".to_owned(),
            Err(status) => format!("{status:?}"),
        };
        self.put("x-shared-set", result);
    }

    /// `cas-incr`: read, add one, write back with the token, retry on mismatch (up to
    /// 10 000 times).
    pub(super) fn cas_incr(&self) {
        let key = self.shared_key();
        let mut retries = 0u32;
        loop {
            let (value, cas) = self.get_shared_data(&key);
            let current: u64 = value.and_then(|v| String::from_utf8(v).ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
            let next = (current + 1).to_string();
            match self.set_shared_data(&key, Some(next.as_bytes()), cas) {
                Ok(()) => {
                    self.put("x-cas-value", next);
                    break;
                }
                Err(_) if retries < 10_000 => retries += 1,
                Err(_) => {
                    self.put("x-cas-value", "gave-up");
                    break;
                }
            }
        }
        self.put("x-cas-retries", retries.to_string());
    }

    /// Runs the get / set steps of `x-shared-script` (separated by `;`) with the raw host
    /// calls, and reports each as `x-shared-step-<i>` (from 0): `get <key>` gives
    /// `<status> <cas> <value>` (just `<status>` unless OK), `set <key> <value> <cas>`
    /// gives `<status>`. `~` is the empty key or value; a cas is a number, or `@<i>` (the
    /// cas step `<i>` read) with an optional `+<n>`. With `x-shared-vm`, only the plugin
    /// whose `vm_id` it names runs the script (several plugins see the same request).
    pub(super) fn shared_script(&self) {
        if let Some(vm) = self.request_header("x-shared-vm") {
            let own = header_text(self.get_property(vec!["plugin_vm_id"])).unwrap_or_default();
            if own != vm {
                return;
            }
        }
        let script = self.request_header("x-shared-script").unwrap_or_default();
        let mut read: Vec<u32> = Vec::new();
        for (index, step) in script.split(';').map(str::trim).filter(|s| !s.is_empty()).enumerate() {
            let words: Vec<&str> = step.split_whitespace().collect();
            let bytes = |word: &str| if word == "~" { Vec::new() } else { word.as_bytes().to_vec() };
            let report = match words.as_slice() {
                ["get", key] => {
                    let (status, value, cas) = raw::get_shared_data(&bytes(key));
                    read.push(if status == 0 { cas } else { 0 });
                    if status == 0 {
                        let value = if value.is_empty() {
                            "~".to_owned()
                        } else {
                            String::from_utf8_lossy(&value).into_owned()
                        };
                        format!("{status} {cas} {value}")
                    } else {
                        status.to_string()
                    }
                }
                ["set", key, value, cas] => {
                    read.push(0);
                    let cas = match cas.strip_prefix('@') {
                        Some(reference) => {
                            let (step, plus) = reference.split_once('+').unwrap_or((reference, "0"));
                            let base = step.parse::<usize>().ok().and_then(|i| read.get(i).copied()).unwrap_or(0);
                            base.wrapping_add(plus.parse().unwrap_or(0))
                        }
                        None => cas.parse().unwrap_or(0),
                    };
                    raw::set_shared_data(&bytes(key), &bytes(value), cas).to_string()
                }
                _ => {
                    read.push(0);
                    format!("bad step: {step}")
                }
            };
            self.put(&format!("x-shared-step-{index}"), report);
        }
    }

    /// `enqueue`: `x-value` onto the queue `events` (`x-enqueue`: `ok`, the status, or
    /// `not-found`), and whether an unknown queue resolves (`x-resolve-missing`).
    pub(super) fn enqueue(&self) {
        let result = match self.resolve_shared_queue("", "events") {
            Some(queue) => {
                let value = self.request_header("x-value").unwrap_or_default();
                match self.enqueue_shared_queue(queue, Some(value.as_bytes())) {
                    Ok(()) => "ok".to_owned(),
                    Err(status) => format!("{status:?}"),
                }
            }
            None => "not-found".to_owned(),
        };
        self.put("x-enqueue", result);
        let missing = self.resolve_shared_queue("", "no-such-queue").map_or("none", |_| "found");
        self.put("x-resolve-missing", missing);
    }
}

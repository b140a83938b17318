//! The proxy-wasm glue: a root context that validates the configuration and releases
//! paused requests on its tick, and an HTTP context per request that asks the engine.
//!
//! Each Envoy worker runs its own VM, so everything here is single-threaded (`Rc`,
//! `RefCell`); workers share only the host's shared data, through [`HostStore`].

use crate::abi::{self, HostLogger, HostStore, WasiClock};
use crate::config::Config;
use crate::engine::{Engine, Outcome, anchor_key, establish_secret, plugin_prefix, private_cache_control};
use crate::host::{Counter, Metrics, RequestFacts};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use shared_store::{Clock, Limit, Limiter, Nanos};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

static LOGGER: HostLogger = HostLogger;

proxy_wasm::main! {{
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { state: None }) });
}}

/// What every HTTP context of one configuration shares.
struct Shared {
    engine: Engine,
    limiter: Limiter<HostStore, WasiClock>,
    metrics: RefCell<HostMetrics>,
    /// Paused requests: context id → (due time, policies it counts under).
    paused: RefCell<BTreeMap<u32, (Nanos, Vec<usize>)>>,
}

/// Where counts go if the metrics are somehow borrowed already: never a panic.
struct NoMetrics;

impl Metrics for NoMetrics {
    fn add(&mut self, _: usize, _: Counter, _: i64) {}
}

/// Metric ids per policy, in [`Counter::ALL`] order.
struct HostMetrics(Vec<Vec<Option<u32>>>);

impl Metrics for HostMetrics {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        if let Some(Some(id)) = self.0.get(policy).and_then(|ids| ids.get(counter.index())) {
            abi::increment_metric(*id, delta);
        }
    }
}

struct Root {
    state: Option<Rc<Shared>>,
}

impl Root {
    fn configure(&self) -> Result<Shared, String> {
        let bytes = abi::plugin_configuration()
            .map_err(|s| format!("cannot read the plugin configuration (host status {})", s.0))?;
        let config = Config::from_json(&bytes).map_err(|e| e.to_string())?;
        let plugin = abi::property(&["plugin_name"]).unwrap_or_default();
        let root_id = abi::property(&["plugin_root_id"]).unwrap_or_default();
        let prefix = plugin_prefix(&plugin, &root_id);
        let candidate = abi::random16().ok_or("the host gave no random bytes for the hash secret")?;
        let secret = establish_secret(&HostStore, &prefix, candidate).map_err(|e| e.to_string())?;
        let metrics = HostMetrics(
            config
                .policies
                .iter()
                .map(|p| {
                    Counter::ALL
                        .iter()
                        .map(|c| {
                            abi::define_metric(&format!("{}.{}.{}", config.stat_prefix, p.name, c.name()), c.is_gauge())
                        })
                        .collect()
                })
                .collect(),
        );
        let shapes = config
            .policies
            .iter()
            .any(|p| matches!(p.limit, Limit::LeakyBucket { max_wait, .. } if max_wait > Nanos::ZERO));
        let tick_ms = config.shaping.tick_ms;
        let engine = Engine::new(config, &prefix, secret);
        engine.claim_tables(&HostStore)?;
        if shapes {
            abi::set_tick_period(tick_ms).map_err(|s| format!("cannot set the tick period (host status {})", s.0))?;
        }
        let limiter = Limiter::new(HostStore, WasiClock).with_anchor_key(anchor_key(&prefix));
        Ok(Shared { engine, limiter, metrics: RefCell::new(metrics), paused: RefCell::new(BTreeMap::new()) })
    }
}

impl Context for Root {}

impl RootContext for Root {
    fn on_vm_start(&mut self, _: usize) -> bool {
        true
    }

    fn on_configure(&mut self, _: usize) -> bool {
        if let Some(level) = abi::log_level() {
            log::set_max_level(match level {
                0 => log::LevelFilter::Trace,
                1 => log::LevelFilter::Debug,
                2 => log::LevelFilter::Info,
                3 => log::LevelFilter::Warn,
                _ => log::LevelFilter::Error,
            });
        }
        match self.configure() {
            Ok(shared) => {
                self.state = Some(Rc::new(shared));
                true
            }
            Err(message) => {
                log::error!("sluice: invalid configuration: {message}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(shared) = &self.state else { return };
        let now = shared.limiter.clock().now();
        let due: Vec<(u32, Vec<usize>)> = {
            let Ok(mut paused) = shared.paused.try_borrow_mut() else { return };
            let ids: Vec<u32> = paused.iter().filter(|(_, (at, _))| *at <= now).map(|(id, _)| *id).collect();
            ids.into_iter().filter_map(|id| paused.remove(&id).map(|(_, policies)| (id, policies))).collect()
        };
        for (id, policies) in due {
            match shared.metrics.try_borrow_mut() {
                Ok(mut metrics) => shared.engine.release(&policies, &mut *metrics),
                Err(_) => shared.engine.release(&policies, &mut NoMetrics),
            }
            if let Err(status) = abi::resume_request(id) {
                log::debug!("sluice: could not resume request {id} (host status {})", status.0);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter { id: context_id, shared: self.state.clone(), response_headers: Vec::new() }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Reads the current request through the host.
struct HostRequest;

impl RequestFacts for HostRequest {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        abi::header(abi::REQUEST_HEADERS, name)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        abi::property(path)
    }
}

struct Filter {
    id: u32,
    shared: Option<Rc<Shared>>,
    response_headers: Vec<(String, String)>,
}

impl Context for Filter {}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(shared) = &self.shared else { return Action::Continue };
        let max_paused = usize::try_from(shared.engine.config().shaping.max_paused).unwrap_or(usize::MAX);
        let room = shared.paused.try_borrow().is_ok_and(|paused| paused.len() < max_paused);
        let outcome = match shared.metrics.try_borrow_mut() {
            Ok(mut metrics) => shared.engine.decide(&HostRequest, &shared.limiter, room, &mut *metrics),
            Err(_) => shared.engine.decide(&HostRequest, &shared.limiter, room, &mut NoMetrics),
        };
        match outcome {
            Outcome::Continue { headers } => {
                self.response_headers = headers;
                Action::Continue
            }
            Outcome::Reject(response) => {
                if let Err(status) =
                    abi::send_local_response(response.status, &response.headers, response.body.as_bytes())
                {
                    log::warn!("sluice: could not send the rejection (host status {})", status.0);
                }
                Action::Pause
            }
            Outcome::Delay { due, headers, policies, .. } => {
                self.response_headers = headers;
                match shared.paused.try_borrow_mut() {
                    Ok(mut paused) => {
                        paused.insert(self.id, (due, policies));
                        Action::Pause
                    }
                    // Cannot happen (nothing else holds the queue during this callback);
                    // if it did, forwarding now is better than a request held forever.
                    Err(_) => Action::Continue,
                }
            }
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if self.response_headers.is_empty() {
            return Action::Continue;
        }
        for (name, value) in &self.response_headers {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, name, value.as_bytes());
        }
        let existing = abi::header(abi::RESPONSE_HEADERS, "cache-control");
        if let Some(value) = private_cache_control(existing.as_deref()) {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, "cache-control", value.as_bytes());
        }
        Action::Continue
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        // A stream that ends while paused: forget it, and count it.
        let Some(shared) = &self.shared else { return };
        let removed = shared.paused.try_borrow_mut().ok().and_then(|mut paused| paused.remove(&self.id));
        if let Some((_, policies)) = removed
            && let Ok(mut metrics) = shared.metrics.try_borrow_mut()
        {
            shared.engine.abandon(&policies, &mut *metrics);
        }
    }
}

//! The Sluice filter and the clusters a test's Envoy runs, as Envoy configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{Value, json};

/// The Sluice wasm filter as an HTTP filter entry of the bootstrap.
#[derive(Clone, Debug)]
pub struct SluiceFilter {
    config: String,
    wasm: PathBuf,
    env: BTreeMap<String, String>,
    failure_policy: &'static str,
    name: String,
}

/// The Sluice filter with `config`, loaded from the freshly built `sluice.wasm` (or the
/// file `SLUICE_WASM_UNDER_TEST` names, to show that a test fails on an older build),
/// named as in `envoy-config/envoy.yaml` (plugin name, root id and vm id `sluice`).
pub fn sluice(config: &str) -> SluiceFilter {
    let wasm =
        std::env::var_os("SLUICE_WASM_UNDER_TEST").map_or_else(|| sluice_artifacts::SLUICE_WASM.into(), PathBuf::from);
    SluiceFilter {
        config: config.to_owned(),
        wasm,
        env: BTreeMap::new(),
        failure_policy: "FAIL_CLOSED",
        name: "sluice".to_owned(),
    }
}

impl SluiceFilter {
    /// Loads another module (the test guest, a mutant).
    #[must_use]
    pub fn wasm(mut self, path: impl Into<PathBuf>) -> Self {
        self.wasm = path.into();
        self
    }

    /// Sets an environment variable of the VM (`vm_config.environment_variables`).
    #[must_use]
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.insert(name.to_owned(), value.to_owned());
        self
    }

    /// The plugin failure policy (`FAIL_CLOSED`, `FAIL_OPEN`, `FAIL_RELOAD`).
    #[must_use]
    pub fn failure_policy(mut self, policy: &'static str) -> Self {
        self.failure_policy = policy;
        self
    }

    /// Another plugin name, root id and vm id (a second plugin beside the first).
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// The filter's JSON.
    pub fn to_json(&self) -> Value {
        let mut vm_config = json!({
            "vm_id": self.name,
            "runtime": "envoy.wasm.runtime.v8",
            "code": { "local": { "filename": self.wasm.display().to_string() } },
        });
        if !self.env.is_empty() {
            vm_config["environment_variables"] = json!({ "key_values": self.env });
        }
        json!({
            "name": "envoy.filters.http.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {
                    "name": self.name,
                    "root_id": self.name,
                    "vm_config": vm_config,
                    "failure_policy": self.failure_policy,
                    "configuration": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                        "value": self.config,
                    },
                },
            },
        })
    }
}

/// A static cluster of one loopback endpoint.
pub fn cluster(name: &str, addr: SocketAddr, http2: bool) -> Value {
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": { "socket_address": {
                "address": addr.ip().to_string(), "port_value": addr.port() } } } }] }],
        },
    });
    if http2 {
        cluster["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} },
            },
        });
    }
    cluster
}

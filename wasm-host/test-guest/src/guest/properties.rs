//! What the operations that read the stream's surroundings report: `props` (every
//! property), `set-prop` (a property round trip), `config` (the plugin and VM
//! configuration buffers) and `ids` (the context ids).

use proxy_wasm::hostcalls;
use proxy_wasm::traits::Context;
use proxy_wasm::types::BufferType;

use super::{HttpStream, header_text, hex};

/// A little-endian 64-bit property as a decimal, or `none`.
fn int64(value: Option<Vec<u8>>) -> String {
    match value.and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok()) {
        Some(bytes) => i64::from_le_bytes(bytes).to_string(),
        None => "none".to_owned(),
    }
}

impl HttpStream {
    /// `props`: one `x-prop-<name>` header per property.
    pub(super) fn properties(&self) {
        let strings = [
            ("source-address", vec!["source", "address"]),
            ("destination-address", vec!["destination", "address"]),
            ("plugin-name", vec!["plugin_name"]),
            ("plugin-root-id", vec!["plugin_root_id"]),
            ("plugin-vm-id", vec!["plugin_vm_id"]),
            ("request-path", vec!["request", "path"]),
            ("request-url-path", vec!["request", "url_path"]),
            ("request-query", vec!["request", "query"]),
            ("request-method", vec!["request", "method"]),
            ("request-host", vec!["request", "host"]),
            ("request-protocol", vec!["request", "protocol"]),
            ("request-header", vec!["request", "headers", "x-test-op"]),
            ("node-id", vec!["node", "id"]),
        ];
        for (name, path) in strings {
            let value = header_text(self.get_property(path)).unwrap_or_else(|| "none".to_owned());
            self.put(&format!("x-prop-{name}"), value);
        }
        let ints = [
            ("source-port", vec!["source", "port"]),
            ("destination-port", vec!["destination", "port"]),
            ("connection-id", vec!["connection", "id"]),
            ("request-time", vec!["request", "time"]),
            ("request-size", vec!["request", "size"]),
        ];
        for (name, path) in ints {
            self.put(&format!("x-prop-{name}"), int64(self.get_property(path)));
        }
        let mtls = self.get_property(vec!["connection", "mtls"]).map(|v| hex(&v)).unwrap_or_else(|| "none".to_owned());
        self.put("x-prop-mtls", mtls);
        let missing = self.get_property(vec!["does", "not", "exist"]).map_or("none", |_| "found");
        self.put("x-prop-missing", missing);
        let headers_map = self.get_property(vec!["request", "headers"]).map_or(0, |v| v.len());
        self.put("x-prop-request-headers-bytes", headers_map.to_string());
    }

    /// `set-prop`: sets `test.prop` to `x-prop-value`; `x-prop-roundtrip` is what reads back.
    pub(super) fn set_prop(&self) {
        let value = self.request_header("x-prop-value").unwrap_or_default();
        self.set_property(vec!["test", "prop"], Some(value.as_bytes()));
        let back = header_text(self.get_property(vec!["test", "prop"])).unwrap_or_else(|| "none".to_owned());
        self.put("x-prop-roundtrip", back);
    }

    /// `config`: the plugin configuration in hex, the VM configuration as text.
    pub(super) fn configurations(&self) {
        let plugin = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX);
        self.put("x-plugin-config", plugin.ok().flatten().map_or("none".to_owned(), |c| hex(&c)));
        let vm = hostcalls::get_buffer(BufferType::VmConfiguration, 0, usize::MAX);
        let vm = vm.ok().flatten().map_or("none".to_owned(), |c| String::from_utf8_lossy(&c).into_owned());
        self.put("x-vm-config", vm);
    }

    /// `ids`.
    pub(super) fn ids(&self) {
        self.put("x-context-id", self.id.to_string());
        self.put("x-root-id", self.root.to_string());
    }
}

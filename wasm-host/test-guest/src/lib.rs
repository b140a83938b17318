//! Test guest (placeholder).
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Trace);
}}

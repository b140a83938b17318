//! What the request-header operations do: `headers` (read, replace, add, remove and
//! count), `set-all` (replace the whole map) and `header-size` (the raw map size call).

use proxy_wasm::traits::HttpContext;

use super::HttpStream;
use crate::raw;

impl HttpStream {
    /// `headers`.
    pub(super) fn headers(&self) {
        let got = self.get_http_request_header_bytes("x-in").unwrap_or_else(|| b"absent".to_vec());
        self.put("x-got", got);
        self.set_http_request_header_bytes("x-replace", Some(b"new"));
        self.add_http_request_header_bytes("x-added", b"1");
        self.remove_http_request_header("x-remove");
        self.add_http_request_header_bytes("x-binary", &[0xff, 0xfe, 0x00, 0x41]);
        let missing = self.get_http_request_header_bytes("x-does-not-exist").map_or("absent", |_| "present");
        self.put("x-missing", missing);
        let count = self.get_http_request_headers_bytes().len();
        self.put("x-pair-count", count.to_string());
        self.header_size();
    }

    /// `set-all`: keeps the pseudo-headers and `x-replaced-all: yes`, nothing else.
    pub(super) fn set_all_headers(&self) {
        let current = self.get_http_request_headers_bytes();
        let mut kept: Vec<(&str, &[u8])> =
            current.iter().filter(|(n, _)| n.starts_with(':')).map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        kept.push(("x-replaced-all", b"yes"));
        self.set_http_request_headers_bytes(kept);
    }

    /// `header-size`: `x-header-size: <status>:<size>`.
    pub(super) fn header_size(&self) {
        let (status, size) = raw::header_map_size(0);
        self.put("x-header-size", format!("{status}:{size}"));
    }
}

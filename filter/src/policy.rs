//! From a request to a policy's inputs: does the policy apply, what is the caller's key,
//! what does the request cost. Everything works on bytes and never panics. A value the
//! request does not carry is "missing" (`Ok(None)`); a host call that fails is a
//! [`HostFailure`], which the engine turns into the policy's `on_failure`, never into
//! "missing" (that would let `on_missing_key: skip` admit silently).

use crate::config::{Cost, HeaderCondition, KeyPart, Matcher, Policy};
use crate::host::{HostFailure, RequestFacts};
use shared_store::HashKey;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The request's `:path` without its query string.
fn path_only(path: &[u8]) -> &[u8] {
    match path.iter().position(|b| *b == b'?') {
        Some(at) => path.get(..at).unwrap_or(path),
        None => path,
    }
}

/// The first value of query parameter `name` (raw bytes as sent, not percent-decoded).
fn query_parameter(path: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let at = path.iter().position(|b| *b == b'?')?;
    let query = path.get(at.saturating_add(1)..)?;
    let query = match query.iter().position(|b| *b == b'#') {
        Some(end) => query.get(..end)?,
        None => query,
    };
    query.split(|b| *b == b'&').find_map(|pair| {
        let (key, value) = match pair.iter().position(|b| *b == b'=') {
            Some(eq) => (pair.get(..eq)?, pair.get(eq.saturating_add(1)..)?),
            None => (pair, &[][..]),
        };
        (key == name).then(|| value.to_vec())
    })
}

impl Matcher {
    /// Whether every condition holds for the request.
    ///
    /// # Errors
    /// When the host fails a read the decision needs.
    pub fn matches(&self, request: &impl RequestFacts) -> Result<bool, HostFailure> {
        if self.path_exact.is_some() || self.path_prefix.is_some() {
            let Some(path) = request.header(":path")? else { return Ok(false) };
            let path = path_only(&path);
            if let Some(exact) = &self.path_exact
                && path != exact.as_bytes()
            {
                return Ok(false);
            }
            if let Some(prefix) = &self.path_prefix
                && !path.starts_with(prefix.as_bytes())
            {
                return Ok(false);
            }
        }
        if let Some(methods) = &self.methods {
            let Some(method) = request.header(":method")? else { return Ok(false) };
            if !methods.iter().any(|m| m.as_bytes() == method.as_slice()) {
                return Ok(false);
            }
        }
        for condition in &self.headers {
            let holds = match condition {
                HeaderCondition::Present(name, present) => request.header(name)?.is_some() == *present,
                HeaderCondition::Equals(name, value) => request.header(name)?.is_some_and(|v| v == value.as_bytes()),
            };
            if !holds {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Parses a host address property: `ip:port`, `[ipv6]:port`, or a bare address. Envoy
/// gives `source.address` as a string in these forms.
pub fn parse_address(bytes: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (host, _) = rest.split_once(']')?;
        // Drop a zone index ("fe80::1%eth0"): it names an interface, not a client.
        let host = host.split('%').next().unwrap_or(host);
        return host.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, port) = text.rsplit_once(':')?;
    if port.bytes().all(|b| b.is_ascii_digit()) {
        return host.parse::<Ipv4Addr>().ok().map(IpAddr::V4);
    }
    None
}

/// The address masked to its family's prefix, tagged by family, as key bytes.
pub fn masked_address(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> Vec<u8> {
    match ip {
        // An IPv4-mapped IPv6 address is the IPv4 client it carries.
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            masked_address(IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED)), ipv4_prefix, ipv6_prefix)
        }
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32u32.saturating_sub(u32::from(ipv4_prefix))).unwrap_or(0);
            let mut out = vec![4, ipv4_prefix];
            out.extend_from_slice(&(u32::from(v4) & mask).to_be_bytes());
            out
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128u32.saturating_sub(u32::from(ipv6_prefix))).unwrap_or(0);
            let mut out = vec![6, ipv6_prefix];
            out.extend_from_slice(&(u128::from(v6) & mask).to_be_bytes());
            out
        }
    }
}

/// Reads one key part; `Ok(None)` when the request does not carry it.
fn key_part<'a>(part: &'a KeyPart, request: &impl RequestFacts) -> Result<Option<Cow<'a, [u8]>>, HostFailure> {
    let value = match part {
        KeyPart::Constant(value) => return Ok(Some(Cow::Borrowed(value.as_bytes()))),
        KeyPart::Header(name) => request.header(name)?,
        KeyPart::ClientAddress { ipv4_prefix, ipv6_prefix } => request
            .property(&["source", "address"])?
            .and_then(|address| parse_address(&address))
            .map(|ip| masked_address(ip, *ipv4_prefix, *ipv6_prefix)),
        KeyPart::Authority => request.header(":authority")?.map(|mut a| {
            a.make_ascii_lowercase();
            a
        }),
        KeyPart::Path => request.header(":path")?.map(|p| path_only(&p).to_vec()),
        KeyPart::Method => request.header(":method")?,
        KeyPart::QueryParameter(name) => {
            request.header(":path")?.and_then(|path| query_parameter(&path, name.as_bytes()))
        }
        KeyPart::Property(path) => {
            let segments: Vec<&str> = path.iter().map(String::as_str).collect();
            request.property(&segments)?
        }
    };
    Ok(value.map(Cow::Owned))
}

impl Policy {
    /// The caller's fingerprint: the keyed hash of the policy's descriptor (name,
    /// version, one value per key part); `Ok(None)` when any part is missing.
    ///
    /// # Errors
    /// When the host fails a read.
    pub fn fingerprint(&self, request: &impl RequestFacts, secret: &HashKey) -> Result<Option<u128>, HostFailure> {
        fingerprint_parts(&self.name, self.version, &self.key, request, secret)
    }

    /// What the request costs under this policy.
    ///
    /// # Errors
    /// When the host fails to read the cost header.
    pub fn cost_of(&self, request: &impl RequestFacts) -> Result<u64, HostFailure> {
        cost_of(&self.cost, request)
    }
}

/// What `cost` makes a request spend at admission (a response cost's estimate).
fn cost_of(cost: &Cost, request: &impl RequestFacts) -> Result<u64, HostFailure> {
    Ok(match cost {
        Cost::Constant(cost) => *cost,
        Cost::Header { name, default, min, max } => {
            request.header(name)?.and_then(|v| parse_cost(&v)).map_or(*default, |c| c.clamp(*min, *max))
        }
        Cost::Response(response) => return cost_of(&response.estimate, request),
    })
}

/// The keyed hash of `parts` as read from the request, under the name and version given
/// (a policy's, or the partition's); `Ok(None)` when any part is missing.
///
/// # Errors
/// When the host fails a read.
pub fn fingerprint_parts(
    name: &str,
    version: u64,
    parts: &[KeyPart],
    request: &impl RequestFacts,
    secret: &HashKey,
) -> Result<Option<u128>, HostFailure> {
    let mut hasher = secret.fingerprinter(name, version);
    for part in parts {
        match key_part(part, request)? {
            Some(value) => hasher.part(&value),
            None => return Ok(None),
        }
    }
    Ok(Some(hasher.finish()))
}

/// A decimal integer, optionally surrounded by spaces or tabs; saturates at `u64::MAX`.
pub(crate) fn parse_cost(value: &[u8]) -> Option<u64> {
    let trimmed = value.trim_ascii();
    if trimmed.is_empty() || !trimmed.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(trimmed.iter().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_and_without_ports() {
        assert_eq!(parse_address(b"10.1.2.3:443"), Some("10.1.2.3".parse().unwrap()));
        assert_eq!(parse_address(b"10.1.2.3"), Some("10.1.2.3".parse().unwrap()));
        assert_eq!(parse_address(b"[2001:db8::1]:8080"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(parse_address(b"2001:db8::1"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(parse_address(b"[fe80::1%eth0]:1"), Some("fe80::1".parse().unwrap()));
        assert_eq!(parse_address(b"not an address"), None);
        assert_eq!(parse_address(&[0xff, 0xfe]), None);
    }

    #[test]
    fn ipv6_addresses_in_one_64_share_a_key() {
        let a = masked_address("2001:db8:1:2:aaaa::1".parse().unwrap(), 32, 64);
        let b = masked_address("2001:db8:1:2:ffff::9".parse().unwrap(), 32, 64);
        let c = masked_address("2001:db8:1:3::1".parse().unwrap(), 32, 64);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn ipv4_masks_keep_the_prefix_only() {
        let a = masked_address("10.1.2.3".parse().unwrap(), 24, 64);
        let b = masked_address("10.1.2.200".parse().unwrap(), 24, 64);
        assert_eq!(a, b);
        assert_ne!(
            masked_address("10.1.2.3".parse().unwrap(), 32, 64),
            masked_address("10.1.2.4".parse().unwrap(), 32, 64)
        );
        assert_eq!(masked_address("1.2.3.4".parse().unwrap(), 0, 0), masked_address("9.9.9.9".parse().unwrap(), 0, 0));
    }

    #[test]
    fn an_ipv4_mapped_address_is_its_ipv4_client() {
        assert_eq!(
            masked_address("::ffff:10.0.0.1".parse().unwrap(), 32, 64),
            masked_address("10.0.0.1".parse().unwrap(), 32, 64)
        );
    }

    #[test]
    fn query_parameters_are_found_by_exact_name() {
        assert_eq!(query_parameter(b"/a?x=1&user=bob&user=eve", b"user"), Some(b"bob".to_vec()));
        assert_eq!(query_parameter(b"/a?flag&x=1", b"flag"), Some(Vec::new()));
        assert_eq!(query_parameter(b"/a?xuser=1", b"user"), None);
        assert_eq!(query_parameter(b"/a", b"user"), None);
    }

    #[test]
    fn costs_parse_as_decimal_integers_only() {
        assert_eq!(parse_cost(b" 42 "), Some(42));
        assert_eq!(parse_cost(b"-1"), None);
        assert_eq!(parse_cost(b"1e3"), None);
        assert_eq!(parse_cost(b""), None);
        assert_eq!(parse_cost(b"99999999999999999999999"), Some(u64::MAX));
    }
}

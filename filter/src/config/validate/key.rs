//! Whether a key is well formed: the parts that identify a caller, in a policy's `key`
//! and in `counter_service.partition`; and how a part is written, for messages.

use super::fields::header_name;
use super::issues::Issues;
use crate::config::model::bounds::{DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, MAX_IPV4_PREFIX, MAX_IPV6_PREFIX};
use crate::config::model::request::KeyPart;
use crate::config::raw::RawKeyPart;

/// Validates a list of key parts; only a partition may be empty.
pub(super) fn validate_key(
    issues: &mut Issues,
    path: &str,
    parts: Vec<RawKeyPart>,
    may_be_empty: bool,
) -> Vec<KeyPart> {
    if parts.is_empty() && !may_be_empty {
        issues.add(path, "expected at least one key part (use {\"constant\": \"all\"} for one shared bucket)");
    }
    let mut key = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        key.push(match part {
            RawKeyPart::Header(name) => {
                header_name(issues, &format!("{at}.header"), &name);
                if name.starts_with(':') {
                    issues.add(format!("{at}.header"), "use \"authority\", \"path\" or \"method\" for pseudo-headers");
                }
                KeyPart::Header(name)
            }
            RawKeyPart::ClientAddress => {
                KeyPart::ClientAddress { ipv4_prefix: MAX_IPV4_PREFIX, ipv6_prefix: MAX_IPV6_PREFIX }
            }
            RawKeyPart::MaskedClientAddress(mask) => {
                let ipv4_prefix = mask.ipv4_prefix.unwrap_or(DEFAULT_IPV4_PREFIX);
                let ipv6_prefix = mask.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
                if ipv4_prefix > MAX_IPV4_PREFIX {
                    issues.add(
                        format!("{at}.masked_client_address.ipv4_prefix"),
                        format!("must be at most {MAX_IPV4_PREFIX}, got {ipv4_prefix}"),
                    );
                }
                if ipv6_prefix > MAX_IPV6_PREFIX {
                    issues.add(
                        format!("{at}.masked_client_address.ipv6_prefix"),
                        format!("must be at most {MAX_IPV6_PREFIX}, got {ipv6_prefix}"),
                    );
                }
                KeyPart::ClientAddress { ipv4_prefix, ipv6_prefix }
            }
            RawKeyPart::Authority => KeyPart::Authority,
            RawKeyPart::Path => KeyPart::Path,
            RawKeyPart::Method => KeyPart::Method,
            RawKeyPart::QueryParameter(name) => {
                if name.is_empty() {
                    issues.add(format!("{at}.query_parameter"), "expected a parameter name, got \"\"");
                }
                KeyPart::QueryParameter(name)
            }
            RawKeyPart::Property(segments) => {
                if segments.is_empty() || segments.iter().any(String::is_empty) {
                    issues.add(
                        format!("{at}.property"),
                        "expected a non-empty path of non-empty segments, such as [\"source\", \"address\"]",
                    );
                }
                KeyPart::Property(segments)
            }
            RawKeyPart::Constant(value) => KeyPart::Constant(value),
        });
    }
    key
}

/// How a key part is written in the configuration, for messages.
pub(super) fn describe(part: &KeyPart) -> String {
    match part {
        KeyPart::Header(name) => format!("{{\"header\": {name:?}}}"),
        KeyPart::ClientAddress { ipv4_prefix: MAX_IPV4_PREFIX, ipv6_prefix: MAX_IPV6_PREFIX } => {
            "\"client_address\"".to_owned()
        }
        KeyPart::ClientAddress { ipv4_prefix, ipv6_prefix } => {
            format!("{{\"masked_client_address\": {{\"ipv4_prefix\": {ipv4_prefix}, \"ipv6_prefix\": {ipv6_prefix}}}}}")
        }
        KeyPart::Authority => "\"authority\"".to_owned(),
        KeyPart::Path => "\"path\"".to_owned(),
        KeyPart::Method => "\"method\"".to_owned(),
        KeyPart::QueryParameter(name) => format!("{{\"query_parameter\": {name:?}}}"),
        KeyPart::Property(path) => format!("{{\"property\": {path:?}}}"),
        KeyPart::Constant(value) => format!("{{\"constant\": {value:?}}}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The position of a key part's kind, naming every kind: a new one does not compile
    /// until it has a sample below.
    const fn kind(part: &RawKeyPart) -> usize {
        match part {
            RawKeyPart::Header(_) => 0,
            RawKeyPart::ClientAddress => 1,
            RawKeyPart::MaskedClientAddress(_) => 2,
            RawKeyPart::Authority => 3,
            RawKeyPart::Path => 4,
            RawKeyPart::Method => 5,
            RawKeyPart::QueryParameter(_) => 6,
            RawKeyPart::Property(_) => 7,
            RawKeyPart::Constant(_) => 8,
        }
    }

    #[test]
    fn every_key_part_is_described_in_messages_as_it_is_written() {
        let samples = [
            r#"{"header":"x-api-key"}"#,
            r#""client_address""#,
            r#"{"masked_client_address":{"ipv4_prefix":24,"ipv6_prefix":48}}"#,
            r#""authority""#,
            r#""path""#,
            r#""method""#,
            r#"{"query_parameter":"user"}"#,
            r#"{"property":["connection","requested_server_name"]}"#,
            r#"{"constant":"all"}"#,
        ];
        let mut kinds = Vec::new();
        for sample in samples {
            let raw: RawKeyPart = serde_json::from_str(sample).unwrap();
            kinds.push(kind(&raw));
            let mut issues = Issues::default();
            let parts = validate_key(&mut issues, "key", vec![raw], false);

            let described: serde_json::Value = serde_json::from_str(&describe(&parts[0])).unwrap();
            assert_eq!(described, serde_json::from_str::<serde_json::Value>(sample).unwrap());
        }
        assert_eq!(kinds, (0..samples.len()).collect::<Vec<_>>(), "one sample of each kind");
    }
}

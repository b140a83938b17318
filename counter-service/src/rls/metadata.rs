//! The answer's `dynamic_metadata` (with `--rls-response-dynamic-metadata`), as
//! envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA` writes it. Envoy's filter stores
//! it under its `metadata_namespace` (`envoy.filters.http.ratelimit` by default), where
//! `%DYNAMIC_METADATA(envoy.filters.http.ratelimit:…)%` reads it: an access log, a
//! header, or a choice of upstream by which quota still has room.
//!
//! ```text
//! { domain, descriptors: [{ entries: ["key=value", …], limit?, hitsAddend? }, …],
//!   hitsAddend?, metadata? }
//! ```
//!
//! `metadata` merges the `metadata:` of the rules that passed (`OK`, shadow mode
//! included; not an unlimited or a replaced rule), in the request's order: the first
//! value of a key wins, and two mappings under one key are merged the same way, depth by
//! depth. It is absent when none passed with metadata. A descriptor's own `limit` is
//! written `requests_per_unit:N unit:UNIT` (envoyproxy/ratelimit writes Go's text form of
//! the message, whose spacing is not stable).

use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

use super::config::Metadata;
use super::decide::{Code, RlsAnswer, RlsRequest};

/// The `dynamic_metadata` of `answer` to `request`.
pub fn dynamic_metadata(request: &RlsRequest, answer: &RlsAnswer) -> Struct {
    let mut fields = vec![("domain".to_owned(), string(&request.domain))];
    let descriptors = request.descriptors.iter().map(|d| {
        let mut fields =
            vec![("entries".to_owned(), list(d.entries.iter().map(|(k, v)| string(&format!("{k}={v}"))).collect()))];
        if let Some((rpu, unit)) = d.limit {
            fields.push(("limit".to_owned(), string(&format!("requests_per_unit:{rpu} unit:{}", unit_name(unit)))));
        }
        if let Some(hits) = d.hits_addend {
            fields.push(("hitsAddend".to_owned(), number(hits as f64)));
        }
        structure(fields)
    });
    fields.push(("descriptors".to_owned(), list(descriptors.collect())));
    if request.hits_addend != 0 {
        fields.push(("hitsAddend".to_owned(), number(f64::from(request.hits_addend))));
    }
    let mut passed = Metadata::new();
    for status in answer.statuses.iter().filter(|s| s.code == Code::Ok) {
        if let Some(metadata) = &status.metadata {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        fields.push(("metadata".to_owned(), json(&serde_json::Value::Object(passed))));
    }
    Struct { fields: fields.into_iter().collect() }
}

/// Adds to `into` what `from` has and it lacks: a key already there keeps its value,
/// unless both are mappings, which are merged the same way.
fn merge(into: &mut Metadata, from: &Metadata) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(serde_json::Value::Object(inner)), serde_json::Value::Object(more)) => merge(inner, more),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Envoy's `RateLimitUnit` by number, as its enum names it.
fn unit_name(unit: i32) -> String {
    match unit {
        0 => "UNKNOWN".to_owned(),
        1 => "SECOND".to_owned(),
        2 => "MINUTE".to_owned(),
        3 => "HOUR".to_owned(),
        4 => "DAY".to_owned(),
        5 => "MONTH".to_owned(),
        6 => "YEAR".to_owned(),
        7 => "WEEK".to_owned(),
        other => other.to_string(),
    }
}

fn json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value { kind: Some(Kind::NullValue(0)) },
        serde_json::Value::Bool(b) => Value { kind: Some(Kind::BoolValue(*b)) },
        serde_json::Value::Number(n) => number(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => string(s),
        serde_json::Value::Array(items) => list(items.iter().map(json).collect()),
        serde_json::Value::Object(map) => structure(map.iter().map(|(k, v)| (k.clone(), json(v))).collect()),
    }
}

fn string(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_owned())) }
}

const fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

fn list(values: Vec<Value>) -> Value {
    Value { kind: Some(Kind::ListValue(ListValue { values })) }
}

fn structure(fields: Vec<(String, Value)>) -> Value {
    Value { kind: Some(Kind::StructValue(Struct { fields: fields.into_iter().collect() })) }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::rls::decide::{RlsDescriptor, Status};

    fn passed(code: Code, metadata: serde_json::Value) -> Status {
        let serde_json::Value::Object(map) = metadata else { unreachable!("a mapping") };
        Status { code, metadata: Some(Arc::new(map)), ..Status::allowed(0) }
    }

    fn field<'a>(s: &'a Struct, name: &str) -> Option<&'a Kind> {
        s.fields.get(name).and_then(|v| v.kind.as_ref())
    }

    #[test]
    fn the_first_passed_rule_wins_a_key_and_mappings_under_one_key_merge() {
        let request = RlsRequest {
            domain: "shop".to_owned(),
            descriptors: vec![RlsDescriptor { entries: vec![("k".to_owned(), "v".to_owned())], ..Default::default() }],
            hits_addend: 0,
        };
        let statuses = vec![
            passed(Code::OverLimit, serde_json::json!({"pick": "over"})),
            passed(Code::Ok, serde_json::json!({"pick": "first", "nested": {"a": 1}})),
            passed(Code::Ok, serde_json::json!({"pick": "second", "nested": {"a": 2, "b": true}, "more": [1]})),
        ];
        let answer = RlsAnswer { overall: Code::Ok, statuses, domain_not_found: false };
        let built = dynamic_metadata(&request, &answer);
        let Some(Kind::StructValue(metadata)) = field(&built, "metadata") else { panic!("no metadata: {built:?}") };
        assert_eq!(field(metadata, "pick"), Some(&Kind::StringValue("first".to_owned())));
        let Some(Kind::StructValue(nested)) = field(metadata, "nested") else { panic!("no nested: {metadata:?}") };
        assert_eq!(field(nested, "a"), Some(&Kind::NumberValue(1.0)));
        assert_eq!(field(nested, "b"), Some(&Kind::BoolValue(true)));
        assert!(field(metadata, "more").is_some(), "a key only the second has is added");
        assert_eq!(field(&built, "domain"), Some(&Kind::StringValue("shop".to_owned())));
        assert_eq!(field(&built, "hitsAddend"), None, "an unset hits_addend is not written");
    }

    #[test]
    fn without_a_passed_rule_that_has_metadata_there_is_no_metadata_field() {
        let request = RlsRequest {
            domain: "shop".to_owned(),
            descriptors: vec![RlsDescriptor {
                entries: vec![("k".to_owned(), "v".to_owned())],
                limit: Some((5, 2)),
                hits_addend: Some(0),
                negative: false,
            }],
            hits_addend: 3,
        };
        let statuses = vec![passed(Code::OverLimit, serde_json::json!({"pick": "over"}))];
        let built =
            dynamic_metadata(&request, &RlsAnswer { overall: Code::OverLimit, statuses, domain_not_found: false });
        assert_eq!(field(&built, "metadata"), None);
        assert_eq!(field(&built, "hitsAddend"), Some(&Kind::NumberValue(3.0)));
        let Some(Kind::ListValue(descriptors)) = field(&built, "descriptors") else { panic!("{built:?}") };
        let Some(Kind::StructValue(first)) = descriptors.values[0].kind.as_ref() else { panic!("{descriptors:?}") };
        assert_eq!(field(first, "limit"), Some(&Kind::StringValue("requests_per_unit:5 unit:MINUTE".to_owned())));
        assert_eq!(field(first, "hitsAddend"), Some(&Kind::NumberValue(0.0)));
        let Some(Kind::ListValue(entries)) = field(first, "entries") else { panic!("{first:?}") };
        assert_eq!(entries.values, vec![string("k=v")]);
    }
}

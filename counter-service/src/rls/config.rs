//! envoyproxy/ratelimit's YAML, loaded into [`RlsConfig`]: the same keys, the same load
//! errors (each naming the file and the descriptor's path), and Sluice's extensions
//! (`algorithm`, `burst`, `unit_multiplier`).
//!
//! A directory is loaded whole or not at all ([`RlsConfig::load_dir`]): one bad file
//! refuses the lot, so a reload never half-applies.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_norway::Value;
use sluice_protocol::{LimitSpec, MAX_PERIOD_MS, is_policy_name};

use crate::spec::StoreLimit;

/// The keys envoyproxy/ratelimit accepts anywhere in a file, and Sluice's three
/// extensions (a file that uses them is Sluice's alone: ratelimit refuses it).
const KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const EXTENSION_KEYS: [&str; 5] = ["algorithm", "burst", "unit_multiplier", "all_or_nothing", "all_or_nothing_key"];

/// Deepest nesting of descriptors a file may have (a request's descriptor has at most as
/// many entries as a route's actions; Envoy sends a handful).
pub const MAX_DEPTH: usize = 16;

/// A file that could not be loaded: which file, where in it, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {at}{message}")]
pub struct LoadError {
    /// The file's name (or the directory's, when it cannot be read).
    pub file: String,
    /// The descriptor's path (`domain.key_value.key`) followed by `: `, or empty.
    pub at: String,
    /// What is wrong, in envoyproxy/ratelimit's words where it has them.
    pub message: String,
}

/// The unit of a limit, with the seconds envoyproxy/ratelimit aligns windows to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 604 800 s (windows start on Thursdays, 00:00 UTC, as Unix time's multiples do).
    Week,
    /// 2 592 000 s (30 days, epoch-aligned: not calendar months).
    Month,
    /// 31 536 000 s: refused at load, longer than the store's longest period.
    Year,
}

impl Unit {
    /// `name`, in any case (`minute`, `MINUTE`).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Self::Second,
            "MINUTE" => Self::Minute,
            "HOUR" => Self::Hour,
            "DAY" => Self::Day,
            "WEEK" => Self::Week,
            "MONTH" => Self::Month,
            "YEAR" => Self::Year,
            _ => return None,
        })
    }

    /// Its length in seconds, as envoyproxy/ratelimit's `UnitToDivider`.
    pub const fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3600,
            Self::Day => 86_400,
            Self::Week => 604_800,
            Self::Month => 2_592_000,
            Self::Year => 31_536_000,
        }
    }

    /// Its lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }
}

/// Which algorithm counts a rule (`algorithm:`, Sluice's extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleAlgorithm {
    /// Clock-aligned fixed windows, as envoyproxy/ratelimit counts (the default).
    FixedWindow,
    /// A token bucket (GCRA): `requests_per_unit` per unit, bursts of `burst`.
    TokenBucket,
    /// A sliding window (weighted estimate of the trailing window).
    SlidingWindow,
    /// A sliding log (exact, up to 256 per window).
    SlidingLog,
}

/// A `rate_limit:` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `name:` as written (what `replaces` refers to, and `current_limit.name`).
    pub name: Option<String>,
    /// The policy name operators' overrides are set on: `name` when it is one, otherwise
    /// `rls.<domain>.<path>` made one ([`policy_name`]).
    pub policy: String,
    /// The statistics' and metrics' name of the rule: `domain.key_value.key`.
    pub path: String,
    /// `requests_per_unit:`.
    pub requests_per_unit: u32,
    /// `unit:` (`None` when unlimited).
    pub unit: Option<Unit>,
    /// `unit_multiplier:` (a window of that many units; 1 by default).
    pub unit_multiplier: u32,
    /// `unlimited: true`.
    pub unlimited: bool,
    /// The names of the rules this one replaces.
    pub replaces: Vec<String>,
    /// The algorithm.
    pub algorithm: RuleAlgorithm,
    /// What the stores run; `None` when unlimited or `requests_per_unit` is 0.
    pub limit: Option<StoreLimit>,
    /// `shadow_mode:` of its descriptor.
    pub shadow_mode: bool,
    /// `quota_mode:` of its descriptor.
    pub quota_mode: bool,
    /// `detailed_metric:` or `value_to_metric:` of its descriptor: its metrics carry the
    /// request's values (bounded, see [`super::metrics`]).
    pub detailed_metric: bool,
    /// `metadata:` of its descriptor: returned in the answer's `dynamic_metadata` when
    /// the rule passes (with `--rls-response-dynamic-metadata`, see [`super::metadata`]).
    pub metadata: Option<Arc<Metadata>>,
}

/// A descriptor's `metadata:` (any mapping, as JSON).
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// One `descriptors:` item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// `key:`.
    pub key: String,
    /// `value:` (`None` when absent or empty: the key alone).
    pub value: Option<String>,
    /// `share_threshold:`: every value the wildcard matches shares one counter.
    pub share_threshold: bool,
    /// Its `rate_limit:`.
    pub rule: Option<Rule>,
    /// Its nested `descriptors:`.
    pub children: Vec<Node>,
}

impl Node {
    /// Whether its value is a wildcard pattern.
    pub fn is_wildcard(&self) -> bool {
        self.value.as_deref().is_some_and(|v| v.contains('*'))
    }
}

/// A domain whose requests are decided all or nothing (`all_or_nothing: true`, Sluice's
/// extension): every counted descriptor of a request spends, or none does, in one atomic
/// step on one Redis Cluster slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllOrNothing {
    /// `all_or_nothing_key`: the descriptor key whose value picks the slot (a tenant, so
    /// that tenants spread over the cluster); without it, or when the request has no
    /// entry with that key, the domain's one slot.
    pub key: Option<String>,
}

/// Every domain's descriptors, as loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsConfig {
    /// By domain.
    pub domains: BTreeMap<String, Vec<Node>>,
    /// The domains decided all or nothing.
    pub all_or_nothing: BTreeMap<String, AllOrNothing>,
    /// The files loaded, in order.
    pub files: Vec<PathBuf>,
}

impl RlsConfig {
    /// Loads every `*.yaml` and `*.yml` file in `dir` (not hidden ones, not
    /// subdirectories: a Kubernetes ConfigMap's `..data` is skipped, its links are read),
    /// in name order. With `merge`, files may add to a domain another file defined
    /// (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`); otherwise a second file with the
    /// same domain is refused.
    ///
    /// # Errors
    /// The first file that cannot be read or loaded.
    pub fn load_dir(dir: &Path, merge: bool) -> Result<Self, LoadError> {
        let unreadable = |e: std::io::Error| LoadError {
            file: dir.display().to_string(),
            at: String::new(),
            message: format!("cannot read the directory: {e}"),
        };
        let paths = yaml_files(dir).map_err(unreadable)?;
        let mut files = Vec::with_capacity(paths.len());
        for path in &paths {
            let text = std::fs::read_to_string(path).map_err(|e| LoadError {
                file: path.display().to_string(),
                at: String::new(),
                message: format!("cannot read the file: {e}"),
            })?;
            files.push((path.display().to_string(), text));
        }
        let mut config = Self::from_files(files.iter().map(|(n, t)| (n.as_str(), t.as_str())), merge)?;
        config.files = paths;
        Ok(config)
    }

    /// Loads files given as `(name, text)`, as [`RlsConfig::load_dir`] does.
    ///
    /// # Errors
    /// The first file that cannot be loaded.
    pub fn from_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>, merge: bool) -> Result<Self, LoadError> {
        let mut domains: BTreeMap<String, Vec<Node>> = BTreeMap::new();
        let mut all_or_nothing = BTreeMap::new();
        for (file, text) in files {
            let (domain, nodes, atomic) = load_file(file, text)?;
            if let Some(atomic) = atomic {
                all_or_nothing.insert(domain.clone(), atomic);
            }
            match domains.get_mut(&domain) {
                Some(_) if !merge => {
                    return Err(LoadError::new(file, "", format!("duplicate domain '{domain}' in config file")));
                }
                Some(existing) => {
                    for node in nodes {
                        let at = format!("{domain}.{}", node.segment());
                        if existing.iter().any(|n| n.segment() == node.segment()) {
                            return Err(LoadError::new(file, "", format!("duplicate descriptor composite key '{at}'")));
                        }
                        existing.push(node);
                    }
                }
                None => {
                    domains.insert(domain, nodes);
                }
            }
        }
        Ok(Self { domains, all_or_nothing, files: Vec::new() })
    }

    /// Every rule, with its domain.
    pub fn rules(&self) -> Vec<&Rule> {
        fn walk<'a>(nodes: &'a [Node], out: &mut Vec<&'a Rule>) {
            for node in nodes {
                out.extend(&node.rule);
                walk(&node.children, out);
            }
        }
        let mut out = Vec::new();
        for nodes in self.domains.values() {
            walk(nodes, &mut out);
        }
        out
    }
}

/// The files [`RlsConfig::load_dir`] reads in `dir`, in name order: `*.yaml` and `*.yml`,
/// not hidden, not directories (links are followed).
///
/// # Errors
/// When the directory cannot be read.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if yaml && !name.starts_with('.') && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

impl LoadError {
    fn new(file: &str, at: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            at: if at.is_empty() { String::new() } else { format!("{at}: ") },
            message: message.into(),
        }
    }
}

impl Node {
    /// `key` or `key_value`: how envoyproxy/ratelimit names it in a path.
    pub fn segment(&self) -> String {
        match &self.value {
            Some(value) => format!("{}_{value}", self.key),
            None => self.key.clone(),
        }
    }
}

fn load_file(file: &str, yaml: &str) -> Result<(String, Vec<Node>, Option<AllOrNothing>), LoadError> {
    let root: Value = serde_norway::from_str(yaml)
        .map_err(|e| LoadError::new(file, "", format!("error loading config file: {e}")))?;
    let Value::Mapping(map) = &root else {
        return Err(LoadError::new(file, "", "error loading config file: the file is not a YAML mapping"));
    };
    check_keys(file, &root)?;
    let domain = match map.get("domain") {
        Some(Value::String(d)) if !d.is_empty() => d.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(LoadError::new(file, "", "config file cannot have empty domain"));
        }
        Some(other) => return Err(LoadError::new(file, "", format!("domain: must be a string, not {}", kind(other)))),
    };
    let nodes = load_descriptors(file, &domain, map.get("descriptors"), 1)?;
    let key = text(file, &domain, map.get("all_or_nothing_key"), "all_or_nothing_key")?;
    let atomic = match (flag(file, &domain, map.get("all_or_nothing"), "all_or_nothing")?, key) {
        (true, key) => Some(AllOrNothing { key }),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(LoadError::new(file, &domain, "all_or_nothing_key: given without all_or_nothing: true"));
        }
    };
    Ok((domain, nodes, atomic))
}

/// envoyproxy/ratelimit's `validateYamlKeys`: every key anywhere (but inside
/// `metadata`) is a string among [`KEYS`] (or Sluice's [`EXTENSION_KEYS`]), and every
/// list holds mappings.
fn check_keys(file: &str, value: &Value) -> Result<(), LoadError> {
    match value {
        Value::Mapping(map) => {
            for (k, v) in map {
                let Value::String(k) = k else {
                    return Err(LoadError::new(file, "", format!("config error, key is not of type string: {k:?}")));
                };
                if !KEYS.contains(&k.as_str()) && !EXTENSION_KEYS.contains(&k.as_str()) {
                    return Err(LoadError::new(file, "", format!("config error, unknown key '{k}'")));
                }
                if k != "metadata" {
                    check_keys(file, v)?;
                }
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for item in items {
                if !matches!(item, Value::Mapping(_)) {
                    return Err(LoadError::new(
                        file,
                        "",
                        format!("config error, yaml file contains list of type other than map: {}", show(item)),
                    ));
                }
                check_keys(file, item)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn load_descriptors(file: &str, parent: &str, list: Option<&Value>, depth: usize) -> Result<Vec<Node>, LoadError> {
    let items = match list {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            return Err(LoadError::new(file, parent, format!("descriptors: must be a list, not {}", kind(other))));
        }
    };
    if depth > MAX_DEPTH {
        return Err(LoadError::new(file, parent, format!("descriptors: nested deeper than {MAX_DEPTH} levels")));
    }
    let mut nodes: Vec<Node> = Vec::with_capacity(items.len());
    for item in items {
        let Value::Mapping(map) = item else { continue };
        let key = text(file, parent, map.get("key"), "key")?.unwrap_or_default();
        if key.is_empty() {
            return Err(LoadError::new(file, parent, "descriptor has empty key"));
        }
        let value = text(file, parent, map.get("value"), "value")?.filter(|v| !v.is_empty());
        let segment = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        let path = format!("{parent}.{segment}");
        if nodes.iter().any(|n| n.segment() == segment) {
            return Err(LoadError::new(file, "", format!("duplicate descriptor composite key '{path}'")));
        }
        let flag = |name: &str| flag(file, &path, map.get(name), name);
        let share_threshold = flag("share_threshold")?;
        if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            return Err(LoadError::new(file, &path, "share_threshold can only be used with wildcard values"));
        }
        let modes = (flag("shadow_mode")?, flag("quota_mode")?, flag("detailed_metric")? || flag("value_to_metric")?);
        let metadata = metadata(file, &path, map.get("metadata"))?;
        let rule = match map.get("rate_limit") {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(limit)) => Some(Rule { metadata, ..load_rule(file, &path, limit, modes)? }),
            Some(other) => {
                return Err(LoadError::new(file, &path, format!("rate_limit: must be a mapping, not {}", kind(other))));
            }
        };
        let children = load_descriptors(file, &path, map.get("descriptors"), depth + 1)?;
        nodes.push(Node { key, value, share_threshold, rule, children });
    }
    Ok(nodes)
}

fn load_rule(
    file: &str,
    path: &str,
    map: &serde_norway::Mapping,
    (shadow_mode, quota_mode, detailed_metric): (bool, bool, bool),
) -> Result<Rule, LoadError> {
    let err = |message: String| LoadError::new(file, path, message);
    let unlimited = flag(file, path, map.get("unlimited"), "unlimited")?;
    let unit_text = text(file, path, map.get("unit"), "unit")?.unwrap_or_default();
    let unit = Unit::parse(&unit_text);
    if unlimited && unit.is_some() {
        return Err(err("should not specify rate limit unit when unlimited".to_owned()));
    }
    if !unlimited && unit.is_none() {
        return Err(err(format!("invalid rate limit unit '{unit_text}'")));
    }
    let requests_per_unit =
        number(file, path, map.get("requests_per_unit"), "requests_per_unit", u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let name = text(file, path, map.get("name"), "name")?.filter(|n| !n.is_empty());
    let mut replaces = Vec::new();
    match map.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(items)) => {
            for item in items {
                let replaced = match item {
                    Value::Mapping(m) => text(file, path, m.get("name"), "replaces.name")?.unwrap_or_default(),
                    _ => String::new(),
                };
                if replaced.is_empty() {
                    return Err(err("should not have an empty replaces entry".to_owned()));
                }
                if name.as_deref() == Some(replaced.as_str()) {
                    return Err(err("replaces should not contain name of same descriptor".to_owned()));
                }
                replaces.push(replaced);
            }
        }
        Some(other) => return Err(err(format!("replaces: must be a list, not {}", kind(other)))),
    }
    let algorithm = match text(file, path, map.get("algorithm"), "algorithm")?.as_deref() {
        None | Some("fixed_window") => RuleAlgorithm::FixedWindow,
        Some("token_bucket") => RuleAlgorithm::TokenBucket,
        Some("sliding_window") => RuleAlgorithm::SlidingWindow,
        Some("sliding_log") => RuleAlgorithm::SlidingLog,
        Some("leaky_bucket") => {
            return Err(err(
                "algorithm: leaky_bucket cannot be served over RLS: Envoy's ratelimit filter cannot delay a request"
                    .to_owned(),
            ));
        }
        Some(other) => {
            return Err(err(format!(
                "algorithm: unknown algorithm '{other}' (fixed_window, token_bucket, sliding_window or sliding_log)"
            )));
        }
    };
    let burst = number(file, path, map.get("burst"), "burst", u64::from(u32::MAX))?;
    if burst.is_some() && algorithm != RuleAlgorithm::TokenBucket {
        return Err(err("burst: only a token_bucket has a burst".to_owned()));
    }
    let unit_multiplier =
        number(file, path, map.get("unit_multiplier"), "unit_multiplier", u64::from(u32::MAX))?.unwrap_or(1) as u32;
    if unit_multiplier == 0 {
        return Err(err("unit_multiplier: must be at least 1".to_owned()));
    }
    if unlimited && (map.contains_key("algorithm") || burst.is_some() || map.contains_key("unit_multiplier")) {
        return Err(err("an unlimited rate_limit has no algorithm, burst or unit_multiplier".to_owned()));
    }
    let limit = match unit {
        Some(unit) if requests_per_unit > 0 => {
            let period_ms = unit.seconds().saturating_mul(1000).saturating_mul(u64::from(unit_multiplier));
            if period_ms > MAX_PERIOD_MS {
                return Err(err(format!(
                    "unit: {} × {unit_multiplier} is longer than the longest period the stores keep, 31 days \
                     (a year is refused: windows of `month` are 30 days, as envoyproxy/ratelimit counts them)",
                    unit.name()
                )));
            }
            let rpu = u64::from(requests_per_unit);
            let spec = match algorithm {
                RuleAlgorithm::FixedWindow => LimitSpec::FixedWindow { limit: rpu, window_ms: period_ms },
                RuleAlgorithm::TokenBucket => {
                    LimitSpec::TokenBucket { amount: rpu, per_ms: period_ms, burst: burst.unwrap_or(rpu) }
                }
                RuleAlgorithm::SlidingWindow => LimitSpec::SlidingWindow { limit: rpu, window_ms: period_ms },
                RuleAlgorithm::SlidingLog => LimitSpec::SlidingLog { limit: rpu, window_ms: period_ms },
            };
            Some(StoreLimit::new(spec).map_err(|e| err(format!("rate_limit: {e}")))?)
        }
        _ => None,
    };
    Ok(Rule {
        policy: policy_name(name.as_deref(), path),
        name,
        path: path.to_owned(),
        requests_per_unit,
        unit,
        unit_multiplier,
        unlimited,
        replaces,
        algorithm,
        limit,
        shadow_mode,
        quota_mode,
        detailed_metric,
        metadata: None,
    })
}

/// A descriptor's `metadata:`: a mapping whose keys are strings, at every depth (what
/// envoyproxy/ratelimit turns into a `google.protobuf.Struct`); kept only with a
/// `rate_limit`, as there.
fn metadata(file: &str, at: &str, value: Option<&Value>) -> Result<Option<Arc<Metadata>>, LoadError> {
    fn json(file: &str, at: &str, value: &Value) -> Result<serde_json::Value, LoadError> {
        Ok(match value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Number(n) => n
                .as_f64()
                .and_then(serde_json::Number::from_f64)
                .map(serde_json::Value::Number)
                .ok_or_else(|| LoadError::new(file, at, format!("metadata: {n} is not a finite number")))?,
            Value::String(s) => serde_json::Value::String(s.clone()),
            Value::Sequence(items) => {
                serde_json::Value::Array(items.iter().map(|v| json(file, at, v)).collect::<Result<_, _>>()?)
            }
            Value::Mapping(map) => {
                let mut out = Metadata::new();
                for (k, v) in map {
                    let Value::String(k) = k else {
                        return Err(LoadError::new(file, at, format!("metadata: a key is {}, not a string", kind(k))));
                    };
                    out.insert(k.clone(), json(file, at, v)?);
                }
                serde_json::Value::Object(out)
            }
            Value::Tagged(_) => {
                return Err(LoadError::new(file, at, "metadata: a tagged value cannot be returned as metadata"));
            }
        })
    }
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(map @ Value::Mapping(_)) => match json(file, at, map)? {
            serde_json::Value::Object(map) if map.is_empty() => Ok(None),
            serde_json::Value::Object(map) => Ok(Some(Arc::new(map))),
            _ => Ok(None),
        },
        Some(other) => Err(LoadError::new(file, at, format!("metadata: must be a mapping, not {}", kind(other)))),
    }
}

/// The policy name a rule's counters and overrides go by: its `name` when that is a
/// policy name (1 to 64 of `A-Z a-z 0-9 _ . -`), else `rls.` and its path with every
/// other character made `-`; a path too long for that ends in a hash of the whole.
pub fn policy_name(name: Option<&str>, path: &str) -> String {
    if let Some(name) = name.filter(|n| is_policy_name(n)) {
        return name.to_owned();
    }
    let clean: String =
        path.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '-' }).collect();
    let full = format!("rls.{clean}");
    if is_policy_name(&full) {
        return full;
    }
    let hash = super::identity::hash(&[path.as_bytes()]);
    let head: String = full.chars().take(sluice_protocol::wire::MAX_POLICY_BYTES - 17).collect();
    format!("{head}-{}", &hash[..16])
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn show(value: &Value) -> String {
    serde_norway::to_string(value).map(|s| s.trim().to_owned()).unwrap_or_else(|_| kind(value).to_owned())
}

fn text(file: &str, at: &str, value: Option<&Value>, field: &str) -> Result<Option<String>, LoadError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // YAML reads `value: 5` as a number; envoyproxy/ratelimit (Go's yaml.v2 into a
        // string field) reads it as "5".
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => Err(LoadError::new(file, at, format!("{field}: must be a string, not {}", kind(other)))),
    }
}

fn flag(file: &str, at: &str, value: Option<&Value>, field: &str) -> Result<bool, LoadError> {
    match value {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(LoadError::new(file, at, format!("{field}: must be true or false, not {}", kind(other)))),
    }
}

fn number(file: &str, at: &str, value: Option<&Value>, field: &str, most: u64) -> Result<Option<u64>, LoadError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v <= most => Ok(Some(v)),
            _ => Err(LoadError::new(file, at, format!("{field}: {n} is not a whole number from 0 to {most}"))),
        },
        Some(other) => Err(LoadError::new(file, at, format!("{field}: must be a number, not {}", kind(other)))),
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

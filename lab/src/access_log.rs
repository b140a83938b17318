//! Envoy access logs as traffic to replay: the default text format and JSON lines.
//!
//! * Text, Envoy's default format: `[START_TIME] "METHOD PATH PROTOCOL" CODE FLAGS
//!   RX TX DURATION UPSTREAM_TIME "X-FORWARDED-FOR" "USER-AGENT" "X-REQUEST-ID"
//!   "AUTHORITY" "UPSTREAM_HOST"`. It carries those four headers and no others.
//! * JSON (`json_format`), one object per line: the time under `start_time` (or
//!   `timestamp`, `time`), `method`, `path`, `authority`; every other string field
//!   whose name is a header name (`x-user`, `x-api-key`) is that header, and so is one
//!   named as Envoy users name header fields, with underscores: a field starting `x_`
//!   (`x_user` is `x-user`), and any field whose name, underscores made dashes, is a
//!   header the configuration reads ([`parse_for`]); Envoy's usual names map to theirs
//!   (`user_agent`, `x_forwarded_for`, `request_id`); a `headers` object may hold more.
//!   `client_address`/`downstream_remote_address` give the source address. [`JSON_FIELDS`]
//!   says the same for `sluice-lab replay --help`.
//!
//! A line that is not either is counted and reported by its number, never dropped
//! silently. Times are RFC 3339 (`2026-12-04T10:00:00.123Z`).

use crate::duration::Span;
use crate::scenario::{Caller, Fleet, Keys, Region, Scenario, Spacing};
use std::net::SocketAddr;
use std::time::Duration;

/// What a JSON line's fields are read as (`sluice-lab replay --help` shows it).
pub const JSON_FIELDS: &str = "JSON lines: `start_time` (or `timestamp`, `time`; RFC 3339), `method`, `path`, \
`authority`, `client_address` or `downstream_remote_address` (the source address), a `headers` object, and every \
string field that names a header: with dashes (`x-user`), starting `x_` (`x_user` is `x-user`), or, underscores made \
dashes, a header the configuration reads (`tenant`); `user_agent`, `x_forwarded_for` and `request_id` are \
`user-agent`, `x-forwarded-for` and `x-request-id`.";

/// One request of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its line (1-based).
    pub line: usize,
    /// When, in ns since the Unix epoch.
    pub at: u64,
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Headers the log carried (lower-case names).
    pub headers: Vec<(String, String)>,
    /// The client's address, when the log has it.
    pub source: Option<SocketAddr>,
}

/// A line that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// Its number (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// A parsed log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    /// The requests, in the log's order.
    pub entries: Vec<Entry>,
    /// The lines refused.
    pub bad: Vec<BadLine>,
}

fn time(text: &str) -> Result<u64, String> {
    let at =
        humantime::parse_rfc3339_weak(text.trim()).map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .map_err(|_| format!("{text:?} is before 1970"))
}

/// The quoted fields and bare words of a text line, in order.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {}
            '"' => {
                let mut word = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => word.extend(chars.next()),
                        Some(c) => word.push(c),
                        None => return Err("a quote is not closed".to_owned()),
                    }
                }
                out.push(word);
            }
            '[' => {
                let word: String = chars.by_ref().take_while(|c| *c != ']').collect();
                out.push(word);
            }
            c => {
                let mut word = String::from(c);
                while let Some(c) = chars.next_if(|c| *c != ' ' && *c != '\t') {
                    word.push(c);
                }
                out.push(word);
            }
        }
    }
    Ok(out)
}

fn text_line(number: usize, line: &str) -> Result<Entry, String> {
    if !line.starts_with('[') {
        return Err("neither JSON nor Envoy's default text format (which starts with [START_TIME])".to_owned());
    }
    let words = words(line)?;
    let at = time(words.first().ok_or("no start time")?)?;
    let request = words.get(1).ok_or("no \"METHOD PATH PROTOCOL\" field")?;
    let mut parts = request.split(' ');
    let method = parts.next().filter(|m| !m.is_empty() && *m != "-").ok_or("the request field has no method")?;
    let path = parts.next().filter(|p| p.starts_with('/')).ok_or("the request field has no path")?;
    let mut headers = Vec::new();
    for (index, name) in [(8, "x-forwarded-for"), (9, "user-agent"), (10, "x-request-id"), (11, ":authority")] {
        if let Some(value) = words.get(index).filter(|v| *v != "-") {
            headers.push((name.to_owned(), value.clone()));
        }
    }
    let source = words.get(8).and_then(|v| v.split(',').next()).and_then(|ip| ip.trim().parse().ok());
    Ok(Entry {
        line: number,
        at,
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        source: source.map(|ip| SocketAddr::new(ip, 40_000)),
    })
}

/// The header a JSON field `key` holds, if any: see the module docs. `wanted` are the
/// headers the configuration reads (lower case).
fn header_name(key: &str, wanted: &[String]) -> Option<String> {
    let dashed = key.to_ascii_lowercase().replace('_', "-");
    let mapped = match key {
        "user_agent" => "user-agent".to_owned(),
        "x_forwarded_for" => "x-forwarded-for".to_owned(),
        "request_id" => "x-request-id".to_owned(),
        "authority" => ":authority".to_owned(),
        key if key.contains('-') => key.to_ascii_lowercase(),
        key if key.starts_with("x_") || wanted.contains(&dashed) => dashed,
        _ => return None,
    };
    let valid = mapped.trim_start_matches(':').bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    valid.then_some(mapped)
}

fn json_line(number: usize, line: &str, wanted: &[String]) -> Result<Entry, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("a JSON line must be an object")?;
    let text = |key: &str| object.get(key).and_then(|v| v.as_str()).filter(|v| !v.is_empty() && *v != "-");
    let at = ["start_time", "timestamp", "time"]
        .iter()
        .find_map(|k| text(k))
        .ok_or("field `start_time` is missing (or `timestamp`, `time`)")?;
    let at = time(at).map_err(|e| format!("field `start_time`: {e}"))?;
    let method = text("method").ok_or("field `method` is missing")?;
    let path = text("path").ok_or("field `path` is missing")?;
    if !path.starts_with('/') {
        return Err(format!("field `path`: {path:?} does not start with /"));
    }
    let mut headers: Vec<(String, String)> = object
        .iter()
        .filter_map(|(k, v)| Some((header_name(k, wanted)?, v.as_str().filter(|v| *v != "-")?.to_owned())))
        .collect();
    if let Some(more) = object.get("headers").and_then(|h| h.as_object()) {
        for (k, v) in more {
            if let Some(v) = v.as_str() {
                headers.push((k.to_ascii_lowercase(), v.to_owned()));
            }
        }
    }
    let source = ["client_address", "downstream_remote_address"]
        .iter()
        .find_map(|k| text(k))
        .and_then(|a| a.parse::<SocketAddr>().ok().or_else(|| a.parse().ok().map(|ip| SocketAddr::new(ip, 40_000))));
    Ok(Entry { line: number, at, method: method.to_owned(), path: path.to_owned(), headers, source })
}

/// Parses a whole log: every line is an entry or a bad line (blank lines are skipped).
pub fn parse(text: &str) -> Log {
    parse_for(text, &[])
}

/// [`parse`], reading JSON fields named after the headers in `wanted` (the ones the
/// configuration reads, lower case) with underscores for dashes as those headers.
pub fn parse_for(text: &str, wanted: &[String]) -> Log {
    let mut log = Log::default();
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let parsed = if line.starts_with('{') { json_line(number, line, wanted) } else { text_line(number, line) };
        match parsed {
            Ok(entry) => log.entries.push(entry),
            Err(message) => log.bad.push(BadLine { line: number, message }),
        }
    }
    log
}

/// How a log is replayed: at what pace, through what fleet, in what rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replay {
    /// The log is played this many times faster than it was recorded (above 0).
    pub speed: f64,
    /// Proxies its requests are spread over (1 to 64).
    pub proxies: usize,
    /// Workers per proxy (1 to 16).
    pub workers: usize,
    /// One report row per interval.
    pub interval: Duration,
}

impl Log {
    /// The scenario that replays this log, read from `source`: one caller class, `log`,
    /// whose requests are the entries at `replay`'s pace, over a healthy fleet of one
    /// region, for as long as the log lasts at that pace and a second more.
    pub fn scenario(&self, source: &str, replay: Replay) -> Scenario {
        let Replay { speed, proxies, workers, interval } = replay;
        let first = self.entries.iter().map(|e| e.at).min().unwrap_or(0);
        let last = self.entries.iter().map(|e| e.at).max().unwrap_or(0);
        let length = Duration::from_nanos(((last - first) as f64 / speed) as u64) + Duration::from_secs(1);
        Scenario {
            name: format!("replay of {source}"),
            description: format!(
                "{} requests from the log at {speed}× its pace over {proxies} proxies; {} lines could not be read.",
                self.entries.len(),
                self.bad.len()
            ),
            seed: 1,
            duration: Span(length),
            interval: Span(interval),
            fleet: Fleet {
                regions: vec![Region { name: "all".to_owned(), proxies: proxies.clamp(1, 64) }],
                workers: workers.clamp(1, 16),
                service_latency: Span(Duration::from_millis(2)),
                upstream_latency: Span(Duration::from_millis(20)),
            },
            callers: vec![Caller {
                name: "log".to_owned(),
                legitimate: true,
                method: "GET".to_owned(),
                path: "/".to_owned(),
                headers: Default::default(),
                regions: Vec::new(),
                keys: Keys::default(),
                rate: Vec::new(),
                arrivals: Spacing::Even,
                usage: None,
                retry: None,
            }],
            faults: Vec::new(),
        }
    }

    /// Of `wanted` header names, those no entry carries.
    pub fn missing_headers<'a>(&self, wanted: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        wanted
            .into_iter()
            .filter(|name| !self.entries.iter().any(|e| e.headers.iter().any(|(n, _)| n == name)))
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"[2026-12-04T10:00:00.000Z] "GET /api/items?x=1 HTTP/1.1" 200 - 0 12 3 2 "10.1.2.3" "curl/8" "id-1" "shop.example" "10.0.0.9:80""#;

    #[test]
    fn a_default_format_line_gives_its_time_request_and_the_four_headers_it_carries() {
        let log = parse(TEXT);
        assert!(log.bad.is_empty(), "{:?}", log.bad);
        let entry = &log.entries[0];
        assert_eq!(entry.method, "GET");
        assert_eq!(entry.path, "/api/items?x=1");
        assert_eq!(entry.at, 1_796_378_400_000_000_000);
        assert!(entry.headers.contains(&("user-agent".to_owned(), "curl/8".to_owned())));
        assert_eq!(entry.source, Some("10.1.2.3:40000".parse().unwrap()));
    }

    #[test]
    fn a_json_line_gives_its_header_fields() {
        let log = parse(
            r#"{"start_time":"2026-12-04T10:00:00.250Z","method":"POST","path":"/v1/x","x-user":"alice","user_agent":"app","response_code":200}"#,
        );
        assert!(log.bad.is_empty(), "{:?}", log.bad);
        let entry = &log.entries[0];
        assert_eq!(entry.at, 1_796_378_400_250_000_000);
        assert!(entry.headers.contains(&("x-user".to_owned(), "alice".to_owned())));
        assert!(entry.headers.contains(&("user-agent".to_owned(), "app".to_owned())));
    }

    #[test]
    fn bad_lines_are_reported_by_number_and_the_rest_kept() {
        let text = format!("{TEXT}\n\nnot a log line\n{{\"method\":\"GET\",\"path\":\"/\"}}\n{TEXT}\n");
        let log = parse(&text);
        assert_eq!(log.entries.len(), 2);
        let lines: Vec<usize> = log.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [3, 4]);
        assert!(log.bad[1].message.contains("start_time"), "{}", log.bad[1].message);
    }

    #[test]
    fn json_fields_named_with_underscores_are_the_headers_envoy_users_mean() {
        let line = r#"{"start_time":"2026-12-04T10:00:00Z","method":"GET","path":"/","x_user":"alice","tenant_id":"acme","response_code":"200"}"#;
        let wanted = ["tenant-id".to_owned()];

        let log = parse_for(line, &wanted);

        let headers = &log.entries[0].headers;
        assert!(headers.contains(&("x-user".to_owned(), "alice".to_owned())), "{headers:?}");
        assert!(headers.contains(&("tenant-id".to_owned(), "acme".to_owned())), "{headers:?}");
        assert!(!headers.iter().any(|(n, _)| n.starts_with("response")), "not a header: {headers:?}");
        assert_eq!(log.missing_headers(wanted.iter().map(String::as_str)), Vec::<String>::new());
    }

    #[test]
    fn a_header_no_line_carries_is_named() {
        let log = parse(TEXT);
        assert_eq!(log.missing_headers(["x-user", "user-agent"]), ["x-user"]);
    }
}

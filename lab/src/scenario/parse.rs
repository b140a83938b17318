//! Parsing and validating a scenario: every error names the line, the column and the
//! field, and says what is wrong.

use super::locate::locate;
use super::{Fault, MAX_DURATION_SECS, MAX_INTERVALS, MAX_KEYS, MAX_PROXIES, MAX_RPS, MAX_WORKERS, Scenario};
use std::collections::BTreeSet;
use std::fmt;

/// Why a scenario was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ScenarioError {
    /// 1-based line of the field, when known.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
    /// The field (`callers[1].rate[0].rps`), empty for the whole document.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(f, "line {line}, column {column}")?,
            (Some(line), None) => write!(f, "line {line}")?,
            _ => write!(f, "the scenario")?,
        }
        if !self.field.is_empty() {
            write!(f, ", field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl Scenario {
    /// Parses and validates a scenario's YAML text.
    ///
    /// # Errors
    /// The first problem, with its line, column and field.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let deserializer = serde_norway::Deserializer::from_str(text);
        let scenario: Self = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." { String::new() } else { field };
            let inner = e.into_inner();
            // The field's own place when it has one (serde's location of a custom error
            // is the document's start), else where the parser stopped.
            let location = inner.location().map(|l| (l.line(), l.column()));
            let found = if field.is_empty() { None } else { locate(text, &field) };
            let (line, column) = found.or(location).unzip();
            // serde_norway appends "at line L column C" to its message; the location is
            // said once, in front.
            let message = inner.to_string();
            let message = message.split(" at line ").next().unwrap_or(&message).to_owned();
            ScenarioError { line, column, field, message }
        })?;
        let mut issues = Vec::new();
        scenario.validate(&mut issues);
        match issues.into_iter().next() {
            None => Ok(scenario),
            Some((field, message)) => {
                let (line, column) = locate(text, &field).unzip();
                Err(ScenarioError { line, column, field, message })
            }
        }
    }

    fn validate(&self, issues: &mut Vec<(String, String)>) {
        let mut issue = |field: String, message: String| issues.push((field, message));
        if self.name.trim().is_empty() {
            issue("name".into(), "the scenario needs a name".into());
        }
        let duration = self.duration.0;
        if duration.is_zero() || duration.as_secs() > MAX_DURATION_SECS {
            issue("duration".into(), format!("must be above 0 and at most {MAX_DURATION_SECS} s"));
        }
        let interval = self.interval.nanos();
        if interval < 1_000_000 {
            issue("interval".into(), "must be at least 1ms".into());
        } else if self.duration.nanos().div_ceil(interval) > MAX_INTERVALS {
            issue("interval".into(), format!("gives more than {MAX_INTERVALS} rows over the duration: make it longer"));
        }
        let fleet = &self.fleet;
        if fleet.regions.is_empty() {
            issue("fleet.regions".into(), "the fleet needs at least one region".into());
        }
        let mut regions = BTreeSet::new();
        for (i, region) in fleet.regions.iter().enumerate() {
            if !regions.insert(region.name.as_str()) {
                issue(format!("fleet.regions[{i}].name"), format!("region {:?} is named twice", region.name));
            }
            if region.proxies == 0 {
                issue(format!("fleet.regions[{i}].proxies"), "a region needs at least one proxy".into());
            }
        }
        if self.proxies() > MAX_PROXIES {
            issue("fleet.regions".into(), format!("{} proxies in all; at most {MAX_PROXIES}", self.proxies()));
        }
        if !(1..=MAX_WORKERS).contains(&fleet.workers) {
            issue("fleet.workers".into(), format!("must be 1 to {MAX_WORKERS}"));
        }
        if self.callers.is_empty() {
            issue("callers".into(), "the scenario needs at least one caller class".into());
        }
        let mut names = BTreeSet::new();
        for (c, caller) in self.callers.iter().enumerate() {
            let at = |field: &str| format!("callers[{c}].{field}");
            if caller.name.trim().is_empty() || !names.insert(caller.name.as_str()) {
                issue(at("name"), format!("{:?} is empty or names another class too", caller.name));
            }
            if caller.method.is_empty() || !caller.method.bytes().all(|b| b.is_ascii_alphabetic()) {
                issue(at("method"), format!("{:?} is not an HTTP method", caller.method));
            }
            if !caller.path.starts_with('/') {
                issue(at("path"), format!("{:?} must start with /", caller.path));
            }
            for name in caller.headers.keys() {
                let valid = !name.is_empty()
                    && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
                if !valid {
                    issue(
                        at(&format!("headers.{name}")),
                        "header names are lower-case letters, digits, - and _".into(),
                    );
                }
            }
            for (r, region) in caller.regions.iter().enumerate() {
                if !regions.contains(region.as_str()) {
                    issue(at(&format!("regions[{r}]")), format!("no region is named {region:?}"));
                }
            }
            if !(1..=MAX_KEYS).contains(&caller.keys.count) {
                issue(at("keys.count"), format!("must be 1 to {MAX_KEYS}"));
            }
            if !(0.0..=1.0).contains(&caller.keys.hot_share) {
                issue(at("keys.hot_share"), "is a share: 0 to 1".into());
            }
            if caller.rate.is_empty() {
                issue(at("rate"), "needs at least one point (`- {at: 0s, rps: 10}`)".into());
            }
            let mut previous = None;
            for (p, point) in caller.rate.iter().enumerate() {
                if !point.rps.is_finite() || !(0.0..=MAX_RPS).contains(&point.rps) {
                    issue(at(&format!("rate[{p}].rps")), format!("must be 0 to {MAX_RPS}"));
                }
                if previous.is_some_and(|before| point.at <= before) {
                    issue(at(&format!("rate[{p}].at")), "points must be in time order".into());
                }
                previous = Some(point.at);
            }
            if let Some(retry) = &caller.retry {
                if retry.attempts > 10 {
                    issue(at("retry.attempts"), "at most 10".into());
                }
                if retry.backoff.0.is_zero() {
                    issue(at("retry.backoff"), "must be above 0".into());
                }
            }
        }
        for (f, fault) in self.faults.iter().enumerate() {
            let at = |field: &str| format!("faults[{f}].{field}");
            if fault.at() > self.duration {
                issue(at("at"), "is after the scenario's end".into());
            }
            let (lasts, region) = match fault {
                Fault::Slow { lasts, region, .. }
                | Fault::Down { lasts, region, .. }
                | Fault::Errors { lasts, region, .. } => (Some(*lasts), region.as_deref()),
                Fault::Partition { lasts, region, .. } => (Some(*lasts), Some(region.as_str())),
                Fault::Restart { .. } | Fault::ClockStep { .. } | Fault::Config { .. } => (None, None),
            };
            if lasts.is_some_and(|l| l.0.is_zero()) {
                issue(at("for"), "must be above 0".into());
            }
            if let Some(region) = region
                && !regions.contains(region)
            {
                issue(at("region"), format!("no region is named {region:?}"));
            }
        }
    }
}

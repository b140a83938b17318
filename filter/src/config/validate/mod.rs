//! Whether a raw configuration is a valid one: each policy, the response, shaping and
//! the counter service, then what must hold across policies. Every issue found is
//! reported, one per line.
//!
//! Inside, only downwards: [`issues`] and [`fields`] at the bottom; the parts ([`key`],
//! [`matcher`], [`limit`], [`cost`], [`response`]); [`global`], which checks a partition
//! as a key; [`policy`], which puts a policy's parts together; the document here.

mod cost;
mod fields;
mod global;
mod issues;
mod key;
mod limit;
mod matcher;
mod policy;
mod response;

use super::error::ConfigError;
use super::model::Config;
use super::model::bounds::{DEFAULT_STAT_PREFIX, MAX_METRICS_FLUSH, MIN_METRICS_FLUSH};
use super::model::global::Strategy;
use super::raw::RawConfig;
use fields::{duration_between, is_name, name_expected};
use global::validate_counter_service;
use issues::Issues;
use key::describe;
use policy::validate_policy;
use response::{validate_response, validate_shaping};
use std::collections::BTreeSet;

/// The validated configuration, or every issue found.
///
/// # Errors
/// [`ConfigError::Invalid`] listing every semantic problem.
pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut issues = Issues::default();
    if raw.policies.is_empty() {
        issues.add("policies", "expected at least one policy");
    }
    let mut names = BTreeSet::new();
    let mut policies = Vec::with_capacity(raw.policies.len());
    for (index, policy) in raw.policies.into_iter().enumerate() {
        let path = format!("policies[{index}]");
        if !names.insert(policy.name.clone()) {
            issues.add(format!("{path}.name"), format!("{:?} is used by an earlier policy", policy.name));
        }
        if let Some(policy) = validate_policy(&mut issues, &path, policy) {
            policies.push(policy);
        }
    }
    let response = validate_response(&mut issues, raw.response);
    let shaping = validate_shaping(&mut issues, raw.shaping);
    let stat_prefix = raw.stat_prefix.unwrap_or_else(|| DEFAULT_STAT_PREFIX.to_owned());
    if !is_name(&stat_prefix) {
        issues.add("stat_prefix", format!("expected {}, got {stat_prefix:?}", name_expected()));
    }
    let metrics_flush_ms = raw.metrics_flush.and_then(|spec| {
        duration_between(&mut issues, "metrics_flush", spec, MIN_METRICS_FLUSH, MAX_METRICS_FLUSH)
            .and_then(|ms| u32::try_from(ms).ok())
    });
    let counter_service = raw.counter_service.map(|service| validate_counter_service(&mut issues, service));
    let checks = policies.iter().filter(|p| p.global.is_some_and(|g| g.strategy == Strategy::Check)).count();
    if checks > usize::from(sluice_protocol::DEFAULT_MAX_ENTRIES) {
        issues.add(
            "policies",
            format!(
                "{checks} global policies use strategy \"check\", but one check carries at most {} entries \
                 (sluice-counter's --max-entries default), and a request matching them all would be refused; \
                 use \"lease\" for some, or fewer policies",
                sluice_protocol::DEFAULT_MAX_ENTRIES
            ),
        );
    }
    for (index, policy) in policies.iter().enumerate() {
        if !policy.is_global() {
            continue;
        }
        let Some(service) = &counter_service else {
            issues.add(
                format!("policies[{index}].global"),
                "needs a counter_service (at the top level) to keep its budget",
            );
            continue;
        };
        if let Some(missing) = service.partition.iter().find(|part| !policy.key.contains(part)) {
            issues.add(
                format!("policies[{index}].key"),
                format!(
                    "a global policy's key must include every part of counter_service.partition (missing {})",
                    describe(missing)
                ),
            );
        }
    }
    if issues.count() == 0 {
        Ok(Config { policies, response, shaping, stat_prefix, metrics_flush_ms, counter_service })
    } else {
        Err(ConfigError::Invalid(issues.into_vec()))
    }
}

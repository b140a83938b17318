//! Whether a policy's algorithm and its numbers make a limit: the fields each algorithm
//! needs and uses ([`fields_of`], one row per algorithm), their bounds, and times that
//! must fit the clock. Every match here names each algorithm, so a new one does not
//! compile until it says which fields it reads and how they make its limit.

use super::fields::{amount, window_nanos};
use super::issues::Issues;
use crate::config::model::bounds::MAX_WAIT;
use crate::config::raw::{DurationSpec, RawOverflow, RawPolicy};
use shared_store::{Algorithm, Limit, MAX_CONCURRENCY, MAX_LOG_ENTRIES, Nanos, Rate};

/// The fields of a policy that hold its numbers, in the order their issues are told.
const NUMBER_FIELDS: [&str; 7] = ["rate", "burst", "limit", "window", "queue", "max_wait", "overflow"];

/// The number fields `algorithm` reads; any other one given is an error.
const fn fields_of(algorithm: Algorithm) -> &'static [&'static str] {
    match algorithm {
        Algorithm::TokenBucket => &["rate", "burst"],
        Algorithm::LeakyBucket => &["rate", "queue", "max_wait", "overflow"],
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => &["limit", "window"],
        Algorithm::Concurrency => &["limit"],
    }
}

/// Whether `raw` gives the number field `field`.
const fn given(raw: &RawPolicy, field: &str) -> bool {
    match field.as_bytes() {
        b"rate" => raw.rate.is_some(),
        b"burst" => raw.burst.is_some(),
        b"limit" => raw.limit.is_some(),
        b"window" => raw.window.is_some(),
        b"queue" => raw.queue.is_some(),
        b"max_wait" => raw.max_wait.is_some(),
        b"overflow" => raw.overflow.is_some(),
        _ => false,
    }
}

/// A policy's fields, read for its algorithm: each issue names the field and the
/// algorithm.
struct Fields<'a> {
    issues: &'a mut Issues,
    path: &'a str,
    raw: &'a RawPolicy,
    algorithm: Algorithm,
}

impl Fields<'_> {
    /// Whether `field` is given; when it is not, says that the algorithm requires it.
    fn required(&mut self, field: &str) -> bool {
        let present = given(self.raw, field);
        if !present {
            self.issues
                .add(format!("{}.{field}", self.path), format!("is required by algorithm \"{}\"", self.algorithm));
        }
        present
    }

    /// A required count (`limit`, `queue`, `burst`), at least 1.
    fn count(&mut self, field: &str, value: Option<u64>) -> Option<u64> {
        if !self.required(field) {
            return None;
        }
        value.and_then(|v| amount(self.issues, &format!("{}.{field}", self.path), v))
    }

    /// A required window length, that fits the clock.
    fn window(&mut self, field: &str, value: Option<DurationSpec>) -> Option<Nanos> {
        if !self.required(field) {
            return None;
        }
        value.and_then(|w| window_nanos(self.issues, &format!("{}.{field}", self.path), w))
    }

    /// The required `rate`.
    fn rate(&mut self) -> Option<Rate> {
        if !self.required("rate") {
            return None;
        }
        self.raw.rate.and_then(|spec| {
            let amount = amount(self.issues, &format!("{}.rate", self.path), spec.amount)?;
            Rate::new(amount, Nanos::from_secs(spec.per_secs))
        })
    }

    /// Whether `units` at `rate` fit the clock (the time becomes reset values); when they
    /// do not, says so of `field`.
    fn fits_the_clock(&mut self, field: &str, units: u64, rate: Rate, what: &str) -> bool {
        let time = u128::from(units) * u128::from(rate.per().0) / u128::from(rate.amount());
        let fits = time <= u128::from(u64::MAX);
        if !fits {
            self.issues
                .add(format!("{}.{field}", self.path), format!("takes longer than 584 years to {what} at this rate"));
        }
        fits
    }
}

/// The limit a policy's fields describe, if they make one.
pub(super) fn validate_limit(issues: &mut Issues, path: &str, raw: &RawPolicy) -> Option<Limit> {
    let algorithm = raw.algorithm.0;
    let mut ok = true;
    for field in NUMBER_FIELDS {
        if given(raw, field) && !fields_of(algorithm).contains(&field) {
            issues.add(format!("{path}.{field}"), format!("is not used by algorithm \"{algorithm}\""));
            ok = false;
        }
    }
    let mut fields = Fields { issues, path, raw, algorithm };
    let limit = match algorithm {
        Algorithm::TokenBucket => token_bucket(&mut fields),
        Algorithm::LeakyBucket => leaky_bucket(&mut fields),
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => window(&mut fields),
        Algorithm::Concurrency => concurrency(&mut fields),
    };
    if ok { limit } else { None }
}

fn token_bucket(fields: &mut Fields<'_>) -> Option<Limit> {
    let rate = fields.rate()?;
    let burst = match fields.raw.burst {
        Some(burst) => amount(fields.issues, &format!("{}.burst", fields.path), burst)?,
        // The `<n>` as written: `Rate` keeps its fraction in lowest terms.
        None => fields.raw.rate.map_or(1, |spec| spec.amount),
    };
    // The time to refill from empty must fit the clock.
    if !fields.fits_the_clock("burst", burst, rate, "refill") {
        return None;
    }
    Limit::token_bucket(rate, burst).ok()
}

fn leaky_bucket(fields: &mut Fields<'_>) -> Option<Limit> {
    let rate = fields.rate();
    let queue = fields.count("queue", fields.raw.queue);
    let (path, raw) = (fields.path, fields.raw);
    let max_wait = if raw.overflow.unwrap_or(RawOverflow::Queue) == RawOverflow::Queue {
        if fields.required("max_wait") {
            raw.max_wait.and_then(|w| {
                if w.millis > u128::from(MAX_WAIT.millis()) {
                    fields.issues.add(
                        format!("{path}.max_wait"),
                        format!("must be at most {MAX_WAIT}, got \"{}{}\"", w.amount, w.unit),
                    );
                    None
                } else {
                    window_nanos(fields.issues, &format!("{path}.max_wait"), w)
                }
            })
        } else {
            None
        }
    } else {
        if raw.max_wait.is_some() {
            fields.issues.add(format!("{path}.max_wait"), "is not used with overflow \"reject\" (nothing waits)");
        }
        // Nothing waits: a request is admitted only when it would leave now.
        Some(Nanos::ZERO)
    };
    let (rate, queue, max_wait) = (rate?, queue?, max_wait?);
    if !fields.fits_the_clock("queue", queue, rate, "drain") {
        return None;
    }
    Limit::leaky_bucket(rate, queue, max_wait).ok()
}

/// The window algorithms: `limit` units per `window`.
fn window(fields: &mut Fields<'_>) -> Option<Limit> {
    let limit = fields.count("limit", fields.raw.limit);
    let window = fields.window("window", fields.raw.window);
    let (limit, window) = (limit?, window?);
    match fields.algorithm {
        Algorithm::FixedWindow => Limit::fixed_window(limit, window).ok(),
        Algorithm::SlidingWindow => Limit::sliding_window(limit, window).ok(),
        Algorithm::SlidingLog => {
            if limit > MAX_LOG_ENTRIES {
                fields.issues.add(
                    format!("{}.limit", fields.path),
                    format!(
                        "must be at most {MAX_LOG_ENTRIES} for algorithm \"{}\" (its state keeps one entry per \
                         request), got {limit}",
                        fields.algorithm
                    ),
                );
                return None;
            }
            Limit::sliding_log(limit, window).ok()
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Concurrency => None,
    }
}

fn concurrency(fields: &mut Fields<'_>) -> Option<Limit> {
    let limit = fields.count("limit", fields.raw.limit)?;
    if limit > MAX_CONCURRENCY {
        fields.issues.add(
            format!("{}.limit", fields.path),
            format!("must be at most {MAX_CONCURRENCY} for algorithm \"{}\", got {limit}", fields.algorithm),
        );
        return None;
    }
    Limit::concurrency(limit).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_an_algorithm_reads_is_a_number_field_and_each_algorithm_reads_some() {
        for algorithm in Algorithm::ALL {
            let read = fields_of(algorithm);
            assert!(!read.is_empty(), "{algorithm}");
            assert!(read.iter().all(|f| NUMBER_FIELDS.contains(f)), "{algorithm}: {read:?}");
        }
    }
}

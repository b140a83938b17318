//! Whether a policy's cost is valid: a constant or a header's value, never zero and never
//! more than the policy's capacity (no request could pass).

use super::fields::header_name;
use super::issues::Issues;
use crate::config::model::request::Cost;
use crate::config::raw::RawCost;

/// The cost of one request; `capacity` is what the policy's limit holds.
pub(super) fn validate_cost(issues: &mut Issues, path: &str, raw: Option<&RawCost>, capacity: u64) -> Option<Cost> {
    let at = format!("{path}.cost");
    match raw {
        None => Some(Cost::Constant(1)),
        Some(RawCost::Constant(cost)) => {
            if *cost == 0 {
                issues.add(at, "must be at least 1");
                None
            } else if *cost > capacity {
                issues.add(
                    at,
                    format!(
                        "must not exceed the policy's capacity ({capacity}), got {cost}: no request could ever pass"
                    ),
                );
                None
            } else {
                Some(Cost::Constant(*cost))
            }
        }
        Some(RawCost::Header(header)) => {
            let before = issues.count();
            header_name(issues, &format!("{at}.header"), &header.header);
            let min = header.min.unwrap_or(1);
            if min == 0 {
                issues.add(format!("{at}.min"), "must be at least 1 (a zero cost would let a caller spend nothing)");
            }
            if header.max < min {
                issues.add(format!("{at}.max"), format!("must be at least min ({min}), got {}", header.max));
            } else if header.max > capacity {
                issues.add(
                    format!("{at}.max"),
                    format!("must not exceed the policy's capacity ({capacity}), got {}", header.max),
                );
            }
            let default = header.default.unwrap_or(min);
            if default < min || default > header.max {
                issues.add(
                    format!("{at}.default"),
                    format!("must be between min ({min}) and max ({}), got {default}", header.max),
                );
            }
            (issues.count() == before).then(|| Cost::Header {
                name: header.header.clone(),
                default,
                min,
                max: header.max,
            })
        }
    }
}

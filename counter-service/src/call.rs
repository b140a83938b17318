//! A validated decision request ([`Call`]) and what the store answered to it
//! ([`Outcome`]), whichever route and path carry them.

use crate::api::{ChargePlan, CheckPlan, CreditPlan, LeasePlan, PlannedEntry};
use crate::store::{ChargeOutcome, CheckOutcome, CreditOutcome, LeaseOutcome};

/// A validated request, ready for the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A check.
    Check(CheckPlan),
    /// A lease.
    Lease(LeasePlan),
    /// A charge.
    Charge(ChargePlan),
    /// A credit.
    Credit(CreditPlan),
}

impl Call {
    /// Its entries, in order (one for a lease, a charge or a credit).
    pub fn entries(&self) -> impl Iterator<Item = &PlannedEntry> + Clone {
        let (many, one) = match self {
            Self::Check(plan) => (plan.entries.as_slice(), None),
            Self::Lease(plan) => (&[][..], Some(&plan.entry)),
            Self::Charge(plan) => (&[][..], Some(&plan.entry)),
            Self::Credit(plan) => (&[][..], Some(&plan.entry)),
        };
        many.iter().chain(one)
    }
}

/// What the store answered to a [`Call`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// To a check.
    Check(CheckOutcome),
    /// To a lease.
    Lease(LeaseOutcome),
    /// To a charge.
    Charge(ChargeOutcome),
    /// To a credit.
    Credit(CreditOutcome),
}

impl Outcome {
    /// Units of debt the call's carry-overs to other numbers could not keep.
    pub const fn carry_forgiven(&self) -> u64 {
        match self {
            Self::Check(o) => o.carry_forgiven,
            Self::Lease(o) => o.carry_forgiven,
            Self::Charge(o) => o.carry_forgiven,
            Self::Credit(o) => o.carry_forgiven,
        }
    }
}

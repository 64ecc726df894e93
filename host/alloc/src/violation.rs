//! [`Violation`]: how a plan breaks its problem, as each formulation's `Plan::check`
//! reports it (`proteus::Plan::check`, `infadapter::Plan::check`,
//! `loki::Plan::check`).

use thiserror::Error;

/// A plan that breaks a rule of its problem. Every plan the allocator returns meets
/// its problem, a solver's or not (the plans made without one are checked before
/// they are returned); the tests check the solvers' plans with it. The variant says
/// which kind of rule; the message names the part of the plan (the device type,
/// route, app, variant, task, chain or path) and the numbers that disagree.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Violation {
    /// The plan's entries do not match the problem's: a task, variant, app, route or
    /// device type the problem lacks, or not one entry per what the problem has.
    #[error("{0}")]
    Shape(String),
    /// A constraint of the formulation is broken: a capacity, a budget of devices,
    /// cores or workers, a latency budget, the ladder of β, the shares.
    #[error("{0}")]
    Constraint(String),
    /// A number the plan reports is not what its own choices give: a capacity, a
    /// latency, a load, the served and shed demand, the accuracy or objective.
    #[error("{0}")]
    Reported(String),
}

impl Violation {
    /// What the plan gets wrong, without the kind.
    pub fn message(&self) -> &str {
        match self {
            Violation::Shape(m) | Violation::Constraint(m) | Violation::Reported(m) => m,
        }
    }
}

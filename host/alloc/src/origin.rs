//! Where a plan came from, for every formulation: a MILP's, or — when no MILP found
//! one within the allocation's time limit — one made without a solver (issue 34:
//! "the allocator returns the best plan it has … never nothing"). Proteus
//! ([`crate::proteus::solve_from`]), Loki ([`crate::loki::solve_from`]) and InfAdapter
//! ([`crate::infadapter::solve_from`]) mark their plans with it, and
//! [`crate::Allocation::origin`] reports it (`sluice allocate`, its `--json`, the live
//! host's log and `GET /admin/allocation`).

use serde::Serialize;

/// Where a plan came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Origin {
    /// A MILP's plan (Proteus's local search may have improved it).
    #[default]
    Milp,
    /// No MILP found a plan within the allocation's time limit: a plan built in
    /// closed form by the formulation's greedy rule (Proteus: each app's fastest
    /// variants on devices given in order of need, then the local search; Loki: one
    /// variant and batch size per task, the most accurate that the workers carry;
    /// InfAdapter: the variants that carry the demand on the fewest cores, the most
    /// accurate filled first), valid under the formulation's own constraints.
    Greedy {
        /// Why no MILP's plan (the error it would have been).
        reason: String,
    },
    /// No MILP found a plan within the allocation's time limit: the previous plan
    /// kept where it stands (Proteus: its placement; Loki: its variants, batch sizes
    /// and path shares; InfAdapter: its cores) and fitted to the new demand (Proteus:
    /// re-routed, each app shed to its capacity, then the local search; Loki: workers
    /// rescaled; InfAdapter: quotas re-routed, spare cores added).
    Repaired {
        /// Why no MILP's plan (the error it would have been).
        reason: String,
    },
}

impl Origin {
    /// `milp`, `greedy` or `repaired`.
    pub fn name(&self) -> &'static str {
        match self {
            Origin::Milp => "milp",
            Origin::Greedy { .. } => "greedy",
            Origin::Repaired { .. } => "repaired",
        }
    }

    /// Why the plan is not a MILP's (None for a MILP's).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Origin::Milp => None,
            Origin::Greedy { reason } | Origin::Repaired { reason } => Some(reason),
        }
    }

    /// The seconds an allocation of this origin took: its MILP solves' (`solves_s`),
    /// and for a plan made without a solver also the report's own (`report_s`: the
    /// greedy search or the repair, after the solves that found nothing in time).
    pub fn seconds(&self, solves_s: f64, report_s: f64) -> f64 {
        solves_s + if *self == Origin::Milp { 0.0 } else { report_s }
    }

    /// The greedy plan's origin (`repaired == false`) or the repaired plan's, with
    /// `reason`.
    pub fn without_solver(repaired: bool, reason: String) -> Origin {
        if repaired {
            Origin::Repaired { reason }
        } else {
            Origin::Greedy { reason }
        }
    }
}

/// The reason a plan made without a solver gives, in one wording for every
/// formulation: `no MILP found a plan within the allocation's time limit of 10 s (5
/// solves)`.
pub fn no_plan_in_time(limit_s: f64, solves: usize) -> String {
    format!("no MILP found a plan within the allocation's time limit of {limit_s} s ({solves} solves)")
}

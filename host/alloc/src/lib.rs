//! sluice-alloc: the MILP allocator — which model variant each device serves and
//! how each app's demand is split over them — as functions from a problem to a plan,
//! over good_lp with the HiGHS backend. No HTTP, no Wasm: the live host and the
//! simulator call it off their request paths.
//!
//! Start here:
//! - [`proteus::solve`]: Proteus §4 (accuracy scaling: selection, placement, query
//!   assignment; demand lowered step by step when infeasible) and Loki §4.1's
//!   hardware scaling first ([`proteus::Objective::HardwareFirst`]).
//! - [`infadapter::solve`]: InfAdapter §3 (a set of variants with cores, quotas,
//!   α·accuracy − β·cores − γ·loading under a core budget).
//! - [`problem::AnyProblem`]: the strict, versioned problem file `sluice allocate`
//!   reads.
//! - [`solver`]: one bounded solve (time limit, MIP gap) and its report (status,
//!   objective, achieved gap, solve time); any model, even one without variables,
//!   is answered without a panic.
//! - [`limits`]: the range of every number of a problem file and an `[allocator]`
//!   config, checked where it is parsed.
//! - [`planner::Planner`]: what a config's `[allocator]` runs — the MILP, or a
//!   baseline of Proteus's evaluation around it (a static plan, fixed placement,
//!   restricted variants, uniform routing, [`infaas`]'s greedy autoscaler) — for the
//!   live host and the simulator alike.
//! - [`loki::solve`]: Loki §4 (pipelines: hardware scaling, then accuracy scaling,
//!   over any rooted tree of tasks) and [`loki::routing`]'s MostAccurateFirst
//!   routing tables (§5).
//! - [`cores`]: InfAdapter's world — variants on CPU cores from a capacity table,
//!   planned by its ILP, by Model-Switching+ or by a VPA-like rule (§5's systems).
//! - [`Allocator`]: repeated solves that never leave the caller without a plan: a
//!   solve that fails or finds none falls back to the last feasible plan, and one
//!   that runs out of time with none answers with the last plan repaired or a greedy
//!   plan, marked with its [`Origin`] (every formulation).
//!
//! Design notes and how each formulation differs from its paper and reference code:
//! `docs/allocator.md`.

pub mod config;
pub mod cores;
pub mod infaas;
pub mod infadapter;
pub mod ladder;
pub mod limits;
pub mod loki;
pub mod origin;
pub mod planner;
pub mod problem;
pub mod proteus;
pub mod solver;
pub mod violation;

use serde::Serialize;

pub use origin::Origin;
pub use problem::AnyProblem;
pub use solver::{SolveError, SolveReport, SolveStatus, SolverSettings};
pub use violation::Violation;

/// A plan of either kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AnyPlan {
    /// Devices and routing shares.
    Proteus(proteus::Plan),
    /// Variants with cores and quotas.
    Infadapter(infadapter::Plan),
    /// A pipeline's workers, batch sizes and path shares.
    Loki(loki::Plan),
}

/// What one allocation produced.
#[derive(Clone, Debug, Serialize)]
pub struct Allocation {
    /// `optimal`, `time-limit`, `infeasible` (no plan at any demand factor),
    /// `fallback` (this solve produced no plan; `plan` is the last feasible one), or,
    /// when no MILP found a plan within the allocation's time limit, `greedy` or
    /// `repaired`: a plan made without a solver (`origin` says why).
    pub status: String,
    /// Where the plan came from when no solver made it (every formulation): `greedy`
    /// or `repaired`, and why (None: a solver's plan, a heuristic's, or the last kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// The plan's objective (of the solve that produced it).
    pub objective: Option<f64>,
    /// The achieved relative MIP gap.
    pub gap: Option<f64>,
    /// Wall seconds of all solves of this allocation (a ladder may solve several times).
    pub solve_seconds: f64,
    /// Solves made (the ladder's attempts).
    pub solves: usize,
    /// The report of the last solve.
    pub report: Option<SolveReport>,
    /// Why there is no new plan (solver error), if so.
    pub error: Option<String>,
    /// The plan in force after this allocation (None only before any plan exists).
    pub plan: Option<AnyPlan>,
}

impl Allocation {
    /// Whether this allocation made a new plan (solved, within the time limit, or by
    /// a heuristic) rather than keeping the last one.
    pub fn is_new_plan(&self) -> bool {
        self.error.is_none()
            && matches!(self.status.as_str(), "optimal" | "time-limit" | "heuristic" | "greedy" | "repaired")
    }
}

/// Solves problems one after another, remembering the last feasible plan so that a
/// failed or infeasible solve leaves the previous plan in force, never nothing.
#[derive(Default)]
pub struct Allocator {
    last: Option<AnyPlan>,
}

impl Allocator {
    /// An allocator whose fallback is `initial` (e.g. the plan the host started with).
    pub fn with_plan(initial: Option<AnyPlan>) -> Allocator {
        Allocator { last: initial }
    }

    /// The plan in force.
    pub fn current(&self) -> Option<&AnyPlan> {
        self.last.as_ref()
    }

    /// Puts `plan` in force as it is (a heuristic's plan, or a solved plan that a
    /// baseline changed), reporting `status` and the seconds it took.
    pub fn adopt(&mut self, plan: AnyPlan, status: &str, seconds: f64) -> Allocation {
        self.last = Some(plan.clone());
        Allocation {
            status: status.into(),
            objective: None,
            gap: None,
            solve_seconds: seconds,
            solves: 0,
            report: None,
            error: None,
            plan: Some(plan),
            origin: None,
        }
    }

    /// Keeps the last plan without solving, reporting `status` (a planner that chose
    /// not to re-plan now).
    pub fn keep(&self, status: &str) -> Allocation {
        Allocation { status: status.into(), error: None, ..self.fail("") }
    }

    /// Records a solve's result: its plan in force when there is one, otherwise the
    /// last plan kept (`fallback`, or `infeasible` when there is none).
    pub fn solved(
        &mut self,
        report: SolveReport,
        solves: usize,
        solve_seconds: f64,
        plan: Option<AnyPlan>,
    ) -> Allocation {
        match plan {
            Some(plan) => {
                self.last = Some(plan.clone());
                Allocation {
                    status: status_name(report.status).into(),
                    objective: report.objective,
                    gap: report.gap,
                    solve_seconds,
                    solves,
                    report: Some(report),
                    error: None,
                    plan: Some(plan),
                    origin: None,
                }
            }
            None => Allocation {
                status: if self.last.is_some() { "fallback".into() } else { "infeasible".into() },
                objective: None,
                gap: None,
                solve_seconds,
                solves,
                report: Some(report),
                error: None,
                plan: self.last.clone(),
                origin: None,
            },
        }
    }

    /// Keeps the last plan and reports `error` (a solver or heuristic that failed):
    /// its message is what the allocation's view shows.
    pub fn fail(&self, error: impl std::fmt::Display) -> Allocation {
        Allocation {
            status: "fallback".into(),
            objective: None,
            gap: None,
            solve_seconds: 0.0,
            solves: 0,
            report: None,
            error: Some(error.to_string()),
            plan: self.last.clone(),
            origin: None,
        }
    }

    /// Solves `problem`; on success the new plan is in force, otherwise the last one
    /// stays. When no MILP finds a plan within the problem's time limit, the plan in
    /// force (of the same kind) repaired for the new demand, or a greedy plan, is put in
    /// force with status `greedy` / `repaired` and its [`Origin`] — for Proteus, Loki
    /// and InfAdapter alike.
    pub fn allocate(&mut self, problem: &AnyProblem) -> Allocation {
        // (report, solves, seconds, plan, origin) of whichever formulation ran.
        type Solved = (SolveReport, usize, f64, Option<AnyPlan>, Origin);
        let solved: Result<Solved, AllocateError> = match (problem, &self.last) {
            (AnyProblem::Proteus(p), last) => {
                let previous = match last {
                    Some(AnyPlan::Proteus(plan)) => Some(plan),
                    _ => None,
                };
                proteus::solve_from(p, previous).map_err(AllocateError::from).map(|o| {
                    // Made without a solver, a Proteus plan has no attempts: the
                    // report's seconds are its own.
                    let secs =
                        o.origin.seconds(o.attempts.iter().map(|a| a.solve_seconds).sum(), o.report.solve_seconds);
                    (o.report, o.attempts.len(), secs, o.plan.map(AnyPlan::Proteus), o.origin)
                })
            }
            (AnyProblem::InfAdapter(p), last) => {
                let previous = match last {
                    Some(AnyPlan::Infadapter(plan)) => Some(plan),
                    _ => None,
                };
                infadapter::solve_from(p, previous).map_err(AllocateError::from).map(|o| {
                    let secs =
                        o.origin.seconds(o.attempts.iter().map(|a| a.solve_seconds).sum(), o.report.solve_seconds);
                    (o.report, o.attempts.len(), secs, o.plan.map(AnyPlan::Infadapter), o.origin)
                })
            }
            (AnyProblem::Loki(p), last) => {
                let previous = match last {
                    Some(AnyPlan::Loki(plan)) => Some(plan),
                    _ => None,
                };
                loki::solve_from(p, previous).map_err(AllocateError::from).map(|o| {
                    let secs =
                        o.origin.seconds(o.attempts.iter().map(|a| a.solve_seconds).sum(), o.report.solve_seconds);
                    (o.report, o.attempts.len(), secs, o.plan.map(AnyPlan::Loki), o.origin)
                })
            }
        };
        match solved {
            Ok((report, solves, solve_seconds, plan, origin)) => {
                self.solved_by(report, solves, solve_seconds, plan, origin)
            }
            Err(e) => self.fail(e),
        }
    }

    /// [`Self::solved`] for a plan of `origin`: a greedy or repaired plan (no MILP
    /// found one in time) is in force and reported as such, status `greedy` /
    /// `repaired` with its [`Origin`], never nothing.
    pub(crate) fn solved_by(
        &mut self,
        report: SolveReport,
        solves: usize,
        solve_seconds: f64,
        plan: Option<AnyPlan>,
        origin: Origin,
    ) -> Allocation {
        let mut a = self.solved(report, solves, solve_seconds, plan);
        if origin != Origin::Milp && a.error.is_none() && a.plan.is_some() {
            a.status = origin.name().into();
            a.origin = Some(origin);
        }
        a
    }
}

/// Why a formulation made no plan ([`Allocator::allocate`]): its own error, whose
/// message the allocation reports.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// Proteus's.
    #[error(transparent)]
    Proteus(#[from] proteus::ProteusError),
    /// InfAdapter's.
    #[error(transparent)]
    InfAdapter(#[from] SolveError),
    /// Loki's.
    #[error(transparent)]
    Loki(#[from] loki::LokiError),
}

fn status_name(s: SolveStatus) -> &'static str {
    match s {
        SolveStatus::Optimal => "optimal",
        SolveStatus::TimeLimit => "time-limit",
        SolveStatus::Infeasible => "infeasible",
    }
}

//! The demand-lowering ladder both formulations share: solve at a factor β, and when
//! the model is infeasible, lower β and solve again, until a plan is found or β
//! reaches its floor (Proteus §4; the artifact's `algorithms/ilp.py` steps β from 1.05
//! by 0.05 while β > 0.2).
//!
//! Proteus looks for the same factor — the highest step of [`Ladder::steps`] with a
//! plan — with one MILP over placements ([`Search::Lexicographic`], the default, in
//! `proteus::solve`), or with [`Ladder::search`]: by bisection over the steps
//! ([`Search::Bisect`]) or one step at a time ([`Search::Descend`], the artifact's),
//! under one deadline for the whole search. Feasibility is monotone in β (a lower β
//! serves less of every app and asks less headroom), so all three find the same step,
//! and the same model there gives the same plan (to within the MIP gap).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::solver::{SolveReport, SolveStatus};

/// The demand-lowering ladder.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ladder {
    /// `beta = 1.05`: the first factor (capacity headroom when ≥ 1).
    #[serde(default = "default_beta")]
    pub beta: f64,
    /// `step = 0.05`: how much β drops after an infeasible solve (twice this above 1.5).
    #[serde(default = "default_step")]
    pub step: f64,
    /// `min_beta = 0.2`: no solve at or below this factor.
    #[serde(default = "default_min_beta")]
    pub min_beta: f64,
    /// `search = "lexicographic"`: how the steps are searched (`"bisect"`: bisection
    /// over the steps; `"descend"`: one at a time from the top, the artifact's).
    #[serde(default)]
    pub search: Search,
    /// `local_search = true`: the lexicographic search moves devices between variants
    /// and apps, one or two at a time, around its accuracy solves while a move raises
    /// the objective (`placement.rs`; docs/allocator.md, "Proteus"). `false`: the
    /// MILPs' plans alone, as before 2026-11-26 (the surge bench's baseline).
    #[serde(default = "default_local_search")]
    pub local_search: bool,
}

fn default_local_search() -> bool {
    true
}

/// How the ladder's steps are searched.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Search {
    /// Two solves (Proteus, `proteus::solve`): one MILP over placements finds the
    /// highest step at which every app can be served — its bound proves every step
    /// above infeasible at once — then the accuracy solve at that step starts from
    /// that placement. Where a caller has no such model, [`Ladder::search`] bisects.
    #[default]
    Lexicographic,
    /// The first step, then bisection over the rest: ⌈log2 n⌉ + 1 solves at most
    /// (17 steps by default: 6, where a surge to 4× took 17 one at a time).
    Bisect,
    /// One step at a time from the top (the artifact's ladder).
    Descend,
}

fn default_beta() -> f64 {
    1.05
}
fn default_step() -> f64 {
    0.05
}
fn default_min_beta() -> f64 {
    0.2
}

impl Default for Ladder {
    fn default() -> Self {
        Ladder {
            beta: default_beta(),
            step: default_step(),
            min_beta: default_min_beta(),
            search: Search::default(),
            local_search: default_local_search(),
        }
    }
}

impl Ladder {
    /// The factors tried, in order (1.05, 1.00, …, 0.25 by default). Computed on a
    /// grid of 1e-9 so floating-point drift neither adds nor loses a step.
    pub fn steps(&self) -> Vec<f64> {
        let mut out = Vec::new();
        let mut b = self.beta;
        while b > self.min_beta + 1e-9 && out.len() < 1000 {
            out.push((b * 1e9).round() / 1e9);
            b -= if b > 1.5 { 2.0 * self.step } else { self.step };
        }
        out
    }
}

/// One solve of a descent.
#[derive(Clone, Debug, Serialize)]
pub struct Tried {
    /// The factor.
    pub beta: f64,
    /// How it ended.
    pub status: SolveStatus,
    /// Its wall time, s.
    pub solve_seconds: f64,
}

/// What a descent found.
pub struct Descent<P> {
    /// Every solve, in order.
    pub tried: Vec<Tried>,
    /// The report of the solve that produced the plan, or of the last one.
    pub report: SolveReport,
    /// The plan (None: infeasible at every factor, or none found in time).
    pub plan: Option<P>,
    /// Whether the deadline stopped the search before it was decided (the plan, if
    /// any, is the best found by then: the highest factor that had one).
    pub timed_out: bool,
}

impl Ladder {
    /// Solves at each factor of [`Ladder::steps`] in turn until one gives a plan.
    pub fn descend<P, E>(
        &self,
        mut solve: impl FnMut(f64) -> Result<(SolveReport, Option<P>), E>,
    ) -> Result<Descent<P>, E> {
        let mut tried = Vec::new();
        let mut report = SolveReport::none();
        for beta in self.steps() {
            let (r, plan) = solve(beta)?;
            tried.push(Tried { beta, status: r.status, solve_seconds: r.solve_seconds });
            report = r;
            if plan.is_some() {
                return Ok(Descent { tried, report, plan, timed_out: false });
            }
        }
        Ok(Descent { tried, report, plan: None, timed_out: false })
    }

    /// Finds the highest step with a plan, as [`Ladder::search`] says, before
    /// `deadline`: `solve(beta, seconds_left)` solves at one factor within the time
    /// left (a solve that runs out of it without a plan answers `None`, like an
    /// infeasible one: the search goes lower). When the deadline passes, the best plan
    /// found so far is returned (`timed_out`), or none.
    pub fn search<P, E>(
        &self,
        deadline: Instant,
        mut solve: impl FnMut(f64, f64) -> Result<(SolveReport, Option<P>), E>,
    ) -> Result<Descent<P>, E> {
        let steps = self.steps();
        let mut tried = Vec::new();
        let mut last = SolveReport::none();
        // The highest step with a plan so far: (index, report, plan).
        let mut best: Option<(usize, SolveReport, P)> = None;
        let mut timed_out = false;
        let mut at = |i: usize, tried: &mut Vec<Tried>, last: &mut SolveReport| -> Result<Option<Option<P>>, E> {
            let left = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
            if left < 1e-3 {
                return Ok(None);
            }
            let beta = steps[i];
            let (r, plan) = solve(beta, left)?;
            tried.push(Tried { beta, status: r.status, solve_seconds: r.solve_seconds });
            *last = r;
            Ok(Some(plan))
        };
        // Bounds of the bisection: every step below `lo` has no plan; `hi` is the
        // highest step known to have one (steps.len(): none known).
        let (mut lo, mut hi) = (0, steps.len());
        while lo < hi {
            let mid = match self.search {
                // The top first: a problem that fits is decided in one solve.
                Search::Bisect | Search::Lexicographic if lo > 0 => lo + (hi - lo) / 2,
                _ => lo,
            };
            match at(mid, &mut tried, &mut last)? {
                None => {
                    timed_out = true;
                    break;
                }
                Some(Some(plan)) => {
                    best = Some((mid, last.clone(), plan));
                    hi = mid;
                }
                Some(None) => lo = mid + 1,
            }
        }
        Ok(match best {
            Some((_, report, plan)) => Descent { tried, report, plan: Some(plan), timed_out },
            None => Descent { tried, report: last, plan: None, timed_out },
        })
    }
}

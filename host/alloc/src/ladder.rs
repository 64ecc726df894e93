//! The demand-lowering ladder both formulations share: solve at a factor β, and when
//! the model is infeasible, lower β and solve again, until a plan is found or β
//! reaches its floor (Proteus §4; the artifact's `algorithms/ilp.py` steps β from 1.05
//! by 0.05 while β > 0.2).

use serde::{Deserialize, Serialize};

use crate::solver::{SolveReport, Status};

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
        Ladder { beta: default_beta(), step: default_step(), min_beta: default_min_beta() }
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
    pub status: Status,
    /// Its wall time, s.
    pub solve_seconds: f64,
}

/// What a descent found.
pub struct Descent<P> {
    /// Every solve, in order.
    pub tried: Vec<Tried>,
    /// The report of the solve that produced the plan, or of the last one.
    pub report: SolveReport,
    /// The plan (None: infeasible at every factor).
    pub plan: Option<P>,
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
                return Ok(Descent { tried, report, plan });
            }
        }
        Ok(Descent { tried, report, plan: None })
    }
}

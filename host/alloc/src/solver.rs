//! One MILP solve, bounded and reported: the model is written with `good_lp`, solved
//! by HiGHS under a time limit and a relative MIP gap, and the outcome says what the
//! solver achieved (status, objective, achieved gap, wall time) instead of only a
//! solution.
//!
//! good_lp's HiGHS solution does not expose the achieved gap or the objective, so
//! the model is handed to the `highs` crate after it is built (`try_into_inner`),
//! options are set there, and the values are read back by the variables' creation
//! order, which [`Milp`] records.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Instant;

use good_lp::{
    highs, Expression, ProblemVariables, Solution, SolutionStatus, SolverModel, Variable, VariableDefinition,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::limits;

/// Limits of one solve. Every solve has both: a MILP can take arbitrarily long, and
/// a plan that arrives after the demand it was made for has changed is worth less
/// than a slightly suboptimal one on time.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SolverSettings {
    /// `time_limit_s = 10`: wall-clock limit of one solve; the best plan found by
    /// then is used (status `time-limit`), and none found is an error. For Proteus
    /// it bounds the whole allocation, every step of the ladder together
    /// (`proteus::solve`).
    #[serde(default = "default_time_limit")]
    pub time_limit_s: f64,
    /// `mip_gap = 0.005`: HiGHS stops when the relative gap between the best plan
    /// and the bound is below this. HiGHS's own default, 1e-4, spent 3 s proving a
    /// surge's plan that 0.005 proves in 0.4 s with the same objective (issue 34's
    /// goal allows 1 %).
    #[serde(default = "default_gap")]
    pub mip_gap: f64,
    /// `soft_limit_s = 0.2`: Proteus's accuracy solves and local searches (with the
    /// default `[ladder] search = "lexicographic"`) stop here with the best plan by
    /// then, reported with its status `time-limit` and the gap it reached; only a
    /// search with no plan yet goes on to `time_limit_s`. With the local search, the
    /// surges' plans are within 1 % of the best in this time, and the same at 0.15 and
    /// 0.3 s (docs/allocator.md, "Proteus"); HiGHS alone spends seconds proving them.
    /// 0: no soft limit, solve to `mip_gap`.
    #[serde(default = "default_soft_limit")]
    pub soft_limit_s: f64,
    /// `threads = 1`: HiGHS threads. One by default: the allocator runs beside the
    /// serving workers and must not take their cores.
    #[serde(default = "default_threads")]
    pub threads: u32,
}

fn default_time_limit() -> f64 {
    10.0
}
fn default_gap() -> f64 {
    0.005
}
fn default_soft_limit() -> f64 {
    0.2
}
fn default_threads() -> u32 {
    1
}

impl Default for SolverSettings {
    fn default() -> Self {
        SolverSettings {
            time_limit_s: default_time_limit(),
            mip_gap: default_gap(),
            soft_limit_s: default_soft_limit(),
            threads: default_threads(),
        }
    }
}

impl SolverSettings {
    /// Checks the values against their ranges ([`crate::limits`]): `time_limit_s` in
    /// (0, 86400], `mip_gap` in [0, 1], `threads` 1 to 256. The error names the field.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if !limits::positive_within(self.time_limit_s, limits::MAX_TIME_LIMIT_S) {
            return Err(SettingsError::TimeLimit(self.time_limit_s));
        }
        if !limits::within(self.soft_limit_s, limits::MAX_TIME_LIMIT_S) {
            return Err(SettingsError::SoftLimit(self.soft_limit_s));
        }
        if !(self.mip_gap.is_finite() && limits::MIP_GAP.contains(&self.mip_gap)) {
            return Err(SettingsError::MipGap(self.mip_gap));
        }
        if !limits::THREADS.contains(&self.threads) {
            return Err(SettingsError::Threads(self.threads));
        }
        Ok(())
    }
}

/// A `[solver]` setting out of its range ([`crate::limits`]); the message starts
/// with the field.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SettingsError {
    /// `time_limit_s` not positive or above a day.
    #[error("time_limit_s: expected a positive number of seconds, at most {}", limits::MAX_TIME_LIMIT_S)]
    TimeLimit(f64),
    /// `soft_limit_s` negative or above a day.
    #[error("soft_limit_s: expected a number of seconds from 0 to {}", limits::MAX_TIME_LIMIT_S)]
    SoftLimit(f64),
    /// `mip_gap` outside [0, 1].
    #[error("mip_gap: expected a fraction from 0 to 1")]
    MipGap(f64),
    /// `threads` outside [`limits::THREADS`].
    #[error("threads: expected {} threads", limits::span(&limits::THREADS))]
    Threads(u32),
}

/// How a solve ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SolveStatus {
    /// Solved to within the MIP gap.
    Optimal,
    /// Stopped by the time limit with a feasible plan (its gap says how good).
    TimeLimit,
    /// No feasible plan exists.
    Infeasible,
}

/// What one solve achieved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SolveReport {
    /// How it ended.
    pub status: SolveStatus,
    /// The objective of the plan (None when infeasible).
    pub objective: Option<f64>,
    /// The achieved relative gap between the plan and the solver's bound (0 when
    /// proven optimal; None when infeasible).
    pub gap: Option<f64>,
    /// Wall time of the solve, seconds (model building excluded).
    pub solve_seconds: f64,
    /// Variables and constraints of the model.
    pub variables: usize,
    /// Constraint rows.
    pub constraints: usize,
}

impl SolveReport {
    /// The report of a plan made without a solver (greedy or repaired: see
    /// [`crate::Origin`]) of `objective`, in `seconds`: status `time-limit`, as no
    /// MILP found one in time.
    pub fn without_solver(objective: f64, seconds: f64) -> SolveReport {
        SolveReport {
            status: SolveStatus::TimeLimit,
            objective: Some(objective),
            solve_seconds: seconds,
            ..SolveReport::none()
        }
    }

    /// The report of no solve at all (a ladder with no step).
    pub fn none() -> SolveReport {
        SolveReport {
            status: SolveStatus::Infeasible,
            objective: None,
            gap: None,
            solve_seconds: 0.0,
            variables: 0,
            constraints: 0,
        }
    }
}

/// The solver could not be run (as opposed to a model that has no solution).
#[derive(Debug, Error)]
pub enum SolveError {
    /// HiGHS refused the model or an option, or failed while solving.
    #[error("HiGHS: {0}")]
    Highs(String),
    /// The time limit passed before any feasible plan was found.
    #[error("no feasible plan found within the time limit of {0} s")]
    NoPlanInTime(f64),
    /// A number of a problem built in code is out of its range ([`crate::limits`]):
    /// refused before a model of that size is built.
    #[error("{field}: {range}")]
    OutOfRange {
        /// Which number: the field, with the app or the values it goes with.
        field: String,
        /// What its range is.
        range: crate::limits::RangeError,
    },
}

/// A MILP under construction: variables (whose creation order is kept, to read
/// HiGHS's columns back), constraints and the objective.
pub struct Milp {
    vars: ProblemVariables,
    index: HashMap<Variable, usize>,
    constraints: Vec<good_lp::Constraint>,
    switches: Vec<(&'static str, bool)>,
    limits: Vec<(&'static str, i32)>,
    start: Vec<(Variable, f64)>,
}

impl Default for Milp {
    fn default() -> Self {
        Milp {
            vars: ProblemVariables::new(),
            index: HashMap::new(),
            constraints: Vec::new(),
            switches: Vec::new(),
            limits: Vec::new(),
            start: Vec::new(),
        }
    }
}

/// Values of a solved model's variables.
pub struct Values {
    columns: Vec<f64>,
    index: HashMap<Variable, usize>,
    bound: Option<f64>,
}

impl Solution for Values {
    fn status(&self) -> SolutionStatus {
        SolutionStatus::Optimal
    }

    /// The variable's value (0 for a variable of another model).
    fn value(&self, variable: Variable) -> f64 {
        self.index.get(&variable).and_then(|&i| self.columns.get(i)).copied().unwrap_or(0.0)
    }
}

impl Values {
    /// A binary variable's value, rounded (HiGHS returns integers within a tolerance).
    pub fn is_set(&self, v: Variable) -> bool {
        self.value(v) > 0.5
    }

    /// The solver's bound on the objective (HiGHS's `mip_dual_bound`: no plan is
    /// better than it), where HiGHS reports one; the objective itself for a model
    /// decided without HiGHS.
    pub fn bound(&self) -> Option<f64> {
        self.bound
    }
}

/// Whether to maximise or minimise.
#[derive(Clone, Copy, Debug)]
pub enum Sense {
    /// Maximise the objective.
    Maximise,
    /// Minimise the objective.
    Minimise,
}

impl Milp {
    /// Adds a variable.
    pub fn add(&mut self, def: VariableDefinition) -> Variable {
        let v = self.vars.add(def);
        self.index.insert(v, self.index.len());
        v
    }

    /// Variables added so far.
    pub fn variables(&self) -> usize {
        self.index.len()
    }

    /// Constraints added so far.
    pub fn constraints(&self) -> usize {
        self.constraints.len()
    }

    /// Sets a boolean HiGHS option for this model's solve (e.g.
    /// `mip_allow_restart`): search-strategy switches a model's author has measured
    /// on that model. They change how HiGHS searches, not the time limit or gap.
    pub fn switch(&mut self, option: &'static str, on: bool) {
        self.switches.push((option, on));
    }

    /// Sets an integer HiGHS search option for this model's solve (e.g.
    /// `mip_pool_soft_limit`): like [`Milp::switch`], measured on the model, never the
    /// time limit or gap.
    pub fn limit(&mut self, option: &'static str, value: i32) {
        self.limits.push((option, value));
    }

    /// Proposes `value` for `v` in a starting plan (HiGHS's `setSolution`): a
    /// feasible start gives the branch and bound an incumbent from the first node,
    /// so a solve under a gap stops as soon as the bound is close to it. Variables
    /// given no value start at 0. A start HiGHS refuses, or finds infeasible, is
    /// ignored: it only ever saves time.
    pub fn start(&mut self, v: Variable, value: f64) {
        self.start.push((v, value));
    }

    /// Adds a constraint.
    pub fn constrain(&mut self, c: good_lp::Constraint) {
        self.constraints.push(c);
    }

    /// Solves with `settings`: `Ok((report, Some(values)))` with a plan, `Ok((report,
    /// None))` when the model is infeasible.
    ///
    /// Any model is answered without a panic: a model with no variables is decided
    /// here (its constraints are constants, HiGHS leaves such a model's solution
    /// status undefined and its Rust bindings panic reading it), and HiGHS's answers
    /// are read through the calls that return errors rather than panic.
    pub fn solve(
        self,
        sense: Sense,
        objective: Expression,
        settings: &SolverSettings,
    ) -> Result<(SolveReport, Option<Values>), SolveError> {
        if self.index.is_empty() {
            return Ok(self.solve_constant(&objective));
        }
        let Milp { vars, index, constraints, switches, limits, start } = self;
        let variables = index.len();
        let rows = constraints.len();
        let mut problem = match sense {
            Sense::Maximise => vars.maximise(objective),
            Sense::Minimise => vars.minimise(objective),
        }
        .using(highs);
        for c in constraints {
            problem.add_constraint(c);
        }
        let mut model = problem.try_into_inner().map_err(|e| SolveError::Highs(e.to_string()))?;
        model.make_quiet();
        let set = |m: &mut highs::Model, k: &str, v: f64| {
            m.try_set_option(k, v).map_err(|e| SolveError::Highs(format!("option {k}: {e:?}")))
        };
        set(&mut model, "time_limit", settings.time_limit_s)?;
        set(&mut model, "mip_rel_gap", settings.mip_gap)?;
        for (option, on) in switches {
            model.try_set_option(option, on).map_err(|e| SolveError::Highs(format!("option {option}: {e:?}")))?;
        }
        for (option, value) in limits {
            model.try_set_option(option, value).map_err(|e| SolveError::Highs(format!("option {option}: {e:?}")))?;
        }
        // Clamped as well as validated: HiGHS starts this many scheduler workers
        // whatever the machine has, and aborts the process on 100,000.
        let threads = settings.threads.clamp(*crate::limits::THREADS.start(), *crate::limits::THREADS.end());
        model.set_threads(NonZeroU32::new(threads).unwrap_or(NonZeroU32::MIN));
        if !start.is_empty() {
            let mut cols = vec![0.0; variables];
            for (v, x) in &start {
                if let Some(&i) = index.get(v) {
                    cols[i] = *x;
                }
            }
            // A refused start costs nothing but the time it would have saved.
            let _ = model.try_set_solution(Some(&cols), None, None, None);
        }
        let started = Instant::now();
        let solved = model.try_solve().map_err(|e| SolveError::Highs(format!("{e:?}")))?;
        let solve_seconds = started.elapsed().as_secs_f64();
        use highs::HighsModelStatus as H;
        // `primal_solution_status()` and `mip_gap()` panic where HiGHS has no such
        // information (an empty model): read them as values that may be missing.
        let feasible = solved
            .int_info_value(c"primal_solution_status")
            .ok()
            .and_then(|v| highs::HighsSolutionStatus::try_from(v as std::os::raw::c_int).ok())
            == Some(highs::HighsSolutionStatus::Feasible);
        let status = match solved.status() {
            H::Optimal | H::ObjectiveBound | H::ObjectiveTarget => SolveStatus::Optimal,
            H::Infeasible | H::UnboundedOrInfeasible => SolveStatus::Infeasible,
            H::ReachedTimeLimit
            | H::ReachedIterationLimit
            | H::ReachedSolutionLimit
            | H::ReachedInterrupt
            | H::ReachedMemoryLimit => {
                if feasible {
                    SolveStatus::TimeLimit
                } else {
                    return Err(SolveError::NoPlanInTime(settings.time_limit_s));
                }
            }
            other => return Err(SolveError::Highs(format!("model status {other:?}"))),
        };
        let report = |objective: Option<f64>, gap: Option<f64>| SolveReport {
            status,
            objective,
            gap,
            solve_seconds,
            variables,
            constraints: rows,
        };
        if status == SolveStatus::Infeasible {
            return Ok((report(None, None), None));
        }
        // A pure LP (no integer columns) reports an infinite MIP gap: it is exact.
        let gap = solved.double_info_value(c"mip_gap").unwrap_or(0.0);
        let gap = if gap.is_finite() { gap.max(0.0) } else { 0.0 };
        let columns = solved.get_solution().columns().to_vec();
        if columns.len() != variables {
            return Err(SolveError::Highs(format!("{} columns in the solution of {variables}", columns.len())));
        }
        let bound = solved.double_info_value(c"mip_dual_bound").ok().filter(|b| b.is_finite());
        Ok((report(Some(solved.objective_value()), Some(gap)), Some(Values { columns, index, bound })))
    }

    /// A model without variables: each constraint is a constant that holds or not
    /// (good_lp keeps it as `constant ≤ 0` or `constant = 0`), and the objective is
    /// its constant. Within HiGHS's default feasibility tolerance, 1e-7.
    fn solve_constant(self, objective: &Expression) -> (SolveReport, Option<Values>) {
        let mut none = Values { columns: Vec::new(), index: HashMap::new(), bound: None };
        let holds = self.constraints.iter().all(|c| {
            let v = c.expression().eval_with(&none);
            if c.is_equality() {
                v.abs() <= 1e-7
            } else {
                v <= 1e-7
            }
        });
        let status = if holds { SolveStatus::Optimal } else { SolveStatus::Infeasible };
        let report = SolveReport {
            status,
            objective: holds.then(|| objective.eval_with(&none)),
            gap: holds.then_some(0.0),
            solve_seconds: 0.0,
            variables: 0,
            constraints: self.constraints.len(),
        };
        none.bound = report.objective;
        (report, holds.then_some(none))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use good_lp::{constraint, variable};

    #[test]
    fn a_small_knapsack_is_solved_and_reported() {
        // max 5a + 4b + 3c, 2a + 3b + c <= 5, binaries: a + c (value 8) beats a + b (9?
        // no: weight 5, value 9). The optimum is a + b = 9.
        let mut m = Milp::default();
        let a = m.add(variable().binary());
        let b = m.add(variable().binary());
        let c = m.add(variable().binary());
        m.constrain(constraint!(2 * a + 3 * b + c <= 5));
        let objective: Expression = 5 * a + 4 * b + 3 * c;
        let (report, values) = m.solve(Sense::Maximise, objective.clone(), &SolverSettings::default()).unwrap();
        let values = values.unwrap();
        assert_eq!(report.status, SolveStatus::Optimal);
        assert!((report.objective.unwrap() - 9.0).abs() < 1e-6, "{report:?}");
        assert!((objective.eval_with(&values) - 9.0).abs() < 1e-6);
        assert!(values.is_set(a) && values.is_set(b) && !values.is_set(c));
        assert_eq!((report.variables, report.constraints), (3, 1));
        assert_eq!(report.gap, Some(0.0));
    }

    #[test]
    fn infeasible_models_say_so() {
        let mut m = Milp::default();
        let a = m.add(variable().binary());
        m.constrain(constraint!(a >= 2));
        let (report, values) = m.solve(Sense::Minimise, a.into(), &SolverSettings::default()).unwrap();
        assert_eq!(report.status, SolveStatus::Infeasible);
        assert!(values.is_none() && report.objective.is_none());
    }

    #[test]
    fn switches_reach_highs() {
        // A known switch leaves the optimum as it is; an unknown one is HiGHS's error.
        let model = |option: &'static str| {
            let mut m = Milp::default();
            let a = m.add(variable().integer().min(0).max(3));
            m.switch(option, false);
            (m, a)
        };
        let (m, a) = model("mip_allow_restart");
        let (report, _) = m.solve(Sense::Maximise, a.into(), &SolverSettings::default()).unwrap();
        assert_eq!(report.objective, Some(3.0));
        let (m, a) = model("no_such_option");
        let error = m.solve(Sense::Maximise, a.into(), &SolverSettings::default()).err().expect("an error");
        assert!(error.to_string().contains("no_such_option"), "{error}");
        let mut m = Milp::default();
        let a = m.add(variable().integer().min(0).max(3));
        m.limit("mip_pool_soft_limit", 30);
        let (report, _) = m.solve(Sense::Maximise, a.into(), &SolverSettings::default()).unwrap();
        assert_eq!(report.objective, Some(3.0));
        let mut m = Milp::default();
        let a = m.add(variable().integer().min(0).max(3));
        m.limit("no_such_limit", 1);
        let error = m.solve(Sense::Maximise, a.into(), &SolverSettings::default()).err().expect("an error");
        assert!(error.to_string().contains("no_such_limit"), "{error}");
    }

    #[test]
    fn settings_are_checked() {
        let bad = SolverSettings { time_limit_s: 0.0, ..SolverSettings::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("time_limit_s"));
        let bad = SolverSettings { time_limit_s: 1e12, ..SolverSettings::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("time_limit_s"));
        let bad = SolverSettings { mip_gap: -1.0, ..SolverSettings::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("mip_gap"));
        let bad = SolverSettings { mip_gap: 2.0, ..SolverSettings::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("mip_gap"));
        for soft in [-1.0, f64::NAN, 1e12] {
            let bad = SolverSettings { soft_limit_s: soft, ..SolverSettings::default() };
            assert!(bad.validate().unwrap_err().to_string().contains("soft_limit_s"));
        }
        assert!(SolverSettings { soft_limit_s: 0.0, ..SolverSettings::default() }.validate().is_ok());
        // 100,000 HiGHS threads abort the process with std::bad_alloc.
        for threads in [0, 257, 100_000] {
            let bad = SolverSettings { threads, ..SolverSettings::default() };
            let e = bad.validate().unwrap_err();
            assert_eq!(e, SettingsError::Threads(threads));
            assert_eq!(e.to_string(), "threads: expected 1 to 256 threads");
        }
        assert!(SolverSettings { threads: 256, ..SolverSettings::default() }.validate().is_ok());
    }

    #[test]
    fn a_model_without_variables_is_decided_without_highs() {
        // HiGHS leaves an empty model's solution status undefined, and its bindings
        // panicked reading it (a problem where no device can host any variant).
        let feasible = |c: good_lp::Constraint| {
            let mut m = Milp::default();
            m.constrain(c);
            let objective = Expression::from(2.0);
            let (report, values) = m.solve(Sense::Maximise, objective, &SolverSettings::default()).unwrap();
            assert_eq!((report.variables, report.constraints), (0, 1));
            assert_eq!(values.is_some(), report.status == SolveStatus::Optimal);
            report
        };
        let zero = Expression::from(0.0);
        let r = feasible(constraint!(zero.clone() == 1));
        assert_eq!((r.status, r.objective), (SolveStatus::Infeasible, None));
        let r = feasible(constraint!(zero.clone() <= 3));
        assert_eq!((r.status, r.objective, r.gap), (SolveStatus::Optimal, Some(2.0), Some(0.0)));
        let r = feasible(constraint!(zero.clone() >= 3));
        assert_eq!(r.status, SolveStatus::Infeasible);
        let r = feasible(constraint!(zero == 0));
        assert_eq!(r.status, SolveStatus::Optimal);
        // No constraints either: the objective's constant.
        let (r, values) =
            Milp::default().solve(Sense::Minimise, Expression::from(0.0), &SolverSettings::default()).unwrap();
        assert_eq!((r.status, r.objective), (SolveStatus::Optimal, Some(0.0)));
        assert!(values.is_some());
    }

    #[test]
    fn models_highs_reduces_to_nothing_are_answered() {
        // Variables whose constraints presolve removes entirely, and a variable in no
        // constraint: HiGHS solves them without a panic.
        let mut m = Milp::default();
        let a = m.add(variable().integer().min(0).max(0));
        let (r, values) = m.solve(Sense::Maximise, a.into(), &SolverSettings::default()).unwrap();
        assert_eq!((r.status, r.objective), (SolveStatus::Optimal, Some(0.0)));
        assert_eq!(values.unwrap().value(a), 0.0);
        let mut m = Milp::default();
        let a = m.add(variable().min(0).max(1));
        m.constrain(constraint!(a - a >= 1));
        let (r, _) = m.solve(Sense::Maximise, a.into(), &SolverSettings::default()).unwrap();
        assert_eq!(r.status, SolveStatus::Infeasible);
    }
}

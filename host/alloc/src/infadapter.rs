//! InfAdapter's adapter (§3 of the paper): a *set* of model variants, each with a
//! CPU-core count, and the share of the load (quota λ_m) each serves, chosen to
//! maximise α·accuracy − β·cores − γ·loading cost under a core budget B.
//!
//! As the paper states it: AA = Σ_m (λ_m/λ)·acc_m, RC = Σ_m n_m, LC = max_m
//! tc(m)·rt_m (the loading time of the variants that must be (re)loaded);
//! λ ≤ Σ_m th_m(n_m), λ_m ≤ th_m(n_m), RC ≤ B. The reference (`auto_tuner/adapter/
//! reconfig.py` of the artifact) divides RC by B and LC by the largest loading
//! time, weighs accuracy by 1, cores by its `ALPHA` (0.05) and loading by its
//! `BETA` (0.001) — the paper's β and γ under other names —, and gives a variant in
//! use at least 2 cores; a variant costs loading when it is used and its core count
//! changes (a resize recreates its pod). All of that is followed here. th_m(n)
//! is the reference's capacity model: a linear fit of the measured capacity at the
//! SLA against cores, intercept truncated, scaled by 0.8 and floored ([`fit`]).
//!
//! The reference leaves the products and the max to Gurobi's general constraints;
//! here each variant's core count is chosen among {0} ∪ [min_cores, B] by binaries,
//! which makes th_m(n), n and the loading indicator linear, exactly. One reference
//! detail is not followed: its quota variables are bounded below by 0 in a way that
//! forbids spare capacity on every variant but the least accurate (docs/allocator.md
//! shows the decisions that changes); a plan here may keep spare capacity anywhere.
//! Demand beyond the budget is shed down the same ladder as Proteus's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use good_lp::{constraint, variable, Expression, Solution as _, Variable};
use serde::{Deserialize, Serialize};

use crate::ladder::{Ladder, Search, Tried};
use crate::solver::{Milp, Sense, SolveError, SolveReport, SolverSettings, Status};

/// A variant: its accuracy, its loading time and its capacity model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Variant {
    /// Its name.
    pub name: String,
    /// Accuracy in [0, 1].
    pub accuracy: f64,
    /// Seconds to load it (a pod start, in InfAdapter).
    pub load_time_s: f64,
    /// Capacity slope, requests/s per core.
    pub slope: f64,
    /// Capacity intercept, requests/s (already truncated as the reference does).
    pub intercept: f64,
}

impl Variant {
    /// th(n): requests/s sustained within the SLA on `n` cores, as the reference
    /// plans with it: ⌊max(0, coef·(slope·n + intercept))⌋, 0 for no cores.
    pub fn throughput(&self, cores: u32, capacity_coef: f64) -> f64 {
        if cores == 0 {
            return 0.0;
        }
        (capacity_coef * (self.slope * cores as f64 + self.intercept)).max(0.0).floor()
    }
}

/// The objective's weights (the paper's α, β, γ).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    /// `accuracy = 1.0`: α, on the average accuracy (a fraction).
    #[serde(default = "one")]
    pub accuracy: f64,
    /// `cores = 0.05`: β, on the cores used as a fraction of the budget.
    #[serde(default = "default_cores_weight")]
    pub cores: f64,
    /// `loading = 0.001`: γ, on the loading time as a fraction of the longest.
    #[serde(default = "default_loading_weight")]
    pub loading: f64,
}

fn one() -> f64 {
    1.0
}
fn default_cores_weight() -> f64 {
    0.05
}
fn default_loading_weight() -> f64 {
    0.001
}

impl Default for Weights {
    fn default() -> Self {
        Weights { accuracy: 1.0, cores: default_cores_weight(), loading: default_loading_weight() }
    }
}

/// An InfAdapter problem.
#[derive(Clone, Debug)]
pub struct Problem {
    /// The variants.
    pub variants: Vec<Variant>,
    /// The load to serve (λ), requests/s: InfAdapter's forecast of the next
    /// minute's peak, plus its 10 % margin.
    pub demand_rps: f64,
    /// The core budget B (cores are costed as a fraction of it).
    pub budget_cores: u32,
    /// Cores a plan may use, at most, when fewer than B (the reference caps them at
    /// what the most accurate variant alone needs for λ; `cores::plan`).
    pub usable_cores: Option<u32>,
    /// One variant only (Model-Switching+, InfAdapter §5: the same objective over
    /// single-variant plans).
    pub single: bool,
    /// Cores of a variant in use, at least (the reference's 2).
    pub min_cores: u32,
    /// Cores each variant has now (absent: not loaded).
    pub current: BTreeMap<String, u32>,
    /// The capacity scaling the reference plans with (0.8).
    pub capacity_coef: f64,
    /// Weights.
    pub weights: Weights,
    /// Demand lowering when even the budget cannot serve λ (starts at 1: no headroom;
    /// InfAdapter's margin is in its forecast).
    pub ladder: Ladder,
    /// Solver limits.
    pub solver: SolverSettings,
}

/// One variant in a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VariantPlan {
    /// The variant.
    pub name: String,
    /// Its cores (0: not used).
    pub cores: u32,
    /// Requests/s routed to it (λ_m).
    pub quota_rps: f64,
    /// th(cores).
    pub capacity_rps: f64,
    /// Whether the plan (re)loads it.
    pub loads: bool,
}

/// An InfAdapter plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The demand factor it was solved at.
    pub beta: f64,
    /// Per variant, in the problem's order.
    pub variants: Vec<VariantPlan>,
    /// Cores used.
    pub cores: u32,
    /// Requests/s served.
    pub served_rps: f64,
    /// Requests/s shed.
    pub shed_rps: f64,
    /// Average accuracy of what is served.
    pub accuracy: f64,
    /// The loading cost, s (the longest load the plan needs).
    pub loading_s: f64,
    /// α·AA − β·RC/B − γ·LC/max rt.
    pub objective: f64,
}

/// What [`solve`] returns.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The report of the solve that produced the plan (the last one when none did).
    pub report: SolveReport,
    /// Factors tried and how each ended.
    pub attempts: Vec<Tried>,
    /// The plan (None: infeasible down to the ladder's minimum).
    pub plan: Option<Plan>,
}

/// Core counts a variant may get: 0 or min_cores..=budget.
fn core_options(p: &Problem) -> Vec<u32> {
    std::iter::once(0).chain(p.min_cores.max(1)..=p.budget_cores).collect()
}

/// Solves the problem down the ladder. A budget or demand out of its range
/// ([`crate::limits`]; a problem file refuses them as it is read) is refused before
/// the model, one binary per variant and core count, is built.
pub fn solve(problem: &Problem) -> Result<Outcome, SolveError> {
    use crate::limits::{self, span, within, CORES};
    if !CORES.contains(&problem.budget_cores) || problem.min_cores > *CORES.end() {
        return Err(SolveError::OutOfRange(format!(
            "cores {} (min_cores {}): expected a budget of {} cores",
            problem.budget_cores,
            problem.min_cores,
            span(&CORES)
        )));
    }
    if !within(problem.demand_rps, limits::MAX_DEMAND_QPS) {
        return Err(SolveError::OutOfRange(format!(
            "demand_rps: expected 0 to {:e} requests/s",
            limits::MAX_DEMAND_QPS
        )));
    }
    // `time_limit_s` bounds the whole allocation, every step of the ladder together
    // (issue 34; as `proteus::solve`): each solve gets the time left, and one that
    // runs out of it without a plan counts as a step without one.
    let deadline = Instant::now() + Duration::from_secs_f64(problem.solver.time_limit_s.clamp(0.0, 1e7));
    let ladder = Ladder { search: Search::Descend, ..problem.ladder.clone() };
    let mut ran_out = false;
    let d = ladder.search(deadline, |beta, left| {
        let p = Problem { solver: SolverSettings { time_limit_s: left, ..problem.solver.clone() }, ..problem.clone() };
        match solve_at(&p, beta.min(1.0)) {
            Err(SolveError::NoPlanInTime(s)) => {
                ran_out = true;
                Ok((SolveReport { status: Status::TimeLimit, solve_seconds: s, ..SolveReport::none() }, None))
            }
            other => other,
        }
    })?;
    if d.plan.is_none() && (d.timed_out || ran_out) {
        return Err(SolveError::NoPlanInTime(problem.solver.time_limit_s));
    }
    Ok(Outcome { report: d.report, attempts: d.tried, plan: d.plan })
}

fn solve_at(problem: &Problem, beta: f64) -> Result<(SolveReport, Option<Plan>), SolveError> {
    let options = core_options(problem);
    let lambda = problem.demand_rps;
    let served = lambda * beta;
    let max_rt = problem.variants.iter().map(|v| v.load_time_s).fold(0.0, f64::max).max(1e-9);
    let mut m = Milp::default();
    // y[v][k]: variant v gets options[k] cores.
    let y: Vec<Vec<Variable>> =
        problem.variants.iter().map(|_| options.iter().map(|_| m.add(variable().binary())).collect()).collect();
    let quota: Vec<Variable> = problem.variants.iter().map(|_| m.add(variable().min(0))).collect();
    let lc = m.add(variable().min(0));
    let mut cores = Expression::default();
    for (v, variant) in problem.variants.iter().enumerate() {
        let pick: Expression = y[v].iter().copied().sum();
        m.constrain(constraint!(pick == 1));
        let th: Expression =
            options.iter().zip(&y[v]).map(|(&n, &yv)| variant.throughput(n, problem.capacity_coef) * yv).sum();
        m.constrain(constraint!(quota[v] <= th));
        cores += options.iter().zip(&y[v]).map(|(&n, &yv)| n as f64 * yv).sum::<Expression>();
        // Loading: used (not 0 cores) and not kept at its current count.
        let current = problem.current.get(&variant.name).copied().unwrap_or(0);
        let mut unchanged: Expression = y[v][0].into();
        if current > 0 {
            if let Some(k) = options.iter().position(|&n| n == current) {
                unchanged += y[v][k];
            }
        }
        m.constrain(constraint!(lc >= variant.load_time_s - variant.load_time_s * unchanged));
    }
    let usable = problem.usable_cores.unwrap_or(problem.budget_cores).min(problem.budget_cores);
    m.constrain(constraint!(cores.clone() <= usable as f64));
    if problem.single {
        // At most one variant off its 0-core option.
        let used: Expression = y.iter().map(|yv| 1.0 - yv[0]).sum();
        m.constrain(constraint!(used <= 1.0));
    }
    let total: Expression = quota.iter().copied().sum();
    m.constrain(constraint!(total == served));
    let w = &problem.weights;
    let accuracy: Expression =
        problem.variants.iter().zip(&quota).map(|(v, &q)| (v.accuracy / lambda.max(1e-12)) * q).sum();
    let objective: Expression =
        w.accuracy * accuracy - (w.cores / problem.budget_cores.max(1) as f64) * cores - (w.loading / max_rt) * lc;
    let (report, values) = m.solve(Sense::Maximise, objective, &problem.solver)?;
    let Some(values) = values else { return Ok((report, None)) };
    let mut variants = Vec::new();
    let mut used_cores = 0;
    let mut loading: f64 = 0.0;
    let mut acc_mass = 0.0;
    for (v, variant) in problem.variants.iter().enumerate() {
        let k = y[v].iter().position(|&yv| values.is_set(yv)).unwrap_or(0);
        let n = options[k];
        let q = values.value(quota[v]).max(0.0);
        let current = problem.current.get(&variant.name).copied().unwrap_or(0);
        let loads = n > 0 && n != current;
        if loads {
            loading = loading.max(variant.load_time_s);
        }
        used_cores += n;
        acc_mass += q * variant.accuracy;
        variants.push(VariantPlan {
            name: variant.name.clone(),
            cores: n,
            quota_rps: q,
            capacity_rps: variant.throughput(n, problem.capacity_coef),
            loads,
        });
    }
    let plan = Plan {
        beta,
        cores: used_cores,
        served_rps: served,
        shed_rps: lambda - served,
        accuracy: if served > 0.0 { acc_mass / served } else { 0.0 },
        loading_s: loading,
        objective: w.accuracy * acc_mass / lambda.max(1e-12)
            - w.cores * used_cores as f64 / problem.budget_cores.max(1) as f64
            - w.loading * loading / max_rt,
        variants,
    };
    Ok((report, Some(plan)))
}

/// The reference's capacity model for one variant: a least-squares line through
/// (cores, measured capacity) at the SLA for the fit's core counts, its intercept
/// truncated toward zero after capping at 0.99 (`int(min(intercept, 0.99))` in
/// `reconfig.py`). Returns (slope, intercept); None with fewer than two points.
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let slope = sxy / sxx;
    let intercept = (my - slope * mx).min(0.99).trunc();
    Some((slope, intercept))
}

/// `[weights]`: finite, 0 to 1e6 each.
pub(crate) fn check_weights(w: &Weights) -> Result<(), String> {
    if ![w.accuracy, w.cores, w.loading].iter().all(|&x| crate::limits::within(x, crate::limits::MAX_FACTOR)) {
        return Err(format!("expected weights from 0 to {:e}", crate::limits::MAX_FACTOR));
    }
    Ok(())
}

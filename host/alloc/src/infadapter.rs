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
//!
//! When no MILP finds a plan within the allocation's time limit, [`solve_from`]
//! still answers with one made without a solver ([`crate::origin::Origin`]): the
//! previous plan's cores re-routed for the new demand (spare cores added where it
//! falls short), or the greedy plan — the fewest cores that carry the demand with one
//! variant or two, quotas filled most accurate first (λ_m ≤ th_m(n_m), Σ λ_m = λ, RC ≤
//! B: the constraints of Eq. 1) — each checked with [`Plan::check`].

use crate::violation::Violation;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use good_lp::{constraint, variable, Expression, Solution as _, Variable};
use serde::{Deserialize, Serialize};

use crate::ladder::{Ladder, Search, Tried};
use crate::origin::{self, Origin};
use crate::solver::{Milp, Sense, SolveError, SolveReport, SolveStatus, SolverSettings};

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

/// What [`solve`] returns: the plan, if any, and how it was found. Named for the
/// solve, so that `Outcome` stays a request's (`sluice_core::outcome::Outcome`).
#[derive(Clone, Debug, Serialize)]
pub struct Solved {
    /// The report of the solve that produced the plan (the last one when none did).
    pub report: SolveReport,
    /// Factors tried and how each ended.
    pub attempts: Vec<Tried>,
    /// The plan (None: infeasible down to the ladder's minimum).
    pub plan: Option<Plan>,
    /// Where the plan came from: the ILP's, or, when none found one within the time
    /// limit, the greedy plan or the previous one repaired ([`solve_from`]).
    pub origin: Origin,
}

/// Core counts a variant may get: 0 or min_cores..=budget.
fn core_options(p: &Problem) -> Vec<u32> {
    std::iter::once(0).chain(p.min_cores.max(1)..=p.budget_cores).collect()
}

/// Cores a plan may use: the budget, or fewer where the problem caps them.
fn usable_cores(p: &Problem) -> u32 {
    p.usable_cores.unwrap_or(p.budget_cores).min(p.budget_cores)
}

/// Tolerance of [`Plan::check`] on requests/s (HiGHS's feasibility tolerance is
/// 1e-7 on rows whose coefficients are about 1).
const RPS_TOLERANCE: f64 = 1e-6;

impl Plan {
    /// Checks the plan against the ILP's constraints (Eq. 1 as written here): one
    /// entry per variant in the problem's order, each with 0 or `min_cores` to B cores
    /// and a quota within its capacity th(n) (none on 0 cores); Σ n ≤ the usable
    /// cores; at most one variant used for Model-Switching+; Σ λ_m the served demand,
    /// λ·min(β, 1), with β a step of the ladder; the loading, accuracy and objective
    /// as the ILP computes them. Every plan [`solve_from`] returns meets it, a
    /// solver's or not. The error names the variant or the row.
    pub fn check(&self, problem: &Problem) -> Result<(), Violation> {
        if self.variants.len() != problem.variants.len()
            || self.variants.iter().zip(&problem.variants).any(|(a, b)| a.name != b.name)
        {
            return Err(Violation::Shape("expected one entry per variant, in the problem's order".into()));
        }
        let lambda = problem.demand_rps;
        let steps = problem.ladder.steps();
        if !steps.iter().any(|&b| (b.min(1.0) - self.beta).abs() < 1e-9) {
            return Err(Violation::Constraint(format!("beta {}: not a step of the ladder", self.beta)));
        }
        let served = lambda * self.beta;
        let tol = |x: f64| RPS_TOLERANCE * x.abs().max(1.0);
        let mut expected = vec![0u32; self.variants.len()];
        for (v, (vp, variant)) in self.variants.iter().zip(&problem.variants).enumerate() {
            let n = vp.cores;
            if n > problem.budget_cores || (n > 0 && n < problem.min_cores) {
                return Err(Violation::Constraint(format!(
                    "variant {}: {n} cores, expected 0 or {} to {}",
                    vp.name, problem.min_cores, problem.budget_cores
                )));
            }
            let th = variant.throughput(n, problem.capacity_coef);
            if (vp.capacity_rps - th).abs() > tol(th) {
                return Err(Violation::Reported(format!(
                    "variant {}: capacity {} is not th({n}) = {th}",
                    vp.name, vp.capacity_rps
                )));
            }
            if !(vp.quota_rps >= -tol(0.0) && vp.quota_rps <= th + tol(th)) {
                return Err(Violation::Constraint(format!(
                    "variant {}: quota {} outside [0, th({n}) = {th}]",
                    vp.name, vp.quota_rps
                )));
            }
            let current = problem.current.get(&vp.name).copied().unwrap_or(0);
            if vp.loads != (n > 0 && n != current) {
                return Err(Violation::Reported(format!(
                    "variant {}: loads {} with {n} cores and {current} now",
                    vp.name, vp.loads
                )));
            }
            expected[v] = n;
        }
        let cores: u32 = expected.iter().sum();
        if cores != self.cores || cores > usable_cores(problem) {
            return Err(Violation::Constraint(format!(
                "{} cores used (entries: {cores}), at most {}",
                self.cores,
                usable_cores(problem)
            )));
        }
        if problem.single && expected.iter().filter(|&&n| n > 0).count() > 1 {
            return Err(Violation::Constraint("Model-Switching+: more than one variant used".into()));
        }
        let total: f64 = self.variants.iter().map(|v| v.quota_rps).sum();
        if (total - served).abs() > tol(served) || (self.served_rps - served).abs() > tol(served) {
            return Err(Violation::Constraint(format!(
                "quotas sum to {total} req/s, served {}, expected {served}",
                self.served_rps
            )));
        }
        if (self.shed_rps - (lambda - served)).abs() > tol(lambda) {
            return Err(Violation::Reported(format!("shed {} req/s, expected {}", self.shed_rps, lambda - served)));
        }
        let quotas: Vec<f64> = self.variants.iter().map(|v| v.quota_rps).collect();
        let again = build_plan(problem, self.beta, &expected, &quotas);
        if (again.objective - self.objective).abs() > 1e-6
            || (again.accuracy - self.accuracy).abs() > 1e-6
            || (again.loading_s - self.loading_s).abs() > 1e-9
        {
            return Err(Violation::Reported(format!(
                "objective {} / accuracy {} / loading {} s, expected {} / {} / {}",
                self.objective, self.accuracy, self.loading_s, again.objective, again.accuracy, again.loading_s
            )));
        }
        Ok(())
    }
}

/// The plan of `cores` and `quotas` per variant (the problem's order) at factor
/// `beta` (≤ 1), with its loading, accuracy and objective as the ILP counts them:
/// one implementation for the ILP's plans, the greedy and repaired ones, and
/// [`Plan::check`].
fn build_plan(problem: &Problem, beta: f64, cores: &[u32], quotas: &[f64]) -> Plan {
    let lambda = problem.demand_rps;
    let served = lambda * beta;
    let max_rt = problem.variants.iter().map(|v| v.load_time_s).fold(0.0, f64::max).max(1e-9);
    let w = &problem.weights;
    let mut variants = Vec::new();
    let mut loading: f64 = 0.0;
    let mut acc_mass = 0.0;
    for ((variant, &n), &q) in problem.variants.iter().zip(cores).zip(quotas) {
        let current = problem.current.get(&variant.name).copied().unwrap_or(0);
        let loads = n > 0 && n != current;
        if loads {
            loading = loading.max(variant.load_time_s);
        }
        acc_mass += q * variant.accuracy;
        variants.push(VariantPlan {
            name: variant.name.clone(),
            cores: n,
            quota_rps: q,
            capacity_rps: variant.throughput(n, problem.capacity_coef),
            loads,
        });
    }
    let used_cores: u32 = cores.iter().sum();
    Plan {
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
    }
}

/// Solves the problem down the ladder. A budget or demand out of its range
/// ([`crate::limits`]; a problem file refuses them as it is read) is refused before
/// the model, one binary per variant and core count, is built. When no ILP finds a
/// plan within the time limit, the greedy plan ([`solve_from`] with no previous plan).
pub fn solve(problem: &Problem) -> Result<Solved, SolveError> {
    solve_from(problem, None)
}

/// [`solve`], with the plan in force. `time_limit_s` bounds the whole allocation
/// (issue 34), and when it passes with no ILP's plan the answer is still a plan:
/// `previous` repaired (its cores kept, quotas re-routed for the new demand, spare
/// cores added to one of its variants where it falls short) or the greedy plan
/// ([`greedy`]), whichever serves the higher demand factor (then the higher
/// objective; the repaired one on a tie: it loads nothing), checked with
/// [`Plan::check`] and marked in [`Solved::origin`]. `NoPlanInTime` remains only
/// when neither serves even the ladder's lowest step.
pub fn solve_from(problem: &Problem, previous: Option<&Plan>) -> Result<Solved, SolveError> {
    let (outcome, ran_out) = solve_milp(problem)?;
    if outcome.plan.is_some() || !ran_out {
        return Ok(outcome);
    }
    let started = Instant::now();
    let reason = origin::no_plan_in_time(problem.solver.time_limit_s, outcome.attempts.len());
    let repaired = previous.and_then(|p| repaired(problem, p)).map(|p| (p, true));
    let greedy = greedy(problem).map(|p| (p, false));
    let mut best: Option<(Plan, bool)> = None;
    for (plan, is_repair) in [repaired, greedy].into_iter().flatten() {
        if plan.check(problem).is_err() {
            continue;
        }
        if best.as_ref().is_none_or(|(b, _)| better(&plan, b)) {
            best = Some((plan, is_repair));
        }
    }
    let Some((plan, is_repair)) = best else { return Err(SolveError::NoPlanInTime(problem.solver.time_limit_s)) };
    let report = SolveReport::without_solver(plan.objective, started.elapsed().as_secs_f64());
    Ok(Solved {
        report,
        attempts: outcome.attempts,
        plan: Some(plan),
        origin: Origin::without_solver(is_repair, reason),
    })
}

/// Whether `a` is a better plan than `b`: a higher demand factor, then a higher
/// objective (which counts the cores and the loading as well as accuracy).
fn better(a: &Plan, b: &Plan) -> bool {
    a.beta > b.beta + 1e-9 || ((a.beta - b.beta).abs() <= 1e-9 && a.objective > b.objective + 1e-12)
}

/// The ILP down the ladder; `true` when the time limit passed with no plan.
fn solve_milp(problem: &Problem) -> Result<(Solved, bool), SolveError> {
    use crate::limits::{check_demand, RangeError, CORES};
    if !CORES.contains(&problem.budget_cores) || problem.min_cores > *CORES.end() {
        return Err(SolveError::OutOfRange {
            field: format!("cores {} (min_cores {})", problem.budget_cores, problem.min_cores),
            range: RangeError::CoreBudget(problem.budget_cores),
        });
    }
    check_demand(problem.demand_rps).map_err(|range| SolveError::OutOfRange { field: "demand_rps".into(), range })?;
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
                Ok((SolveReport { status: SolveStatus::TimeLimit, solve_seconds: s, ..SolveReport::none() }, None))
            }
            other => other,
        }
    })?;
    let ran_out = d.plan.is_none() && (d.timed_out || ran_out);
    Ok((Solved { report: d.report, attempts: d.tried, plan: d.plan, origin: Origin::Milp }, ran_out))
}

/// Quotas for `cores` (the problem's variant order) that serve `served` req/s,
/// filled most accurate first up to each variant's capacity — for fixed cores the
/// accuracy term's optimum (a fractional knapsack), the rest of the objective being
/// fixed by the cores. None when the cores cannot carry it.
fn route(problem: &Problem, cores: &[u32], served: f64) -> Option<Vec<f64>> {
    let mut order: Vec<usize> = (0..problem.variants.len()).collect();
    order.sort_by(|&a, &b| problem.variants[b].accuracy.total_cmp(&problem.variants[a].accuracy).then(a.cmp(&b)));
    let mut quotas = vec![0.0; cores.len()];
    let mut left = served.max(0.0);
    for v in order {
        let q = problem.variants[v].throughput(cores[v], problem.capacity_coef).min(left);
        quotas[v] = q;
        left -= q;
    }
    // Served exactly: the last quota takes what rounding left.
    (left <= RPS_TOLERANCE * served.max(1.0)).then_some(quotas)
}

/// The plan with `cores` at the highest step of the ladder they carry (β capped at 1,
/// as the ILP's steps are), routed by [`route`]; None below the ladder's floor.
fn at_highest_step(problem: &Problem, cores: &[u32]) -> Option<Plan> {
    let capacity: f64 = problem.variants.iter().zip(cores).map(|(v, &n)| v.throughput(n, problem.capacity_coef)).sum();
    let beta = problem.ladder.steps().into_iter().map(|b| b.min(1.0)).find(|b| {
        let served = problem.demand_rps * b;
        served <= capacity + RPS_TOLERANCE * served.max(1.0)
    })?;
    let quotas = route(problem, cores, problem.demand_rps * beta)?;
    Some(build_plan(problem, beta, cores, &quotas))
}

/// Per variant and core count n (0 to `most`), the fewest cores whose capacity is at
/// least th(n) — th is a line through the measured points, but floored and cut at
/// 0, so the running maximum is what a search for "enough cores" needs.
struct Capacities {
    /// `best[v][n]`: the largest th(m) for an allowed m ≤ n.
    best: Vec<Vec<f64>>,
    /// `at[v][n]`: the fewest allowed cores reaching `best[v][n]`.
    at: Vec<Vec<u32>>,
}

impl Capacities {
    fn new(problem: &Problem, most: u32) -> Capacities {
        let (mut best, mut at) = (Vec::new(), Vec::new());
        for v in &problem.variants {
            let (mut b, mut a) = (vec![0.0; most as usize + 1], vec![0u32; most as usize + 1]);
            for n in 1..=most {
                let i = n as usize;
                (b[i], a[i]) = (b[i - 1], a[i - 1]);
                let th = v.throughput(n, problem.capacity_coef);
                if n >= problem.min_cores.max(1) && th > b[i] {
                    (b[i], a[i]) = (th, n);
                }
            }
            best.push(b);
            at.push(a);
        }
        Capacities { best, at }
    }

    /// The fewest cores, at most `most`, with which variant `v` serves `rps`.
    fn fewest(&self, v: usize, rps: f64, most: u32) -> Option<u32> {
        if rps <= 0.0 {
            return Some(0);
        }
        let b = &self.best[v][..=most as usize];
        let i = b.partition_point(|&x| x + RPS_TOLERANCE * rps.max(1.0) < rps);
        (i < b.len()).then(|| self.at[v][i])
    }
}

/// InfAdapter's greedy plan, in closed form: the highest step of the ladder that one
/// variant or two can carry on the usable cores, then, at that step, the fewest cores
/// that carry it — each variant alone (Model-Switching+'s rule), and for a set, every
/// split of the cores between two variants with the second given the fewest cores
/// that carry the rest — quotas filled most accurate first, the best objective kept.
/// O(V²·B·log B): a few milliseconds at B = 4,096. None when even the ladder's
/// lowest step is more than any of these carries.
pub fn greedy(problem: &Problem) -> Option<Plan> {
    let usable = usable_cores(problem);
    let k = problem.variants.len();
    let caps = Capacities::new(problem, usable);
    let pairs = |f: &mut dyn FnMut(usize, usize, u32)| {
        if problem.single {
            return;
        }
        for a in 0..k {
            for b in (0..k).filter(|&b| b != a) {
                for na in problem.min_cores.max(1)..usable {
                    f(a, b, na);
                }
            }
        }
    };
    // The most any candidate carries: one variant on every usable core, or two.
    let mut most = (0..k).map(|v| caps.best[v][usable as usize]).fold(0.0, f64::max);
    pairs(&mut |a, b, na| {
        let th = problem.variants[a].throughput(na, problem.capacity_coef) + caps.best[b][(usable - na) as usize];
        most = most.max(th);
    });
    let beta = problem.ladder.steps().into_iter().map(|b| b.min(1.0)).find(|b| {
        let served = problem.demand_rps * b;
        served <= most + RPS_TOLERANCE * served.max(1.0)
    })?;
    let served = problem.demand_rps * beta;
    let mut best: Option<Plan> = None;
    let mut consider = |cores: Vec<u32>| {
        let Some(quotas) = route(problem, &cores, served) else { return };
        let plan = build_plan(problem, beta, &cores, &quotas);
        if best.as_ref().is_none_or(|b| plan.objective > b.objective + 1e-12) {
            best = Some(plan);
        }
    };
    consider(vec![0; k]);
    for v in 0..k {
        if let Some(n) = caps.fewest(v, served, usable) {
            let mut cores = vec![0; k];
            cores[v] = n;
            consider(cores);
        }
    }
    pairs(&mut |a, b, na| {
        let th = problem.variants[a].throughput(na, problem.capacity_coef);
        if th <= 0.0 || th >= served {
            return;
        }
        if let Some(nb) = caps.fewest(b, served - th, usable - na) {
            let mut cores = vec![0; k];
            (cores[a], cores[b]) = (na, nb);
            consider(cores);
        }
    });
    best
}

/// The previous plan repaired for this problem: its cores per variant (by name) kept
/// and its quotas re-routed at the highest step they carry; where that is below the
/// ladder's first step and cores are spare, one of its variants also gets the fewest
/// spare cores that carry the first step (or all of them), the best kept. None when
/// its cores are not a valid choice here (more than the usable cores, fewer than
/// `min_cores`).
pub fn repaired(problem: &Problem, previous: &Plan) -> Option<Plan> {
    let usable = usable_cores(problem);
    let cores: Vec<u32> = problem
        .variants
        .iter()
        .map(|v| previous.variants.iter().find(|p| p.name == v.name).map_or(0, |p| p.cores))
        .collect();
    let used: u32 = cores.iter().sum();
    if used > usable || cores.iter().any(|&n| n > 0 && n < problem.min_cores) {
        return None;
    }
    let mut best = at_highest_step(problem, &cores);
    let top = problem.ladder.steps().first().map_or(1.0, |b| b.min(1.0));
    if best.as_ref().is_none_or(|b| b.beta < top - 1e-9) && used < usable {
        let spare = usable - used;
        for v in (0..cores.len()).filter(|&v| cores[v] > 0) {
            let others: f64 = (0..cores.len())
                .filter(|&o| o != v)
                .map(|o| problem.variants[o].throughput(cores[o], problem.capacity_coef))
                .sum();
            let need = problem.demand_rps * top - others;
            let variant = &problem.variants[v];
            let extra = (1..=spare)
                .find(|&e| {
                    variant.throughput(cores[v] + e, problem.capacity_coef) + RPS_TOLERANCE * need.max(1.0) >= need
                })
                .unwrap_or(spare);
            let mut grown = cores.clone();
            grown[v] += extra;
            if let Some(plan) = at_highest_step(problem, &grown) {
                if best.as_ref().is_none_or(|b| better(&plan, b)) {
                    best = Some(plan);
                }
            }
        }
    }
    best
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
    let cores: Vec<u32> = y.iter().map(|yv| options[yv.iter().position(|&x| values.is_set(x)).unwrap_or(0)]).collect();
    let quotas: Vec<f64> = quota.iter().map(|&q| values.value(q).max(0.0)).collect();
    let plan = build_plan(problem, beta, &cores, &quotas);
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
pub(crate) fn check_weights(w: &Weights) -> Result<(), crate::limits::RangeError> {
    if ![w.accuracy, w.cores, w.loading].iter().all(|&x| crate::limits::within(x, crate::limits::MAX_FACTOR)) {
        return Err(crate::limits::RangeError::Weights);
    }
    Ok(())
}

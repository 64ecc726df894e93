//! Loki's resource manager (HPDC'24 §4): for a pipeline — any rooted tree of tasks
//! ([`sluice_core::pipeline::Pipeline`]) — how many workers each (task, variant)
//! gets, at which maximum batch size, and which share of the traffic takes each
//! path through the variants.
//!
//! The formulation of §4.1, over the *augmented graph* (a vertex per (task, variant),
//! an edge for every pair of variants of adjacent tasks):
//! - a path p picks one variant per task of a root-to-sink task chain; m(p, i, k) =
//!   Π r(i′, k′) over the variants before (i, k) on p (Eq. 1), where r is the
//!   variant's fan-out to the next task (multiplicative factor × branch ratio);
//! - integer replicas x(i, k), a batch size y(i, k) ∈ B (4), traffic shares c(p);
//! - (2) β·Σ_p D·c(p)·m(p, i, k) ≤ x(i, k)·q(i, k, y(i, k)), with q(i, k, b) = b /
//!   latency(b) (5); (3) Σ x ≤ S;
//! - (6)–(7) Σ_{(i,k)∈p} l(i, k) ≤ (L − n_p·comm)/2 for every path with traffic: the
//!   SLO halved for queueing (§4.1) after the communication latency of the path's n_p
//!   hops (§4.2, "Communication latency");
//!
//! written without products or big-M: a vertex per (task, variant, batch size) with
//! its own integer workers z(i, k, b) and a binary y(i, k, b), Σ_b y ≤ 1 and z ≤
//! x̄·y (one batch size per variant, x = Σ_b z), and paths over those vertices, of
//! which only the ones within their chain's latency budget exist. Every plan of the
//! paper's model is one of this model and back (a path with traffic runs at its
//! variants' batch sizes, whose latencies then meet (7)), so the optima are equal;
//! x̄ is the most workers the variant could need at the peak fan-out, not S.
//! Solved, the model is reduced without changing its optimum (`prune`: batch sizes
//! on no path within budget or dominated by another of the same variant are
//! dropped; z continuous and x integer, the same thing with one batch size per
//! variant): 4–12× faster on traffic analysis (`docs/allocator.md`, "Loki").
//! - step 1, hardware scaling (Eqs. 8–11): only each task's most accurate variants,
//!   minimise Σ x; step 2, accuracy scaling (Eq. 12) when step 1 is infeasible:
//!   maximise Σ_p c(p)·Â(p) − ε·Σ x (ε small enough never to trade accuracy for
//!   workers: a tie-breaker towards fewer workers).
//!
//! Beyond the paper's chain-shaped presentation (and the reference's MILP, which is
//! written for the traffic-analysis pipeline's car branch only), a tree with several
//! sinks has one set of shares per root-to-sink chain, each summing to 1, and the
//! chains must agree where they share tasks: at every task with several children,
//! the traffic through each variant prefix equals across the children's chains.
//! The load of (i, k) is counted once, over one chain through task i. The objective
//! weighs each chain equally (a request's accuracy is the mean over its sinks).
//! Â(p) is the product of the variants' (normalised) accuracies, as the reference
//! computes it (`algorithms/pipeline_ilp.py`; the paper profiles Â per path).
//!
//! When even accuracy scaling cannot serve the demand, the demand is lowered down
//! the same ladder as Proteus's and the rest reported as shed (the reference raises
//! an exception). Details and differences: `docs/allocator.md`, "Loki".
//!
//! When no MILP finds a plan within the allocation's time limit, [`solve_from`]
//! still answers with one made without a solver ([`crate::origin::Origin`]): the
//! previous plan with its workers rescaled for the new demand, or the greedy plan —
//! one variant and batch size per task, every chain within its budget (7), the most
//! accurate the workers (3) carry at the highest step of the ladder (2) — each checked
//! with [`Plan::check`] against the constraints above.

mod greedy;
pub mod routing;

pub use greedy::{greedy, repaired};

use std::time::{Duration, Instant};

use good_lp::{constraint, variable, Expression, Solution as _, Variable};
use serde::{Deserialize, Serialize};
use sluice_core::pipeline::Pipeline;
use sluice_core::profile::{Percentile, Profile};

use crate::ladder::{Ladder, Search, Tried};
use crate::origin::{self, Origin};
use crate::solver::{Milp, Sense, SolveError, SolveReport, SolveStatus, SolverSettings};

/// One variant of a task, as the MILP sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Variant {
    /// Its name.
    pub name: String,
    /// Its accuracy (normalised per task in Loki's data), in [0, 1].
    pub accuracy: f64,
    /// (batch size, latency µs) for each allowed batch size, increasing.
    pub latency_us: Vec<(u32, u64)>,
}

impl Variant {
    /// q(b): requests/s of one replica at batch `b` (b / latency).
    pub fn throughput(&self, batch: u32) -> f64 {
        self.latency_us.iter().find(|(b, _)| *b == batch).map_or(0.0, |&(b, us)| b as f64 * 1e6 / us.max(1) as f64)
    }

    /// The latency of batch `batch`, µs.
    pub fn latency(&self, batch: u32) -> Option<u64> {
        self.latency_us.iter().find(|(b, _)| *b == batch).map(|&(_, us)| us)
    }
}

/// Each task's variants from `profile`: latency at percentile `p` for every
/// allowed batch size the profile measured. Errors name the field
/// (`pipeline.task.<task>.models`) and the model.
pub fn variants(
    pipeline: &Pipeline,
    profile: &Profile,
    p: Percentile,
    batch_sizes: &[u32],
) -> Result<Vec<Vec<Variant>>, (String, String)> {
    pipeline
        .tasks
        .iter()
        .map(|t| {
            t.models
                .iter()
                .map(|name| {
                    let field = format!("pipeline.task.{}.models", t.name);
                    let m = profile
                        .model(name)
                        .ok_or_else(|| (field.clone(), format!("`{name}` is not in the profile")))?;
                    let latency_us: Vec<(u32, u64)> = m
                        .batch_sizes
                        .iter()
                        .zip(m.measured_us(p))
                        .filter(|(b, _)| batch_sizes.contains(b))
                        .map(|(&b, &us)| (b, us))
                        .collect();
                    if latency_us.is_empty() {
                        return Err((field, format!("`{name}` has no measured latency at an allowed batch size")));
                    }
                    Ok(Variant { name: name.clone(), accuracy: m.accuracy, latency_us })
                })
                .collect()
        })
        .collect()
}

/// The first task without models that has no children, if any. A task without
/// models is a pass-through (Loki's social-media `source`): it fans a request out to
/// its children and takes no worker. A sink without models would answer with no
/// model at all, and the plan would credit it an accuracy of 1: refused, as an app
/// with `models = []` is.
pub fn passthrough_sink(pipeline: &Pipeline) -> Option<&str> {
    pipeline.tasks.iter().find(|t| t.is_passthrough() && t.is_sink()).map(|t| t.name.as_str())
}

/// Why [`passthrough_sink`]'s task is refused.
pub fn passthrough_sink_message(task: &str) -> String {
    format!(
        "expected at least one model: a task without models only fans out to its children, and `{task}` has none \
         (the front end collects the sinks' answers: no sink pseudo-task is needed)"
    )
}

/// Which steps run.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Scaling {
    /// Loki: hardware scaling, and accuracy scaling when it is infeasible.
    #[default]
    Loki,
    /// Hardware scaling only, most accurate variants always (InferLine-style).
    HardwareOnly,
    /// Accuracy scaling always (maximise accuracy on the whole cluster).
    AccuracyOnly,
}

/// Which plan step 1 (hardware scaling) returns among those with the fewest workers.
///
/// The paper and the reference minimise Σ x alone, so a tie goes to whatever the
/// solver finds first. Ties are common: on traffic analysis at 97 req/s four yolov5x
/// workers serve at batch 1 (98 req/s, 99% utilised, a 82 ms task budget) or at batch
/// 2 (113 req/s, 86%, 142 ms), and which one runs decides how many detections miss
/// their budget (docs/results/loki/README.md, "The artifact's own simulator").
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TieBreak {
    /// The solver's choice (the paper's objective as it stands).
    #[default]
    Solver,
    /// The most capacity: each task's workers weighed by their per-worker capacity
    /// over the task's best, maximised below one worker's worth so that it never
    /// trades a worker.
    Headroom,
}

/// A Loki problem.
#[derive(Clone, Debug)]
pub struct Problem {
    /// The pipeline (fan-out estimates included).
    pub pipeline: Pipeline,
    /// Per task, its variants in the pipeline's model order (empty: pass-through).
    pub variants: Vec<Vec<Variant>>,
    /// D: requests/s entering at the root.
    pub demand_qps: f64,
    /// S: workers in the cluster.
    pub workers: u32,
    /// L: the end-to-end SLO, ms.
    pub slo_ms: f64,
    /// Communication latency per worker on a path, ms (subtracted from L).
    pub comm_latency_ms: f64,
    /// Which steps run.
    pub scaling: Scaling,
    /// Demand factor β: ≥ 1 is headroom on every variant's capacity (the
    /// reference's `beta`, 1 by default); steps below 1 serve that share and shed
    /// the rest.
    pub ladder: Ladder,
    /// Which fewest-worker plan step 1 returns.
    pub tie_break: TieBreak,
    /// Solver limits.
    pub solver: SolverSettings,
}

/// One hosted (task, variant) in a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VariantPlan {
    /// Task name.
    pub task: String,
    /// Variant name.
    pub variant: String,
    /// x(i, k): workers.
    pub replicas: u32,
    /// y(i, k): maximum batch size.
    pub batch: u32,
    /// l(i, k): latency of that batch, µs — the task's latency budget (§4.2).
    pub latency_us: u64,
    /// q(i, k, y): requests/s of one worker.
    pub capacity_qps: f64,
    /// Requests/s the plan routes to it (all its workers).
    pub load_qps: f64,
    /// Its accuracy.
    pub accuracy: f64,
}

/// A path's share of the traffic.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PathShare {
    /// The variant at each task of the chain, root first (a pass-through task's
    /// entry is its task name).
    pub variants: Vec<String>,
    /// c(p): share of the chain's traffic.
    pub share: f64,
    /// Â(p).
    pub accuracy: f64,
    /// Σ l over the path, µs.
    pub latency_us: u64,
}

/// A Loki plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// `hardware` (step 1) or `accuracy` (step 2).
    pub step: String,
    /// The demand factor it was solved at.
    pub beta: f64,
    /// Requests/s entering the pipeline.
    pub demand_qps: f64,
    /// Requests/s the plan serves (D·min(β, 1)).
    pub served_qps: f64,
    /// Requests/s it sheds.
    pub shed_qps: f64,
    /// Workers used (Σ x).
    pub workers: u32,
    /// Σ_p c(p)·Â(p), chains weighed equally.
    pub accuracy: f64,
    /// The hosted variants (x > 0), in task order.
    pub variants: Vec<VariantPlan>,
    /// Per root-to-sink chain (task names), the paths with traffic.
    pub chains: Vec<ChainPlan>,
}

/// The shares of one root-to-sink chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainPlan {
    /// Task names, root first.
    pub tasks: Vec<String>,
    /// Paths with a share above 1e-9.
    pub paths: Vec<PathShare>,
}

impl Plan {
    /// The hosted entry of `variant`, if any.
    pub fn variant(&self, variant: &str) -> Option<&VariantPlan> {
        self.variants.iter().find(|v| v.variant == variant)
    }

    /// The plan's workers as the load balancer sees them: each replica of each
    /// hosted variant, in plan order (variants the pipeline does not know are
    /// skipped).
    pub fn routing_workers(&self, pipeline: &Pipeline) -> Vec<routing::Replica> {
        self.variants
            .iter()
            .filter_map(|v| pipeline.model(&v.variant).map(|(task, variant)| (v, task, variant)))
            .flat_map(|(v, task, variant)| {
                (0..v.replicas).map(move |_| routing::Replica {
                    task,
                    variant,
                    accuracy: v.accuracy,
                    capacity_qps: v.capacity_qps,
                    latency_us: v.latency_us,
                })
            })
            .collect()
    }
}

/// What [`solve`] returns: the plan, if any, and how it was found. Named for the
/// solve, so that `Outcome` stays a request's (`sluice_core::outcome::Outcome`).
#[derive(Clone, Debug, Serialize)]
pub struct Solved {
    /// The report of the solve that produced the plan (the last one when none did).
    pub report: SolveReport,
    /// Every solve (step 1 first when it ran), and how each ended.
    pub attempts: Vec<Tried>,
    /// The plan (None: infeasible down to the ladder's minimum).
    pub plan: Option<Plan>,
    /// Where the plan came from: the MILP's, or, when none found one within the time
    /// limit, the greedy plan or the previous one repaired ([`solve_from`]).
    pub origin: Origin,
}

/// The problem is not one the MILP can take.
#[derive(Debug, thiserror::Error)]
pub enum LokiError {
    /// Variants do not match the pipeline's models.
    #[error("task `{0}`: the variants given do not match the pipeline's models")]
    Variants(String),
    /// A variant has no latency at any allowed batch size.
    #[error("task `{task}`, variant `{variant}`: no latency at any allowed batch size")]
    NoBatch {
        /// Task.
        task: String,
        /// Variant.
        variant: String,
    },
    /// A task without models that is a sink: a pass-through only fans a request out
    /// to its children, so this one would answer with no model (and the plan would
    /// credit it an accuracy of 1).
    #[error("task `{task}`: {}", passthrough_sink_message(task))]
    PassThroughSink {
        /// The task.
        task: String,
    },
    /// Not one variant list per task.
    #[error("one variant list per task expected ({lists} lists for {tasks} tasks)")]
    VariantLists {
        /// Tasks of the pipeline.
        tasks: usize,
        /// Variant lists given.
        lists: usize,
    },
    /// A number out of its range ([`crate::limits`]).
    #[error("{field}: {range}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its range.
        range: crate::limits::RangeError,
    },
    /// `slo_ms` or `comm_latency_ms` out of range.
    #[error(
        "expected slo_ms in (0, {max}] and comm_latency_ms from 0 to {max} (slo_ms = {slo_ms}, comm_latency_ms = {comm_latency_ms})",
        max = crate::limits::MAX_LATENCY_MS
    )]
    Latencies {
        /// `slo_ms` as given.
        slo_ms: f64,
        /// `comm_latency_ms` as given.
        comm_latency_ms: f64,
    },
    /// `workers` outside [`crate::limits::WORKERS`].
    #[error("workers {0}: expected {span}", span = crate::limits::span(&crate::limits::WORKERS))]
    Workers(u32),
    /// `[solver]` out of range.
    #[error(transparent)]
    Settings(#[from] crate::solver::SettingsError),
    /// The solver failed.
    #[error(transparent)]
    Solve(#[from] SolveError),
}

impl Problem {
    /// Checks the problem's shape and numbers.
    pub fn validate(&self) -> Result<(), LokiError> {
        if self.variants.len() != self.pipeline.tasks.len() {
            return Err(LokiError::VariantLists { tasks: self.pipeline.tasks.len(), lists: self.variants.len() });
        }
        for (t, vs) in self.pipeline.tasks.iter().zip(&self.variants) {
            if vs.len() != t.models.len() || vs.iter().zip(&t.models).any(|(v, m)| &v.name != m) {
                return Err(LokiError::Variants(t.name.clone()));
            }
            for v in vs {
                if v.latency_us.is_empty() {
                    return Err(LokiError::NoBatch { task: t.name.clone(), variant: v.name.clone() });
                }
            }
        }
        if let Some(task) = passthrough_sink(&self.pipeline) {
            return Err(LokiError::PassThroughSink { task: task.to_string() });
        }
        use crate::limits::{self, positive_within, within};
        limits::check_demand(self.demand_qps).map_err(|range| LokiError::OutOfRange { field: "demand_qps", range })?;
        if !(positive_within(self.slo_ms, limits::MAX_LATENCY_MS)
            && within(self.comm_latency_ms, limits::MAX_LATENCY_MS))
        {
            return Err(LokiError::Latencies { slo_ms: self.slo_ms, comm_latency_ms: self.comm_latency_ms });
        }
        if !limits::WORKERS.contains(&self.workers) {
            return Err(LokiError::Workers(self.workers));
        }
        Ok(self.solver.validate()?)
    }

    /// Â(p): the product of the variants' accuracies.
    fn path_accuracy(&self, chain: &[usize], path: &[usize]) -> f64 {
        chain.iter().zip(path).map(|(&t, &k)| self.variants[t].get(k).map_or(1.0, |v| v.accuracy)).product()
    }

    /// The chain's `j`-th task and the index, among its children, of the next task.
    fn edge(&self, chain: &[usize], j: usize) -> (&sluice_core::pipeline::Task, usize) {
        let t = &self.pipeline.tasks[chain[j]];
        (t, t.children.iter().position(|&c| c == chain[j + 1]).expect("chain follows edges"))
    }

    /// m(p, i): requests reaching the chain's `pos`-th task per request entering.
    fn multiplier(&self, chain: &[usize], path: &[usize], pos: usize) -> f64 {
        (0..pos)
            .map(|j| {
                let (t, child) = self.edge(chain, j);
                t.fanout[path[j]][child]
            })
            .product()
    }

    /// Each root-to-sink chain's latency budget, ms: (L − n_p·comm)/2 with n_p the
    /// chain's tasks that run a model (§4.1's halved SLO, §4.2's communication).
    fn budgets(&self, chains: &[Vec<usize>]) -> Vec<f64> {
        chains
            .iter()
            .map(|chain| {
                let hops = chain.iter().filter(|&&t| !self.variants[t].is_empty()).count() as f64;
                (self.slo_ms - hops * self.comm_latency_ms) / 2.0
            })
            .collect()
    }

    /// Per task, the first chain through it and its position there: a task's load is
    /// counted over that chain (the chains agree on shared tasks).
    fn first_chains(&self, chains: &[Vec<usize>]) -> Vec<(usize, usize)> {
        (0..self.pipeline.tasks.len())
            .map(|t| {
                let ci = chains.iter().position(|c| c.contains(&t)).expect("every task is on a chain");
                (ci, chains[ci].iter().position(|&x| x == t).expect("task on its chain"))
            })
            .collect()
    }

    /// Each task's most accurate variants (ties kept).
    fn most_accurate(&self) -> Vec<Vec<bool>> {
        self.variants
            .iter()
            .map(|vs| {
                let best = vs.iter().map(|v| v.accuracy).fold(f64::NEG_INFINITY, f64::max);
                vs.iter().map(|v| v.accuracy >= best).collect()
            })
            .collect()
    }
}

/// Solves the problem: step 1 (hardware scaling) and, when it is infeasible, step 2
/// (accuracy scaling) down the demand ladder — or only one of them (`scaling`).
/// When no MILP finds a plan within the time limit, the greedy plan ([`solve_from`]
/// with no previous plan).
pub fn solve(problem: &Problem) -> Result<Solved, LokiError> {
    solve_from(problem, None)
}

/// [`solve`], with the plan in force. `time_limit_s` bounds the whole allocation
/// (issue 34), and when it passes with no MILP's plan the answer is still a plan:
/// `previous` repaired ([`repaired`]: its variants, batch sizes and path shares kept,
/// its workers rescaled for the new demand) or the greedy plan ([`greedy`]),
/// whichever serves the higher demand factor (then accuracy, then fewer workers; the
/// repaired one on a tie: it moves nothing), checked with [`Plan::check`] and marked
/// in [`Solved::origin`]. A chain that no variants fit within its latency budget
/// has no plan at any demand: that stays the MILP's answer (no plan, status
/// infeasible). `NoPlanInTime` remains only when the workers cannot carry even the
/// ladder's lowest step with one variant per task.
pub fn solve_from(problem: &Problem, previous: Option<&Plan>) -> Result<Solved, LokiError> {
    let (outcome, ran_out) = solve_with(problem, Formulation::Reduced)?;
    if outcome.plan.is_some() || !ran_out {
        return Ok(outcome);
    }
    let started = Instant::now();
    let reason = origin::no_plan_in_time(problem.solver.time_limit_s, outcome.attempts.len());
    if !greedy::has_paths(problem) {
        // No path within its budget on some chain: infeasible at every factor, as the
        // MILP would have found.
        return Ok(Solved { report: SolveReport::none(), ..outcome });
    }
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
    let Some((plan, is_repair)) = best else {
        return Err(SolveError::NoPlanInTime(problem.solver.time_limit_s).into());
    };
    let objective = match plan.step.as_str() {
        "hardware" => plan.workers as f64,
        _ => plan.accuracy,
    };
    let report = SolveReport::without_solver(objective, started.elapsed().as_secs_f64());
    Ok(Solved {
        report,
        attempts: outcome.attempts,
        plan: Some(plan),
        origin: Origin::without_solver(is_repair, reason),
    })
}

/// Whether `a` is a better plan than `b`: a higher demand factor, then accuracy, then
/// fewer workers.
fn better(a: &Plan, b: &Plan) -> bool {
    if (a.beta - b.beta).abs() > 1e-9 {
        return a.beta > b.beta;
    }
    if (a.accuracy - b.accuracy).abs() > 1e-12 {
        return a.accuracy > b.accuracy;
    }
    a.workers < b.workers
}

/// [`solve`] on the model as written before its reductions (every batch size of
/// every variant, integer workers per batch size, HiGHS's default search): the
/// same optimum, slower. For benches and tests that compare the two. No plan in
/// time is the `NoPlanInTime` error here (no greedy plan).
#[doc(hidden)]
pub fn solve_unreduced(problem: &Problem) -> Result<Solved, LokiError> {
    match solve_with(problem, Formulation::Reference)? {
        (_, true) => Err(SolveError::NoPlanInTime(problem.solver.time_limit_s).into()),
        (outcome, false) => Ok(outcome),
    }
}

/// Which model [`solve_at`] writes. Both have the same optimum; the reference one
/// is kept to test that (`tests::the_reduced_model_has_the_reference_optimum`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Formulation {
    /// Every (task, variant, batch size) vertex.
    Reference,
    /// Without the vertices `prune` proves useless, with one integer worker count
    /// per variant instead of one per vertex, and HiGHS's restarts, cuts below the
    /// root and three primal heuristics off (measured faster on this model).
    Reduced,
}

/// The MILPs; `true` when the time limit passed with no plan.
fn solve_with(problem: &Problem, formulation: Formulation) -> Result<(Solved, bool), LokiError> {
    problem.validate()?;
    let all: Vec<Vec<bool>> = problem.variants.iter().map(|vs| vec![true; vs.len()]).collect();
    let best = problem.most_accurate();
    let first = problem.ladder.steps().first().copied().unwrap_or(1.0);
    // `time_limit_s` bounds the whole allocation, both steps and every factor of the
    // ladder together (issue 34; as `proteus::solve`): each solve gets the time
    // left, and one that runs out of it without a plan counts as a step without one.
    let limit_s = problem.solver.time_limit_s;
    let deadline = Instant::now() + Duration::from_secs_f64(limit_s.clamp(0.0, 1e7));
    let ladder = Ladder { search: Search::Descend, ..problem.ladder.clone() };
    let mut ran_out = false;
    let mut within = |allowed: &[Vec<bool>], step: Step, beta: f64, left: f64| {
        let p = Problem { solver: SolverSettings { time_limit_s: left, ..problem.solver.clone() }, ..problem.clone() };
        match solve_at(&p, allowed, step, beta, formulation) {
            Err(SolveError::NoPlanInTime(s)) => {
                ran_out = true;
                Ok((SolveReport { status: SolveStatus::TimeLimit, solve_seconds: s, ..SolveReport::none() }, None))
            }
            other => other,
        }
    };
    let mut attempts = Vec::new();
    let mut report = SolveReport::none();
    match problem.scaling {
        Scaling::Loki => {
            let (r, plan) = within(&best, Step::Hardware, first, limit_s)?;
            attempts.push(Tried { beta: first, status: r.status, solve_seconds: r.solve_seconds });
            if plan.is_some() {
                return Ok((Solved { report: r, attempts, plan, origin: Origin::Milp }, false));
            }
            report = r;
        }
        Scaling::HardwareOnly => {
            let d = ladder.search(deadline, |beta, left| within(&best, Step::Hardware, beta, left))?;
            let out_of_time = d.plan.is_none() && (d.timed_out || ran_out);
            let outcome = Solved { report: d.report, attempts: d.tried, plan: d.plan, origin: Origin::Milp };
            return Ok((outcome, out_of_time));
        }
        Scaling::AccuracyOnly => {}
    }
    let d = ladder.search(deadline, |beta, left| within(&all, Step::Accuracy, beta, left))?;
    let out_of_time = d.plan.is_none() && (d.timed_out || ran_out);
    let report = if d.tried.is_empty() { report } else { d.report };
    attempts.extend(d.tried);
    Ok((Solved { report, attempts, plan: d.plan, origin: Origin::Milp }, out_of_time))
}

#[derive(Clone, Copy, PartialEq)]
enum Step {
    Hardware,
    Accuracy,
}

impl Step {
    /// The step's name in a plan (`Plan::step`).
    fn name(self) -> String {
        match self {
            Step::Hardware => "hardware".into(),
            Step::Accuracy => "accuracy".into(),
        }
    }
}

/// A (task, variant, batch size) vertex of the batch-augmented graph.
struct Vertex {
    task: usize,
    variant: usize,
    batch: u32,
    latency_ms: f64,
    /// q(i, k, b): requests/s of one worker.
    throughput: f64,
    /// z(i, k, b): workers of the variant at this batch size.
    z: Variable,
    /// y(i, k, b): this is the variant's batch size.
    y: Variable,
}

/// A (task, variant, batch size) the plan could use, before it gets variables.
#[derive(Clone, Debug)]
struct Candidate {
    task: usize,
    variant: usize,
    batch: u32,
    latency_ms: f64,
    /// q(i, k, b): requests/s of one worker.
    throughput: f64,
}

/// Paths are within their budget up to this (ms), as in the path enumeration.
const LATENCY_TOLERANCE_MS: f64 = 1e-9;

/// The most distinct latency sums of the other tasks of a chain `prune` collects;
/// past it the chain's sums are not listed and only plain dominance applies there.
/// Without a cap a long chain of many-variant tasks would list a product of sizes.
const MAX_REST_SUMS: usize = 4096;

/// Which candidates to keep: those on some path within budget on every chain
/// through their task (a task's share is the same on each of its chains), and not
/// *dominated* by another batch size of the same variant. w dominates v when w's
/// worker serves at least as many requests/s (q(w) ≥ q(v)) and every path within
/// budget through v stays within budget through w: w is no slower, or no latency
/// sum r of the chain's other tasks falls in (L′ − l(w), L′ − l(v)] (L′ the chain's
/// budget). Then any plan using v is matched, with the same workers, shares and
/// accuracy, by one using w, so dropping v leaves the optimum as it is (§4.1's
/// model); mutual dominance (equal throughput and the same paths) keeps the first.
/// Rounds repeat until nothing changes: dropping a vertex removes latency sums, and
/// so can make more batch sizes equivalent.
///
/// On the traffic-analysis pipeline this leaves 33 of 112 vertices and 186 of 895
/// paths: most batch sizes are either too slow for any path or fit exactly the same
/// partners as a larger, faster-per-worker one.
fn prune(candidates: &[Candidate], chains: &[Vec<usize>], budgets: &[f64]) -> Vec<bool> {
    let mut keep = vec![true; candidates.len()];
    loop {
        // Per chain and task on it: the sorted latency sums of the chain's other tasks
        // (None past MAX_REST_SUMS), and the smallest of them.
        let tasks = chains.iter().flatten().copied().max().map_or(0, |t| t + 1);
        let latencies: Vec<Vec<f64>> = (0..tasks)
            .map(|t| {
                (0..candidates.len())
                    .filter(|&i| keep[i] && candidates[i].task == t)
                    .map(|i| candidates[i].latency_ms)
                    .collect()
            })
            .collect();
        let has_variants = |t: usize| candidates.iter().any(|c| c.task == t);
        let rest: Vec<Vec<(Option<Vec<f64>>, f64)>> = chains
            .iter()
            .map(|chain| {
                chain
                    .iter()
                    .map(|&t| {
                        let mut sums = Some(vec![0.0]);
                        let mut least = 0.0;
                        for &o in chain.iter().filter(|&&o| o != t && has_variants(o)) {
                            least += latencies[o].iter().copied().fold(f64::INFINITY, f64::min);
                            sums = sums.and_then(|sums| {
                                let mut next: Vec<f64> =
                                    sums.iter().flat_map(|a| latencies[o].iter().map(move |b| a + b)).collect();
                                next.sort_by(f64::total_cmp);
                                next.dedup();
                                (next.len() <= MAX_REST_SUMS).then_some(next)
                            });
                        }
                        (sums, least)
                    })
                    .collect()
            })
            .collect();
        // The (chain, position) pairs of each task.
        let places = |t: usize| {
            chains.iter().enumerate().filter_map(move |(ci, chain)| chain.iter().position(|&x| x == t).map(|j| (ci, j)))
        };
        let fits = |i: usize| {
            places(candidates[i].task)
                .all(|(ci, j)| candidates[i].latency_ms + rest[ci][j].1 <= budgets[ci] + LATENCY_TOLERANCE_MS)
        };
        // Every path within budget through v is within budget through w.
        let covers = |w: usize, v: usize| {
            let (lw, lv) = (candidates[w].latency_ms, candidates[v].latency_ms);
            lw <= lv
                || places(candidates[v].task).all(|(ci, j)| match &rest[ci][j].0 {
                    Some(sums) => {
                        let (low, high) =
                            (budgets[ci] + LATENCY_TOLERANCE_MS - lw, budgets[ci] + LATENCY_TOLERANCE_MS - lv);
                        !sums.iter().any(|&r| r > low && r <= high)
                    }
                    None => false,
                })
        };
        let dominates = |w: usize, v: usize| {
            w != v
                && candidates[w].task == candidates[v].task
                && candidates[w].variant == candidates[v].variant
                && candidates[w].throughput >= candidates[v].throughput
                && covers(w, v)
        };
        let before = keep.clone();
        for v in 0..candidates.len() {
            if !before[v] {
                continue;
            }
            let dominated =
                (0..candidates.len()).any(|w| before[w] && fits(w) && dominates(w, v) && (!dominates(v, w) || w < v));
            if !fits(v) || dominated {
                keep[v] = false;
            }
        }
        if keep == before {
            return keep;
        }
    }
}

/// A chain's paths: per path, a vertex per task of the chain (None for a
/// pass-through task).
type ChainPaths = (Vec<usize>, Vec<Vec<Option<usize>>>);

fn solve_at(
    p: &Problem,
    allowed: &[Vec<bool>],
    step: Step,
    beta: f64,
    formulation: Formulation,
) -> Result<(SolveReport, Option<Plan>), SolveError> {
    let s = p.workers as f64;
    let task_paths = p.pipeline.task_paths();
    let budgets = p.budgets(&task_paths);
    // Each task's load is counted over the first chain through it, at its position
    // there.
    let first_chain = p.first_chains(&task_paths);
    // The most a variant could ever need, to bound its worker counts (a tighter
    // relaxation than the paper's bound S; the optimum is unchanged).
    let peak_multiplier = |t: usize| -> f64 {
        let (ci, pos) = first_chain[t];
        (0..pos)
            .map(|j| {
                let (task, child) = p.edge(&task_paths[ci], j);
                task.fanout.iter().map(|f| f[child]).fold(0.0, f64::max)
            })
            .product::<f64>()
    };
    // The (task, variant, batch size) candidates, less those that cannot change the
    // optimum (`prune`).
    let mut candidates = Vec::new();
    for (t, vs) in p.variants.iter().enumerate() {
        for (k, v) in vs.iter().enumerate() {
            if allowed[t][k] {
                candidates.extend(v.latency_us.iter().map(|&(b, us)| Candidate {
                    task: t,
                    variant: k,
                    batch: b,
                    latency_ms: us as f64 / 1000.0,
                    throughput: v.throughput(b),
                }));
            }
        }
    }
    if formulation == Formulation::Reduced {
        let keep = prune(&candidates, &task_paths, &budgets);
        candidates = candidates.into_iter().zip(keep).filter(|(_, k)| *k).map(|(c, _)| c).collect();
    }
    let mut m = Milp::default();
    let mut vertices: Vec<Vertex> = Vec::new();
    let mut workers = Expression::from(0.0);
    for (t, vs) in p.variants.iter().enumerate() {
        for k in 0..vs.len() {
            let mine: Vec<&Candidate> = candidates.iter().filter(|c| c.task == t && c.variant == k).collect();
            if mine.is_empty() {
                continue;
            }
            let need = beta.max(0.0) * p.demand_qps * peak_multiplier(t);
            let mut choices = Expression::from(0.0);
            let mut replicas = Expression::from(0.0);
            for c in mine {
                let most = (need / c.throughput.max(1e-9)).ceil().clamp(1.0, s.max(1.0));
                // Reduced: z continuous, the variant's x = Σ_b z integer instead. With
                // one batch size per variant the z that is not 0 equals x, so it is an
                // integer all the same; HiGHS branches on 16 worker counts instead of
                // 33 on traffic analysis, which it finishes sooner.
                let z = match formulation {
                    Formulation::Reference => m.add(variable().integer().min(0).max(most)),
                    Formulation::Reduced => m.add(variable().min(0).max(most)),
                };
                let y = m.add(variable().binary());
                m.constrain(constraint!(z <= most * y));
                workers += z;
                replicas += z;
                choices += y;
                vertices.push(Vertex {
                    task: t,
                    variant: k,
                    batch: c.batch,
                    latency_ms: c.latency_ms,
                    throughput: c.throughput,
                    z,
                    y,
                });
            }
            m.constrain(constraint!(choices <= 1));
            if formulation == Formulation::Reduced {
                let x = m.add(variable().integer().min(0).max(s));
                m.constrain(constraint!(x == replicas));
            }
        }
    }
    m.constrain(constraint!(workers.clone() <= s));
    if formulation == Formulation::Reduced {
        // Measured on traffic analysis (BENCHMARKS.md §6): HiGHS spends most of a
        // solve separating cuts (path aggregation over the share columns) and in
        // sub-MIP heuristics on a model of ~100 rows whose tree has under a hundred
        // nodes. Restarts, cuts below the root, feasibility jump, RINS and RENS off
        // roughly halve the time; the gap and time limit are as configured, so the
        // plan is still optimal within the gap.
        for option in [
            "mip_allow_restart",
            "mip_allow_cut_separation_at_nodes",
            "mip_heuristic_run_feasibility_jump",
            "mip_heuristic_run_rins",
            "mip_heuristic_run_rens",
        ] {
            m.switch(option, false);
        }
        // Measured on traffic analysis at 600 and 1000 req/s on a quiet machine
        // (BENCHMARKS.md §6.1, 2026-11-24): 139 / 100 ms with HiGHS's defaults, 82 / 59 ms
        // with pseudo-costs trusted from the first branching (no strong branching to
        // make them reliable: the tree has under a hundred nodes) and a cut pool of
        // 30 (the default 10,000 keeps cuts whose LP work outweighs what they prune
        // on a model of ~100 rows). Same optima, same gap.
        m.limit("mip_pscost_minreliable", 0);
        m.limit("mip_pool_soft_limit", 30);
    }
    // Paths over the vertices, only those within their chain's latency budget: with
    // one batch size per variant (Σ_b y ≤ 1) and capacity only where y = 1, this is
    // Eqs. (4)–(7) exactly, with no big-M.
    let by_task: Vec<Vec<usize>> =
        (0..p.pipeline.tasks.len()).map(|t| (0..vertices.len()).filter(|&v| vertices[v].task == t).collect()).collect();
    let chains: Vec<ChainPaths> = task_paths
        .iter()
        .zip(&budgets)
        .map(|(chain, &budget)| {
            let fastest: Vec<f64> = chain
                .iter()
                .map(|&t| by_task[t].iter().map(|&v| vertices[v].latency_ms).fold(f64::INFINITY, f64::min))
                .map(|f| if f.is_finite() { f } else { 0.0 })
                .collect();
            let mut rest = vec![0.0; chain.len() + 1];
            for j in (0..chain.len()).rev() {
                rest[j] = rest[j + 1] + fastest[j];
            }
            let mut out = Vec::new();
            let mut stack: Vec<(Vec<Option<usize>>, f64)> = vec![(Vec::new(), 0.0)];
            while let Some((prefix, spent)) = stack.pop() {
                let j = prefix.len();
                if j == chain.len() {
                    out.push(prefix);
                    continue;
                }
                let t = chain[j];
                if p.variants[t].is_empty() {
                    let mut next = prefix.clone();
                    next.push(None);
                    stack.push((next, spent));
                    continue;
                }
                for &v in by_task[t].iter().rev() {
                    let l = spent + vertices[v].latency_ms;
                    if l + rest[j + 1] <= budget + 1e-9 {
                        let mut next = prefix.clone();
                        next.push(Some(v));
                        stack.push((next, l));
                    }
                }
            }
            (chain.clone(), out)
        })
        .collect();
    // Each path's variant indices (0 for a pass-through task), for m(p, i) and Â(p).
    let indices: Vec<Vec<Vec<usize>>> = chains
        .iter()
        .map(|(_, paths)| {
            paths.iter().map(|path| path.iter().map(|v| v.map_or(0, |v| vertices[v].variant)).collect()).collect()
        })
        .collect();
    // A chain with no path within its budget cannot be served at any demand. Said
    // here rather than by HiGHS: pruning can leave it a model with no columns, whose
    // solution status HiGHS leaves undefined.
    if chains.iter().any(|(_, paths)| paths.is_empty()) {
        let mut report = SolveReport::none();
        (report.variables, report.constraints) = (m.variables(), m.constraints());
        return Ok((report, None));
    }
    let mut shares: Vec<Vec<Variable>> = Vec::with_capacity(chains.len());
    for (_, paths) in &chains {
        let cs: Vec<Variable> = paths.iter().map(|_| m.add(variable().min(0.0).max(1.0))).collect();
        let total: Expression = cs.iter().copied().sum();
        // No feasible path: the chain cannot be served within the SLO.
        m.constrain(constraint!(total == 1));
        shares.push(cs);
    }
    // Chains agree where they share tasks: at each task with several children, the
    // share through every prefix is the same on each child's chain.
    for (t, task) in p.pipeline.tasks.iter().enumerate() {
        if task.children.len() < 2 {
            continue;
        }
        let through: Vec<usize> = task.children.iter().map(|&c| first_chain[c].0).collect();
        let depth = chains[through[0]].0.iter().position(|&x| x == t).expect("task on its chain") + 1;
        let mut prefixes: Vec<&[Option<usize>]> =
            through.iter().flat_map(|&ci| chains[ci].1.iter().map(move |path| &path[..depth])).collect();
        prefixes.sort();
        prefixes.dedup();
        for prefix in prefixes {
            let sum = |ci: usize| -> Expression {
                chains[ci].1.iter().zip(&shares[ci]).filter(|(path, _)| path[..depth] == *prefix).map(|(_, &c)| c).sum()
            };
            let first = sum(through[0]);
            for &ci in &through[1..] {
                m.constrain(constraint!(first.clone() == sum(ci)));
            }
        }
    }
    // (2): each vertex's capacity covers what reaches it, counted over the first
    // chain through its task.
    for (vi, vx) in vertices.iter().enumerate() {
        let (ci, pos) = first_chain[vx.task];
        let (chain, paths) = &chains[ci];
        let load: Expression = paths
            .iter()
            .zip(&shares[ci])
            .zip(&indices[ci])
            .filter(|((path, _), _)| path[pos] == Some(vi))
            .map(|((_, &c), ks)| beta * p.demand_qps * p.multiplier(chain, ks, pos) * c)
            .sum();
        m.constrain(constraint!(load <= vx.throughput * vx.z));
    }
    let weight = 1.0 / chains.len() as f64;
    let accuracy: Expression = chains
        .iter()
        .zip(&shares)
        .zip(&indices)
        .flat_map(|(((chain, _), cs), ks)| cs.iter().zip(ks).map(|(&c, ks)| weight * p.path_accuracy(chain, ks) * c))
        .sum();
    let (sense, objective) = match step {
        Step::Hardware if p.tie_break == TieBreak::Headroom => {
            // Σ over vertices of z · q / q_best(task) is at most Σ z ≤ S, so a weight of
            // 1 / (2(S + 1)) keeps it under half a worker: it orders equal worker counts
            // and nothing else.
            let mut best = vec![0.0_f64; p.pipeline.tasks.len()];
            for v in &vertices {
                best[v.task] = best[v.task].max(v.throughput);
            }
            let headroom: Expression = vertices.iter().map(|v| (v.throughput / best[v.task].max(1e-9)) * v.z).sum();
            (Sense::Minimise, workers.clone() - (0.5 / (s + 1.0)) * headroom)
        }
        Step::Hardware => (Sense::Minimise, workers.clone()),
        Step::Accuracy => (Sense::Maximise, accuracy - (1e-5 / (s + 1.0)) * workers.clone()),
    };
    let (mut report, values) = m.solve(sense, objective, &p.solver)?;
    let Some(values) = values else { return Ok((report, None)) };

    // The plan: workers and batch size per hosted variant, shares per path.
    let served = p.demand_qps * beta.min(1.0);
    let mut variants = Vec::new();
    let mut loads = vec![0.0; vertices.len()];
    let mut chain_plans = Vec::new();
    let mut total_accuracy = 0.0;
    for (ci, ((chain, paths), cs)) in chains.iter().zip(&shares).enumerate() {
        let mut kept = Vec::new();
        for ((path, &c), ks) in paths.iter().zip(cs).zip(&indices[ci]) {
            let share = values.value(c).clamp(0.0, 1.0);
            if share <= 1e-9 {
                continue;
            }
            let acc = p.path_accuracy(chain, ks);
            total_accuracy += weight * share * acc;
            for (pos, (&t, v)) in chain.iter().zip(path).enumerate() {
                if let (Some(v), true) = (v, first_chain[t].0 == ci) {
                    loads[*v] += served * p.multiplier(chain, ks, pos) * share;
                }
            }
            kept.push(PathShare {
                variants: chain
                    .iter()
                    .zip(path)
                    .map(|(&t, v)| match v {
                        Some(v) => p.variants[t][vertices[*v].variant].name.clone(),
                        None => p.pipeline.tasks[t].name.clone(),
                    })
                    .collect(),
                share,
                accuracy: acc,
                latency_us: path.iter().flatten().map(|&v| (vertices[v].latency_ms * 1000.0).round() as u64).sum(),
            });
        }
        chain_plans
            .push(ChainPlan { tasks: chain.iter().map(|&t| p.pipeline.tasks[t].name.clone()).collect(), paths: kept });
    }
    for (t, vs) in p.variants.iter().enumerate() {
        for (k, v) in vs.iter().enumerate() {
            let mine: Vec<usize> =
                (0..vertices.len()).filter(|&i| vertices[i].task == t && vertices[i].variant == k).collect();
            let replicas: f64 = mine.iter().map(|&i| values.value(vertices[i].z)).sum();
            let replicas = replicas.round() as u32;
            let chosen = mine.iter().copied().find(|&i| values.is_set(vertices[i].y));
            if let (true, Some(i)) = (replicas > 0, chosen) {
                variants.push(VariantPlan {
                    task: p.pipeline.tasks[t].name.clone(),
                    variant: v.name.clone(),
                    replicas,
                    batch: vertices[i].batch,
                    latency_us: v.latency(vertices[i].batch).unwrap_or(0),
                    capacity_qps: vertices[i].throughput,
                    load_qps: mine.iter().map(|&i| loads[i]).sum(),
                    accuracy: v.accuracy,
                });
            }
        }
    }
    let plan = Plan {
        step: step.name(),
        beta,
        demand_qps: p.demand_qps,
        served_qps: served,
        shed_qps: p.demand_qps - served,
        workers: variants.iter().map(|v| v.replicas).sum(),
        accuracy: total_accuracy,
        variants,
        chains: chain_plans,
    };
    // The report's objective in the paper's terms: workers (step 1) or accuracy.
    report.objective = Some(match step {
        Step::Hardware => plan.workers as f64,
        Step::Accuracy => plan.accuracy,
    });
    Ok((report, Some(plan)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic() -> Problem {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/allocate/loki-traffic.toml");
        match crate::AnyProblem::load(&path).expect("the traffic-analysis problem") {
            crate::AnyProblem::Loki(p) => p,
            _ => unreachable!("a loki problem"),
        }
    }

    #[test]
    fn the_headroom_tie_break_keeps_the_fewest_workers_and_takes_the_most_capacity() {
        // 97 req/s: four yolov5x workers serve it at batch 1 (98 req/s) or batch 2
        // (113 req/s); batch 4 does not fit the path budget.
        let solver = Problem { demand_qps: 97.0, ..traffic() };
        let headroom = Problem { tie_break: TieBreak::Headroom, ..solver.clone() };
        let (a, b) = (solve(&solver).unwrap().plan.unwrap(), solve(&headroom).unwrap().plan.unwrap());
        assert_eq!((a.step.as_str(), b.step.as_str()), ("hardware", "hardware"));
        assert_eq!(a.workers, b.workers, "the tie-break never trades a worker");
        let detector = b.variant("yolov5x").expect("the most accurate detector");
        assert_eq!((detector.replicas, detector.batch), (4, 2));
        // The weighed capacity it maximises is at least the solver's choice's.
        let weighed = |plan: &Plan| -> f64 {
            plan.variants
                .iter()
                .map(|v| {
                    let t = solver.pipeline.tasks.iter().position(|t| t.name == v.task).unwrap();
                    let best =
                        solver.variants[t].iter().flat_map(|x| x.latency_us.iter().map(|&(b, _)| x.throughput(b)));
                    v.replicas as f64 * v.capacity_qps / best.fold(0.0, f64::max)
                })
                .sum()
        };
        assert!(weighed(&b) >= weighed(&a) - 1e-9, "{} < {}", weighed(&b), weighed(&a));
        // Where hardware scaling is infeasible, step 2 is the same with either.
        let busy = Problem { demand_qps: 400.0, ..solver.clone() };
        let busy_headroom = Problem { tie_break: TieBreak::Headroom, ..busy.clone() };
        let (c, d) = (solve(&busy).unwrap().plan.unwrap(), solve(&busy_headroom).unwrap().plan.unwrap());
        assert_eq!((c.step.as_str(), d.step.as_str()), ("accuracy", "accuracy"));
        assert!((c.accuracy - d.accuracy).abs() <= 2.0 * SolverSettings::default().mip_gap * c.accuracy);
    }

    #[test]
    fn the_reduced_model_has_the_reference_optimum() {
        // Light load (hardware scaling) and three loads in accuracy scaling. Each
        // solve is within the MIP gap of the true optimum, so the two are within
        // twice the gap of each other.
        let gap = 2.0 * SolverSettings::default().mip_gap;
        for demand in [50.0, 250.0, 400.0, 1000.0] {
            let p = Problem { demand_qps: demand, ..traffic() };
            let reference = solve_with(&p, Formulation::Reference).unwrap().0;
            let reduced = solve_with(&p, Formulation::Reduced).unwrap().0;
            let (a, b) = (reference.plan.unwrap(), reduced.plan.unwrap());
            assert_eq!((a.step.as_str(), a.beta), (b.step.as_str(), b.beta), "{demand} req/s");
            if a.step == "hardware" {
                assert_eq!(a.workers, b.workers, "{demand} req/s");
            }
            assert!(
                (a.accuracy - b.accuracy).abs() <= gap * a.accuracy,
                "{demand} req/s: reference {} vs reduced {}",
                a.accuracy,
                b.accuracy
            );
            assert!(
                reduced.report.variables < reference.report.variables / 2,
                "{demand} req/s: {} vs {} variables",
                reduced.report.variables,
                reference.report.variables
            );
        }
    }

    fn candidate(task: usize, variant: usize, batch: u32, latency_ms: f64, throughput: f64) -> Candidate {
        Candidate { task, variant, batch, latency_ms, throughput }
    }

    #[test]
    fn prune_drops_only_batch_sizes_that_cannot_matter() {
        // One chain a → b, budget 100 ms. Task a's variant 0: batch 1 (10 ms, 100/s),
        // batch 2 (30 ms, 150/s), batch 4 (40 ms, 120/s: slower and fewer per worker
        // than batch 2), batch 8 (95 ms, 300/s: no partner is fast enough). Task b's
        // only variant: 50 ms or 65 ms.
        let candidates = [
            candidate(0, 0, 1, 10.0, 100.0),
            candidate(0, 0, 2, 30.0, 150.0),
            candidate(0, 0, 4, 40.0, 120.0),
            candidate(0, 0, 8, 95.0, 300.0),
            candidate(1, 0, 1, 50.0, 100.0),
            candidate(1, 0, 2, 65.0, 150.0),
        ];
        // Batch 1 of a fits both of b's vertices (≤ 50 ms left for b), batch 2 fits
        // them too (70 ms left): batch 1 is dominated. Batch 4 is dominated outright;
        // batch 8 is on no path. On b's side, batch 1 fits with a's 30 ms vertex (a's
        // 10 ms one is gone), as does batch 2: batch 1 goes too.
        assert_eq!(prune(&candidates, &[vec![0, 1]], &[100.0]), [false, true, false, false, false, true]);
        // With a 60 ms partner on a's side (another variant), b's batch 2 (65 ms) no
        // longer fits everything batch 1 (50 ms) fits: both stay.
        let mut more = candidates.to_vec();
        more.push(candidate(0, 1, 1, 45.0, 50.0));
        let keep = prune(&more, &[vec![0, 1]], &[100.0]);
        assert_eq!(&keep[4..], [true, true, true]);
    }
}

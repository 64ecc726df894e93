//! Pipelines in virtual time (Loki, HPDC'24): one rooted tree of tasks
//! ([`sluice_core::pipeline::Pipeline`]) served by per-(task, variant) workers that
//! the Loki MILP ([`sluice_alloc::loki::solve`]) places, re-planned every
//! `solve_interval_s` on an EWMA of the demand, with MostAccurateFirst routing and
//! early dropping ([`RoutingTables::hop`]) between tasks.
//!
//! Start here: [`PipelineExperiment`] (the TOML file: a `[pipeline]` section with
//! `[[pipeline.task]]`/`[[pipeline.edge]]` as in an allocation problem, a
//! `[pipeline.system]` table and a `[sweep]`), [`run_pipeline_experiment`] (every
//! run), [`PipelineResult`] (what a run measures). The design and the reference's
//! behaviour it follows are in `docs/results/loki/README.md`.
//!
//! The request path of one run:
//! 1. A client request arrives at the root. A pass-through root (no model) fans out
//!    at once; otherwise the front end's routing table picks a root worker
//!    (`root_dispatch = "queue-aware"`: the Loki artifact's choice by queue, see
//!    [`RootDispatch`]).
//! 2. Each worker is a slot with its own queue and its own instance of an ordinary
//!    policy component (default `fixed` with `{"allocated": true}`), decided by the
//!    same decision core as every other simulated or live worker. The policy sees
//!    the hosted variant's latency table cut at the plan's batch size, so no batch
//!    exceeds it.
//! 3. An intermediate request's deadline at a task is its entry time + the task's
//!    latency budget (`latency_budget_us`, 2 × the worker's batch latency; the
//!    Proteus baseline uses SLO / depth as its reference does, and so does the root
//!    with `root_budget = "slo-per-stage"`). The end-to-end deadline is arrival + SLO.
//! 4. A served request creates `fanout_count(expected, u)` children per child task,
//!    each routed by the serving worker's table (sampled by probability from the
//!    run's seeded rng) and passed through `hop` for the run's early-drop mode.
//! 5. A client request is finished when every descendant is served or dropped. It
//!    violates its SLO when any descendant was dropped or the last one finished
//!    after the end-to-end deadline.
//!
//! Determinism: arrivals, fan-outs and routing draws come from one [`Rng`] seeded
//! per run, policies read no clock, and MILP plans are cached per rounded demand in
//! a map keyed by that demand — so a run's results are a function of its file and
//! seed (the MILP is deterministic with one thread).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use sluice_alloc::ladder::Ladder;
use sluice_alloc::loki::routing::{
    most_accurate_first_filling, queue_aware_root, Backup, Hop, RootQueue, Route, RoutingTables,
};
use sluice_alloc::loki::{self, Scaling};
use sluice_alloc::proteus;
use sluice_alloc::solver::SolverSettings;
use sluice_core::decision::{self, Bound, Context, Next, Queued};
use sluice_core::demand::{Ewma, Forecaster as _};
use sluice_core::pipeline::{
    fanout_count, finish_at_batch, slo_per_stage_us, DropAt, EarlyDrop, EdgeSpec, Pipeline, PipelineSpec, RootBudget,
    RootDispatch, TaskSpec,
};
use sluice_core::profile::{Percentile, Profile};
use sluice_core::queue::{insert_by_deadline, DropReason};
use sluice_core::runtime::{Binding, Limits, PolicyInstance};
use sluice_core::workload::{ArrivalSpec, Spacing};
use sluice_sdk as sdk;

use crate::arrivals::generate;
use crate::rng::Rng;
use crate::PolicyCache;

/// A pipeline experiment file (`sluice sim <file>` runs it when it has a
/// `[pipeline]` section).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineExperiment {
    /// `version = 1`.
    pub version: u32,
    /// `name = "loki-capacity"`.
    pub name: String,
    /// `seed = 1`: arrivals, fan-outs and routing draws (a sweep's `seeds` override it).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// `duration_s = 120`: simulated time of arrivals (the run then drains).
    pub duration_s: f64,
    /// `builtin_policy_dir = "../../target/policies"`: where policies named without a
    /// `.wasm` path are found.
    #[serde(default = "default_builtin")]
    pub builtin_policy_dir: PathBuf,
    /// `profile = "../../profiles/loki-simulator.toml"`: latencies and accuracies.
    pub profile: PathBuf,
    /// `window_s = 1.0`: width of the time-series windows.
    #[serde(default = "default_window")]
    pub window_s: f64,
    /// `max_queue = 200000`: a worker queue longer than this ends the run as overloaded.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// `[pipeline]`: the pipeline, its cluster, its load and the serving system.
    pub pipeline: PipelineConfig,
    /// `[sweep]`: the runs, as a cartesian product (one run without it).
    #[serde(default)]
    pub sweep: PipelineSweep,
}

/// The `[pipeline]` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// `slo_ms = 250`: the end-to-end latency SLO.
    pub slo_ms: f64,
    /// `workers = 20`: the cluster's workers (S).
    pub workers: u32,
    /// `arrivals = { kind = "rate-trace", file = "...", scale = 1.0 }`: client requests
    /// entering the root.
    pub arrivals: ArrivalSpec,
    /// `percentile = "p50"`: the latency the MILP plans with and batches take (the
    /// reference simulator's runtimes are p50).
    #[serde(default = "default_percentile")]
    pub percentile: Percentile,
    /// `batch_sizes = [1, 2, 4, 8, 16, 32, 64]`: allowed batch sizes (the reference's
    /// `allowedBatchSizes`).
    #[serde(default = "default_batches")]
    pub batch_sizes: Vec<u32>,
    /// `comm_latency_ms = 0`: per-hop communication latency the MILP subtracts.
    #[serde(default)]
    pub comm_latency_ms: f64,
    /// `[[pipeline.task]]`: the tasks, as in a `PipelineSpec`.
    #[serde(rename = "task", default)]
    pub tasks: Vec<TaskSpec>,
    /// `[[pipeline.edge]]`: parent → child.
    #[serde(rename = "edge", default)]
    pub edges: Vec<EdgeSpec>,
    /// `[pipeline.system]`: the serving system (each sweep system overrides keys of it).
    #[serde(default)]
    pub system: toml::Table,
}

/// The runs: every combination of the non-empty lists (systems, SLOs, loads,
/// workers, seeds, in that nesting order).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSweep {
    /// `[[sweep.systems]]`: tables of [`SystemSpec`] keys replacing the
    /// `[pipeline.system]` ones (`label` names the system in results).
    #[serde(default)]
    pub systems: Vec<toml::Table>,
    /// `slo_ms = [150, 250, 350]`: end-to-end SLOs.
    #[serde(default)]
    pub slo_ms: Vec<f64>,
    /// `load_qps = [20, 40]`: constant Poisson rates replacing the arrivals.
    #[serde(default)]
    pub load_qps: Vec<f64>,
    /// `scale = [0.5, 1.0]`: multipliers of a rate trace's rates.
    #[serde(default)]
    pub scale: Vec<f64>,
    /// `workers = [10, 20]`: cluster sizes.
    #[serde(default)]
    pub workers: Vec<u32>,
    /// `seeds = [1, 2]`.
    #[serde(default)]
    pub seeds: Vec<u64>,
}

/// How the workers are allocated.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Allocator {
    /// Loki: hardware scaling, then accuracy scaling when it is infeasible.
    #[default]
    Loki,
    /// Hardware scaling only, most accurate variants (InferLine-style).
    HardwareOnly,
    /// Accuracy scaling always (the whole cluster).
    AccuracyOnly,
    /// Proteus per task, pipeline-unaware (the reference's `proteus.json` for
    /// pipelines: every task an independent query type with its own measured
    /// demand and an equal share SLO / depth of the SLO, one accuracy-maximising
    /// MILP over the shared cluster).
    ProteusPerTask,
}

impl Allocator {
    fn scaling(self) -> Option<Scaling> {
        match self {
            Allocator::Loki => Some(Scaling::Loki),
            Allocator::HardwareOnly => Some(Scaling::HardwareOnly),
            Allocator::AccuracyOnly => Some(Scaling::AccuracyOnly),
            Allocator::ProteusPerTask => None,
        }
    }

    /// The name used in files and results.
    pub fn as_str(self) -> &'static str {
        match self {
            Allocator::Loki => "loki",
            Allocator::HardwareOnly => "hardware-only",
            Allocator::AccuracyOnly => "accuracy-only",
            Allocator::ProteusPerTask => "proteus-per-task",
        }
    }
}

/// How the Proteus-per-task baseline routes between tasks.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProteusRouting {
    /// By the MILP's shares of each task's demand, whoever sent the request
    /// (Proteus's own query assignment, §4).
    #[default]
    Shares,
    /// Loki's MostAccurateFirst over the placed workers, the MILP's shares ignored:
    /// what the Loki artifact runs for its Proteus baseline (`proteus.json`:
    /// `job_scheduling = "most_accurate_first"`, its load balancer's only policy).
    MostAccurateFirst,
}

/// Which requests `rerouting` moves to a faster downstream worker.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RerouteRule {
    /// §5.2: a request that left its task x behind its budget goes to the most
    /// accurate worker with capacity left that executes within y − x
    /// (`RoutingTables::hop`).
    #[default]
    Paper,
    /// The Loki artifact's `pop_while_first_expires` with `dynamic_rerouting`, at
    /// batch formation (needs `early_drop_at = "batch"`): walking the queue from the
    /// head, a request whose finish in this batch leaves at least a faster child
    /// worker's budget before its task deadline is sent, for that child, to the first
    /// child worker (in plan order) with capacity left whose budget is below the one
    /// its routing table drew; the walk goes on past rerouted requests and stops at
    /// the first that is neither rerouted nor late. It moves requests that are
    /// *ahead* of their deadline — the opposite of §5.2.
    Artifact,
}

/// When the routing tables are rebuilt.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TableRebuild {
    /// At every plan applied, for its demand (as the live host, which also rebuilds
    /// them between plans from the measured demand).
    #[default]
    EveryPlan,
    /// Only when a plan adds or removes a worker (a slot changes its task or variant,
    /// or is placed or freed): the Loki artifact's load balancer runs from
    /// `add_predictor` and `remove_predictor_by_id` only, so its tables keep the
    /// demand and capacities of the last such plan.
    WorkerChange,
}

/// The fan-out a routing table is sized for at each worker.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Branching {
    /// Its variant's expected fan-out (the plan's).
    #[default]
    Expected,
    /// What the worker measured over its last 50 requests per child, and 1 while it
    /// has served none since it took its (task, variant): the Loki artifact's
    /// `getBranchingFactor` over `PROFILED_BRANCHING_MAX_HISTORY` ("we will assume the
    /// branching factor is 1").
    Measured,
}

/// Requests a worker's branching is measured over ([`Branching::Measured`]).
const BRANCHING_HISTORY: usize = 50;

/// How a worker's routing table is turned into one destination.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingDraw {
    /// A draw from the run's rng over the table's probabilities (the reference
    /// samples too).
    #[default]
    Sampled,
    /// Smooth weighted round robin over the probabilities (nginx's): the same
    /// proportions with the smallest spread.
    Smooth,
}

/// A serving system: `[pipeline.system]` merged with a sweep system's keys.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SystemSpec {
    /// `label = "Loki"`: its name in results (default: the allocator's name and
    /// early-drop mode).
    #[serde(default)]
    pub label: Option<String>,
    /// `allocator = "loki"` | `"hardware-only"` | `"accuracy-only"` | `"proteus-per-task"`.
    #[serde(default)]
    pub allocator: Allocator,
    /// `early_drop = "rerouting"` | `"per-task"` | `"last-task"` | `"none"`.
    #[serde(default)]
    pub early_drop: EarlyDrop,
    /// `early_drop_at = "hop"` | `"batch"`: where early dropping acts (see [`DropAt`]).
    #[serde(default)]
    pub early_drop_at: DropAt,
    /// `policy = "fixed"`: the batching policy every worker runs.
    #[serde(default = "default_policy")]
    pub policy: String,
    /// `params = { allocated = true }`: its params.
    #[serde(default)]
    pub params: Option<toml::Table>,
    /// `solve_interval_s = 1`: re-planning period (the reference's `solve_interval`;
    /// 10 for its InferLine). 0: plan once at the start.
    #[serde(default = "one")]
    pub solve_interval_s: f64,
    /// `ewma_decay = 1.6`: the demand EWMA's centre of mass (pandas `ewm(com=…)`,
    /// as the reference's `add_moving_demand`).
    #[serde(default = "default_decay")]
    pub ewma_decay: f64,
    /// `ewma_window = 20`: one-second counts the EWMA looks at (the reference's
    /// `EWMA_WINDOW`).
    #[serde(default = "default_ewma_window")]
    pub ewma_window: usize,
    /// `beta = 1.0`: capacity headroom of the first solve (the reference's `beta`).
    #[serde(default = "one")]
    pub beta: f64,
    /// `min_beta = 0.2`: the demand factor below which a plan is not sought (the
    /// ladder's floor: Loki and the baselines shed demand down to it when even their
    /// fastest plan cannot serve it all). A sweep far past a system's capacity lowers
    /// it; at the floor the first plan fails and the run stops with an error.
    #[serde(default = "default_min_beta")]
    pub min_beta: f64,
    /// `min_demand_qps = 1`: the demand the MILP is given at least (the reference's
    /// pipeline ILP clamps to 50, which hides hardware scaling off-peak; not
    /// followed by default, see the README).
    #[serde(default = "one")]
    pub min_demand_qps: f64,
    /// `demand_step_qps = 1`: plans are solved for the demand rounded up to a
    /// multiple of this and cached per multiple (a solve takes 10 ms – 2 s).
    #[serde(default = "one")]
    pub demand_step_qps: f64,
    /// `routing = "sampled"` | `"smooth"`.
    #[serde(default)]
    pub routing: RoutingDraw,
    /// `routing_utilization = 1.0`: the share of each worker's capacity
    /// MostAccurateFirst may fill. 1 is the paper's Algorithm 1, which fills the most
    /// accurate workers to exactly their capacity — with Poisson arrivals a worker at
    /// 100% utilisation queues without bound, so experiments may leave headroom.
    #[serde(default = "one")]
    pub routing_utilization: f64,
    /// `fill_cluster = true` (proteus-per-task only): every worker hosts a variant;
    /// the ones the MILP leaves idle host the most accurate variant of the most
    /// loaded task (`proteus::Plan::upgrade_idle`, the Loki artifact's Proteus
    /// baseline). Default false: Proteus's Eq. 1 lets devices stay idle.
    #[serde(default)]
    pub fill_cluster: bool,
    /// `proteus_routing = "shares"` | `"most-accurate-first"` (proteus-per-task only).
    #[serde(default)]
    pub proteus_routing: ProteusRouting,
    /// `reroute_rule = "paper"` | `"artifact"` (see [`RerouteRule`]; `"artifact"` needs
    /// `early_drop = "rerouting"` and `early_drop_at = "batch"`).
    #[serde(default)]
    pub reroute_rule: RerouteRule,
    /// `tie_break = "solver"` | `"headroom"` (Loki's allocators only): which plan
    /// hardware scaling returns among those with the fewest workers
    /// ([`loki::TieBreak`]).
    #[serde(default)]
    pub tie_break: loki::TieBreak,
    /// `root_dispatch = "table"` | `"queue-aware"` (see [`RootDispatch`]).
    #[serde(default)]
    pub root_dispatch: RootDispatch,
    /// `root_budget = "batch"` | `"slo-per-stage"` (see [`RootBudget`]; the
    /// proteus-per-task baseline uses SLO / depth at every task whatever this says).
    #[serde(default)]
    pub root_budget: RootBudget,
    /// `table_rebuild = "every-plan"` | `"worker-change"` (see [`TableRebuild`]).
    #[serde(default)]
    pub table_rebuild: TableRebuild,
    /// `branching = "expected"` | `"measured"` (see [`Branching`]).
    #[serde(default)]
    pub branching: Branching,
}

impl SystemSpec {
    fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| match self.early_drop_at {
            DropAt::Hop => format!("{}/{}", self.allocator.as_str(), self.early_drop.as_str()),
            DropAt::Batch => format!("{}/{}@batch", self.allocator.as_str(), self.early_drop.as_str()),
        })
    }
}

fn default_seed() -> u64 {
    1
}
fn default_builtin() -> PathBuf {
    PathBuf::from("target/policies")
}
fn default_window() -> f64 {
    1.0
}
fn default_max_queue() -> usize {
    200_000
}
fn default_percentile() -> Percentile {
    Percentile::P50
}
fn default_batches() -> Vec<u32> {
    vec![1, 2, 4, 8, 16, 32, 64]
}
fn default_policy() -> String {
    "fixed".into()
}
fn one() -> f64 {
    1.0
}
fn default_min_beta() -> f64 {
    Ladder::default().min_beta
}
fn default_decay() -> f64 {
    1.6
}
fn default_ewma_window() -> usize {
    20
}

/// One run of a pipeline experiment.
#[derive(Clone, Debug)]
pub struct PipelineRun {
    /// Index in the sweep.
    pub index: usize,
    /// The system.
    pub system: SystemSpec,
    /// End-to-end SLO, ms.
    pub slo_ms: f64,
    /// Cluster size.
    pub workers: u32,
    /// Client arrivals.
    pub arrivals: ArrivalSpec,
    /// Seed.
    pub seed: u64,
}

impl PipelineExperiment {
    /// Reads and checks a pipeline experiment; returns it and the directory its
    /// relative paths start from.
    pub fn load(path: &Path) -> Result<(PipelineExperiment, PathBuf)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
        let e = PipelineExperiment::parse(&text, &path.display().to_string())?;
        Ok((e, path.parent().map(Path::to_path_buf).unwrap_or_default()))
    }

    /// Parses and checks experiment text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<PipelineExperiment> {
        let e: PipelineExperiment = toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        if e.version != 1 {
            bail!("{origin}: version: expected 1, got {}", e.version);
        }
        if !(e.duration_s.is_finite() && e.duration_s > 0.0) {
            bail!("{origin}: duration_s: expected a positive number of seconds");
        }
        e.pipeline_graph().map_err(|err| anyhow::anyhow!("{origin}: pipeline: {err}"))?;
        for run in e.runs().map_err(|err| anyhow::anyhow!("{origin}: {err}"))? {
            if !(run.slo_ms.is_finite() && run.slo_ms > 0.0) || run.workers == 0 {
                bail!("{origin}: run {}: slo_ms > 0 and workers > 0 expected", run.index);
            }
            let s = &run.system;
            if !(s.ewma_decay >= 0.0
                && s.ewma_window > 0
                && s.demand_step_qps > 0.0
                && s.solve_interval_s >= 0.0
                && s.routing_utilization > 0.0)
            {
                bail!("{origin}: system {}: ewma_decay ≥ 0, ewma_window > 0, demand_step_qps > 0, solve_interval_s ≥ 0 expected", s.label());
            }
            if s.reroute_rule == RerouteRule::Artifact
                && (s.early_drop != EarlyDrop::Rerouting || s.early_drop_at != DropAt::Batch)
            {
                bail!(
                    "{origin}: system {}: `reroute_rule = \"artifact\"` needs early_drop = \"rerouting\" and early_drop_at = \"batch\" (it decides at batch formation)",
                    s.label()
                );
            }
            if s.allocator == Allocator::ProteusPerTask && s.tie_break != loki::TieBreak::Solver {
                bail!(
                    "{origin}: system {}: `tie_break` applies to Loki's allocators only, not \"proteus-per-task\"",
                    s.label()
                );
            }
            if s.allocator != Allocator::ProteusPerTask {
                let key = if s.fill_cluster {
                    Some("fill_cluster")
                } else if s.proteus_routing != ProteusRouting::Shares {
                    Some("proteus_routing")
                } else {
                    None
                };
                if let Some(key) = key {
                    bail!(
                        "{origin}: system {}: `{key}` applies to allocator = \"proteus-per-task\" only, not \"{}\"",
                        s.label(),
                        s.allocator.as_str()
                    );
                }
            }
        }
        Ok(e)
    }

    /// The checked pipeline.
    pub fn pipeline_graph(&self) -> Result<Pipeline> {
        let spec = PipelineSpec { tasks: self.pipeline.tasks.clone(), edges: self.pipeline.edges.clone() };
        Ok(Pipeline::new(&spec)?)
    }

    /// Every run of the sweep.
    pub fn runs(&self) -> Result<Vec<PipelineRun>> {
        let base = &self.pipeline.system;
        let systems: Vec<SystemSpec> = if self.sweep.systems.is_empty() {
            vec![system_from(base, &toml::Table::new())?]
        } else {
            self.sweep.systems.iter().map(|s| system_from(base, s)).collect::<Result<_>>()?
        };
        let list = |v: &Vec<f64>| if v.is_empty() { vec![None] } else { v.iter().copied().map(Some).collect() };
        let slos = list(&self.sweep.slo_ms);
        let loads = list(&self.sweep.load_qps);
        let scales = list(&self.sweep.scale);
        let workers: Vec<Option<u32>> = if self.sweep.workers.is_empty() {
            vec![None]
        } else {
            self.sweep.workers.iter().copied().map(Some).collect()
        };
        let seeds = if self.sweep.seeds.is_empty() { vec![self.seed] } else { self.sweep.seeds.clone() };
        let mut out = Vec::new();
        for system in &systems {
            for slo in &slos {
                for load in &loads {
                    for scale in &scales {
                        for w in &workers {
                            for &seed in &seeds {
                                let mut arrivals = self.pipeline.arrivals.clone();
                                if let Some(l) = load {
                                    arrivals = ArrivalSpec::Poisson { rate_qps: *l };
                                }
                                if let (Some(s), ArrivalSpec::RateTrace { scale, .. }) = (scale, &mut arrivals) {
                                    *scale *= s;
                                }
                                out.push(PipelineRun {
                                    index: out.len(),
                                    system: system.clone(),
                                    slo_ms: slo.unwrap_or(self.pipeline.slo_ms),
                                    workers: w.unwrap_or(self.pipeline.workers),
                                    arrivals,
                                    seed,
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// `[pipeline.system]` with a sweep system's keys replacing its own.
fn system_from(base: &toml::Table, over: &toml::Table) -> Result<SystemSpec> {
    let mut merged = base.clone();
    for (k, v) in over {
        merged.insert(k.clone(), v.clone());
    }
    let label = over.get("label").and_then(|v| v.as_str()).unwrap_or("pipeline.system").to_string();
    toml::Value::Table(merged).try_into().map_err(|e| anyhow::anyhow!("system `{label}`: {e}"))
}

/// What one task saw in a run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TaskResult {
    /// The task.
    pub task: String,
    /// Intermediate requests created for it (client requests for the root).
    pub created: u64,
    /// Served (on time or late).
    pub served: u64,
    /// Served after their deadline at this task (the reference's `late`).
    pub late: u64,
    /// Dropped, by cause (`over-budget`, `no-time-left`, `no-faster-worker`: early
    /// dropping on the way in; `policy`: the batching policy; `expired`: the host's
    /// expiry, a full SLO past the task deadline).
    pub dropped: BTreeMap<String, u64>,
    /// Rerouted on the way in (opportunistic rerouting).
    pub rerouted: u64,
}

impl TaskResult {
    /// Every drop, whatever the cause.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// The fan-out measured on one edge of one variant.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FanoutResult {
    /// The parent task.
    pub task: String,
    /// The variant that served.
    pub variant: String,
    /// The child task.
    pub child: String,
    /// Requests the variant served.
    pub served: u64,
    /// Requests they created for the child.
    pub created: u64,
    /// created / served.
    pub measured: f64,
    /// The pipeline's expected factor (factor × branch).
    pub expected: f64,
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineResult {
    /// Index in the sweep.
    pub run: usize,
    /// The system's label.
    pub system: String,
    /// The allocator.
    pub allocator: String,
    /// The early-drop mode.
    pub early_drop: String,
    /// Where early dropping acts (`hop` or `batch`).
    pub early_drop_at: String,
    /// End-to-end SLO, ms.
    pub slo_ms: f64,
    /// Cluster size.
    pub workers: u32,
    /// The arrivals (mean rate, or the trace file and scale).
    pub load: String,
    /// Seed.
    pub seed: u64,
    /// Client requests that arrived.
    pub requests: u64,
    /// Client requests finished (all descendants served or dropped).
    pub finished: u64,
    /// Finished on time with nothing dropped.
    pub on_time: u64,
    /// on_time / requests.
    pub on_time_fraction: f64,
    /// 1 − on_time_fraction: the client-level SLO violation ratio.
    pub violation_ratio: f64,
    /// Client requests with at least one dropped descendant.
    pub clients_with_drops: u64,
    /// Client requests late with nothing dropped.
    pub clients_late: u64,
    /// Sink results served (on time or late).
    pub sink_results: u64,
    /// Mean over served sink results of the path accuracy (product of the serving
    /// variants' accuracies, normalised per task as Loki's data are).
    pub accuracy: f64,
    /// The reference simulator's metric: mean over every served request at every
    /// task of its variant's accuracy (`total_accuracy / total_successful`).
    pub accuracy_per_request: f64,
    /// Intermediate requests (all tasks, the root's included).
    pub task_requests: u64,
    /// The reference's violation ratio: (dropped + served late vs their task
    /// deadline) / created, over every task.
    pub violation_ratio_per_request: f64,
    /// What the Loki artifact prints as its `Overall SLO violation ratio`: the same
    /// failures over every request it counts, which includes one `sink` request per
    /// result that reaches a sink (never dropped).
    pub violation_ratio_with_sink: f64,
    /// Drops by mode cause, all tasks.
    pub drops: BTreeMap<String, u64>,
    /// Per task.
    pub tasks: Vec<TaskResult>,
    /// Per (task, variant, child).
    pub fanout: Vec<FanoutResult>,
    /// Time-weighted mean of workers allocated (placed or still draining).
    pub workers_mean: f64,
    /// Fewest workers allocated at once, from the first plan on (the off-peak low).
    pub workers_min: u32,
    /// Most workers allocated at once.
    pub workers_max: u32,
    /// Plans applied (the first included).
    pub replans: u64,
    /// Routing-table builds (one per plan unless `table_rebuild = "worker-change"`).
    pub table_builds: u64,
    /// MILP solves (cache misses).
    pub solves: u64,
    /// Plans taken from the cache.
    pub cache_hits: u64,
    /// Wall seconds spent in MILP solves.
    pub solve_seconds: f64,
    /// Mean demand share the plans shed (1 − min(β, 1), over applied plans).
    pub shed_fraction: f64,
    /// Set when a queue grew past `max_queue` and the run stopped.
    pub overloaded: Option<String>,
}

/// One time-series window of one run.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineWindow {
    /// Run index.
    pub run: usize,
    /// System label.
    pub system: String,
    /// Window start, s.
    pub t_s: f64,
    /// Client arrivals in the window.
    pub arrivals: u64,
    /// The demand estimate the last plan used, requests/s.
    pub demand_qps: f64,
    /// Workers allocated at the end of the window.
    pub workers: u32,
    /// Client requests that arrived in the window and violated their SLO.
    pub violations: u64,
    /// Mean path accuracy of sink results of requests that arrived in the window.
    pub accuracy: Option<f64>,
}

/// Every run's results and time series.
pub struct PipelineOutput {
    /// Per run.
    pub results: Vec<PipelineResult>,
    /// Per run and window.
    pub timeseries: Vec<PipelineWindow>,
    /// Wall seconds per run.
    pub wall_seconds: Vec<f64>,
}

/// Runs every run of the experiment, in order.
pub fn run_pipeline_experiment(exp: &PipelineExperiment, base: &Path) -> Result<PipelineOutput> {
    let mut cache = PolicyCache::new(base.join(&exp.builtin_policy_dir), base.to_path_buf())?;
    let profile = Profile::load(&base.join(&exp.profile))?;
    let pipeline = exp.pipeline_graph()?;
    let mut out = PipelineOutput { results: Vec::new(), timeseries: Vec::new(), wall_seconds: Vec::new() };
    for run in exp.runs()? {
        let started = Instant::now();
        let sim = PipelineSim::new(exp, base, &pipeline, &profile, &run, &mut cache)?;
        let (r, ts) = sim.run();
        out.wall_seconds.push(started.elapsed().as_secs_f64());
        out.results.push(r);
        out.timeseries.extend(ts);
    }
    Ok(out)
}

/// Writes `results.json` and `timeseries.csv` into `dir`.
pub fn write_outputs(dir: &Path, out: &PipelineOutput) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&out.results)? + "\n")?;
    let mut csv = String::from("run,system,t_s,arrivals,demand_qps,workers,violations,accuracy\n");
    for w in &out.timeseries {
        csv.push_str(&format!(
            "{},{},{:.1},{},{:.2},{},{},{}\n",
            w.run,
            w.system,
            w.t_s,
            w.arrivals,
            w.demand_qps,
            w.workers,
            w.violations,
            w.accuracy.map(|a| format!("{a:.4}")).unwrap_or_default()
        ));
    }
    std::fs::write(dir.join("timeseries.csv"), csv)?;
    Ok(())
}

/// An intermediate request at one task.
#[derive(Clone, Copy, Debug)]
struct Req {
    id: u64,
    client: u32,
    task: usize,
    /// When it entered this task.
    entry: u64,
    /// entry + the task's budget on the worker it was sent to.
    deadline: u64,
    /// The product of the accuracies of the variants that served its ancestors.
    accuracy: f64,
}

impl Queued for Req {
    fn pending(&self) -> sdk::Pending {
        sdk::Pending { id: self.id, arrival: self.entry, deadline: self.deadline }
    }
}

struct Client {
    arrival: u64,
    deadline: u64,
    /// Descendants created and not yet served or dropped.
    outstanding: u32,
    last_done: u64,
    dropped: bool,
    finished: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SlotState {
    /// Placed by the current plan: receives traffic.
    Active,
    /// No longer in the plan: serves what it has queued, then frees.
    Retiring,
    /// Unused.
    Free,
}

/// Requests/s one worker sustains at `batch` taking `latency_us` a batch.
fn capacity_qps(batch: u32, latency_us: u64) -> f64 {
    f64::from(batch) * 1e6 / latency_us.max(1) as f64
}

/// One worker: a (task, variant) replica with its queue and policy instance.
struct Slot {
    task: usize,
    variant: usize,
    batch: u32,
    latency_us: u64,
    budget_us: u64,
    state: SlotState,
    policy: Bound,
    /// The task's models as this worker's policy sees them.
    models: Arc<Vec<sdk::Model>>,
    loaded: Vec<u32>,
    queue: Vec<Req>,
    busy: bool,
    token: u64,
    /// Its node in the current routing tables.
    node: Option<usize>,
    /// Per child task, the requests it sent there per request served, the last
    /// [`BRANCHING_HISTORY`] ([`Branching::Measured`] only; emptied when the slot
    /// takes another (task, variant)).
    branching: Vec<std::collections::VecDeque<u32>>,
}

enum Event {
    Arrival,
    Done { slot: usize, model: u32, batch: Vec<Req>, started: u64 },
    Timer { slot: usize, token: u64 },
    Replan,
    Window,
}

/// A placement: per (task, variant) hosted, its replicas, batch and latency.
#[derive(Clone, Debug, PartialEq)]
struct Placement {
    hosted: Vec<(usize, usize, u32, u32, u64)>,
    /// Per task (proteus-per-task only): per hosted entry, its share of the task's demand.
    shares: Option<Vec<f64>>,
    shed: f64,
}

#[derive(Default)]
struct TaskCounters {
    created: u64,
    served: u64,
    late: u64,
    dropped: BTreeMap<&'static str, u64>,
    rerouted: u64,
    accuracy_sum: f64,
}

/// (task, variant, batch, budget µs): what a worker's policy binding depends on.
type BindingKey = (usize, usize, u32, u64);
/// A binding and the models its instances see.
type BoundModels = (Arc<Binding>, Arc<Vec<sdk::Model>>);

struct PipelineSim<'a> {
    pipeline: &'a Pipeline,
    run: PipelineRun,
    label: String,
    profile: &'a Profile,
    /// Per task, its variants for the Loki MILP (empty for pass-through).
    loki_variants: Vec<Vec<loki::Variant>>,
    /// Per task, its models as policies see them (dense latency tables).
    task_models: Vec<Vec<sdk::Model>>,
    compiled: Option<Arc<sluice_core::runtime::CompiledPolicy>>,
    engine: Arc<sluice_core::runtime::PolicyEngine>,
    params: String,
    bindings: HashMap<BindingKey, BoundModels>,
    rng: Rng,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    payloads: BTreeMap<u64, Event>,
    seq: u64,
    now: u64,
    arrivals: Vec<u64>,
    next_arrival: usize,
    duration_us: u64,
    window_us: u64,
    slo_us: u64,
    expire_us: u64,
    max_queue: usize,
    depth: usize,
    slots: Vec<Slot>,
    tables: RoutingTables,
    node_slot: Vec<Option<usize>>,
    smooth: HashMap<(usize, usize), Vec<f64>>,
    clients: Vec<Client>,
    next_req: u64,
    /// Per second: client arrivals; per task, requests created.
    per_second_root: Vec<u64>,
    per_second_task: Vec<Vec<u64>>,
    plan_cache: HashMap<u64, Option<Placement>>,
    placement: Option<Placement>,
    demand_used: f64,
    counters: Vec<TaskCounters>,
    fanout_served: Vec<Vec<u64>>,
    fanout_created: Vec<Vec<Vec<u64>>>,
    sink_results: u64,
    sink_accuracy: f64,
    replans: u64,
    table_builds: u64,
    /// The workers the routing tables were built over: per node, its slot, task and
    /// variant (for [`TableRebuild::WorkerChange`]).
    table_workers: Vec<(usize, usize, usize)>,
    solves: u64,
    cache_hits: u64,
    solve_seconds: f64,
    shed_sum: f64,
    workers_area: f64,
    workers_since: u64,
    workers_now: u32,
    workers_min: u32,
    workers_max: u32,
    windows: Vec<PipelineWindow>,
    window_violations: Vec<u64>,
    window_acc: Vec<(f64, u64)>,
    overloaded: Option<String>,
    /// Requests the artifact's rule rerouted while queued: per child index, the node
    /// their children go to. Cleared at every plan (the nodes change), when the
    /// children fall back to the routing tables as the artifact's do when the target
    /// is gone.
    reroutes: HashMap<u64, Vec<(usize, usize)>>,
}

impl<'a> PipelineSim<'a> {
    fn new(
        exp: &PipelineExperiment,
        base: &Path,
        pipeline: &'a Pipeline,
        profile: &'a Profile,
        run: &PipelineRun,
        cache: &mut PolicyCache,
    ) -> Result<PipelineSim<'a>> {
        let duration_us = (exp.duration_s * 1e6) as u64;
        let mut rng = Rng::new(run.seed);
        let arrivals: Vec<u64> =
            generate(&run.arrivals, "pipeline", base, duration_us, &mut rng)?.into_iter().map(|a| a.at).collect();
        let pc = &exp.pipeline;
        let loki_variants = loki::variants(pipeline, profile, pc.percentile, &pc.batch_sizes)
            .map_err(|(field, msg)| anyhow::anyhow!("{field}: {msg}"))?;
        let task_models = pipeline
            .tasks
            .iter()
            .map(|t| {
                profile
                    .policy_models(Some(&t.models), pc.percentile, None)
                    .map(|v| v.into_iter().map(|(m, _)| m).collect())
                    .map_err(|e| anyhow::anyhow!("task {}: {e}", t.name))
            })
            .collect::<Result<Vec<Vec<sdk::Model>>>>()?;
        let compiled = match run.system.policy.as_str() {
            "safe" => None,
            p => Some(cache.get(p)?),
        };
        let params = match &run.system.params {
            Some(t) => serde_json::to_string(t)?,
            None => "{}".into(),
        };
        let depth = pipeline.depth();
        let slo_us = (run.slo_ms * 1000.0).round() as u64;
        let secs = (duration_us / 1_000_000 + 2) as usize;
        let n = pipeline.tasks.len();
        let mut sim = PipelineSim {
            pipeline,
            label: run.system.label(),
            run: run.clone(),
            profile,
            loki_variants,
            task_models,
            compiled,
            engine: cache.engine().clone(),
            params,
            bindings: HashMap::new(),
            rng,
            events: BinaryHeap::new(),
            payloads: BTreeMap::new(),
            seq: 0,
            now: 0,
            arrivals,
            next_arrival: 0,
            duration_us,
            window_us: (exp.window_s * 1e6).max(1.0) as u64,
            slo_us,
            // A request a full SLO past its task deadline is past its end-to-end
            // deadline too (task deadlines start after the arrival): expiring it
            // only turns a certain violation into a drop, and bounds queues.
            expire_us: slo_us,
            max_queue: exp.max_queue,
            depth,
            slots: Vec::new(),
            tables: RoutingTables {
                frontend: Vec::new(),
                nodes: Vec::new(),
                passthrough: vec![None; n],
                backup: vec![Vec::new(); n],
                incoming: Vec::new(),
                latency_us: Vec::new(),
            },
            node_slot: Vec::new(),
            smooth: HashMap::new(),
            clients: Vec::new(),
            next_req: 0,
            per_second_root: vec![0; secs],
            per_second_task: vec![vec![0; secs]; n],
            plan_cache: HashMap::new(),
            placement: None,
            demand_used: 0.0,
            counters: (0..n).map(|_| TaskCounters::default()).collect(),
            fanout_served: pipeline.tasks.iter().map(|t| vec![0; t.models.len().max(1)]).collect(),
            fanout_created: pipeline
                .tasks
                .iter()
                .map(|t| vec![vec![0; t.children.len()]; t.models.len().max(1)])
                .collect(),
            sink_results: 0,
            sink_accuracy: 0.0,
            replans: 0,
            table_builds: 0,
            table_workers: Vec::new(),
            solves: 0,
            cache_hits: 0,
            solve_seconds: 0.0,
            shed_sum: 0.0,
            workers_area: 0.0,
            workers_since: 0,
            workers_now: 0,
            workers_min: u32::MAX,
            workers_max: 0,
            windows: Vec::new(),
            window_violations: Vec::new(),
            window_acc: Vec::new(),
            overloaded: None,
            reroutes: HashMap::new(),
        };
        // The first plan: the demand of the first second of arrivals (a warm start:
        // the reference starts from a fixed allocation and its clamp of 50 req/s).
        let first = sim.arrivals.iter().take_while(|&&t| t < 1_000_000).count() as f64;
        let per_task: Vec<f64> = sim.expected_task_demand(first);
        sim.replan(first, &per_task)?;
        if sim.placement.is_none() {
            bail!("run {}: no feasible plan for the initial demand {first} req/s", run.index);
        }
        if let Some(&t) = sim.arrivals.first() {
            sim.schedule(t, Event::Arrival);
        }
        if run.system.solve_interval_s > 0.0 {
            sim.schedule((run.system.solve_interval_s * 1e6) as u64, Event::Replan);
        }
        sim.schedule(sim.window_us, Event::Window);
        Ok(sim)
    }

    fn schedule(&mut self, at: u64, e: Event) {
        // Ties break by insertion order, which keeps runs deterministic.
        self.seq += 1;
        self.events.push(Reverse((at, self.seq)));
        self.payloads.insert(self.seq, e);
    }

    /// Per task, the requests/s a root demand creates through the most accurate
    /// variants' fan-outs (the Proteus baseline's first plan, before it has measured).
    fn expected_task_demand(&self, root: f64) -> Vec<f64> {
        let mut d = vec![0.0; self.pipeline.tasks.len()];
        if !d.is_empty() {
            d[0] = root;
        }
        for (t, task) in self.pipeline.tasks.iter().enumerate() {
            let best = (0..task.models.len().max(1))
                .max_by(|&a, &b| {
                    let acc = |k: usize| self.task_models[t].get(k).map_or(1.0, |m| m.accuracy);
                    acc(a).total_cmp(&acc(b))
                })
                .unwrap_or(0);
            for (ci, &c) in task.children.iter().enumerate() {
                d[c] += d[t] * task.fanout[best][ci];
            }
        }
        d
    }

    fn run(mut self) -> (PipelineResult, Vec<PipelineWindow>) {
        while let Some(Reverse((now, seq))) = self.events.pop() {
            self.now = now;
            let Some(event) = self.payloads.remove(&seq) else { continue };
            match event {
                Event::Arrival => self.arrive(),
                Event::Done { slot, model, batch, started } => {
                    self.finish(slot, model, batch, started);
                    self.slots[slot].busy = false;
                    self.after_idle(slot);
                }
                Event::Timer { slot, token } => {
                    if self.slots[slot].token == token && !self.slots[slot].busy {
                        self.decide(slot);
                    }
                }
                Event::Replan => {
                    let (root, tasks) = self.demand_estimate();
                    if let Err(e) = self.replan(root, &tasks) {
                        self.overloaded = Some(format!("re-plan failed: {e:#}"));
                    }
                    let next = now + (self.run.system.solve_interval_s * 1e6) as u64;
                    if next < self.duration_us {
                        self.schedule(next, Event::Replan);
                    }
                }
                Event::Window => {
                    self.close_window();
                    let busy = self.slots.iter().any(|s| s.busy || !s.queue.is_empty());
                    if now + self.window_us <= self.duration_us || busy {
                        self.schedule(now + self.window_us, Event::Window);
                    }
                }
            }
            if self.overloaded.is_some() {
                break;
            }
        }
        self.account_workers();
        self.result()
    }

    /// The EWMA of the last `ewma_window` one-second counts (core's `Ewma`, pandas'
    /// `ewm(com=decay, adjust=True).mean()` as the reference's `add_moving_demand`),
    /// over the seconds completed so far that the counts cover.
    fn demand_estimate(&self) -> (f64, Vec<f64>) {
        let s = &self.run.system;
        let secs = (self.now / 1_000_000) as usize;
        let from = secs.saturating_sub(s.ewma_window);
        let f = Ewma { com: s.ewma_decay, window: s.ewma_window };
        let ewma = |counts: &[u64]| -> f64 {
            let window: Vec<f64> =
                counts[from.min(counts.len())..secs.min(counts.len())].iter().map(|&c| c as f64).collect();
            f.forecast(&window)
        };
        (ewma(&self.per_second_root), self.per_second_task.iter().map(|c| ewma(c)).collect())
    }

    /// Solves (or takes from the cache) the plan for this demand and applies it.
    fn replan(&mut self, root: f64, per_task: &[f64]) -> Result<()> {
        let s = self.run.system.clone();
        let step = s.demand_step_qps;
        let demand = root.max(s.min_demand_qps);
        let key = (demand / step).ceil().max(1.0) as u64;
        let planned = key as f64 * step;
        let placement = if s.allocator == Allocator::ProteusPerTask {
            // Per-task demands differ run to run; no cache (the MILP is small).
            let scale = if root > 0.0 { planned / root } else { 1.0 };
            let tasks: Vec<f64> = per_task.iter().map(|d| (d * scale).max(s.min_demand_qps)).collect();
            self.solve_proteus(&tasks)?
        } else if let Some(p) = self.plan_cache.get(&key) {
            self.cache_hits += 1;
            p.clone()
        } else {
            let p = self.solve_loki(planned)?;
            self.plan_cache.insert(key, p.clone());
            p
        };
        let Some(placement) = placement else { return Ok(()) };
        self.demand_used = planned;
        self.apply(&placement, planned);
        self.placement = Some(placement);
        Ok(())
    }

    fn solve_loki(&mut self, demand: f64) -> Result<Option<Placement>> {
        let s = &self.run.system;
        let problem = loki::Problem {
            pipeline: self.pipeline.clone(),
            variants: self.loki_variants.clone(),
            demand_qps: demand,
            workers: self.run.workers,
            slo_ms: self.run.slo_ms,
            comm_latency_ms: 0.0,
            scaling: s.allocator.scaling().expect("a Loki scaling"),
            ladder: Ladder { beta: s.beta, min_beta: s.min_beta, ..Ladder::default() },
            tie_break: s.tie_break,
            solver: SolverSettings::default(),
        };
        let started = Instant::now();
        let outcome = loki::solve(&problem)?;
        self.solve_seconds += started.elapsed().as_secs_f64();
        self.solves += 1;
        Ok(outcome.plan.map(|plan| Placement {
            hosted: plan
                .variants
                .iter()
                .filter_map(|v| self.pipeline.model(&v.variant).map(|(t, k)| (t, k, v.replicas, v.batch, v.latency_us)))
                .collect(),
            shares: None,
            shed: 1.0 - plan.beta.min(1.0),
        }))
    }

    /// The reference's `proteus.json` for a pipeline: every task a query type with
    /// its own measured demand and SLO / depth, one accuracy MILP over the cluster.
    fn solve_proteus(&mut self, per_task: &[f64]) -> Result<Option<Placement>> {
        let stage_slo = self.run.slo_ms / self.depth as f64;
        let apps: Vec<proteus::App> = self
            .pipeline
            .tasks
            .iter()
            .zip(per_task)
            .filter(|(t, _)| !t.is_passthrough())
            .map(|(t, &d)| proteus::App {
                name: t.name.clone(),
                slo_ms: stage_slo,
                demand_qps: d,
                models: t.models.clone(),
                memory_mb: BTreeMap::new(),
            })
            .collect();
        let problem = proteus::Problem {
            devices: vec![proteus::DeviceType {
                name: "worker".into(),
                count: self.run.workers,
                memory_mb: None,
                profile: self.profile.clone(),
            }],
            apps,
            batch_sizes: self.batch_sizes(),
            objective: proteus::Objective::Accuracy,
            formulation: proteus::Formulation::Aggregated,
            ladder: Ladder { beta: self.run.system.beta, min_beta: self.run.system.min_beta, ..Ladder::default() },
            solver: SolverSettings::default(),
            variants: proteus::Variants::All,
            pinned: None,
        };
        let started = Instant::now();
        let outcome = proteus::solve(&problem).map_err(|e| anyhow::anyhow!("{e}"))?;
        self.solve_seconds += started.elapsed().as_secs_f64();
        self.solves += 1;
        let Some(mut plan) = outcome.plan else { return Ok(None) };
        if self.run.system.fill_cluster {
            plan.upgrade_idle(&problem).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let mut hosted = Vec::new();
        let mut shares = Vec::new();
        for r in plan.routes.iter().filter(|r| r.devices > 0) {
            let Some((t, k)) = self.pipeline.model(&r.model) else { continue };
            let latency = self.task_models[t][k].latency.get(r.batch as usize - 1).copied().unwrap_or(0);
            hosted.push((t, k, r.devices, r.batch, latency));
            shares.push(r.share);
        }
        let shares = match self.run.system.proteus_routing {
            ProteusRouting::Shares => Some(shares),
            ProteusRouting::MostAccurateFirst => None,
        };
        Ok(Some(Placement { hosted, shares, shed: 1.0 - plan.beta.min(1.0) }))
    }

    fn batch_sizes(&self) -> Vec<u32> {
        let mut b: Vec<u32> =
            self.loki_variants.iter().flatten().flat_map(|v| v.latency_us.iter().map(|x| x.0)).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// The policy binding for a worker of (task, variant) at `batch` with `budget`.
    fn binding(
        &mut self,
        task: usize,
        variant: usize,
        batch: u32,
        budget: u64,
    ) -> (Arc<Binding>, Arc<Vec<sdk::Model>>) {
        let key = (task, variant, batch, budget);
        if let Some(b) = self.bindings.get(&key) {
            return b.clone();
        }
        let mut models = self.task_models[task].clone();
        // The plan's batch size is the most the worker may run (the reference's
        // `pipeline_batch_size`): the policy never sees larger batches.
        models[variant].latency.truncate(batch as usize);
        let models = Arc::new(models);
        let compiled = self.compiled.clone().expect("a compiled policy");
        let config = sdk::Config {
            app: self.pipeline.tasks[task].name.clone(),
            slo: budget,
            workers: self.run.workers,
            worker: 0,
            models: (*models).clone(),
            params: self.params.clone(),
        };
        // The live host's default limits, on the thread's CPU clock (`Limits::simulated`).
        let limits = Limits::default().simulated();
        let b = (Binding::new(compiled, config, limits), models);
        self.bindings.insert(key, b.clone());
        b
    }

    fn set_slot(&mut self, i: usize, task: usize, variant: usize, batch: u32, latency_us: u64) {
        let stage_us = slo_per_stage_us(self.slo_us, self.depth);
        let budget = if self.run.system.allocator == Allocator::ProteusPerTask {
            stage_us
        } else {
            self.run.system.root_budget.budget_us(task, stage_us, latency_us)
        };
        let same = {
            let s = &self.slots[i];
            s.task == task && s.variant == variant && s.batch == batch && s.budget_us == budget
        };
        if same && !matches!(self.slots[i].policy, Bound::Safe) {
            self.slots[i].state = SlotState::Active;
            return;
        }
        let policy = if self.compiled.is_some() {
            let (binding, _) = self.binding(task, variant, batch, budget);
            match PolicyInstance::new(&self.engine, &binding, i as u32) {
                Ok(p) => Bound::Wasm(Box::new(p)),
                Err(_) => Bound::Safe,
            }
        } else {
            Bound::Safe
        };
        let models = if self.compiled.is_some() {
            self.binding(task, variant, batch, budget).1
        } else {
            let mut m = self.task_models[task].clone();
            m[variant].latency.truncate(batch as usize);
            Arc::new(m)
        };
        let s = &mut self.slots[i];
        if s.task != task || s.variant != variant {
            s.branching = vec![Default::default(); self.pipeline.tasks[task].children.len()];
        }
        s.task = task;
        s.variant = variant;
        s.batch = batch;
        s.latency_us = latency_us;
        s.budget_us = budget;
        s.policy = policy;
        s.models = models;
        s.loaded = vec![variant as u32];
        s.state = SlotState::Active;
    }

    /// Places the plan's workers (keeping queues where a (task, variant) stays) and
    /// rebuilds the routing tables for `demand`.
    fn apply(&mut self, p: &Placement, demand: f64) {
        self.account_workers();
        self.replans += 1;
        self.shed_sum += p.shed;
        let mut taken = vec![false; self.slots.len()];
        let mut assigned: Vec<Vec<usize>> = Vec::new();
        for &(t, k, replicas, _, _) in &p.hosted {
            // Keep this (task, variant)'s workers, active ones first.
            let mut mine: Vec<usize> = (0..self.slots.len())
                .filter(|&i| {
                    !taken[i]
                        && self.slots[i].state != SlotState::Free
                        && self.slots[i].task == t
                        && self.slots[i].variant == k
                })
                .collect();
            mine.sort_by_key(|&i| (self.slots[i].state != SlotState::Active, i));
            mine.truncate(replicas as usize);
            for &i in &mine {
                taken[i] = true;
            }
            assigned.push(mine);
        }
        // Workers no longer placed retire (drain, then free).
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !taken[i] && s.state == SlotState::Active {
                s.state = SlotState::Retiring;
            }
            s.node = None;
        }
        for (h, &(t, k, replicas, batch, latency)) in p.hosted.iter().enumerate() {
            while assigned[h].len() < replicas as usize {
                let free = (0..self.slots.len()).find(|&i| self.slots[i].state == SlotState::Free && !taken[i]);
                let i = match free {
                    Some(i) => i,
                    None => {
                        self.slots.push(Slot {
                            task: usize::MAX,
                            variant: 0,
                            batch: 0,
                            latency_us: 0,
                            budget_us: 0,
                            state: SlotState::Free,
                            policy: Bound::Safe,
                            models: Arc::new(Vec::new()),
                            loaded: Vec::new(),
                            queue: Vec::new(),
                            busy: false,
                            token: 0,
                            node: None,
                            branching: Vec::new(),
                        });
                        taken.push(false);
                        self.slots.len() - 1
                    }
                };
                taken[i] = true;
                assigned[h].push(i);
            }
            for &i in &assigned[h].clone() {
                self.set_slot(i, t, k, batch, latency);
            }
        }
        // The artifact keeps its tables while no worker was added or removed: the
        // nodes stay where they were, and so does everything the tables were built for.
        if self.run.system.table_rebuild == TableRebuild::WorkerChange && self.same_workers(&assigned) {
            for (node, &(i, _, _)) in self.table_workers.iter().enumerate() {
                self.slots[i].node = Some(node);
            }
            self.free_idle();
            self.account_workers();
            return;
        }
        self.table_builds += 1;
        // Nodes in plan order, replica by replica (Plan::routing_workers' order).
        let mut workers = Vec::new();
        self.node_slot.clear();
        for (h, &(t, k, _, batch, latency)) in p.hosted.iter().enumerate() {
            let accuracy = self.task_models[t][k].accuracy;
            for &i in &assigned[h] {
                self.slots[i].node = Some(workers.len());
                self.node_slot.push(Some(i));
                workers.push(loki::routing::Worker {
                    task: t,
                    variant: k,
                    accuracy,
                    capacity_qps: capacity_qps(batch, latency),
                    latency_us: latency,
                });
            }
        }
        self.table_workers = workers
            .iter()
            .zip(&self.node_slot)
            .map(|(w, s)| (s.expect("a worker's slot"), w.task, w.variant))
            .collect();
        self.tables = match &p.shares {
            None => {
                let slots = &self.slots;
                let node_slot = &self.node_slot;
                let measured = self.run.system.branching == Branching::Measured;
                let utilization = self.run.system.routing_utilization;
                most_accurate_first_filling(self.pipeline, &workers, demand, utilization, |w, ci| {
                    if !measured {
                        return None;
                    }
                    let seen = slots[node_slot[w]?].branching.get(ci)?;
                    Some(match seen.len() {
                        0 => 1.0,
                        n => seen.iter().map(|&x| x as f64).sum::<f64>() / n as f64,
                    })
                })
            }
            Some(shares) => self.share_tables(p, shares, &workers, &assigned),
        };
        self.node_slot.resize(self.tables.nodes.len(), None);
        self.smooth.clear();
        self.reroutes.clear();
        self.free_idle();
        self.account_workers();
    }

    /// Whether the workers `assigned` to the plan's (task, variant)s are those the
    /// tables in force were built over (same slots, tasks and variants).
    fn same_workers(&self, assigned: &[Vec<usize>]) -> bool {
        if self.table_builds == 0 {
            return false;
        }
        let mut placed: Vec<(usize, usize, usize)> =
            assigned.iter().flatten().map(|&i| (i, self.slots[i].task, self.slots[i].variant)).collect();
        let mut before = self.table_workers.clone();
        placed.sort_unstable();
        before.sort_unstable();
        before == placed
    }

    /// Pipeline-unaware routing (the Proteus baseline): every request for a task
    /// goes to its workers by the plan's shares, whoever sent it.
    fn share_tables(
        &self,
        p: &Placement,
        shares: &[f64],
        workers: &[loki::routing::Worker],
        assigned: &[Vec<usize>],
    ) -> RoutingTables {
        let n = self.pipeline.tasks.len();
        let mut per_task: Vec<Vec<Route>> = vec![Vec::new(); n];
        let mut node = 0;
        for (h, &(t, _, _, _, _)) in p.hosted.iter().enumerate() {
            let each = shares[h] / assigned[h].len().max(1) as f64;
            for _ in &assigned[h] {
                per_task[t].push(Route { node, probability: each });
                node += 1;
            }
        }
        let mut nodes_latency: Vec<u64> = workers.iter().map(|w| w.latency_us).collect();
        let mut passthrough = vec![None; n];
        let mut node_task: Vec<usize> = workers.iter().map(|w| w.task).collect();
        for (t, task) in self.pipeline.tasks.iter().enumerate() {
            if task.is_passthrough() {
                passthrough[t] = Some(node_task.len());
                per_task[t] = vec![Route { node: node_task.len(), probability: 1.0 }];
                node_task.push(t);
                nodes_latency.push(0);
            }
        }
        for routes in &mut per_task {
            let total: f64 = routes.iter().map(|r| r.probability).sum();
            if total > 0.0 {
                routes.iter_mut().for_each(|r| r.probability /= total);
            }
        }
        let nodes = node_task
            .iter()
            .map(|&t| self.pipeline.tasks[t].children.iter().map(|&c| per_task[c].clone()).collect())
            .collect();
        RoutingTables {
            frontend: per_task[0].clone(),
            nodes,
            passthrough,
            backup: vec![Vec::<Backup>::new(); n],
            incoming: vec![0.0; node_task.len()],
            latency_us: nodes_latency,
        }
    }

    /// Retiring workers with nothing left to do are freed.
    fn free_idle(&mut self) {
        let mut changed = false;
        for s in &mut self.slots {
            if s.state == SlotState::Retiring && !s.busy && s.queue.is_empty() {
                s.state = SlotState::Free;
                s.policy = Bound::Safe;
                changed = true;
            }
        }
        if changed {
            self.account_workers();
        }
    }

    fn account_workers(&mut self) {
        let now = self.now;
        self.workers_area += self.workers_now as f64 * now.saturating_sub(self.workers_since) as f64;
        self.workers_since = now;
        self.workers_now = self.slots.iter().filter(|s| s.state != SlotState::Free).count() as u32;
        // Before the first plan is applied no worker exists yet; counting that instant
        // made `workers_min` 0 in every run. The extremes are over what plans used.
        if self.replans > 0 {
            self.workers_min = self.workers_min.min(self.workers_now);
            self.workers_max = self.workers_max.max(self.workers_now);
        }
    }

    fn arrive(&mut self) {
        let now = self.now;
        let c = self.clients.len() as u32;
        self.clients.push(Client {
            arrival: now,
            deadline: now + self.slo_us,
            outstanding: 1,
            last_done: now,
            dropped: false,
            finished: false,
        });
        let sec = (now / 1_000_000) as usize;
        if let Some(x) = self.per_second_root.get_mut(sec) {
            *x += 1;
        }
        self.next_arrival += 1;
        if let Some(&next) = self.arrivals.get(self.next_arrival) {
            self.schedule(next, Event::Arrival);
        }
        let node = match self.run.system.root_dispatch {
            RootDispatch::QueueAware => self.root_by_queue().or_else(|| self.frontend_draw()),
            RootDispatch::Table => self.frontend_draw(),
        };
        let req = self.new_req(c, 0, 1.0);
        self.counters[0].created += 1;
        self.bump_task_second(0);
        self.deliver(req, node);
    }

    fn frontend_draw(&mut self) -> Option<usize> {
        let frontend = self.tables.frontend.clone();
        self.draw(usize::MAX, 0, &frontend)
    }

    /// [`RootDispatch::QueueAware`]: the routing node of the root worker to send a
    /// client request to now ([`queue_aware_root`]; None: the root has no worker,
    /// e.g. a pass-through root).
    fn root_by_queue(&self) -> Option<usize> {
        // Slot order, so that ties in accuracy go to the earlier slot (the artifact
        // keeps its predictors' insertion order).
        let workers: Vec<&Slot> =
            self.slots.iter().filter(|s| s.task == 0 && s.state == SlotState::Active && s.node.is_some()).collect();
        let seen: Vec<RootQueue> = workers
            .iter()
            .map(|s| RootQueue {
                accuracy: self.task_models[0][s.variant].accuracy,
                queued: s.queue.len(),
                head_wait_us: s.queue.first().map_or(0, |head| self.now.saturating_sub(head.entry)),
                capacity_qps: capacity_qps(s.batch, s.latency_us),
                head_late: s.queue.first().is_some_and(|head| !decision::met(self.now + s.latency_us, head.deadline)),
            })
            .collect();
        queue_aware_root(&seen).and_then(|i| workers[i].node)
    }

    fn bump_task_second(&mut self, task: usize) {
        let sec = (self.now / 1_000_000) as usize;
        if let Some(x) = self.per_second_task[task].get_mut(sec) {
            *x += 1;
        }
    }

    fn new_req(&mut self, client: u32, task: usize, accuracy: f64) -> Req {
        self.next_req += 1;
        Req { id: self.next_req, client, task, entry: self.now, deadline: self.now, accuracy }
    }

    /// One destination from a table (`key` identifies the table for smooth routing).
    fn draw(&mut self, from: usize, child: usize, routes: &[Route]) -> Option<usize> {
        if routes.is_empty() {
            return None;
        }
        match self.run.system.routing {
            RoutingDraw::Sampled => {
                let u = self.rng.uniform();
                let mut acc = 0.0;
                for r in routes {
                    acc += r.probability;
                    if u < acc {
                        return Some(r.node);
                    }
                }
                routes.iter().rev().find(|r| r.probability > 0.0).map(|r| r.node)
            }
            RoutingDraw::Smooth => {
                let current = self.smooth.entry((from, child)).or_insert_with(|| vec![0.0; routes.len()]);
                let mut best = 0;
                for (i, r) in routes.iter().enumerate() {
                    current[i] += r.probability;
                    if current[i] > current[best] {
                        best = i;
                    }
                }
                current[best] -= 1.0;
                Some(routes[best].node)
            }
        }
    }

    /// Sends a request that entered its task now to `node` (a worker or a
    /// pass-through node, which serves it at once).
    fn deliver(&mut self, mut req: Req, node: Option<usize>) {
        let Some(node) = node else {
            self.drop_req(req, "no-worker");
            return;
        };
        if let Some(slot) = self.node_slot.get(node).copied().flatten() {
            req.deadline = self.now + self.slots[slot].budget_us;
            let q = &mut self.slots[slot].queue;
            insert_by_deadline(q, req);
            if q.len() > self.max_queue {
                self.overloaded = Some(format!(
                    "at {:.3} s a worker queue of task `{}` exceeded max_queue = {}",
                    self.now as f64 / 1e6,
                    self.pipeline.tasks[req.task].name,
                    self.max_queue
                ));
                return;
            }
            if !self.slots[slot].busy {
                self.decide(slot);
            }
        } else {
            // A pass-through task: served at once, fans out with its node's table.
            self.served(req, 0, 1.0, node, None, self.now);
        }
    }

    fn decide(&mut self, i: usize) {
        // Each drop-only decision removes a request, so this loop ends.
        while self.decide_once(i) {}
    }

    fn decide_once(&mut self, i: usize) -> bool {
        self.drop_at_batch_formation(i);
        let now = self.now;
        let (workers, expire_us) = (self.run.workers, self.expire_us);
        let s = &mut self.slots[i];
        let cx = Context {
            now,
            worker: i as u32,
            workers,
            load_qps: 0.0,
            loaded: &s.loaded,
            models: &s.models[..],
            expire_us,
            draining: s.state == SlotState::Retiring,
            timed: true,
        };
        let d = decision::decide(&mut s.policy, &mut s.queue, &cx);
        s.token += 1;
        let token = s.token;
        let mut again = false;
        let mut next = None;
        match d.next {
            Next::Run { model, batch } => {
                s.busy = true;
                let latency = s.models[model as usize].latency[batch.len() - 1];
                next = Some((now + latency, Event::Done { slot: i, model, batch, started: now }));
            }
            Next::Wait(t) | Next::Idle { expire_at: Some(t) } => next = Some((t, Event::Timer { slot: i, token })),
            Next::Again => again = true,
            Next::Idle { expire_at: None } => {}
        }
        if let Some((t, e)) = next {
            self.schedule(t, e);
        }
        for r in d.expired {
            self.drop_req(r, DropReason::Expired.as_str());
        }
        for r in d.dropped {
            self.drop_req(r, DropReason::Policy.as_str());
        }
        again
    }

    /// Early dropping at batch formation (`early_drop_at = "batch"`, [`DropAt`]):
    /// while the request at the head of an idle worker's queue (the earliest task
    /// deadline) would finish after its task deadline even if it ran now, in the
    /// batch the queue makes (its length, at most the plan's batch size), it is
    /// dropped before it costs the worker any time. The reference advances its
    /// pointer past a dropped request and so skips the next one; this checks every
    /// head.
    fn drop_at_batch_formation(&mut self, i: usize) {
        let task = self.slots[i].task;
        if self.slots[i].busy
            || self.pipeline.tasks[task].is_passthrough()
            || !self
                .run
                .system
                .early_drop_at
                .at_batch(self.run.system.early_drop, self.pipeline.is_last_model_task(task))
        {
            return;
        }
        let now = self.now;
        let artifact = self.run.system.reroute_rule == RerouteRule::Artifact;
        // The artifact's rule walks past the requests it reroutes; §5.2's looks only at
        // the head.
        let mut at = 0;
        loop {
            let s = &self.slots[i];
            let table = s.models.get(s.variant).map_or(std::slice::from_ref(&s.latency_us), |m| &m.latency[..]);
            let table = &table[..table.len().min(s.batch.max(1) as usize)];
            let Some(&r) = s.queue.get(at) else { return };
            let Some(finish) = finish_at_batch(now, s.queue.len(), table) else { return };
            let late = finish > r.deadline;
            // A request rerouted at an earlier batch formation is judged again only for
            // lateness (the artifact would plan it again, taking capacity twice).
            let rerouted = self.reroutes.contains_key(&r.id);
            if artifact && ((rerouted && !late) || (!rerouted && self.plan_reroute(i, &r, finish))) {
                at += 1;
            } else if late {
                let r = self.slots[i].queue.remove(at);
                // The live host's label for the same drop (one name, one meaning).
                self.drop_req(r, DropReason::EarlyAtBatch.as_str());
            } else {
                return;
            }
        }
    }

    /// The artifact's reroute decision for `r`, queued at worker `i` and finishing at
    /// `finish` in the batch being formed (see [`RerouteRule::Artifact`]). Records the
    /// targets and lowers their leftover capacity by the children `r` is expected to
    /// send them; true when any child was rerouted.
    fn plan_reroute(&mut self, i: usize, r: &Req, finish: u64) -> bool {
        let (task, variant) = (self.slots[i].task, self.slots[i].variant);
        let Some(node) = self.slots[i].node else { return false };
        let mut targets = Vec::new();
        for ci in 0..self.pipeline.tasks[task].children.len() {
            let child = self.pipeline.tasks[task].children[ci];
            let routes = self.tables.nodes.get(node).and_then(|n| n.get(ci)).cloned().unwrap_or_default();
            // The artifact draws the assigned worker from the routing table here too.
            let assigned = self.draw(node, ci, &routes);
            let budget_of = |n: usize| self.node_slot.get(n).copied().flatten().map(|s| self.slots[s].budget_us);
            let assigned_budget = assigned.and_then(budget_of).unwrap_or(u64::MAX);
            // The first qualifying worker in plan order.
            let pick = self.tables.backup[child]
                .iter()
                .enumerate()
                .filter(|(_, backup)| {
                    budget_of(backup.node).is_some_and(|budget| {
                        budget < assigned_budget && backup.leftover_qps > 0.0 && finish + budget <= r.deadline
                    })
                })
                .min_by_key(|(_, backup)| backup.node)
                .map(|(b, _)| b);
            if let Some(b) = pick {
                let backup = &mut self.tables.backup[child][b];
                backup.leftover_qps -= self.pipeline.tasks[task].fanout[variant][ci];
                targets.push((ci, backup.node));
            }
        }
        if targets.is_empty() {
            return false;
        }
        self.reroutes.insert(r.id, targets);
        true
    }

    fn after_idle(&mut self, i: usize) {
        if !self.slots[i].queue.is_empty() {
            self.decide(i);
        }
        if self.slots[i].state == SlotState::Retiring {
            self.free_idle();
        }
    }

    fn finish(&mut self, i: usize, model: u32, batch: Vec<Req>, started: u64) {
        let now = self.now;
        let (accuracy, node) = (self.slots[i].models[model as usize].accuracy, self.slots[i].node);
        if let Bound::Wasm(instance) = &mut self.slots[i].policy {
            let _ = instance.observe(&decision::outcome(model, &batch, started, now, false));
        }
        // A retired worker routes as the first current node of its task would.
        let node = node.or_else(|| {
            let t = self.slots[i].task;
            (0..self.node_slot.len()).find(|&n| self.node_slot[n].is_some_and(|s| self.slots[s].task == t))
        });
        for r in batch {
            let Some(node) = node else {
                // The task has no worker any more: its descendants cannot be served.
                self.drop_req(r, "no-worker");
                continue;
            };
            self.served(r, model as usize, accuracy, node, Some(i), now);
        }
    }

    /// A request served at its task by `variant` (accuracy `accuracy`) on routing
    /// node `node` (by worker `slot`, whose branching it records): children are
    /// created and routed, or the sink result recorded.
    fn served(&mut self, r: Req, variant: usize, accuracy: f64, node: usize, slot: Option<usize>, now: u64) {
        let t = r.task;
        let pipeline = self.pipeline;
        let task = &pipeline.tasks[t];
        let passthrough = task.is_passthrough();
        let c = &mut self.counters[t];
        c.served += 1;
        if !passthrough {
            c.accuracy_sum += accuracy;
            if !decision::met(now, r.deadline) {
                c.late += 1;
            }
        }
        self.fanout_served[t][variant] += 1;
        let path_accuracy = r.accuracy * accuracy;
        let client = r.client as usize;
        {
            let cl = &mut self.clients[client];
            cl.last_done = cl.last_done.max(now);
        }
        if task.is_sink() {
            self.sink_results += 1;
            self.sink_accuracy += path_accuracy;
            let w = (self.clients[client].arrival / self.window_us) as usize;
            if self.window_acc.len() <= w {
                self.window_acc.resize(w + 1, (0.0, 0));
            }
            self.window_acc[w].0 += path_accuracy;
            self.window_acc[w].1 += 1;
        }
        let children = task.children.clone();
        let expected: Vec<f64> = children.iter().enumerate().map(|(ci, _)| task.fanout[variant][ci]).collect();
        // The parent's lateness against its budget, for early dropping.
        let over_us = now as i64 - r.deadline as i64;
        let mode = if passthrough { sluice_core::pipeline::EarlyDrop::None } else { self.run.system.early_drop };
        let planned = self.reroutes.remove(&r.id).unwrap_or_default();
        for (ci, &child) in children.iter().enumerate() {
            let target = planned.iter().find(|(c, _)| *c == ci).map(|&(_, n)| n);
            let n = fanout_count(expected[ci], self.rng.uniform());
            self.fanout_created[t][variant][ci] += n as u64;
            if let Some(seen) = slot.and_then(|i| self.slots[i].branching.get_mut(ci)) {
                if seen.len() == BRANCHING_HISTORY {
                    seen.pop_front();
                }
                seen.push_back(n);
            }
            self.clients[client].outstanding += n;
            let routes = self.tables.nodes.get(node).and_then(|n| n.get(ci)).cloned().unwrap_or_default();
            let is_sink = self.pipeline.tasks[child].is_sink();
            for _ in 0..n {
                let child_req = self.new_req(r.client, child, path_accuracy);
                self.counters[child].created += 1;
                self.bump_task_second(child);
                if let Some(n) = target {
                    self.counters[child].rerouted += 1;
                    self.deliver(child_req, Some(n));
                    continue;
                }
                let Some(assigned) = self.draw(node, ci, &routes) else {
                    self.drop_req(child_req, "no-worker");
                    continue;
                };
                let deadline = self.clients[client].deadline;
                match self.tables.hop(mode, child, is_sink, assigned, over_us, now, deadline) {
                    Hop::Assigned(n) => self.deliver(child_req, Some(n)),
                    Hop::Rerouted(n) => {
                        self.counters[child].rerouted += 1;
                        // The backup worker's leftover capacity shrinks by one request
                        // per second of plan (the reference decrements its
                        // `remaining_capacity` per rerouted request and resets it at
                        // every 1 s solve).
                        if let Some(b) = self.tables.backup[child].iter_mut().find(|b| b.node == n) {
                            b.leftover_qps -= 1.0;
                        }
                        self.tables.backup[child].retain(|b| b.leftover_qps > 0.0);
                        self.deliver(child_req, Some(n));
                    }
                    Hop::Drop(cause) => self.drop_req(child_req, cause.as_str()),
                }
            }
        }
        self.done_one(client);
    }

    fn drop_req(&mut self, r: Req, cause: &'static str) {
        self.reroutes.remove(&r.id);
        *self.counters[r.task].dropped.entry(cause).or_insert(0) += 1;
        let client = r.client as usize;
        self.clients[client].dropped = true;
        self.done_one(client);
    }

    fn done_one(&mut self, client: usize) {
        let cl = &mut self.clients[client];
        cl.outstanding -= 1;
        if cl.outstanding == 0 {
            assert!(!cl.finished, "client request {client} finished twice");
            cl.finished = true;
            if cl.dropped || cl.last_done > cl.deadline {
                let w = (cl.arrival / self.window_us) as usize;
                if self.window_violations.len() <= w {
                    self.window_violations.resize(w + 1, 0);
                }
                self.window_violations[w] += 1;
            }
        }
    }

    fn close_window(&mut self) {
        self.account_workers();
        let w = self.windows.len();
        let start = w as u64 * self.window_us;
        if start >= self.duration_us {
            return;
        }
        let end = start + self.window_us;
        let arrivals = self.arrivals.iter().filter(|&&t| t >= start && t < end).count() as u64;
        self.windows.push(PipelineWindow {
            run: self.run.index,
            system: self.label.clone(),
            t_s: start as f64 / 1e6,
            arrivals,
            demand_qps: self.demand_used,
            workers: self.workers_now,
            violations: 0,
            accuracy: None,
        });
    }

    fn result(mut self) -> (PipelineResult, Vec<PipelineWindow>) {
        for (w, row) in self.windows.iter_mut().enumerate() {
            row.violations = self.window_violations.get(w).copied().unwrap_or(0);
            row.accuracy = self.window_acc.get(w).filter(|a| a.1 > 0).map(|a| a.0 / a.1 as f64);
        }
        let requests = self.clients.len() as u64;
        let finished = self.clients.iter().filter(|c| c.finished).count() as u64;
        let on_time =
            self.clients.iter().filter(|c| c.finished && !c.dropped && c.last_done <= c.deadline).count() as u64;
        let clients_with_drops = self.clients.iter().filter(|c| c.dropped).count() as u64;
        let clients_late =
            self.clients.iter().filter(|c| c.finished && !c.dropped && c.last_done > c.deadline).count() as u64;
        let tasks: Vec<TaskResult> = self
            .pipeline
            .tasks
            .iter()
            .zip(&self.counters)
            .map(|(t, c)| TaskResult {
                task: t.name.clone(),
                created: c.created,
                served: c.served,
                late: c.late,
                dropped: c.dropped.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                rerouted: c.rerouted,
            })
            .collect();
        let mut drops = BTreeMap::new();
        for t in &tasks {
            for (k, v) in &t.dropped {
                *drops.entry(k.clone()).or_insert(0) += v;
            }
        }
        let modelled: Vec<&TaskResult> =
            tasks.iter().zip(&self.pipeline.tasks).filter(|(_, t)| !t.is_passthrough()).map(|(r, _)| r).collect();
        let task_requests: u64 = modelled.iter().map(|t| t.created).sum();
        let failed: u64 = modelled.iter().map(|t| t.dropped_total() + t.late).sum();
        let served: u64 = modelled.iter().map(|t| t.served).sum();
        let acc_sum: f64 = self
            .pipeline
            .tasks
            .iter()
            .zip(&self.counters)
            .filter(|(t, _)| !t.is_passthrough())
            .map(|(_, c)| c.accuracy_sum)
            .sum();
        let mut fanout = Vec::new();
        for (t, task) in self.pipeline.tasks.iter().enumerate() {
            for v in 0..task.models.len().max(1) {
                for (ci, &c) in task.children.iter().enumerate() {
                    let served = self.fanout_served[t][v];
                    if served == 0 {
                        continue;
                    }
                    let created = self.fanout_created[t][v][ci];
                    fanout.push(FanoutResult {
                        task: task.name.clone(),
                        variant: task.models.get(v).cloned().unwrap_or_else(|| task.name.clone()),
                        child: self.pipeline.tasks[c].name.clone(),
                        served,
                        created,
                        measured: created as f64 / served as f64,
                        expected: task.fanout[v][ci],
                    });
                }
            }
        }
        let span = self.workers_since.max(1) as f64;
        let load = match &self.run.arrivals {
            ArrivalSpec::RateTrace { file, scale, spacing } => match spacing {
                Spacing::Poisson => format!("{} ×{scale}", file.display()),
                Spacing::Even => format!("{} ×{scale} even", file.display()),
            },
            a => a.rate_qps().map(|r| format!("{r}")).unwrap_or_default(),
        };
        let frac = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let r = PipelineResult {
            run: self.run.index,
            system: self.label.clone(),
            allocator: self.run.system.allocator.as_str().into(),
            early_drop: self.run.system.early_drop.as_str().into(),
            early_drop_at: self.run.system.early_drop_at.as_str().into(),
            slo_ms: self.run.slo_ms,
            workers: self.run.workers,
            load,
            seed: self.run.seed,
            requests,
            finished,
            on_time,
            on_time_fraction: frac(on_time, requests),
            violation_ratio: 1.0 - frac(on_time, requests),
            clients_with_drops,
            clients_late,
            sink_results: self.sink_results,
            accuracy: if self.sink_results > 0 { self.sink_accuracy / self.sink_results as f64 } else { 0.0 },
            accuracy_per_request: if served > 0 { acc_sum / served as f64 } else { 0.0 },
            task_requests,
            violation_ratio_per_request: frac(failed, task_requests),
            violation_ratio_with_sink: frac(failed, task_requests + self.sink_results),
            drops,
            tasks,
            fanout,
            workers_mean: self.workers_area / span,
            workers_min: if self.workers_min == u32::MAX { 0 } else { self.workers_min },
            workers_max: self.workers_max,
            replans: self.replans,
            table_builds: self.table_builds,
            solves: self.solves,
            cache_hits: self.cache_hits,
            solve_seconds: self.solve_seconds,
            shed_fraction: if self.replans > 0 { self.shed_sum / self.replans as f64 } else { 0.0 },
            overloaded: self.overloaded.clone(),
        };
        (r, self.windows)
    }
}

/// Whether an experiment file is a pipeline experiment (it has a `[pipeline]` table).
pub fn is_pipeline_experiment(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("pipeline"))
}

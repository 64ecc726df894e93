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
//! 2. Each worker is a task worker ([`TaskWorker`]) with its own queue and its own instance of an ordinary
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

use std::collections::{BTreeMap, HashMap};
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
use sluice_core::app_config::{FailMode, DEFAULT_UNBIND_AFTER};
use sluice_core::decision::{self, Context, Queued, WorkerPolicy};
use sluice_core::demand::{Ewma, Forecaster as _};
use sluice_core::pipeline::flow;
use sluice_core::pipeline::{
    fanout_count, slo_per_stage_us, DropAt, EarlyDrop, EdgeSpec, Pipeline, PipelineSpec, RootDispatch, Serving,
    TaskSpec,
};
use sluice_core::profile::{Percentile, Profile};
use sluice_core::queue::{insert_by_deadline, DropReason};
use sluice_core::router::LoadWindow;
use sluice_core::runtime::{Binding, Limits, PolicyInstance};
use sluice_core::worker;
use sluice_core::workload::{ArrivalSpec, Spacing};
use sluice_sdk as sdk;

use crate::arrivals::draw;
use crate::events::{key, time as event_time, Events, Pending, EMPTY};
use crate::rng::Rng;
use crate::PolicyCache;

mod events;
mod experiment;
mod plan;
mod results;
mod routing;

pub use experiment::*;
pub use results::*;

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
enum TaskWorkerState {
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
struct TaskWorker {
    task: usize,
    variant: usize,
    batch: u32,
    latency_us: u64,
    budget_us: u64,
    state: TaskWorkerState,
    policy: WorkerPolicy,
    /// The task's models as this worker's policy sees them.
    models: Arc<Vec<sdk::Model>>,
    loaded: Vec<u32>,
    queue: Vec<Req>,
    busy: bool,
    /// What the worker's slot of the event queue holds: the batch it runs, or the
    /// timer its last decision armed.
    pending: Pending<Req>,
    /// Its node in the current routing tables.
    node: Option<usize>,
    /// When it last left its task (`Retiring`), µs: `flow::retired` frees it.
    retiring_since: u64,
    /// Per child task, the requests it sent there per request served, the last
    /// [`BRANCHING_HISTORY`] ([`Branching::Measured`] only; emptied when the worker
    /// takes another (task, variant)).
    branching: Vec<std::collections::VecDeque<u32>>,
}

/// The event queue's slot of the next client arrival (one is due at a time).
const ARRIVAL_SLOT: usize = 0;
/// The slot of the next re-plan (every `solve_interval_s`).
const REPLAN_SLOT: usize = 1;
/// The slot of the next window's close (every `window_s`).
const WINDOW_SLOT: usize = 2;
/// The slot of worker 0; worker `i`'s ([`PipelineSim::task_workers`]) is this + `i`.
const FIRST_WORKER_SLOT: usize = 3;

/// What the simulator deploys from one plan (not a placement, which is the device →
/// variant record): per (task, variant) hosted, its replicas, batch and latency.
#[derive(Clone, Debug, PartialEq)]
struct Deployment {
    hosted: Vec<(usize, usize, u32, u32, u64)>,
    /// Per task (proteus-per-task only): per hosted entry, its share of the task's demand.
    shares: Option<Vec<f64>>,
    shed: f64,
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
    /// The event queue: the singleton slots, then one per worker.
    events: Events,
    /// The last sequence number an event took ([`key`]).
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
    task_workers: Vec<TaskWorker>,
    tables: RoutingTables,
    node_worker: Vec<Option<usize>>,
    smooth: HashMap<(usize, usize), Vec<f64>>,
    clients: Vec<Client>,
    next_req: u64,
    /// Per second: client arrivals; per task, requests created.
    per_second_root: Vec<u64>,
    per_second_task: Vec<Vec<u64>>,
    plan_cache: HashMap<u64, Option<Deployment>>,
    deployment: Option<Deployment>,
    demand_used: f64,
    /// Per task, what became of its requests (the live host's type, `flow::TaskCounters`).
    counters: Vec<flow::TaskCounters>,
    fanout_served: Vec<Vec<u64>>,
    fanout_created: Vec<Vec<Vec<u64>>>,
    sink_results: u64,
    sink_accuracy: f64,
    replans: u64,
    table_builds: u64,
    /// The workers the routing tables were built over: per node, its task worker, task and
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
    /// Per task, its arrival rate as its workers' policies see it (`load_qps`).
    loads: Vec<LoadWindow>,
    /// Per client request, how it ended (kept only for [`replay`]).
    outcomes: Option<Vec<flow::PipelineOutcome>>,
    /// While a finished batch's children are being queued with `children =
    /// "together"`, the idle workers they reached, in the order reached: they decide
    /// once all are queued (`flow::ChildArrival`). None otherwise.
    handoff: Option<Vec<usize>>,
}

/// Runs the experiment's first run and returns how each client request ended, in
/// arrival order (`flow::PipelineOutcome`): what the live-vs-simulated comparison
/// (`tests/live_vs_sim.rs`) replays a live trace through, with recorded arrivals
/// (`kind = "recorded"`, app `pipeline`).
pub fn replay(exp: &PipelineExperiment, base: &Path) -> Result<Vec<flow::PipelineOutcome>> {
    let mut cache = PolicyCache::new(base.join(&exp.builtin_policy_dir), base.to_path_buf())?;
    let profile = Profile::load(&base.join(&exp.profile))?;
    let pipeline = exp.pipeline_graph()?;
    let run = exp.runs()?.into_iter().next().context("no run")?;
    let mut sim = PipelineSim::new(exp, base, &pipeline, &profile, &run, &mut cache)?;
    sim.outcomes = Some(Vec::new());
    let outcomes = sim.run_keeping_outcomes();
    Ok(outcomes)
}

/// Whether an experiment file is a pipeline experiment (it has a `[pipeline]` table).
pub fn is_pipeline_experiment(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("pipeline"))
}

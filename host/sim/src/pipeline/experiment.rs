//! The experiment file of a pipeline run: `[pipeline]`, its `[pipeline.system]` and the
//! `[sweep]`.

use super::*;

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
    /// `duration_s = 120`: simulated time of arrivals (the run then finishes its queues).
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

/// Which system plans (allocates) a simulated pipeline's workers: the TOML key
/// `allocator` of `[pipeline.system]` (a system, not `sluice_alloc::Allocator`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PlanningSystem {
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

impl PlanningSystem {
    pub(super) fn scaling(self) -> Option<Scaling> {
        match self {
            PlanningSystem::Loki => Some(Scaling::Loki),
            PlanningSystem::HardwareOnly => Some(Scaling::HardwareOnly),
            PlanningSystem::AccuracyOnly => Some(Scaling::AccuracyOnly),
            PlanningSystem::ProteusPerTask => None,
        }
    }

    /// The name used in files and results.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanningSystem::Loki => "loki",
            PlanningSystem::HardwareOnly => "hardware-only",
            PlanningSystem::AccuracyOnly => "accuracy-only",
            PlanningSystem::ProteusPerTask => "proteus-per-task",
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
    /// Only when a plan adds or removes a worker (a task worker changes its task or variant,
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
pub(super) const BRANCHING_HISTORY: usize = 50;

/// How a worker's routing table is turned into one destination: the pipeline rule
/// of `sluice_core::pipeline::flow`, here for `routing = "sampled"` | `"smooth"`.
pub use sluice_core::pipeline::flow::RoutingDraw;

/// How a finished batch's children reach an idle worker: the pipeline rule of
/// `sluice_core::pipeline::flow`, here for `children = "one-by-one"` | `"together"`.
pub use sluice_core::pipeline::flow::ChildArrival;

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
    pub allocator: PlanningSystem,
    /// What a simulated pipeline shares with a live one's `[[pipeline]]`:
    /// `policy` (default `fixed`) and its `params`, `early_drop` and `early_drop_at`
    /// (see [`DropAt`]), `root_dispatch` and `root_budget` (see [`RootDispatch`],
    /// [`RootBudget`](sluice_core::pipeline::RootBudget); the proteus-per-task baseline uses SLO / depth at every task
    /// whatever `root_budget` says), `routing_utilization`, `beta` (capacity
    /// headroom of the first solve, the reference's `beta`; default 1) and
    /// `min_demand_qps` (the demand the MILP is given at least; the reference's
    /// pipeline ILP clamps to 50, which hides hardware scaling off-peak; not followed
    /// by default, see the README). Keys of `[pipeline.system]`, as before
    /// (flattened).
    #[serde(flatten)]
    pub serving: Serving,
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
    /// `min_beta = 0.2`: the demand factor below which a plan is not sought (the
    /// ladder's floor: Loki and the baselines shed demand down to it when even their
    /// fastest plan cannot serve it all). A sweep far past a system's capacity lowers
    /// it; at the floor the first plan fails and the run stops with an error.
    #[serde(default = "default_min_beta")]
    pub min_beta: f64,
    /// `demand_step_qps = 1`: plans are solved for the demand rounded up to a
    /// multiple of this and cached per multiple (a solve takes 10 ms – 2 s).
    #[serde(default = "one")]
    pub demand_step_qps: f64,
    /// `routing = "sampled"` | `"smooth"`.
    #[serde(default)]
    pub routing: RoutingDraw,
    /// `children = "one-by-one"` | `"together"`: whether an idle worker decides at
    /// a finished batch's first child or once all of them are queued
    /// ([`ChildArrival`]; the live host's is `together`).
    #[serde(default)]
    pub children: ChildArrival,
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
    /// `table_rebuild = "every-plan"` | `"worker-change"` (see [`TableRebuild`]).
    #[serde(default)]
    pub table_rebuild: TableRebuild,
    /// `branching = "expected"` | `"measured"` (see [`Branching`]).
    #[serde(default)]
    pub branching: Branching,
}

impl SystemSpec {
    pub(super) fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| match self.serving.early_drop_at {
            DropAt::Hop => format!("{}/{}", self.allocator.as_str(), self.serving.early_drop.as_str()),
            DropAt::Batch => format!("{}/{}@batch", self.allocator.as_str(), self.serving.early_drop.as_str()),
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
                && s.serving.routing_utilization > 0.0)
            {
                bail!("{origin}: system {}: ewma_decay ≥ 0, ewma_window > 0, demand_step_qps > 0, solve_interval_s ≥ 0 expected", s.label());
            }
            if s.reroute_rule == RerouteRule::Artifact
                && (s.serving.early_drop != EarlyDrop::Rerouting || s.serving.early_drop_at != DropAt::Batch)
            {
                bail!(
                    "{origin}: system {}: `reroute_rule = \"artifact\"` needs early_drop = \"rerouting\" and early_drop_at = \"batch\" (it decides at batch formation)",
                    s.label()
                );
            }
            if s.allocator == PlanningSystem::ProteusPerTask && s.tie_break != loki::TieBreak::Solver {
                bail!(
                    "{origin}: system {}: `tie_break` applies to Loki's allocators only, not \"proteus-per-task\"",
                    s.label()
                );
            }
            if s.allocator != PlanningSystem::ProteusPerTask {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys a `[pipeline.system]` shares with a live `[[pipeline]]`
    /// (`sluice_core::pipeline::Serving`, flattened) stay keys of the table, a sweep
    /// system replaces them as any other, and a key neither knows is refused.
    #[test]
    fn system_keys_shared_with_the_live_host_stay_in_the_table() {
        let text = |system: &str| {
            format!(
                "version = 1\nname = \"t\"\nduration_s = 1\nprofile = \"p.toml\"\n[pipeline]\nslo_ms = 100\nworkers = 2\narrivals = {{ kind = \"poisson\", rate_qps = 1 }}\n[[pipeline.task]]\nname = \"a\"\nmodels = [\"m\"]\n[pipeline.system]\n{system}\n[[sweep.systems]]\nlabel = \"one\"\n[[sweep.systems]]\nlabel = \"other\"\nbeta = 2.0\n"
            )
        };
        let e = PipelineExperiment::parse(&text("early_drop = \"per-task\"\nbeta = 1.2\nsolve_interval_s = 2"), "t")
            .unwrap();
        let runs = e.runs().unwrap();
        let (s, other) = (&runs[0].system, &runs[1].system);
        assert_eq!(s.serving.early_drop, EarlyDrop::PerTask);
        assert_eq!((s.serving.beta, other.serving.beta, s.solve_interval_s), (Some(1.2), Some(2.0), 2.0));
        assert_eq!((s.serving.policy.as_str(), s.serving.routing_utilization), ("fixed", 1.0));
        let err = PipelineExperiment::parse(&text("erly_drop = \"none\""), "t").unwrap_err().to_string();
        assert!(err.contains("unknown field `erly_drop`"), "{err}");
    }
}

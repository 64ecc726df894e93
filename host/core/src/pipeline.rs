//! Pipelines: apps whose requests flow through a directed rooted tree of tasks
//! (Loki, HPDC'24 §4.1: "The pipeline graph is a directed rooted tree with the
//! source node as the root"). A request enters at the root; each task's output
//! becomes intermediate requests for its children; the client is answered when every
//! sink (leaf) has answered.
//!
//! [`PipelineSpec`] is the config form — tasks with their model variants and the
//! measured (or expected) fan-out of each variant, and edges — the same in a server
//! config, an experiment and an allocation problem. [`Pipeline::new`] checks that the
//! edges form one rooted tree and names the edge that does not. [`flow`] holds the
//! rules of a request's way through the tree that the live host and the simulator
//! share.
//!
//! ```toml
//! [[task]]
//! name = "object_detection"
//! models = ["yolov5n", "yolov5x"]
//! # each detection becomes a request for one child, by its label
//! fanout.yolov5x = { factor = 18.89, branch = { car_classification = 0.943, facial_recognition = 0.057 } }
//! [[task]]
//! name = "car_classification"
//! models = ["efficientnet-b0", "efficientnet-b6"]
//! [[edge]]
//! from = "object_detection"
//! to = "car_classification"
//! ```

pub mod flow;

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

/// A pipeline as a config writes it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// `[[task]]`: the tasks, in any order.
    #[serde(rename = "task", default)]
    pub tasks: Vec<TaskSpec>,
    /// `[[edge]]`: parent → child.
    #[serde(rename = "edge", default)]
    pub edges: Vec<EdgeSpec>,
}

/// One task of a pipeline.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// `name = "object_detection"`.
    pub name: String,
    /// `models = ["yolov5n", "yolov5x"]`: the task's model variants (names in the
    /// profile). Empty: a pass-through task that only fans a request out to its
    /// children (Loki's social-media `source`); it takes no worker and no time.
    #[serde(default)]
    pub models: Vec<String>,
    /// `fanout.<variant> = { factor = 2.5, branch = { child = 0.7 } }`: the expected
    /// number of intermediate requests a request served by the variant creates for
    /// each child, `factor × branch[child]` (Loki's multiplicative factor and branch
    /// ratio). Defaults: factor 1, branch 1 for every child (each output goes to
    /// every child). The live host measures the real factors and reports them.
    #[serde(default)]
    pub fanout: BTreeMap<String, Fanout>,
}

/// A variant's fan-out estimate.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fanout {
    /// `factor = 18.9`: outputs per request (Loki's multiplicative factor).
    #[serde(default = "one")]
    pub factor: f64,
    /// `branch = { car_classification = 0.94 }`: the share of the outputs each child
    /// receives (default 1 for a child not named).
    #[serde(default)]
    pub branch: BTreeMap<String, f64>,
}

fn one() -> f64 {
    1.0
}

/// One edge, parent → child.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    /// `from = "object_detection"`.
    pub from: String,
    /// `to = "car_classification"`.
    pub to: String,
}

/// A pipeline that is not a rooted tree, or whose tasks cannot be used.
#[derive(Debug, Error, PartialEq)]
pub enum GraphError {
    /// No task at all.
    #[error("a pipeline needs at least one task")]
    Empty,
    /// A task name repeats or is not a valid name.
    #[error("task `{0}`: names must be unique, non-empty, and made of letters, digits, '-', '_' and '.'")]
    BadTask(String),
    /// An edge names a task that does not exist.
    #[error("edge {from} -> {to}: no task `{missing}`")]
    UnknownTask {
        /// Parent.
        from: String,
        /// Child.
        to: String,
        /// The name that is not a task.
        missing: String,
    },
    /// An edge from a task to itself.
    #[error("edge {0} -> {0}: a task cannot feed itself")]
    SelfLoop(String),
    /// A second edge into a task (a tree has one parent per task).
    #[error(
        "edge {from} -> {to}: `{to}` already has the parent `{first}`; a pipeline is a tree (one parent per task)"
    )]
    SecondParent {
        /// Parent of this edge.
        from: String,
        /// The child.
        to: String,
        /// Its first parent.
        first: String,
    },
    /// More than one task without a parent.
    #[error("tasks {0:?} have no parent; a pipeline has exactly one root")]
    ManyRoots(Vec<String>),
    /// Every task has a parent: the edges close a cycle.
    #[error("edge {from} -> {to} closes a cycle; a pipeline is a tree")]
    Cycle {
        /// Parent of the closing edge.
        from: String,
        /// Child of the closing edge.
        to: String,
    },
    /// A fan-out entry names no variant of its task, or a child that is not one.
    #[error("task `{task}`: fanout.{variant}: {message}")]
    BadFanout {
        /// The task.
        task: String,
        /// The variant key.
        variant: String,
        /// What is wrong.
        message: String,
    },
    /// The same model variant in two tasks (variants name workers' models; a worker
    /// must know its task).
    #[error("model `{model}` appears in tasks `{first}` and `{second}`; a variant belongs to one task")]
    SharedModel {
        /// The model.
        model: String,
        /// The first task.
        first: String,
        /// The second task.
        second: String,
    },
}

/// One task of a checked pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// Its name.
    pub name: String,
    /// Its variants (empty: pass-through).
    pub models: Vec<String>,
    /// Its parent (None for the root).
    pub parent: Option<usize>,
    /// Its children, in edge order.
    pub children: Vec<usize>,
    /// `fanout[v][c]`: expected requests for child `children[c]` per request served
    /// by `models[v]` (for a pass-through task, one entry).
    pub fanout: Vec<Vec<f64>>,
}

impl Task {
    /// Whether the task only fans out (no model, no worker).
    pub fn is_passthrough(&self) -> bool {
        self.models.is_empty()
    }

    /// Whether the task is a sink (a leaf, whose answers go to the client).
    pub fn is_sink(&self) -> bool {
        self.children.is_empty()
    }
}

/// A checked pipeline: one rooted tree. Task indices are in breadth-first order from
/// the root (index 0), so every parent comes before its children.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    /// The tasks, root first, parents before children.
    pub tasks: Vec<Task>,
}

impl Pipeline {
    /// Whether no model task follows task `t` (its children, if any, are pass-through
    /// tasks with no model task after them): the reference's last-stage tasks.
    pub fn is_last_model_task(&self, t: usize) -> bool {
        self.tasks[t].children.iter().all(|&c| self.tasks[c].is_passthrough() && self.is_last_model_task(c))
    }

    /// Checks `spec`: unique task names, edges between existing tasks, one parent per
    /// task, one root, no cycle, fan-outs that name the task's variants and children
    /// with finite non-negative values.
    pub fn new(spec: &PipelineSpec) -> Result<Pipeline, GraphError> {
        if spec.tasks.is_empty() {
            return Err(GraphError::Empty);
        }
        let mut index = BTreeMap::new();
        for (i, t) in spec.tasks.iter().enumerate() {
            if !crate::app_config::valid_name(&t.name) || index.insert(t.name.as_str(), i).is_some() {
                return Err(GraphError::BadTask(t.name.clone()));
            }
        }
        let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
        for t in &spec.tasks {
            for m in &t.models {
                if let Some(first) = owner.insert(m, &t.name) {
                    return Err(GraphError::SharedModel {
                        model: m.clone(),
                        first: first.to_string(),
                        second: t.name.clone(),
                    });
                }
            }
        }
        let n = spec.tasks.len();
        let mut parent: Vec<Option<usize>> = vec![None; n];
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
        for e in &spec.edges {
            let find = |name: &str| {
                index.get(name).copied().ok_or_else(|| GraphError::UnknownTask {
                    from: e.from.clone(),
                    to: e.to.clone(),
                    missing: name.to_string(),
                })
            };
            let (from, to) = (find(&e.from)?, find(&e.to)?);
            if from == to {
                return Err(GraphError::SelfLoop(e.from.clone()));
            }
            if let Some(first) = parent[to] {
                return Err(GraphError::SecondParent {
                    from: e.from.clone(),
                    to: e.to.clone(),
                    first: spec.tasks[first].name.clone(),
                });
            }
            parent[to] = Some(from);
            children[from].push(to);
        }
        let roots: Vec<usize> = (0..n).filter(|&i| parent[i].is_none()).collect();
        if roots.len() > 1 {
            return Err(GraphError::ManyRoots(roots.iter().map(|&i| spec.tasks[i].name.clone()).collect()));
        }
        // One parent per task and n − 1 edges: with no root every task is on a
        // cycle; with one root, tasks not reached from it are on a cycle. Either way
        // name the edge into the first unreached task (in spec order).
        let mut order = Vec::with_capacity(n);
        if let Some(&root) = roots.first() {
            order.push(root);
            let mut k = 0;
            while k < order.len() {
                let t = order[k];
                order.extend(children[t].iter().copied());
                k += 1;
            }
        }
        if order.len() < n {
            let mut reached = vec![false; n];
            for &t in &order {
                reached[t] = true;
            }
            let to = (0..n).find(|&i| !reached[i]).expect("an unreached task");
            let from = parent[to].expect("unreached tasks have parents");
            return Err(GraphError::Cycle { from: spec.tasks[from].name.clone(), to: spec.tasks[to].name.clone() });
        }
        let mut position = vec![0; n];
        for (k, &t) in order.iter().enumerate() {
            position[t] = k;
        }
        let mut tasks = Vec::with_capacity(n);
        for &t in &order {
            let s = &spec.tasks[t];
            let kids: Vec<usize> = children[t].iter().map(|&c| position[c]).collect();
            let kid_names: Vec<&str> = children[t].iter().map(|&c| spec.tasks[c].name.as_str()).collect();
            let bad = |variant: &str, message: String| GraphError::BadFanout {
                task: s.name.clone(),
                variant: variant.to_string(),
                message,
            };
            for (v, f) in &s.fanout {
                if !s.models.iter().any(|m| m == v) {
                    return Err(bad(v, "not one of the task's models".into()));
                }
                if !(f.factor.is_finite() && f.factor >= 0.0) {
                    return Err(bad(v, format!("factor {}: expected a finite number ≥ 0", f.factor)));
                }
                for (c, share) in &f.branch {
                    if !kid_names.contains(&c.as_str()) {
                        return Err(bad(v, format!("branch.{c}: `{c}` is not a child of `{}`", s.name)));
                    }
                    if !(share.is_finite() && *share >= 0.0) {
                        return Err(bad(v, format!("branch.{c} = {share}: expected a finite number ≥ 0")));
                    }
                }
            }
            let variants: Vec<Option<&Fanout>> =
                if s.models.is_empty() { vec![None] } else { s.models.iter().map(|m| s.fanout.get(m)).collect() };
            let fanout = variants
                .iter()
                .map(|f| {
                    kid_names
                        .iter()
                        .map(|c| match f {
                            Some(f) => f.factor * f.branch.get(*c).copied().unwrap_or(1.0),
                            None => 1.0,
                        })
                        .collect()
                })
                .collect();
            tasks.push(Task {
                name: s.name.clone(),
                models: s.models.clone(),
                parent: parent[t].map(|p| position[p]),
                children: kids,
                fanout,
            });
        }
        Ok(Pipeline { tasks })
    }

    /// The task named `name`.
    pub fn task(&self, name: &str) -> Option<usize> {
        self.tasks.iter().position(|t| t.name == name)
    }

    /// The task that serves model `model`, and the model's index in it.
    pub fn model(&self, model: &str) -> Option<(usize, usize)> {
        self.tasks.iter().enumerate().find_map(|(i, t)| t.models.iter().position(|m| m == model).map(|k| (i, k)))
    }

    /// The root-to-sink task chains, in breadth-first order of their sinks.
    pub fn task_paths(&self) -> Vec<Vec<usize>> {
        self.tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_sink())
            .map(|(i, _)| {
                let mut chain = vec![i];
                while let Some(p) = self.tasks[*chain.last().expect("non-empty")].parent {
                    chain.push(p);
                }
                chain.reverse();
                chain
            })
            .collect()
    }

    /// The sinks (leaves).
    pub fn sinks(&self) -> Vec<usize> {
        (0..self.tasks.len()).filter(|&i| self.tasks[i].is_sink()).collect()
    }

    /// Tasks on the longest root-to-sink path (at least 1).
    pub fn depth(&self) -> usize {
        self.task_paths().iter().map(Vec::len).max().unwrap_or(1)
    }
}

/// Early dropping (Loki §5.2): what happens to a request that falls behind its
/// latency budgets. A config choice of a pipeline; the live host and the simulator
/// apply it the same way (`sluice_alloc::loki::routing::RoutingTables::hop`).
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum EarlyDrop {
    /// Never drop early; every request follows its routing plan to the end.
    None,
    /// Drop a request at the end of any task where it spent longer than the task's
    /// budget (queueing and execution).
    PerTask,
    /// Drop only on entering a last task, when the time left to the end-to-end
    /// deadline is smaller than that task's expected execution time.
    LastTask,
    /// A request over a task's budget by x is sent on to a downstream worker with
    /// capacity left whose execution time is at most y − x (y: the assigned
    /// worker's), the most accurate such; dropped when there is none (Loki's own).
    #[default]
    Rerouting,
}

/// Where early dropping acts (`early_drop_at`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropAt {
    /// When a request leaves a task for the next, on its lateness at the task it
    /// left (§5.2's text: "when a request finishes execution at a given task").
    #[default]
    Hop,
    /// Also at a worker's queue when it forms a batch, before the request runs (the
    /// reference's `pop_while_first_expires`): the dropped request costs no worker
    /// time. Per-task and rerouting act at every model task, last-task at the last
    /// model tasks (the reference's `last_stage_early_drop`).
    Batch,
}

impl DropAt {
    /// The name used in configs, experiment files and results.
    pub fn as_str(self) -> &'static str {
        match self {
            DropAt::Hop => "hop",
            DropAt::Batch => "batch",
        }
    }

    /// Whether `mode` drops at batch formation at a task (`last`: no model task
    /// follows it).
    pub fn at_batch(self, mode: EarlyDrop, last: bool) -> bool {
        self == DropAt::Batch
            && match mode {
                EarlyDrop::None => false,
                EarlyDrop::PerTask | EarlyDrop::Rerouting => true,
                EarlyDrop::LastTask => last,
            }
    }
}

/// When a batch formed at `now` from a queue of `queued` requests would finish: the
/// batch the queue makes is its length, at most the largest batch of `latency` (the
/// worker's variant's latency per batch size, µs). None when there is no batch.
pub fn finish_at_batch(now: u64, queued: usize, latency: &[u64]) -> Option<u64> {
    let b = queued.min(latency.len());
    (b > 0).then(|| now + latency[b - 1])
}

/// Early dropping at batch formation ([`DropAt::Batch`]): whether the head of a
/// queue of `queued` requests, due at `deadline`, would finish past it even if it ran
/// at `now`, in the batch the queue makes ([`finish_at_batch`]).
pub fn late_at_batch(now: u64, deadline: u64, queued: usize, latency: &[u64]) -> bool {
    finish_at_batch(now, queued, latency).is_some_and(|finish| finish > deadline)
}

impl EarlyDrop {
    /// Every mode, in the order of the paper's Fig. 7.
    pub const ALL: [EarlyDrop; 4] = [EarlyDrop::None, EarlyDrop::LastTask, EarlyDrop::PerTask, EarlyDrop::Rerouting];

    /// The name used in configs, responses and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            EarlyDrop::None => "none",
            EarlyDrop::PerTask => "per-task",
            EarlyDrop::LastTask => "last-task",
            EarlyDrop::Rerouting => "rerouting",
        }
    }
}

/// How a client request picks its worker at the root task.
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RootDispatch {
    /// A draw from the front end's routing table (MostAccurateFirst's shares of the
    /// estimated demand), like every other hop.
    #[default]
    Table,
    /// What the Loki artifact runs: by the root workers' queues, its client table
    /// ignored (`sluice_alloc::loki::routing::queue_aware_root`, capacity at the plan's
    /// batch size), and one guard it lacks: a worker whose head is already late takes
    /// a request only when every root worker's is.
    QueueAware,
}

/// The latency budget of a request at the root task.
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RootBudget {
    /// 2 × the worker's batch latency, as at every task (`latency_budget_us`).
    #[default]
    Batch,
    /// The SLO split equally over the model tasks of the deepest path: what the
    /// Loki artifact gives a client request (`slo_dict`, `simulator.py`), while its
    /// intermediate requests get 2 × their worker's batch latency.
    SloPerStage,
}

impl RootDispatch {
    /// The name used in configs, experiment files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RootDispatch::Table => "table",
            RootDispatch::QueueAware => "queue-aware",
        }
    }
}

impl RootBudget {
    /// The name used in configs, experiment files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RootBudget::Batch => "batch",
            RootBudget::SloPerStage => "slo-per-stage",
        }
    }

    /// The latency budget of a request at `task` on a worker whose batch takes
    /// `latency_us`: `stage_us` (the SLO per stage, [`slo_per_stage_us`]) at the root
    /// under [`RootBudget::SloPerStage`], else [`latency_budget_us`].
    pub fn budget_us(self, task: usize, stage_us: u64, latency_us: u64) -> u64 {
        if task == 0 && self == RootBudget::SloPerStage {
            stage_us
        } else {
            latency_budget_us(latency_us)
        }
    }
}

/// How a pipeline is served: the part of its config the live host's `[[pipeline]]`
/// (`sluice_server::config::PipelineConfig`) and the simulator's `[pipeline.system]`
/// (`sluice_sim::pipeline::experiment::SystemSpec`) share, one type flattened into
/// both (the files keep their keys where they were). Either side adds its own:
/// live, the problem file, executor and re-plan timing; simulated, the allocator
/// under test and the reference's knobs.
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
pub struct Serving {
    /// `policy = "fixed"`: the policy of every task worker.
    #[serde(default = "default_policy", deserialize_with = "named::policy")]
    pub policy: String,
    /// `params = { allocated = true }`: its parameters (live, None gives
    /// `{ allocated = true }`: the variant the plan loaded, batches sized to the
    /// request's task budget).
    #[serde(default, deserialize_with = "named::params")]
    pub params: Option<toml::Table>,
    /// `early_drop = "rerouting"`: `none`, `per-task`, `last-task` or `rerouting`
    /// (Loki §5.2).
    #[serde(default, deserialize_with = "named::early_drop")]
    pub early_drop: EarlyDrop,
    /// `early_drop_at = "hop"`: where early dropping acts (see [`DropAt`]).
    #[serde(default, deserialize_with = "named::early_drop_at")]
    pub early_drop_at: DropAt,
    /// `root_dispatch = "table"`: how a client request picks its root worker (see
    /// [`RootDispatch`]).
    #[serde(default, deserialize_with = "named::root_dispatch")]
    pub root_dispatch: RootDispatch,
    /// `root_budget = "batch"`: a client request's budget at the root task (see
    /// [`RootBudget`]).
    #[serde(default, deserialize_with = "named::root_budget")]
    pub root_budget: RootBudget,
    /// `routing_utilization = 1.0`: the share of each worker's capacity the routing
    /// tables fill. 1 is the paper's Algorithm 1, which fills the most accurate
    /// workers to exactly their capacity (with Poisson arrivals a worker at 100 %
    /// queues without bound); 0.8 (the Loki experiments' setting) leaves queueing
    /// headroom. Backup tables for rerouting count the full capacity.
    #[serde(default = "one", deserialize_with = "named::routing_utilization")]
    pub routing_utilization: f64,
    /// `beta = 1.2`: the demand factor the MILP plans with (the reference's `beta`),
    /// above 1 capacity headroom; the ladder still descends from it when no plan
    /// serves that much. None: the problem's (a live problem file's `[ladder] beta`;
    /// 1 in the simulator).
    #[serde(default, deserialize_with = "named::beta")]
    pub beta: Option<f64>,
    /// `min_demand_qps = 1`: the least demand a plan is made for.
    #[serde(default = "one", deserialize_with = "named::min_demand_qps")]
    pub min_demand_qps: f64,
}

/// Deserialisers for [`Serving`]'s fields that name the field in their error.
/// `Serving` is flattened into the live `[[pipeline]]` table and the simulator's
/// `[pipeline.system]`, and serde's `flatten` buffers the table, so a TOML error
/// there points at the table's header instead of the key's line: without the
/// field's name, `root_dispatch = "queue"` read "unknown variant `queue`" and
/// nothing more.
mod named {
    use serde::{de::Error as _, Deserialize, Deserializer};

    /// `T` from `d`, its error prefixed with `name`.
    fn field<'de, D: Deserializer<'de>, T: Deserialize<'de>>(name: &str, d: D) -> Result<T, D::Error> {
        T::deserialize(d).map_err(|e| D::Error::custom(format_args!("{name}: {e}")))
    }

    macro_rules! named {
        ($($f:ident),*) => {$(
            #[doc = concat!("`", stringify!($f), "`, named in its error.")]
            pub(super) fn $f<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
                field(stringify!($f), d)
            }
        )*};
    }

    named!(
        policy,
        params,
        early_drop,
        early_drop_at,
        root_dispatch,
        root_budget,
        routing_utilization,
        beta,
        min_demand_qps
    );
}

impl Default for Serving {
    fn default() -> Serving {
        Serving {
            policy: default_policy(),
            params: None,
            early_drop: EarlyDrop::default(),
            early_drop_at: DropAt::default(),
            root_dispatch: RootDispatch::default(),
            root_budget: RootBudget::default(),
            routing_utilization: one(),
            beta: None,
            min_demand_qps: one(),
        }
    }
}

fn default_policy() -> String {
    "fixed".into()
}

/// The SLO split equally over the stages of the deepest path (`depth` tasks): the
/// Loki artifact's `slo_dict`, the budget of a root request under
/// [`RootBudget::SloPerStage`] and of every request of the Proteus-per-task baseline.
pub fn slo_per_stage_us(slo_us: u64, depth: usize) -> u64 {
    slo_us / depth.max(1) as u64
}

/// The latency budget of a task on a worker whose variant runs its batch in
/// `latency_us`: twice that (Loki §4.2 gives every path at most SLO/2 of execution;
/// the reference's `update_slo_by_latency_budgets` sets each variant's budget to
/// 2 × its processing latency), so queueing gets as much as execution.
pub fn latency_budget_us(latency_us: u64) -> u64 {
    latency_us.saturating_mul(2)
}

/// How many intermediate requests a served request creates for a child whose
/// expected count is `expected`, given a uniform draw `u` in [0, 1): ⌊expected⌋, plus
/// one with probability equal to the fraction. The mean is exactly `expected` and
/// the spread the smallest possible, so emulated fan-outs match the profile's
/// factors over any run.
pub fn fanout_count(expected: f64, u: f64) -> u32 {
    if !(expected.is_finite() && expected > 0.0) {
        return 0;
    }
    let whole = expected.floor();
    let extra = if u < expected - whole { 1.0 } else { 0.0 };
    (whole + extra).min(u32::MAX as f64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_at_batch_judges_the_head_in_the_batch_the_queue_makes() {
        let latency = [10, 16, 30];
        // One queued: batch 1 (10 µs); due at 110 from 100 just makes it.
        assert!(!late_at_batch(100, 110, 1, &latency));
        assert!(late_at_batch(101, 110, 1, &latency));
        // Five queued: the batch is the largest there is (30 µs).
        assert!(late_at_batch(100, 120, 5, &latency));
        assert!(!late_at_batch(100, 130, 5, &latency));
        // Nothing queued, or no latency known: nothing to judge.
        assert!(!late_at_batch(100, 0, 0, &latency));
        assert!(!late_at_batch(100, 0, 3, &[]));
    }

    fn spec(text: &str) -> PipelineSpec {
        toml::from_str(text).unwrap()
    }

    const TRAFFIC: &str = r#"
        [[task]]
        name = "car"
        models = ["b0", "b6"]
        [[task]]
        name = "detect"
        models = ["n", "x"]
        fanout.x = { factor = 10.0, branch = { car = 0.9, face = 0.1 } }
        [[task]]
        name = "face"
        models = ["g"]
        [[edge]]
        from = "detect"
        to = "car"
        [[edge]]
        from = "detect"
        to = "face"
    "#;

    #[test]
    fn a_tree_is_ordered_root_first_with_its_fanouts() {
        let p = Pipeline::new(&spec(TRAFFIC)).unwrap();
        let names: Vec<&str> = p.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["detect", "car", "face"]);
        assert_eq!(p.tasks[0].children, [1, 2]);
        assert_eq!(p.tasks[1].parent, Some(0));
        // n has no entry: factor 1 to each child; x: 10 × branch.
        assert_eq!(p.tasks[0].fanout, vec![vec![1.0, 1.0], vec![9.0, 1.0]]);
        assert_eq!(p.task_paths(), vec![vec![0, 1], vec![0, 2]]);
        assert_eq!(p.sinks(), [1, 2]);
        assert_eq!(p.model("g"), Some((2, 0)));
    }

    #[test]
    fn graphs_that_are_not_rooted_trees_are_rejected_naming_the_edge() {
        let two_parents = format!("{TRAFFIC}\n[[edge]]\nfrom = \"car\"\nto = \"face\"\n");
        let e = Pipeline::new(&spec(&two_parents)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "edge car -> face: `face` already has the parent `detect`; a pipeline is a tree (one parent per task)"
        );
        let cycle = r#"
            [[task]]
            name = "a"
            [[task]]
            name = "b"
            [[task]]
            name = "c"
            [[edge]]
            from = "a"
            to = "b"
            [[edge]]
            from = "c"
            to = "b2"
        "#;
        let e = Pipeline::new(&spec(cycle)).unwrap_err();
        assert_eq!(e.to_string(), "edge c -> b2: no task `b2`");
        let cycle = cycle.replace("b2", "c").replace("from = \"c\"", "from = \"b\"");
        let closing = format!("{cycle}\n[[edge]]\nfrom = \"c\"\nto = \"a\"\n");
        assert_eq!(
            Pipeline::new(&spec(&closing)).unwrap_err().to_string(),
            "edge c -> a closes a cycle; a pipeline is a tree"
        );
        let roots = r#"
            [[task]]
            name = "a"
            [[task]]
            name = "b"
        "#;
        assert!(matches!(Pipeline::new(&spec(roots)), Err(GraphError::ManyRoots(r)) if r == ["a", "b"]));
        let island = format!(
            "{roots}\n[[task]]\nname = \"c\"\n[[edge]]\nfrom = \"a\"\nto = \"b\"\n[[edge]]\nfrom = \"c\"\nto = \"c\"\n"
        );
        assert_eq!(Pipeline::new(&spec(&island)).unwrap_err(), GraphError::SelfLoop("c".into()));
        let ring = r#"
            [[task]]
            name = "a"
            [[task]]
            name = "b"
            [[task]]
            name = "c"
            [[edge]]
            from = "a"
            to = "b"
            [[edge]]
            from = "c"
            to = "a"
            [[edge]]
            from = "b"
            to = "c"
        "#;
        assert_eq!(
            Pipeline::new(&spec(ring)).unwrap_err().to_string(),
            "edge c -> a closes a cycle; a pipeline is a tree"
        );
        assert_eq!(Pipeline::new(&PipelineSpec::default()).unwrap_err(), GraphError::Empty);
    }

    #[test]
    fn fanouts_and_models_are_checked() {
        let bad = TRAFFIC.replace("face = 0.1", "bike = 0.1");
        assert_eq!(
            Pipeline::new(&spec(&bad)).unwrap_err().to_string(),
            "task `detect`: fanout.x: branch.bike: `bike` is not a child of `detect`"
        );
        let bad = TRAFFIC.replace("fanout.x", "fanout.y");
        assert!(Pipeline::new(&spec(&bad)).unwrap_err().to_string().contains("fanout.y: not one of the task's models"));
        let bad = TRAFFIC.replace("factor = 10.0", "factor = -1.0");
        assert!(Pipeline::new(&spec(&bad)).unwrap_err().to_string().contains("factor -1"));
        let bad = TRAFFIC.replace("[\"g\"]", "[\"b0\"]");
        assert!(matches!(Pipeline::new(&spec(&bad)), Err(GraphError::SharedModel { .. })));
        let bad = TRAFFIC.replace("name = \"face\"", "name = \"car\"");
        assert_eq!(Pipeline::new(&spec(&bad)).unwrap_err(), GraphError::BadTask("car".into()));
    }

    #[test]
    fn fanout_counts_have_the_expected_mean() {
        assert_eq!(fanout_count(0.0, 0.5), 0);
        assert_eq!(fanout_count(f64::NAN, 0.5), 0);
        assert_eq!(fanout_count(2.0, 0.99), 2);
        assert_eq!(fanout_count(2.25, 0.2), 3);
        assert_eq!(fanout_count(2.25, 0.3), 2);
        let n = 10_000;
        let total: u32 = (0..n).map(|i| fanout_count(1.7, (i as f64 + 0.5) / n as f64)).sum();
        assert_eq!(total, 17_000);
        assert_eq!(latency_budget_us(15_000), 30_000);
        // The root's budget: the SLO per stage only at the root under SloPerStage.
        assert_eq!(slo_per_stage_us(250_000, 2), 125_000);
        assert_eq!(RootBudget::SloPerStage.budget_us(0, 125_000, 15_000), 125_000);
        assert_eq!(RootBudget::SloPerStage.budget_us(1, 125_000, 15_000), 30_000);
        assert_eq!(RootBudget::Batch.budget_us(0, 125_000, 15_000), 30_000);
        let modes: Vec<&str> = EarlyDrop::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(modes, ["none", "last-task", "per-task", "rerouting"]);
    }
}

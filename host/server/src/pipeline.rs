//! Serving Loki pipelines (HPDC'24): an app whose requests go through a rooted tree
//! of tasks, placed on the pipeline's workers by Loki's MILP and routed between
//! them by MostAccurateFirst (`sluice_alloc::loki`).
//!
//! Start here: [`PipelineApp::infer`] (one client request through the tree),
//! [`PipelineApp::replan`] (a new plan, make before break) and [`control_loop`]
//! (routing tables rebuilt from the measured demand, re-plans on a period or a
//! shift).
//!
//! Each task runs as an ordinary internal app `<pipeline>.<task>` with one worker
//! per pipeline worker (device): device d serves one (task, variant) under the plan,
//! so worker d of that task's app has the variant loaded and the same worker of the
//! other tasks' apps has nothing. The policies of those workers are ordinary policy
//! components (default `fixed` with `allocated = true`), swapped like any app's,
//! each bound with its plan assignment's view: its variant's table cut at the plan's
//! batch and the task budget as its SLO (`flow::task_view`, as in the simulator;
//! [`PipelineApp::bind_views`], re-bound one worker at a time when a re-plan
//! changes the assignment).
//!
//! A request enters at the root; when a task serves it, it creates intermediate
//! requests for each child — `fanout_count` of the variant's expected factor for the
//! emulated pipelines and the stand-in image pipeline, measured and reported per
//! (task, variant, child) — each routed by the sending worker's routing table and
//! then by the early-drop mode (`RoutingTables::hop`). An intermediate request's
//! deadline on its worker is its entry time plus the task's budget (twice the
//! variant's latency at the plan's batch size); the client's deadline is arrival +
//! SLO. The client is answered once, when every intermediate request has been
//! served or dropped: with the variants that served each task, the path accuracy
//! (mean over the served root-to-sink paths of the product of their variants'
//! accuracies) and every drop with its reason and the task that dropped it.
//!
//! The rules of a request's way through the tree — hops after pass-through tasks,
//! backup capacity, path ends, retiring workers, drop labels — are
//! `sluice_core::pipeline::flow`'s, shared with the simulator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use sluice_alloc::loki::routing::{
    most_accurate_first_filling, queue_aware_root, Backup, Hop, Replica, RootQueue, Route, RoutingTables,
};
use sluice_alloc::loki::{self, Plan};
use sluice_core::clock::{Clock as _, WallClock};
use sluice_core::decision;
use sluice_core::demand::{Forecaster as _, WindowPeak};
use sluice_core::pipeline::flow::{self, PathEnd};
use sluice_core::pipeline::{fanout_count, slo_per_stage_us, EarlyDrop, Pipeline, RootDispatch};
use sluice_core::queue::Reply;
use sluice_core::router::{check_weights, LoadMonitor};
use sluice_core::tensor::Tensor;

use crate::app::{AdmitError, App};
use crate::config::{InputSpec, PipelineConfig};
use crate::executor::{model_set, LoadedModel};
use crate::executor::{AppSources, ModelSource};
use sluice_core::runtime::WorkerView;

/// A boxed future: the tree's steps call each other recursively.
type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

/// What one device (pipeline worker) serves under a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The task (index in the pipeline).
    pub task: usize,
    /// The variant (index in the task's models).
    pub variant: usize,
    /// The plan's batch size.
    pub batch: u32,
    /// Its latency at that batch size, µs.
    pub latency_us: u64,
    /// Requests/s it sustains at that batch size.
    pub capacity_qps: f64,
}

/// The routing in force: the devices' assignments, the load balancer's tables over them,
/// and a smooth weighted picker per table. Replaced whole (an `Arc` swap), so a
/// request routes entirely by one version.
pub struct Routing {
    /// Per device, what it serves (None: idle).
    pub devices: Vec<Option<Assignment>>,
    /// Per node of the tables, its device (None: a pass-through task's node).
    pub node_device: Vec<Option<usize>>,
    /// Per device, its node.
    pub device_node: Vec<Option<usize>>,
    /// The tables.
    pub tables: RoutingTables,
    /// The demand the tables were built for, requests/s.
    pub demand_qps: f64,
    /// The backup tables as rerouting uses them up (`flow::spend_backup`); reset
    /// with every build of the tables, as the reference resets its leftovers at
    /// every plan.
    backup: Mutex<Vec<Vec<Backup>>>,
    frontend: Option<Picker>,
    pickers: Vec<Vec<Option<Picker>>>,
}

/// A routing table drawn from by `flow::LIVE_ROUTING_DRAW` (the simulator's
/// `routing = "smooth"`): each entry gets its probability's share of the requests,
/// evenly spread.
struct Picker {
    nodes: Vec<usize>,
    weights: Vec<f64>,
    /// The draw's smooth credits, one per entry; fresh with every build of the tables.
    credit: Mutex<Vec<f64>>,
}

impl Picker {
    /// None: a table no request can be sent by (empty, or no usable weights).
    fn new(routes: &[Route]) -> Option<Picker> {
        let weights: Vec<f64> = routes.iter().map(|r| r.probability).collect();
        check_weights(&weights, routes.len()).ok()?;
        let credit = Mutex::new(vec![0.0; weights.len()]);
        Some(Picker { nodes: routes.iter().map(|r| r.node).collect(), weights, credit })
    }

    fn pick(&self) -> usize {
        // The live draw is smooth: it takes no uniform.
        let k = flow::LIVE_ROUTING_DRAW.pick(&self.weights, &mut self.credit.lock(), || 0.0);
        self.nodes[k.unwrap_or(0)]
    }
}

impl Routing {
    /// Tables for `devices` at `demand_qps`, filling each worker to `utilization` of
    /// its capacity.
    pub fn build(
        graph: &Pipeline,
        devices: Vec<Option<Assignment>>,
        accuracy: &[Vec<f64>],
        demand_qps: f64,
        utilization: f64,
    ) -> Routing {
        let mut workers = Vec::new();
        let mut node_device = Vec::new();
        let mut device_node = vec![None; devices.len()];
        for (d, assignment) in devices.iter().enumerate() {
            if let Some(s) = assignment {
                device_node[d] = Some(workers.len());
                node_device.push(Some(d));
                workers.push(Replica {
                    task: s.task,
                    variant: s.variant,
                    accuracy: accuracy[s.task][s.variant],
                    capacity_qps: s.capacity_qps,
                    latency_us: s.latency_us,
                });
            }
        }
        let tables = most_accurate_first_filling(graph, &workers, demand_qps, utilization, |_, _| None);
        node_device.resize(tables.nodes.len(), None);
        let frontend = Picker::new(&tables.frontend);
        let pickers = tables.nodes.iter().map(|children| children.iter().map(|r| Picker::new(r)).collect()).collect();
        let backup = Mutex::new(tables.backup.clone());
        Routing { devices, node_device, device_node, tables, demand_qps, backup, frontend, pickers }
    }

    /// Early dropping for one intermediate request bound for `child`
    /// (`RoutingTables::hop` over the backup capacity left); a reroute uses up one
    /// request of the backup worker's leftover capacity.
    #[allow(clippy::too_many_arguments)]
    fn hop(
        &self,
        mode: EarlyDrop,
        child: usize,
        child_is_sink: bool,
        assigned: usize,
        over_us: i64,
        now: u64,
        deadline: u64,
    ) -> Hop {
        if mode != EarlyDrop::Rerouting || over_us <= 0 {
            return self.tables.hop(mode, child, child_is_sink, assigned, over_us, now, deadline);
        }
        let mut backup = self.backup.lock();
        // The tables as built, with the backup capacity left now.
        // The rule reads the nodes' latencies and the backup tables only.
        let mut left = RoutingTables {
            frontend: Vec::new(),
            nodes: Vec::new(),
            passthrough: Vec::new(),
            backup: std::mem::take(&mut *backup),
            incoming: Vec::new(),
            latency_us: self.tables.latency_us.clone(),
        };
        let hop = left.hop(mode, child, child_is_sink, assigned, over_us, now, deadline);
        if let Hop::Rerouted(node) = hop {
            left.spend_backup(child, node);
        }
        *backup = left.backup;
        hop
    }

    /// The node that sends on the output of `device` serving `task`: its own, or
    /// (when a re-plan moved the device meanwhile) the task's most accurate node.
    fn sender(&self, task: usize, device: Option<usize>) -> Option<usize> {
        if let Some(n) = self.tables.passthrough.get(task).copied().flatten() {
            return Some(n);
        }
        let own = device.and_then(|d| self.device_node[d]).filter(|&n| self.node_task(n) == Some(task));
        own.or_else(|| {
            self.devices
                .iter()
                .enumerate()
                .filter(|(_, s)| s.as_ref().is_some_and(|s| s.task == task))
                .filter_map(|(d, _)| self.device_node[d])
                .next()
        })
    }

    fn node_task(&self, node: usize) -> Option<usize> {
        match self.node_device.get(node).copied().flatten() {
            Some(d) => self.devices[d].as_ref().map(|s| s.task),
            None => self.tables.passthrough.iter().position(|p| *p == Some(node)),
        }
    }
}

/// Pipeline-wide counters: every accepted client request is answered once.
#[derive(Default)]
pub struct PipelineCounters {
    /// Client requests accepted.
    pub accepted: AtomicU64,
    /// Answered with every path served by the deadline.
    pub on_time: AtomicU64,
    /// Answered with some path late or dropped but some served.
    pub partial: AtomicU64,
    /// Answered as dropped (no path served).
    pub dropped: AtomicU64,
    /// Refused at admission (queue full or shutting down).
    pub refused: AtomicU64,
}

/// The answer to one client request.
#[derive(Debug, Default)]
pub struct PipelineAnswer {
    /// Per task: variant → intermediate requests it served.
    pub variants: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per task: requests dropped there, by reason (serialised by label).
    pub drops: BTreeMap<String, BTreeMap<flow::Drop, u64>>,
    /// Per task: requests refused at shutdown.
    pub rejected: BTreeMap<String, u64>,
    /// Per task: requests rerouted to a backup worker.
    pub rerouted: BTreeMap<String, u64>,
    /// Path accuracies of the served root-to-sink paths (`flow::PathEnd::Sink`).
    pub paths: Vec<f64>,
    /// Branches served to an end before a sink (`flow::PathEnd::Early`): complete,
    /// but no path accuracy.
    pub early_ends: u64,
    /// Served ends (paths or early ends) that finished after the deadline.
    pub late_paths: u64,
    /// The sinks' outputs, per sink task.
    pub outputs: BTreeMap<String, Vec<Tensor>>,
    /// µs from arrival to the last answer.
    pub latency_us: u64,
    /// The SLO, µs.
    pub slo_us: u64,
}

impl PipelineAnswer {
    fn merge(&mut self, other: PipelineAnswer) {
        for (t, m) in other.variants {
            for (v, n) in m {
                *self.variants.entry(t.clone()).or_default().entry(v).or_default() += n;
            }
        }
        for (t, m) in other.drops {
            for (r, n) in m {
                *self.drops.entry(t.clone()).or_default().entry(r).or_default() += n;
            }
        }
        for (t, n) in other.rejected {
            *self.rejected.entry(t).or_default() += n;
        }
        for (t, n) in other.rerouted {
            *self.rerouted.entry(t).or_default() += n;
        }
        self.paths.extend(other.paths);
        self.early_ends += other.early_ends;
        self.late_paths += other.late_paths;
        for (t, o) in other.outputs {
            self.outputs.entry(t).or_default().extend(o);
        }
    }

    /// Mean accuracy of the served paths (None: none served).
    pub fn accuracy(&self) -> Option<f64> {
        (!self.paths.is_empty()).then(|| self.paths.iter().sum::<f64>() / self.paths.len() as f64)
    }

    /// Intermediate requests dropped anywhere.
    pub fn dropped(&self) -> u64 {
        self.drops.values().flat_map(|m| m.values()).sum()
    }

    /// Branches served to an end (sinks and early ends).
    pub fn ends(&self) -> u64 {
        self.paths.len() as u64 + self.early_ends
    }

    /// Every branch served to its end, none late.
    pub fn deadline_met(&self) -> bool {
        self.late_paths == 0 && self.dropped() == 0 && self.rejected.is_empty() && self.ends() > 0
    }

    /// How the request ended, in the form the simulator reports it
    /// (`flow::PipelineOutcome`; drops by reason, whichever task dropped them).
    pub fn outcome(&self) -> flow::PipelineOutcome {
        let mut drops = BTreeMap::new();
        for m in self.drops.values() {
            for (r, n) in m {
                *drops.entry(*r).or_default() += n;
            }
        }
        flow::PipelineOutcome {
            variants: self.variants.clone(),
            drops,
            sinks: self.paths.len() as u64,
            early_ends: self.early_ends,
            on_time: self.deadline_met(),
        }
    }

    /// The first drop, as `(task, reason label)`, for a request nothing of which was
    /// served: the first task's least label, as when the reasons were keyed by label.
    pub fn first_drop(&self) -> Option<(&str, &str)> {
        self.drops.iter().find_map(|(t, m)| m.keys().map(|r| r.as_str()).min().map(|r| (t.as_str(), r)))
    }
}

/// The plan in force and what the admin API shows of past ones.
struct PlanState {
    plan: Option<Plan>,
    history: std::collections::VecDeque<PipelinePlanSummary>,
}

/// One served pipeline.
pub struct PipelineApp {
    /// Its configuration.
    pub config: PipelineConfig,
    /// The checked graph.
    pub graph: Pipeline,
    /// The Loki problem (its `demand_qps` is replaced at every solve).
    pub problem: loki::Problem,
    /// The input every request carries.
    pub input: InputSpec,
    /// End-to-end SLO, µs.
    pub slo_us: u64,
    /// The SLO over the tree's depth, µs (the root's budget under `root_budget =
    /// "slo-per-stage"`; computed once, not per request).
    stage_us: u64,
    /// Per task, its internal app (None: pass-through).
    pub tasks: Vec<Option<Arc<App>>>,
    /// Per task, per variant: accuracy.
    accuracy: Vec<Vec<f64>>,
    /// Per task, how its variants are loaded.
    sources: Vec<Option<AppSources>>,
    routing: RwLock<Arc<Routing>>,
    plan: tokio::sync::Mutex<PlanState>,
    view: Mutex<PipelinePlanView>,
    /// Per task, what became of its intermediate requests (the simulator's type).
    pub task_counters: Vec<Mutex<flow::TaskCounters>>,
    /// Client-level counters.
    pub counters: PipelineCounters,
    /// Per device, the intermediate requests sent to it (client requests at the root
    /// included).
    device_requests: Vec<AtomicU64>,
    /// Per task, per variant, per child: (requests served, intermediate requests created).
    fanout: Vec<Vec<Vec<(AtomicU64, AtomicU64)>>>,
    arrivals: LoadMonitor,
    /// Whether new requests are accepted.
    pub accepting: AtomicBool,
    in_flight: AtomicUsize,
    draws: AtomicU64,
    /// Task workers re-bound to a new plan assignment's view ([`PipelineApp::bind_views`]).
    rebinds: AtomicU64,
    clock: WallClock,
}

/// Releases a client request's place in the pipeline.
struct InFlight(Arc<PipelineApp>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Stable placement: a device keeps its (task, variant) while the new plan still
/// needs that many; the rest go to idle devices first, in plan order.
pub fn assign(graph: &Pipeline, plan: &Plan, old: &[Option<Assignment>]) -> Vec<Option<Assignment>> {
    let mut needed: Vec<(Assignment, u32)> = plan
        .variants
        .iter()
        .filter_map(|v| {
            let (task, variant) = graph.model(&v.variant)?;
            let assignment =
                Assignment { task, variant, batch: v.batch, latency_us: v.latency_us, capacity_qps: v.capacity_qps };
            Some((assignment, v.replicas))
        })
        .collect();
    let mut new: Vec<Option<Assignment>> = vec![None; old.len()];
    for (d, o) in old.iter().enumerate() {
        let Some(o) = o else { continue };
        if let Some((assignment, n)) =
            needed.iter_mut().find(|(s, n)| *n > 0 && s.task == o.task && s.variant == o.variant)
        {
            new[d] = Some(assignment.clone());
            *n -= 1;
        }
    }
    let mut free: Vec<usize> = (0..old.len()).filter(|&d| new[d].is_none() && old[d].is_none()).collect();
    free.extend((0..old.len()).filter(|&d| new[d].is_none() && old[d].is_some()));
    let mut free = free.into_iter();
    for (assignment, n) in needed {
        for _ in 0..n {
            if let Some(d) = free.next() {
                new[d] = Some(assignment.clone());
            }
        }
    }
    new
}

/// Uniform in [0, 1) from a counter (splitmix64): the fan-out draws.
fn uniform(counter: u64) -> f64 {
    let mut z = counter.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl PipelineApp {
    /// Builds the pipeline over its task apps (already built, workers loaded per
    /// `devices`, the first plan's placement; `origin`, how that plan was made).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: PipelineConfig,
        problem: loki::Problem,
        input: InputSpec,
        tasks: Vec<Option<Arc<App>>>,
        sources: Vec<Option<AppSources>>,
        (plan, origin): (Plan, sluice_alloc::Origin),
        devices: Vec<Option<Assignment>>,
        clock: WallClock,
    ) -> Arc<PipelineApp> {
        let graph = problem.pipeline.clone();
        let accuracy: Vec<Vec<f64>> =
            problem.variants.iter().map(|vs| vs.iter().map(|v| v.accuracy).collect()).collect();
        let routing = Routing::build(&graph, devices, &accuracy, plan.demand_qps, config.serving.routing_utilization);
        let fanout = graph
            .tasks
            .iter()
            .map(|t| {
                (0..t.models.len().max(1))
                    .map(|_| t.children.iter().map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect())
                    .collect()
            })
            .collect();
        let period = Duration::from_millis(config.routing_period_ms.max(1000));
        let slo_us = (problem.slo_ms * 1000.0).round() as u64;
        // One handoff for all the task apps (`crate::handoff`,
        // `flow::LIVE_CHILD_ARRIVAL`): a batch's children are queued together,
        // whichever tasks they go to.
        let handoff = crate::handoff::Handoff::new();
        for app in tasks.iter().flatten() {
            let _ = app.handoff.set(handoff.clone());
        }
        let p = Arc::new(PipelineApp {
            slo_us,
            stage_us: slo_per_stage_us(slo_us, graph.depth()),
            task_counters: graph.tasks.iter().map(|_| Mutex::default()).collect(),
            device_requests: (0..routing.devices.len()).map(|_| AtomicU64::new(0)).collect(),
            graph,
            input,
            tasks,
            accuracy,
            sources,
            routing: RwLock::new(Arc::new(routing)),
            plan: tokio::sync::Mutex::new(PlanState { plan: None, history: Default::default() }),
            view: Mutex::new(PipelinePlanView::default()),
            counters: PipelineCounters::default(),
            fanout,
            arrivals: LoadMonitor::new(period.as_micros() as u64),
            accepting: AtomicBool::new(true),
            in_flight: AtomicUsize::new(0),
            draws: AtomicU64::new(0),
            rebinds: AtomicU64::new(0),
            clock,
            config,
            problem,
        });
        {
            let mut st = p.plan.try_lock().expect("not shared yet");
            st.history.push_back(summary(&plan, "startup", &origin, 0.0));
            st.plan = Some(plan);
            *p.view.lock() = p.view_of(&st);
        }
        p
    }

    /// The pipeline's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The routing in force.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.read().clone()
    }

    /// Serves one client request through the tree; the answer comes when every
    /// intermediate request has been served or dropped.
    pub async fn infer(self: &Arc<Self>, input: Tensor) -> Result<PipelineAnswer, AdmitError> {
        if !self.accepting.load(Ordering::Acquire) {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(AdmitError::ShuttingDown(self.name().to_string()));
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.config.max_queue {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(AdmitError::QueueFull { app: self.name().to_string(), limit: self.config.max_queue });
        }
        let guard = InFlight(self.clone());
        let arrival = self.clock.now();
        self.arrivals.record(arrival);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let this = self.clone();
        // The tree runs as its own task: a client that goes away does not cut it
        // short, so every intermediate request still ends served or dropped.
        let deadline = arrival + this.slo_us;
        let routing = this.routing();
        let input = Arc::new(input);
        // The root request is queued here, in the order clients were admitted (not
        // in the order the runtime gets to their trees).
        let root = match routing.tables.passthrough[0] {
            Some(_) => this.fan_out(routing, 0, None, 0, input, 0, arrival, deadline, 1.0),
            None => match this.root_node(&routing) {
                Some(node) => this.at_task(routing, 0, node, input, deadline, 1.0),
                None => {
                    this.task_counters[0].lock().created += 1;
                    let a = this.drop_at(0, 0, flow::Drop::NoWorker);
                    Box::pin(async move { a })
                }
            },
        };
        let tree = tokio::spawn(async move {
            let _guard = guard;
            let mut answer = root.await;
            answer.latency_us = this.clock.now().saturating_sub(arrival);
            answer.slo_us = this.slo_us;
            let counter = if answer.deadline_met() {
                &this.counters.on_time
            } else if answer.ends() == 0 {
                &this.counters.dropped
            } else {
                &this.counters.partial
            };
            counter.fetch_add(1, Ordering::Relaxed);
            answer
        });
        tree.await.map_err(|e| AdmitError::ShuttingDown(format!("{}: {e}", self.name())))
    }

    /// The root worker (its routing node) a client request goes to: a pick from the
    /// front end's table, or with `root_dispatch = "queue-aware"` the choice by the
    /// root workers' queues ([`queue_aware_root`]; the table when no root worker
    /// serves).
    fn root_node(&self, routing: &Routing) -> Option<usize> {
        if let (RootDispatch::QueueAware, Some(app)) = (self.config.serving.root_dispatch, self.tasks[0].as_ref()) {
            // Device order, so that ties in accuracy go to the lower device.
            let roots: Vec<(usize, &Assignment)> = routing
                .devices
                .iter()
                .enumerate()
                .filter_map(|(d, s)| s.as_ref().filter(|s| s.task == 0).map(|s| (d, s)))
                .collect();
            let seen: Vec<RootQueue> = roots
                .iter()
                .map(|&(d, s)| {
                    let (head, now) = app.queue_head(d);
                    RootQueue {
                        accuracy: self.accuracy[0][s.variant],
                        queued: head.map_or(0, |h| h.len),
                        head_wait_us: head.map_or(0, |h| now.saturating_sub(h.arrival)),
                        capacity_qps: s.capacity_qps,
                        // Late by the host's one on-time rule, were a batch started now.
                        head_late: head.is_some_and(|h| !decision::met(now + s.latency_us, h.deadline)),
                    }
                })
                .collect();
            if let Some(node) = queue_aware_root(&seen).and_then(|i| routing.device_node[roots[i].0]) {
                return Some(node);
            }
        }
        routing.frontend.as_ref().map(Picker::pick)
    }

    /// The latency budget of a request at `task` on a worker whose batch takes
    /// `latency_us` (`root_budget`, `RootBudget::budget_us`).
    fn budget_us(&self, task: usize, latency_us: u64) -> u64 {
        self.config.serving.root_budget.budget_us(task, self.stage_us, latency_us)
    }

    /// An intermediate request bound for `task` dropped, by `by` (the task that
    /// decided), for `reason`.
    fn drop_at(&self, task: usize, by: usize, why: flow::Drop) -> PipelineAnswer {
        let name = &self.graph.tasks[by].name;
        self.task_counters[task].lock().dropped(why);
        let mut a = PipelineAnswer::default();
        a.drops.entry(name.clone()).or_default().insert(why, 1);
        a
    }

    fn reject_at(&self, task: usize) -> PipelineAnswer {
        self.task_counters[task].lock().rejected += 1;
        let mut a = PipelineAnswer::default();
        a.rejected.insert(self.graph.tasks[task].name.clone(), 1);
        a
    }

    /// One intermediate request at `task` on table node `node`.
    fn at_task(
        self: &Arc<Self>,
        routing: Arc<Routing>,
        task: usize,
        node: usize,
        input: Arc<Tensor>,
        deadline: u64,
        accuracy: f64,
    ) -> BoxFuture<PipelineAnswer> {
        let this = self.clone();
        // Queued now, when the caller creates it, not when the future first runs:
        // requests reach a worker in the order they were admitted or made, not in
        // the order the runtime gets to their tasks (as the simulator queues them).
        let ready = |a: PipelineAnswer| -> BoxFuture<PipelineAnswer> { Box::pin(async move { a }) };
        this.task_counters[task].lock().created += 1;
        let Some(device) = routing.node_device.get(node).copied().flatten() else {
            return ready(this.drop_at(task, task, flow::Drop::NoWorker));
        };
        let (Some(app), Some(assignment)) = (this.tasks[task].clone(), routing.devices[device].clone()) else {
            return ready(this.drop_at(task, task, flow::Drop::NoWorker));
        };
        this.device_requests[device].fetch_add(1, Ordering::Relaxed);
        let entered = this.clock.now();
        let budget = this.budget_us(task, assignment.latency_us);
        let (id, rx) = match app.submit_to(device, (*input).clone(), entered + budget) {
            Ok(submitted) => submitted,
            Err(AdmitError::QueueFull { .. }) => return ready(this.drop_at(task, task, flow::Drop::QueueFull)),
            // Not raised for intermediate requests (submit_to skips the
            // prediction); named here so a change there cannot go unanswered.
            Err(AdmitError::WouldMissDeadline { .. }) => {
                return ready(this.drop_at(task, task, flow::Drop::Overloaded))
            }
            Err(AdmitError::ShuttingDown(_)) => return ready(this.reject_at(task)),
        };
        let awaited = crate::handoff::Awaited::new(rx, id, app.handoff.get().cloned());
        Box::pin(async move {
            // Workers answer every request; a closed channel means the worker was
            // stopped at the end of the shutdown grace. A served answer holds the
            // handoff until its children are queued (`crate::handoff`).
            let (served, hold) = match awaited.reply().await {
                Ok((Reply::Served(s), hold)) => (s, hold),
                Ok((Reply::Dropped { reason, .. }, _)) => return this.drop_at(task, task, flow::Drop::Worker(reason)),
                Ok((Reply::Rejected { .. }, _)) | Err(_) => return this.reject_at(task),
            };
            let finished = this.clock.now();
            let t = &this.graph.tasks[task];
            let variant = t.models.iter().position(|m| *m == served.variant).unwrap_or(assignment.variant);
            let on_time = decision::met(finished, entered + budget);
            this.task_counters[task].lock().served(Some((this.accuracy[task][variant], on_time)));
            let accuracy = accuracy * this.accuracy[task][variant];
            let over = finished.saturating_sub(entered) as i64 - budget as i64;
            let children =
                this.fan_out(this.routing(), task, Some(device), variant, input, over, finished, deadline, accuracy);
            // Queued, all of them: the next task's workers may decide.
            drop(hold);
            let mut answer = children.await;
            *answer.variants.entry(t.name.clone()).or_default().entry(served.variant.clone()).or_default() += 1;
            if t.is_sink() {
                answer.outputs.entry(t.name.clone()).or_default().extend(served.outputs);
            }
            answer
        })
    }

    /// The children of a request served at `task` (by `variant` on `device`; a
    /// pass-through task has neither), `over_us` past its budget, at `now`: queued
    /// when this is called (through a pass-through child too), answered when the
    /// future resolves.
    #[allow(clippy::too_many_arguments)]
    fn fan_out(
        self: &Arc<Self>,
        routing: Arc<Routing>,
        task: usize,
        device: Option<usize>,
        variant: usize,
        input: Arc<Tensor>,
        over_us: i64,
        now: u64,
        deadline: u64,
        accuracy: f64,
    ) -> BoxFuture<PipelineAnswer> {
        let this = self.clone();
        let t = &this.graph.tasks[task];
        if t.is_passthrough() {
            let mut c = this.task_counters[task].lock();
            c.created += 1;
            c.served(None);
        }
        let sender = routing.sender(task, device);
        // A pass-through carries the mode on at no lateness (`flow::after_passthrough`).
        let (mode, over_us) = flow::after_passthrough(t.is_passthrough(), this.config.serving.early_drop, over_us);
        let mut children = Vec::new();
        let mut created = 0;
        let mut answer = PipelineAnswer::default();
        for (ci, &child) in t.children.iter().enumerate() {
            let expected = t.fanout.get(variant).and_then(|f| f.get(ci)).copied().unwrap_or(1.0);
            let n = fanout_count(expected, uniform(this.draws.fetch_add(1, Ordering::Relaxed)));
            let (parents, made) = &this.fanout[task][variant.min(this.fanout[task].len() - 1)][ci];
            parents.fetch_add(1, Ordering::Relaxed);
            made.fetch_add(n as u64, Ordering::Relaxed);
            created += u64::from(n);
            let picker = sender.and_then(|s| routing.pickers[s][ci].as_ref());
            let child_sink = this.graph.tasks[child].is_sink();
            for _ in 0..n {
                let Some(assigned) = picker.map(Picker::pick) else {
                    this.task_counters[child].lock().created += 1;
                    answer.merge(this.drop_at(child, child, flow::Drop::NoWorker));
                    continue;
                };
                let hop = routing.hop(mode, child, child_sink, assigned, over_us, now, deadline);
                let node = match hop {
                    Hop::Assigned(node) => node,
                    Hop::Rerouted(node) => {
                        this.task_counters[child].lock().rerouted += 1;
                        *answer.rerouted.entry(this.graph.tasks[child].name.clone()).or_default() += 1;
                        node
                    }
                    Hop::Drop(cause) => {
                        // Counted where it was bound; reported as dropped by the task
                        // it overran (per-task) or could not enter in time.
                        let by = if cause == flow::EarlyCause::OverBudget { task } else { child };
                        this.task_counters[child].lock().created += 1;
                        answer.merge(this.drop_at(child, by, flow::Drop::Early(cause)));
                        continue;
                    }
                };
                let next = if this.graph.tasks[child].is_passthrough() {
                    this.fan_out(routing.clone(), child, None, 0, input.clone(), 0, now, deadline, accuracy)
                } else {
                    this.at_task(routing.clone(), child, node, input.clone(), deadline, accuracy)
                };
                children.push(next);
            }
        }
        if let Some(end) = PathEnd::of(t.is_sink(), created) {
            // The branch ends here: a sink (a path, with its accuracy), or a task
            // that made no intermediate request (complete, no path accuracy).
            match end {
                PathEnd::Sink => answer.paths.push(accuracy),
                PathEnd::Early => answer.early_ends += 1,
            }
            if now > deadline {
                answer.late_paths += 1;
            }
        }
        Box::pin(async move {
            // Each child runs as its own task: one that is still queued when the
            // client goes away is answered and counted all the same.
            let handles: Vec<_> = children.into_iter().map(tokio::spawn).collect();
            for h in handles {
                match h.await {
                    Ok(a) => answer.merge(a),
                    Err(e) => tracing::error!(pipeline = this.name(), "an intermediate request's task failed: {e}"),
                }
            }
            answer
        })
    }
}

/// A plan's line in the history.
fn summary(plan: &Plan, reason: &str, origin: &sluice_alloc::Origin, solve_seconds: f64) -> PipelinePlanSummary {
    PipelinePlanSummary {
        reason: reason.to_string(),
        origin: origin.name(),
        origin_reason: origin.reason().map(str::to_string),
        step: plan.step.clone(),
        demand_qps: plan.demand_qps,
        served_qps: plan.served_qps,
        workers: plan.workers,
        accuracy: plan.accuracy,
        solve_seconds,
        variants: plan.variants.iter().map(|v| (v.variant.clone(), v.replicas, v.batch)).collect(),
    }
}

// The admin views below reach the client through `serde_json::Value` (`admin::view`,
// the dashboard's snapshot), whose maps sort their keys: the bytes do not depend on
// the order of the fields, which follows the old hand-built `json!` for reading.

/// One plan put in force, as `GET /admin/pipelines/{name}`'s `allocation.history`
/// lists it.
#[derive(Clone, Debug, Serialize)]
pub struct PipelinePlanSummary {
    /// Why the pipeline planned: `startup`, `period`, `demand shift` or `admin`.
    pub reason: String,
    /// How the plan was made (`milp`, `greedy`, ...: `sluice_alloc::Origin::name`).
    pub origin: &'static str,
    /// Why it was not the solver's (`null` when it was).
    pub origin_reason: Option<String>,
    /// The plan's step: `hardware` or `accuracy`.
    pub step: String,
    /// Requests/s entering the pipeline that the plan was made for.
    pub demand_qps: f64,
    /// Requests/s the plan serves.
    pub served_qps: f64,
    /// Workers the plan uses.
    pub workers: u32,
    /// The plan's end-to-end accuracy.
    pub accuracy: f64,
    /// Seconds the solve took (0 for the startup plan).
    pub solve_seconds: f64,
    /// Per variant placed, `[variant, replicas, batch]`.
    pub variants: Vec<(String, u32, u32)>,
}

/// The plan in force and the last [`HISTORY`] plans put in force, oldest first:
/// `GET /admin/pipelines/{name}`'s `allocation`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelinePlanView {
    /// The plan in force (`null` only before the first).
    pub plan: Option<Plan>,
    /// The plans put in force, oldest first.
    pub history: std::collections::VecDeque<PipelinePlanSummary>,
}

/// `GET /admin/pipelines/{name}`'s body ([`PipelineApp::status`]): the serving
/// settings, the client counters, per task what became of its intermediate
/// requests, the measured fan-outs, the devices, the routing tables and the plans.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineStatus {
    /// The pipeline's name.
    pub name: String,
    /// `early_drop` in force.
    pub early_drop: &'static str,
    /// `early_drop_at` in force.
    pub early_drop_at: &'static str,
    /// `root_dispatch` in force.
    pub root_dispatch: &'static str,
    /// `root_budget` in force.
    pub root_budget: &'static str,
    /// The share of each worker's capacity the routing tables fill.
    pub routing_utilization: f64,
    /// The problem's demand factor.
    pub beta: f64,
    /// End-to-end SLO, ms.
    pub slo_ms: f64,
    /// Workers of the problem.
    pub workers: u32,
    /// Client requests/s measured over the routing period.
    pub demand_qps: f64,
    /// Client requests not answered yet.
    pub in_flight: usize,
    /// Task workers re-bound to a plan assignment's view.
    pub rebinds: u64,
    /// The client-level counters.
    pub counters: PipelineCountersView,
    /// Per task, what became of its intermediate requests.
    pub tasks: Vec<TaskStatus>,
    /// Per (task, variant, child), the fan-out expected and measured.
    pub fanout: Vec<FanoutStatus>,
    /// Per device, what it serves (`null`: idle).
    pub devices: Vec<Option<DeviceStatus>>,
    /// The routing tables in force.
    pub routing: RoutingStatus,
    /// The plan in force and the history of plans.
    pub allocation: PipelinePlanView,
}

/// [`PipelineCounters`] read once.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PipelineCountersView {
    /// Client requests admitted.
    pub accepted: u64,
    /// Answered with every path served in time.
    pub on_time: u64,
    /// Answered with part of the tree served.
    pub partial: u64,
    /// Answered with nothing served.
    pub dropped: u64,
    /// Refused at the door.
    pub refused: u64,
}

/// One task's line of [`PipelineStatus::tasks`] ([`flow::TaskCounters`] and the
/// task app's policy faults).
#[derive(Clone, Debug, Serialize)]
pub struct TaskStatus {
    /// The task's name.
    pub task: String,
    /// Intermediate requests made for it.
    pub created: u64,
    /// Served.
    pub served: u64,
    /// Served past their deadline.
    pub late: u64,
    /// Dropped, every reason.
    pub dropped: u64,
    /// Dropped, by reason label.
    pub dropped_by_reason: BTreeMap<&'static str, u64>,
    /// Refused by the task's app.
    pub rejected: u64,
    /// Sent to a backup node.
    pub rerouted: u64,
    /// The task app's policy faults.
    pub policy_faults: u64,
}

/// One (task, variant, child) line of [`PipelineStatus::fanout`].
#[derive(Clone, Debug, Serialize)]
pub struct FanoutStatus {
    /// The parent task.
    pub task: String,
    /// The parent's variant (`null` for a pass-through task).
    pub variant: Option<String>,
    /// The child task.
    pub child: String,
    /// Requests per parent request the profile expects (`null`: none given).
    pub expected: Option<f64>,
    /// Requests per parent request measured (`null` before the first parent).
    pub measured: Option<f64>,
    /// Parent requests served by the variant.
    pub requests: u64,
}

/// One placed device of [`PipelineStatus::devices`].
#[derive(Clone, Debug, Serialize)]
pub struct DeviceStatus {
    /// The task it serves.
    pub task: String,
    /// The variant it runs.
    pub variant: String,
    /// The plan's batch.
    pub batch: u32,
    /// The variant's latency at that batch, µs.
    pub latency_us: u64,
    /// The task's budget on it, µs.
    pub budget_us: u64,
    /// Intermediate requests sent to it.
    pub requests: u64,
}

/// [`PipelineStatus::routing`]: the load balancer's tables and the demand they were
/// built for.
#[derive(Clone, Debug, Serialize)]
pub struct RoutingStatus {
    /// Requests/s the tables were built for.
    pub demand_qps: f64,
    /// The tables.
    pub tables: RoutingTables,
}

/// How many plan summaries the admin view keeps.
const HISTORY: usize = 20;

/// Why [`PipelineApp::replan`] applied no plan (or only part of one: a load or
/// unload that fails stops the apply where it is). The messages are the ones the
/// admin answer and the control loop's log carried as text before.
#[derive(Debug, thiserror::Error)]
pub enum PipelineReplanError {
    /// The request's demand is negative or not finite (the one 400: the caller's).
    #[error("demand_qps: expected non-negative requests/s")]
    BadDemand,
    /// The blocking solve's task panicked or was cancelled.
    #[error("allocator task: {0}")]
    Task(tokio::task::JoinError),
    /// The solver failed.
    #[error(transparent)]
    Solve(#[from] loki::LokiError),
    /// The solve found no plan for the demand; the plan in force stays.
    #[error("no plan for {demand:.1} req/s ({status:?}); the last one stays")]
    NoPlan {
        /// The demand solved for, requests/s.
        demand: f64,
        /// The solver's status.
        status: sluice_alloc::solver::SolveStatus,
    },
    /// The plan puts a variant of a task that has no workers on a device.
    #[error("task {task} has no workers")]
    NoWorkers {
        /// The task's name.
        task: String,
    },
    /// The blocking model load's task panicked or was cancelled.
    #[error("{0}")]
    LoadTask(tokio::task::JoinError),
    /// The model did not load (the whole cause chain, as `{:#}` wrote it).
    #[error("{0:#}")]
    Model(anyhow::Error),
    /// The worker did not take its new models.
    #[error(transparent)]
    Install(#[from] crate::app::InstallError),
}

impl PipelineReplanError {
    /// Whether the caller's request was at fault (400) rather than the plan (409).
    pub fn is_bad_request(&self) -> bool {
        matches!(self, PipelineReplanError::BadDemand)
    }
}

impl PipelineApp {
    /// The measured demand at the root, requests/s (at least `min_demand_qps`).
    pub fn demand(&self) -> f64 {
        self.arrivals.rate(self.clock.now()).max(self.config.serving.min_demand_qps)
    }

    /// Re-solves the MILP for `demand` (default: the measured demand) and applies
    /// the plan make before break: variants a device newly serves are loaded and
    /// warmed first (the device gets no traffic for them yet), then the routing
    /// switches at once, then devices that left a task retire (serve out their
    /// queue) and unload. Nothing queued is lost: a device that keeps its task but changes
    /// variant serves its queue with the new one. Returns the admin view.
    pub async fn replan(
        self: &Arc<Self>,
        reason: &str,
        demand: Option<f64>,
    ) -> Result<PipelineStatus, PipelineReplanError> {
        if let Some(d) = demand {
            if !(d.is_finite() && d >= 0.0) {
                return Err(PipelineReplanError::BadDemand);
            }
        }
        let mut st = self.plan.lock().await;
        let demand = demand.unwrap_or_else(|| self.demand()).max(self.config.serving.min_demand_qps);
        let mut problem = self.problem.clone();
        problem.demand_qps = demand;
        // The plan in force, so one that no MILP improves on in time is repaired
        // for the new demand rather than replaced by a greedy one.
        let previous = st.plan.clone();
        let outcome = tokio::task::spawn_blocking(move || loki::solve_from(&problem, previous.as_ref()))
            .await
            .map_err(PipelineReplanError::Task)??;
        let Some(plan) = outcome.plan else {
            return Err(PipelineReplanError::NoPlan { demand, status: outcome.report.status });
        };
        let old = self.routing();
        let devices = assign(&self.graph, &plan, &old.devices);
        // Each task worker whose plan assignment changed gets its new view first: before
        // its new variant is loaded (the view keeps the old one's table cut while it
        // is still loaded) and before the new tables send it requests.
        self.bind_views(&old.devices, &devices).await;
        for (d, (o, n)) in old.devices.iter().zip(&devices).enumerate() {
            let Some(n) = n else { continue };
            if o.as_ref().is_some_and(|o| o.task == n.task && o.variant == n.variant) {
                continue;
            }
            self.load(n.task, d, Some(n.variant)).await?;
        }
        *self.routing.write() = Arc::new(Routing::build(
            &self.graph,
            devices.clone(),
            &self.accuracy,
            demand,
            self.config.serving.routing_utilization,
        ));
        for (d, (o, n)) in old.devices.iter().zip(&devices).enumerate() {
            let Some(o) = o else { continue };
            if n.as_ref().is_some_and(|n| n.task == o.task) {
                continue;
            }
            if let Some(app) = &self.tasks[o.task] {
                let worker = &app.workers[d];
                // Served out by `flow::retired`: idle, or at the bound.
                let since = tokio::time::Instant::now();
                // Requests routed by the old tables just before the switch land
                // within microseconds: give them that before watching the queue.
                tokio::time::sleep(Duration::from_millis(20)).await;
                while !flow::retired(
                    worker.queue.is_empty() && worker.in_flight.load(Ordering::Acquire) == 0,
                    since.elapsed().as_micros() as u64,
                    self.slo_us,
                    app.expire_us,
                ) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            self.load(o.task, d, None).await?;
        }
        tracing::info!(
            pipeline = self.name(),
            demand,
            accuracy = plan.accuracy,
            step = plan.step,
            origin = outcome.origin.name(),
            why = outcome.origin.reason().unwrap_or(""),
            "pipeline: plan applied"
        );
        st.history.push_back(summary(&plan, reason, &outcome.origin, outcome.report.solve_seconds));
        while st.history.len() > HISTORY {
            st.history.pop_front();
        }
        st.plan = Some(plan);
        let view = self.view_of(&st);
        *self.view.lock() = view;
        Ok(self.status())
    }

    /// What the policy of a worker serving `assignment` sees: its variant's latency table
    /// cut at the plan's batch and the task budget as its SLO (`flow::task_view`,
    /// the simulator's rule too).
    fn task_view(&self, app: &App, assignment: &Assignment) -> WorkerView {
        let budget = self.budget_us(assignment.task, assignment.latency_us);
        let view = flow::task_view(&app.models, assignment.variant, assignment.batch, budget);
        WorkerView { models: view.models, slo: view.slo_us }
    }

    /// Re-binds each device's task worker whose view changed from plan assignment `old`
    /// (empty: none before, at start) to `new` ([`App::rebind_worker`]: a new policy
    /// instance installed between two decisions, its queue kept). A device that keeps
    /// its task but changes variant serves with the old one until its models switch
    /// ([`PipelineApp::replan`] loads the new one after this): its view keeps the old
    /// variant's table cut at the old plan's batch as well, so the worker never sees
    /// either table whole. A worker that cannot be re-bound keeps its instance and
    /// view, logged: the plan stands.
    pub async fn bind_views(&self, old: &[Option<Assignment>], new: &[Option<Assignment>]) {
        for (d, n) in new.iter().enumerate() {
            let Some(n) = n else { continue };
            let Some(app) = &self.tasks[n.task] else { continue };
            let mut view = self.task_view(app, n);
            let o = old.get(d).and_then(Option::as_ref).filter(|o| o.task == n.task);
            if o.is_some_and(|o| self.task_view(app, o) == view) {
                continue;
            }
            if let Some(o) = o.filter(|o| o.variant != n.variant) {
                view.models = flow::task_view(&view.models, o.variant, o.batch, view.slo).models;
            }
            match app.rebind_worker(d, view).await {
                Ok(()) => {
                    self.rebinds.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(pipeline = self.name(), device = d, "task worker keeps its policy's view: {e}")
                }
            }
        }
    }

    /// Loads `variant` of `task` on `device` (None: unloads it), off the worker.
    async fn load(&self, task: usize, device: usize, variant: Option<usize>) -> Result<(), PipelineReplanError> {
        let (Some(app), Some(sources)) = (&self.tasks[task], &self.sources[task]) else {
            return Err(PipelineReplanError::NoWorkers { task: self.graph.tasks[task].name.clone() });
        };
        let set = match variant {
            None => sluice_core::executor::ModelSet::default(),
            Some(v) => {
                let source: ModelSource = sources.models[v].clone();
                let loaded = tokio::task::spawn_blocking(move || source.load())
                    .await
                    .map_err(PipelineReplanError::LoadTask)?
                    .map_err(PipelineReplanError::Model)?;
                model_set(BTreeMap::from([(v as u32, loaded as LoadedModel)]))
            }
        };
        Ok(app.install_models(device, set).await?)
    }

    /// Rebuilds the routing tables over the devices in force for `demand`.
    fn reroute_for(&self, demand: f64) {
        let devices = self.routing().devices.clone();
        *self.routing.write() = Arc::new(Routing::build(
            &self.graph,
            devices,
            &self.accuracy,
            demand,
            self.config.serving.routing_utilization,
        ));
    }

    fn view_of(&self, st: &PlanState) -> PipelinePlanView {
        PipelinePlanView { plan: st.plan.clone(), history: st.history.clone() }
    }

    /// `GET /admin/pipelines/{name}`: the plan, the devices, the routing tables,
    /// the counters and the measured fan-outs.
    pub fn status(&self) -> PipelineStatus {
        let routing = self.routing();
        let name = |t: usize| self.graph.tasks[t].name.clone();
        let devices = routing
            .devices
            .iter()
            .enumerate()
            .map(|(d, s)| {
                s.as_ref().map(|s| DeviceStatus {
                    task: name(s.task),
                    variant: self.graph.tasks[s.task].models[s.variant].clone(),
                    batch: s.batch,
                    latency_us: s.latency_us,
                    budget_us: self.budget_us(s.task, s.latency_us),
                    requests: self.device_requests[d].load(Ordering::Relaxed),
                })
            })
            .collect();
        let tasks = self
            .task_counters
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let c = c.lock().clone();
                // Faults are the task app's (its fail mode counts them per app).
                let faults = self.tasks[t].as_ref().map_or(0, |a| a.counters.faults.load(Ordering::Relaxed));
                TaskStatus {
                    task: name(t),
                    created: c.created,
                    served: c.served,
                    late: c.late,
                    dropped: c.dropped_total(),
                    dropped_by_reason: flow::by_label(&c.dropped),
                    rejected: c.rejected,
                    rerouted: c.rerouted,
                    policy_faults: faults,
                }
            })
            .collect();
        let mut fanout = Vec::new();
        for (t, task) in self.graph.tasks.iter().enumerate() {
            for (v, per_child) in self.fanout[t].iter().enumerate() {
                for (ci, (parents, created)) in per_child.iter().enumerate() {
                    let parents = parents.load(Ordering::Relaxed);
                    let created = created.load(Ordering::Relaxed);
                    fanout.push(FanoutStatus {
                        task: task.name.clone(),
                        variant: task.models.get(v).cloned(),
                        child: name(task.children[ci]),
                        expected: task.fanout.get(v).and_then(|f| f.get(ci)).copied(),
                        measured: (parents > 0).then(|| created as f64 / parents as f64),
                        requests: parents,
                    });
                }
            }
        }
        let c = &self.counters;
        PipelineStatus {
            name: self.name().to_string(),
            early_drop: self.config.serving.early_drop.as_str(),
            early_drop_at: self.config.serving.early_drop_at.as_str(),
            root_dispatch: self.config.serving.root_dispatch.as_str(),
            root_budget: self.config.serving.root_budget.as_str(),
            routing_utilization: self.config.serving.routing_utilization,
            beta: self.problem.ladder.beta,
            slo_ms: self.problem.slo_ms,
            workers: self.problem.workers,
            demand_qps: self.arrivals.rate(self.clock.now()),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            rebinds: self.rebinds.load(Ordering::Relaxed),
            counters: PipelineCountersView {
                accepted: c.accepted.load(Ordering::Relaxed),
                on_time: c.on_time.load(Ordering::Relaxed),
                partial: c.partial.load(Ordering::Relaxed),
                dropped: c.dropped.load(Ordering::Relaxed),
                refused: c.refused.load(Ordering::Relaxed),
            },
            tasks,
            fanout,
            devices,
            routing: RoutingStatus { demand_qps: routing.demand_qps, tables: routing.tables.clone() },
            allocation: self.view.lock().clone(),
        }
    }
}

/// Rebuilds the routing tables every `routing_period_ms` from the measured demand,
/// and re-plans every `replan_period_s` or when the demand moved more than
/// `replan_threshold` from the plan's; ends when the pipeline stops accepting.
pub async fn control_loop(pipeline: std::sync::Weak<PipelineApp>) {
    let Some(period) = pipeline.upgrade().map(|p| Duration::from_millis(p.config.routing_period_ms)) else { return };
    let Some(window_s) = pipeline.upgrade().map(|p| p.config.scale_down_window_s) else { return };
    // The measured demand of the last `scale_down_window_s`, one sample a tick.
    let window_ticks = ((window_s * 1000.0 / period.as_millis().max(1) as f64).ceil() as usize).max(1);
    let mut seen: std::collections::VecDeque<f64> = std::collections::VecDeque::with_capacity(window_ticks + 1);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let Some(p) = pipeline.upgrade() else { return };
        if !p.accepting.load(Ordering::Acquire) {
            return;
        }
        // Plans and tables follow the peak of the last `scale_down_window_s`: up at
        // once, down only after the window (a pause must not leave the pipeline
        // planned for an idle stream when traffic resumes).
        seen.push_back(p.demand());
        if seen.len() > window_ticks {
            seen.pop_front();
        }
        let demand = WindowPeak { window: window_ticks }.forecast(seen.make_contiguous());
        // A re-plan in progress owns the routing; skip this tick.
        let Ok(st) = p.plan.try_lock() else { continue };
        let planned = st.plan.as_ref().map_or(0.0, |plan| plan.demand_qps);
        let every = p.config.replan_period_s;
        let due = every > 0.0 && last.elapsed().as_secs_f64() >= every;
        let shifted = every > 0.0
            && sluice_alloc::config::demand_moved(
                planned,
                demand,
                p.config.replan_threshold,
                p.config.serving.min_demand_qps,
            );
        if due || shifted {
            drop(st);
            last = tokio::time::Instant::now();
            let reason = if shifted { "demand shift" } else { "period" };
            if let Err(e) = p.replan(reason, Some(demand)).await {
                tracing::warn!(pipeline = p.name(), "re-plan: {e}");
            }
        } else {
            p.reroute_for(demand);
            drop(st);
        }
    }
}

/// The internal app that runs `task` of pipeline `config`: `<pipeline>.<task>`, one
/// worker per pipeline worker, the task's variants from the problem's profile at
/// its percentile, the pipeline's policy and input (None: the app finds its
/// variants' input, as any app does). Built as a value, every other field at the
/// default a config file gives it (`AppConfig::new`).
pub fn task_app_config(
    config: &PipelineConfig,
    source: &sluice_alloc::problem::LokiSource,
    task: &sluice_core::pipeline::Task,
    workers: u32,
    slo_ms: f64,
    input: Option<&InputSpec>,
) -> anyhow::Result<crate::config::AppConfig> {
    let name = format!("{}.{}", config.name, task.name);
    let mut app =
        crate::config::AppConfig::new(name, slo_ms, workers, source.profile.clone(), config.serving.policy.clone());
    app.executor = Some(config.executor);
    app.latency_percentile = source.percentile;
    app.models = Some(task.models.clone());
    app.model_dir = config.model_dir.clone();
    // Fan-outs multiply the requests of a client request: the task's bound is the
    // pipeline's times a generous factor (the pipeline's own bound is the admission).
    app.max_queue = config.max_queue.saturating_mul(64);
    // An intermediate request's deadline is its task budget, and dropping it early
    // is the pipeline's early-drop mode's call (§5.2), not the host's: the host
    // keeps it up to one SLO past that, as it did before it expired at deadlines.
    app.expire_after_ms = Some(slo_ms);
    app.params = Some(config.serving.params.clone().unwrap_or_else(|| {
        let mut p = toml::Table::new();
        p.insert("allocated".into(), toml::Value::Boolean(true));
        p
    }));
    app.input = input.cloned();
    // The window the simulator measures a task's load over (`flow::LOAD_WINDOW_US`),
    // not whatever the app default becomes.
    app.load_window_ms = flow::LOAD_WINDOW_MS;
    app.validate().map_err(|e| anyhow::anyhow!("pipeline {}: task {}: {e}", config.name, task.name))?;
    Ok(app)
}

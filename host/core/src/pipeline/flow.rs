//! How a request flows through a pipeline: one rule each for the live host
//! (`sluice_server::pipeline`) and the simulator (`sluice_sim::pipeline`), so that a
//! trace replayed in virtual time ends as it did live (issue 35; the differential
//! test `tests/live_vs_sim.rs` checks it request by request).
//!
//! The rules, and where each side applies them:
//! - [`task_view`]: what a task worker's policy sees — its variant's latency table
//!   cut at the plan's batch size, the task budget as its SLO — and [`LOAD_WINDOW_US`]
//!   for its `load_qps`.
//! - [`batch_formation_table`]: the latency table early dropping at batch formation
//!   judges the head by (the same cut).
//! - [`after_passthrough`]: the early-drop mode and lateness a request carries out of
//!   a pass-through task.
//! - [`DECIDES_ON_ARRIVAL`]: an idle worker decides when a request reaches it, and
//!   [`ChildArrival`] ([`LIVE_CHILD_ARRIVAL`] live): at a batch's first child or once
//!   all are queued.
//! - [`spend_backup`]: how opportunistic rerouting uses up a backup worker's
//!   leftover capacity (applied to the backup table by
//!   `sluice_alloc::loki::routing::RoutingTables::spend_backup`, both sides).
//! - [`EarlyCause`]: why early dropping at a hop dropped a request, carried by the
//!   load balancer's `Hop::Drop` itself.
//! - [`PathEnd`]: which ends of a request's tree count in the path accuracy (sinks)
//!   and which only in its completion (every end).
//! - [`RoutingDraw`]: how a routing table is turned into one child worker
//!   ([`LIVE_ROUTING_DRAW`] live; the simulator's `routing` key).
//! - [`retired`] (with [`retire_bound_us`]) and [`RETIRING_AS_SHUTDOWN`]: how a
//!   worker leaving a task serves out its queue.
//! - A policy fault in a task worker: [`crate::app_config::FailMode::unbinds`] with the app defaults
//!   ([`crate::app_config::DEFAULT_UNBIND_AFTER`]), the same rule as any app's.
//! - [`Drop`]: one label per reason an intermediate request did not get served.
//! - [`TaskCounters`]: what became of a task's intermediate requests.

use std::collections::BTreeMap;

use sluice_sdk as sdk;

use serde::{Deserialize, Serialize};

use super::EarlyDrop;
use crate::queue::DropReason;

/// What a task worker's policy is given: the task's variants with the served
/// variant's latency table ending at the plan's batch size, and the task budget as
/// its SLO.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// The task's variants; the worker's own ends at the plan's batch.
    pub models: Vec<sdk::Model>,
    /// The SLO the policy's `Config` carries, µs: the task budget, the same span an
    /// intermediate request's deadline runs from its entry.
    pub slo_us: u64,
}

/// The view of a worker serving `variant` of a task with `models` at the plan's
/// `batch`, whose intermediate requests get `budget_us` (Loki §4.2; the task budget,
/// [`super::RootBudget::budget_us`]).
///
/// Why cut: the MILP sized the worker's capacity at that batch (the reference's
/// `pipeline_batch_size`) and `fixed` with `allocated` serves the largest feasible
/// batch the table allows, so a longer table lets a worker batch past its plan and
/// take longer than the budget the routing tables assumed. Why the task budget: a
/// policy reads its SLO as "deadline − arrival" of the requests it is given
/// (`sdk::Config::slo`), and an intermediate request's deadline is its entry plus the
/// task budget, not plus the end-to-end SLO.
pub fn task_view(models: &[sdk::Model], variant: usize, batch: u32, budget_us: u64) -> TaskView {
    let mut models = models.to_vec();
    if let Some(m) = models.get_mut(variant) {
        let keep = batch_formation_table(&m.latency, batch).len();
        m.latency.truncate(keep);
    }
    TaskView { models, slo_us: budget_us }
}

/// The window a task's `load_qps` is measured over, µs: the host's default
/// `load_window_ms` (RAMSIS §6's 500 ms), the same live (a task app's
/// `load_window_ms` is set from it, `sluice_server::pipeline::task_app_config`) and
/// simulated (one `LoadWindow` per task on the virtual clock). The simulator used
/// to give 0; the live task apps took the app default, which is this value today
/// but was not tied to it.
pub const LOAD_WINDOW_US: u64 = 500_000;

/// [`LOAD_WINDOW_US`] in ms, as an app's `load_window_ms` takes it.
pub const LOAD_WINDOW_MS: u64 = LOAD_WINDOW_US / 1000;

/// The latency table (µs per batch size) the head of a queue is judged by at batch
/// formation: the worker's variant's, ending at the plan's `batch` (at least one
/// entry when there is any; `u32::MAX`: not cut, for a caller that does not know
/// the plan). The same cut as [`task_view`], so a worker never expects a batch its
/// policy may not run.
pub fn batch_formation_table(latency: &[u64], batch: u32) -> &[u64] {
    let keep = (batch.max(1) as usize).min(latency.len());
    &latency[..keep]
}

/// The early-drop mode and the lateness (µs past budget) a request carries to the
/// children of a task it just left: `mode` and `over_us` after a model task; after a
/// pass-through task the configured `mode` still applies, at no lateness (a
/// pass-through takes no time and has no budget of its own, so it is never over;
/// `last-task` still checks the time left on entering a sink). The simulator used to
/// switch early dropping off after a pass-through; the live host applied the mode.
pub fn after_passthrough(passthrough: bool, mode: EarlyDrop, over_us: i64) -> (EarlyDrop, i64) {
    if passthrough {
        (mode, 0)
    } else {
        (mode, over_us)
    }
}

/// Whether an idle worker decides as soon as a request reaches it: yes, live and
/// simulated; for a batch's children, at the first or once all are queued
/// ([`ChildArrival`]).
pub const DECIDES_ON_ARRIVAL: bool = true;

/// How the children of one finished batch reach an idle worker: all queued before
/// it decides, or one at a time, deciding at each (`children = "together"` |
/// `"one-by-one"` in a simulated system).
///
/// Live, they arrive together ([`LIVE_CHILD_ARRIVAL`]): each served request's own
/// task queues its children, in its turn in the batch's order, and the worker that
/// answered the batch counts its served answers into the pipeline's handoff before
/// the first leaves; a task app's worker waits for the handoff to settle before it
/// decides (`sluice_server`'s `handoff` module, at most `HANDOFF_WAIT_MAX`). Until
/// 2026-11-27 the live worker woke at the first child and decided with whichever
/// siblings were queued by then, a race: the differential test agreed on 85.9 % of
/// its requests at batch formation (docs/simulator.md).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ChildArrival {
    /// Each child is queued on its own and an idle worker decides at the first,
    /// running it alone; its siblings wait for the next batch. The Loki artifact's
    /// rule (each child a `START_REQUEST` event, and `enqueue_request` starts a
    /// batch on an idle predictor at once), so the simulator's default, which its
    /// reproductions of the artifact keep.
    #[default]
    OneByOne,
    /// Every child of the batch is queued, in the batch's order, before an idle
    /// worker they reach decides; the workers then decide in the order reached. The
    /// live host's.
    Together,
}

/// The live host's arrival of a batch's children: [`ChildArrival::Together`]. One
/// at a time would make an idle worker run a batch of one while its siblings are
/// µs behind, and live it was a race, not a rule.
pub const LIVE_CHILD_ARRIVAL: ChildArrival = ChildArrival::Together;

/// The leftover capacity, requests/s, a backup worker keeps after one request is
/// rerouted to it (None: used up, it leaves the backup table). Loki §5.2 reroutes
/// only to workers "with capacity left"; the reference decrements its
/// `remaining_capacity` by one per rerouted request and resets it at every plan, so
/// the tables reset it at every rebuild. The live host used to never use it up.
pub fn spend_backup(leftover_qps: f64) -> Option<f64> {
    let left = leftover_qps - 1.0;
    (left > 0.0).then_some(left)
}

/// Where one branch of a request's tree ended, served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathEnd {
    /// At a sink: a root-to-sink path, whose accuracy (the product of its variants')
    /// counts in the path accuracy (Loki §3: a path's accuracy is over the tasks of a
    /// root-to-sink path).
    Sink,
    /// At a task that made no request for any child (e.g. a detector that found
    /// nothing): the branch is complete and counts for the client's completion and
    /// lateness, but it is not a path and has no path accuracy. The live host used
    /// to count it as a path.
    Early,
}

impl PathEnd {
    /// The end at a task that served a request and created `children` requests.
    /// None: it created some, the path goes on.
    pub fn of(is_sink: bool, children: u64) -> Option<PathEnd> {
        match (is_sink, children) {
            (true, _) => Some(PathEnd::Sink),
            (false, 0) => Some(PathEnd::Early),
            (false, _) => None,
        }
    }

    /// Whether the end counts in the path accuracy.
    pub fn counts_accuracy(self) -> bool {
        self == PathEnd::Sink
    }
}

/// How long a worker that left a task (a re-plan gave its device another task or
/// none) may take to serve its queue before its variant is unloaded, µs: two SLOs
/// and the expiry (every queued request is then past its end-to-end deadline and
/// expired) plus a second of slack.
pub fn retire_bound_us(slo_us: u64, expire_us: u64) -> u64 {
    2 * slo_us + expire_us + 1_000_000
}

/// Whether a worker that left a task `waited_us` ago is done serving out its queue
/// and may be freed (its variant unloaded): when it is `idle` (its queue empty and
/// no batch running), or at [`retire_bound_us`] whatever it still holds. Until then
/// it serves its queue with its own policy ([`RETIRING_AS_SHUTDOWN`]) and gets no
/// new requests. The live host waits by this rule after a re-plan
/// (`PipelineApp::replan`); the simulator frees a retiring worker by it when the
/// worker idles (`PipelineSim::free_idle`). Past the bound every request still
/// queued is past its expiry (it entered before the worker retired, with at most
/// one SLO to its deadline), so the simulator drops what is left as expired; in
/// virtual time expiry empties the queue before the bound. The simulator used to
/// wait for an empty queue with no bound.
pub fn retired(idle: bool, waited_us: u64, slo_us: u64, expire_us: u64) -> bool {
    idle || waited_us >= retire_bound_us(slo_us, expire_us)
}

/// Whether a retiring worker (one serving out its queue after a re-plan) decides
/// under the host's shutdown rule (`Context::draining`): no. It gets no new
/// requests, but the ones it has keep their task deadlines, which the policy may
/// still meet by batching; draining is the host's shutdown, where the safe rule
/// serves whatever a policy holds back. Live, a task worker's `draining` is the
/// host's shutdown only; the simulator used to say yes.
pub const RETIRING_AS_SHUTDOWN: bool = false;

/// How a routing table (child workers with probabilities) is turned into one
/// destination: the rule of a task's fan-out to its child's workers, live and
/// simulated (`routing = "sampled"` | `"smooth"` in a simulated system).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingDraw {
    /// A draw from a seeded uniform over the table's probabilities: the Loki
    /// artifact samples, so the simulator's reproductions of it draw from the run's
    /// rng (the simulator's default).
    #[default]
    Sampled,
    /// Smooth weighted round robin over the probabilities (nginx's,
    /// [`crate::router::smooth_pick`]): the same proportions with the smallest
    /// spread. The live host's ([`LIVE_ROUTING_DRAW`]).
    Smooth,
}

/// The live host's draw: [`RoutingDraw::Smooth`]. A sampled draw live would only add
/// variance: there is no seeded run to reproduce, and smooth gives every worker its
/// share over any stretch of requests (docs/simulator.md, live and simulated).
pub const LIVE_ROUTING_DRAW: RoutingDraw = RoutingDraw::Smooth;

impl RoutingDraw {
    /// The index of the entry of a table with probabilities `weights` that gets the
    /// next request (None: an empty table). `credit` is the table's smooth state
    /// (one entry per route, kept by the caller between picks and cleared when
    /// the tables are rebuilt; resized here to the table's length); `uniform` gives a draw in
    /// [0, 1) and is called only by [`RoutingDraw::Sampled`] (a smooth run takes
    /// nothing from its rng).
    pub fn pick(self, weights: &[f64], credit: &mut Vec<f64>, uniform: impl FnOnce() -> f64) -> Option<usize> {
        if weights.is_empty() {
            return None;
        }
        match self {
            RoutingDraw::Sampled => {
                let u = uniform();
                let mut acc = 0.0;
                for (k, p) in weights.iter().enumerate() {
                    acc += p;
                    if u < acc {
                        return Some(k);
                    }
                }
                // Rounding left the sum under u: the last entry that gets any.
                weights.iter().rposition(|&p| p > 0.0)
            }
            RoutingDraw::Smooth => {
                credit.resize(weights.len(), 0.0);
                Some(crate::router::smooth_pick(weights, credit))
            }
        }
    }
}

/// Why early dropping at a hop dropped a request (`RoutingTables::hop`'s causes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EarlyCause {
    /// It overran its budget at the task it left (`per-task`).
    OverBudget,
    /// Less time left than the sink's execution (`last-task`).
    NoTimeLeft,
    /// Behind, and no faster backup worker has capacity (`rerouting`).
    NoFasterWorker,
}

/// Why an intermediate request was not served: one label per reason, the same in
/// live answers, metrics, the admin view and simulated results. Counts are keyed
/// by the type; the label ([`Drop::as_str`], also its `Serialize` form, so a map
/// keyed by `Drop` renders as one keyed by label) is written only at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Drop {
    /// Its task had no worker in the routing in force.
    NoWorker,
    /// Its worker's queue was full.
    QueueFull,
    /// Its worker's admission predicted it would miss its deadline (the host's
    /// admission; intermediate requests skip the prediction today).
    Overloaded,
    /// Early dropping at a hop (§5.2).
    Early(EarlyCause),
    /// Dropped by its worker: the policy, expiry, the executor, or early dropping at
    /// batch formation.
    Worker(DropReason),
}

impl Drop {
    /// Its label: `no-worker`, `queue-full`, `overloaded`, `early-drop-over-budget`,
    /// `early-drop-no-time-left`, `early-drop-no-faster-worker`, or the worker's
    /// reason (`policy`, `expired`, `executor-error`, `early-drop-batch-formation`).
    pub fn as_str(self) -> &'static str {
        match self {
            Drop::NoWorker => "no-worker",
            Drop::QueueFull => "queue-full",
            Drop::Overloaded => "overloaded",
            Drop::Early(EarlyCause::OverBudget) => "early-drop-over-budget",
            Drop::Early(EarlyCause::NoTimeLeft) => "early-drop-no-time-left",
            Drop::Early(EarlyCause::NoFasterWorker) => "early-drop-no-faster-worker",
            Drop::Worker(r) => r.as_str(),
        }
    }
}

impl serde::Serialize for Drop {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// `counts` by label ([`Drop::as_str`]), in label order: how a count by reason is
/// rendered at the edge (JSON, results files), the same as when the counts were
/// keyed by label.
pub fn by_label(counts: &BTreeMap<Drop, u64>) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for (why, n) in counts {
        *out.entry(why.as_str()).or_insert(0) += n;
    }
    out
}

/// What became of the intermediate requests made for one task, counted by one type
/// live (`sluice_server::pipeline::PipelineApp`, one per task under a lock) and
/// simulated (`sluice_sim::pipeline`, whose results report it per task): every
/// request created ends served, dropped (by its [`Drop`]) or rejected, so
/// `created = served + dropped + rejected` once nothing is in flight.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskCounters {
    /// Intermediate requests created for the task (the root's: client requests).
    pub created: u64,
    /// Served by one of its workers (a pass-through task serves each at once).
    pub served: u64,
    /// Of those served by a model, after their task deadline (entry + task budget).
    pub late: u64,
    /// Dropped, by reason (rendered by label with [`by_label`]).
    pub dropped: BTreeMap<Drop, u64>,
    /// Refused or abandoned at shutdown (live only: a simulation finishes its queues).
    pub rejected: u64,
    /// Sent to a backup worker by opportunistic rerouting.
    pub rerouted: u64,
    /// The accuracies of the variants that served them, summed (model tasks).
    pub accuracy_sum: f64,
    /// Faults of its workers' policies, answered by the safe policy (simulated; live,
    /// the task app counts them, `AppCounters::faults`).
    pub policy_faults: u64,
}

impl TaskCounters {
    /// One request served: by a model of `accuracy`, on time or not (None: by a
    /// pass-through task, which has neither).
    pub fn served(&mut self, by_model: Option<(f64, bool)>) {
        self.served += 1;
        if let Some((accuracy, on_time)) = by_model {
            self.accuracy_sum += accuracy;
            self.late += u64::from(!on_time);
        }
    }

    /// One request dropped, `why`.
    pub fn dropped(&mut self, why: Drop) {
        *self.dropped.entry(why).or_insert(0) += 1;
    }

    /// Requests dropped, for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// How one client request through a pipeline ended, live or simulated: the record
/// the pipeline differential test compares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PipelineOutcome {
    /// Per task name: variant name → intermediate requests it served.
    pub variants: BTreeMap<String, BTreeMap<String, u64>>,
    /// Drop reason → intermediate requests dropped so.
    pub drops: BTreeMap<Drop, u64>,
    /// Branches that ended served at a sink.
    pub sinks: u64,
    /// Branches that ended served before a sink ([`PathEnd::Early`]).
    pub early_ends: u64,
    /// Every branch served, none dropped, the last by the end-to-end deadline.
    pub on_time: bool,
}

impl PipelineOutcome {
    /// One word for a summary: `on-time`, `late`, `partial` (some branch dropped) or
    /// `dropped` (nothing served to an end).
    pub fn label(&self) -> &'static str {
        let ends = self.sinks + self.early_ends;
        if self.on_time {
            "on-time"
        } else if ends == 0 {
            "dropped"
        } else if self.drops.is_empty() {
            "late"
        } else {
            "partial"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(id: u32, latency: Vec<u64>) -> sdk::Model {
        sdk::Model { id, name: format!("m{id}"), accuracy: 0.5, latency }
    }

    #[test]
    fn a_task_policy_sees_its_table_cut_at_the_plan_batch_and_the_task_budget() {
        let models = vec![model(0, vec![10, 15, 20, 25]), model(1, vec![30, 40, 50, 60])];
        let v = task_view(&models, 1, 2, 80);
        assert_eq!(v.models[1].latency, vec![30, 40]);
        // Other variants are left whole (the worker does not serve them).
        assert_eq!(v.models[0].latency.len(), 4);
        assert_eq!(v.slo_us, 80);
        // A batch past the table keeps the table; batch 0 keeps one entry.
        assert_eq!(task_view(&models, 0, 9, 1).models[0].latency.len(), 4);
        assert_eq!(batch_formation_table(&[5, 6, 7], 0), &[5]);
        assert_eq!(batch_formation_table(&[5, 6, 7], u32::MAX), &[5, 6, 7]);
        assert_eq!(batch_formation_table(&[], 4), &[] as &[u64]);
    }

    #[test]
    fn after_a_passthrough_the_mode_applies_at_no_lateness() {
        assert_eq!(after_passthrough(true, EarlyDrop::LastTask, 500), (EarlyDrop::LastTask, 0));
        assert_eq!(after_passthrough(false, EarlyDrop::PerTask, 500), (EarlyDrop::PerTask, 500));
    }

    #[test]
    fn backup_capacity_is_used_up_one_request_at_a_time() {
        assert_eq!(spend_backup(2.5), Some(1.5));
        assert_eq!(spend_backup(1.5), Some(0.5));
        assert_eq!(spend_backup(0.5), None);
        assert_eq!(spend_backup(1.0), None);
    }

    #[test]
    fn only_sinks_count_in_path_accuracy_but_every_end_completes() {
        assert_eq!(PathEnd::of(true, 0), Some(PathEnd::Sink));
        assert_eq!(PathEnd::of(false, 0), Some(PathEnd::Early));
        assert_eq!(PathEnd::of(false, 3), None);
        assert!(PathEnd::Sink.counts_accuracy() && !PathEnd::Early.counts_accuracy());
    }

    #[test]
    fn a_task_measures_its_load_over_the_app_default_window() {
        let app = crate::app_config::AppConfig::new("p.t".into(), 100.0, 1, "p.toml".into(), "fixed".into());
        assert_eq!(app.load_window_ms, LOAD_WINDOW_MS);
        assert_eq!(LOAD_WINDOW_MS * 1000, LOAD_WINDOW_US);
    }

    #[test]
    fn a_retiring_worker_is_freed_when_idle_or_at_the_bound() {
        assert_eq!(retire_bound_us(100_000, 100_000), 1_300_000);
        assert!(retired(true, 0, 100_000, 100_000));
        assert!(!retired(false, 1_299_999, 100_000, 100_000));
        assert!(retired(false, 1_300_000, 100_000, 100_000));
        const { assert!(!RETIRING_AS_SHUTDOWN) };
    }

    #[test]
    fn routing_draws_sampled_by_the_uniform_and_smooth_by_credit() {
        let w = [0.5, 0.25, 0.25];
        let at = |u: f64| RoutingDraw::Sampled.pick(&w, &mut Vec::new(), || u);
        let drawn: Vec<Option<usize>> = [0.0, 0.49, 0.5, 0.74, 0.75, 0.999].into_iter().map(at).collect();
        assert_eq!(drawn, [Some(0), Some(0), Some(1), Some(1), Some(2), Some(2)]);
        // Probabilities that round below the draw: the last entry that gets any.
        assert_eq!(RoutingDraw::Sampled.pick(&[0.4, 0.4, 0.0], &mut Vec::new(), || 0.9), Some(1));
        // Smooth takes no draw and gives 2:1:1 over every 4 picks, spread out.
        let mut credit = Vec::new();
        let picks: Vec<usize> = (0..8)
            .map(|_| RoutingDraw::Smooth.pick(&w, &mut credit, || unreachable!("smooth draws nothing")).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 0, 1, 2, 0]);
        // Credits follow the table's length; an empty table has no pick.
        assert_eq!(RoutingDraw::Smooth.pick(&[1.0], &mut credit, || 0.0), Some(0));
        assert_eq!(credit.len(), 1);
        assert_eq!(RoutingDraw::Smooth.pick(&[], &mut credit, || 0.0), None);
        assert_eq!(LIVE_ROUTING_DRAW, RoutingDraw::Smooth);
        assert_eq!(RoutingDraw::default(), RoutingDraw::Sampled);
    }

    #[test]
    fn arrival_decisions_and_labels() {
        const { assert!(DECIDES_ON_ARRIVAL) };
        assert_eq!(LIVE_CHILD_ARRIVAL, ChildArrival::Together);
        assert_eq!(ChildArrival::default(), ChildArrival::OneByOne);
        let labels: Vec<&str> = [
            Drop::NoWorker,
            Drop::QueueFull,
            Drop::Early(EarlyCause::OverBudget),
            Drop::Early(EarlyCause::NoTimeLeft),
            Drop::Early(EarlyCause::NoFasterWorker),
            Drop::Worker(DropReason::EarlyAtBatch),
            Drop::Worker(DropReason::Expired),
        ]
        .iter()
        .map(|d| d.as_str())
        .collect();
        assert_eq!(
            labels,
            [
                "no-worker",
                "queue-full",
                "early-drop-over-budget",
                "early-drop-no-time-left",
                "early-drop-no-faster-worker",
                "early-drop-batch-formation",
                "expired"
            ]
        );
        let mut c = TaskCounters { created: 4, ..Default::default() };
        c.served(Some((0.5, true)));
        c.served(Some((0.25, false)));
        c.served(None);
        c.dropped(Drop::Early(EarlyCause::OverBudget));
        assert_eq!((c.served, c.late, c.accuracy_sum, c.dropped_total()), (3, 1, 0.75, 1));
        assert_eq!(c.created, c.served + c.dropped_total() + c.rejected);
        let mut o = PipelineOutcome { sinks: 2, on_time: true, ..Default::default() };
        assert_eq!(o.label(), "on-time");
        o.on_time = false;
        assert_eq!(o.label(), "late");
        o.drops.insert(Drop::Worker(DropReason::Expired), 1);
        assert_eq!(o.label(), "partial");
        o.sinks = 0;
        assert_eq!(o.label(), "dropped");
    }
}

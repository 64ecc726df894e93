//! Loki's load balancer (HPDC'24 §5.1, Algorithm 1 "MostAccurateFirst"): from the
//! hosted workers and an estimate of the demand, a routing table for the front end
//! and for every worker — for each child task, which downstream workers get its
//! intermediate requests and with which probability — and the backup table of
//! workers with capacity left for opportunistic rerouting (§5.2).
//!
//! Tasks are visited root first; within a task, workers in non-increasing order of
//! their variant's accuracy (the paper's order; the reference code sorts ascending,
//! which fills the *least* accurate workers first — not followed). A worker's
//! outgoing rate to a child is its incoming rate × its variant's fan-out to that
//! child; it is poured into the child's workers, most accurate first, up to each
//! one's remaining capacity; an entry's probability is what it took / the outgoing
//! rate. Two cases the algorithm leaves open are closed so that every table sums to
//! 1 (a worker must send every request somewhere): outgoing rate beyond the child's
//! total capacity is spread over the child's workers in proportion to their
//! capacity, and a worker with no estimated traffic gets a table proportional to
//! capacity (the estimate may be wrong; its requests must still go somewhere).
//! Ties in accuracy go to the lower worker index.
//!
//! Pass-through tasks (no model) get one virtual node with unbounded capacity, so a
//! front end that fans a request out (Loki's `source`) routes like a worker.

use serde::Serialize;
use sluice_core::pipeline::flow::{self, EarlyCause};
use sluice_core::pipeline::{EarlyDrop, Pipeline};

/// A hosted (task, variant) replica: one worker as the load balancer sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Replica {
    /// Its task (index in the pipeline).
    pub task: usize,
    /// Its variant (index in the task's models).
    pub variant: usize,
    /// The variant's accuracy.
    pub accuracy: f64,
    /// Requests/s it sustains at its batch size (the plan's q(i, k, y)).
    pub capacity_qps: f64,
    /// Its latency at its batch size, µs (the task's latency budget on it).
    pub latency_us: u64,
}

/// One entry of a routing table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Route {
    /// The node (a worker index; pass-through tasks' nodes follow the workers).
    pub node: usize,
    /// The probability of sending a request there.
    pub probability: f64,
}

/// A worker with capacity left after routing (§5.2's backup table).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Backup {
    /// The node.
    pub node: usize,
    /// Requests/s of capacity left.
    pub leftover_qps: f64,
    /// Its latency, µs.
    pub latency_us: u64,
    /// Its accuracy.
    pub accuracy: f64,
}

/// The load balancer's output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoutingTables {
    /// Routes into the root task.
    pub frontend: Vec<Route>,
    /// Per node (workers, then one per pass-through task), per child of its task in
    /// the pipeline's child order, its routes.
    pub nodes: Vec<Vec<Vec<Route>>>,
    /// The node of each pass-through task (None for a task with models).
    pub passthrough: Vec<Option<usize>>,
    /// Per task, the nodes with capacity left, most accurate first.
    pub backup: Vec<Vec<Backup>>,
    /// Per node, the estimated requests/s it receives.
    pub incoming: Vec<f64>,
    /// Per node, its execution time at its batch size, µs (0 for pass-through).
    pub latency_us: Vec<u64>,
}

/// Where early dropping sends one intermediate request ([`RoutingTables::hop`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// To the node the routing table assigned.
    Assigned(usize),
    /// To a faster node from the backup table (opportunistic rerouting).
    Rerouted(usize),
    /// Dropped: it cannot make its deadline, for the cause the live host and the
    /// simulator count it under (`flow::Drop::Early`).
    Drop(EarlyCause),
}

impl RoutingTables {
    /// Opportunistic rerouting (§5.2): among `task`'s workers with capacity left, the
    /// most accurate whose latency is at most `max_latency_us` (ties: the one with
    /// the most capacity left, then the lower index — the paper breaks ties at
    /// random). None: no such worker; the request is to be dropped.
    pub fn reroute(&self, task: usize, max_latency_us: u64) -> Option<usize> {
        self.backup
            .get(task)?
            .iter()
            .filter(|b| b.latency_us <= max_latency_us)
            .max_by(|a, b| {
                a.accuracy
                    .total_cmp(&b.accuracy)
                    .then(a.leftover_qps.total_cmp(&b.leftover_qps))
                    .then(b.node.cmp(&a.node))
            })
            .map(|b| b.node)
    }

    /// One request rerouted to backup `node` of `task`: its leftover capacity
    /// shrinks by one request, and it leaves the backup table when used up
    /// ([`flow::spend_backup`]). The one walk of the backup list the live host and
    /// the simulator share after a [`Hop::Rerouted`]; a node not in the table is
    /// left alone.
    pub fn spend_backup(&mut self, task: usize, node: usize) {
        let Some(list) = self.backup.get_mut(task) else { return };
        if let Some(k) = list.iter().position(|b| b.node == node) {
            match flow::spend_backup(list[k].leftover_qps) {
                Some(left) => list[k].leftover_qps = left,
                None => {
                    list.remove(k);
                }
            }
        }
    }

    /// Early dropping (§5.2) for one intermediate request bound for `child`, whose
    /// routing table gave it `assigned`. The request left its parent task `over_us`
    /// past that task's budget (negative: ahead of it), at `now`, with its end-to-end
    /// deadline at `deadline` (µs on one clock).
    ///
    /// - `none` always follows the table.
    /// - `per-task` drops every request that overran its parent task's budget.
    /// - `last-task` drops a request entering a sink when the time left is less than
    ///   the assigned worker's execution time.
    /// - `rerouting` sends a request that is behind by x to the most accurate
    ///   backup worker that executes within y − x (y: the assigned worker's time),
    ///   and drops it when there is none.
    // Each argument is one fact about the request the paper's rule reads; a struct
    // for them would only be built to be taken apart here.
    #[allow(clippy::too_many_arguments)]
    pub fn hop(
        &self,
        mode: EarlyDrop,
        child: usize,
        child_is_sink: bool,
        assigned: usize,
        over_us: i64,
        now: u64,
        deadline: u64,
    ) -> Hop {
        match mode {
            EarlyDrop::None => Hop::Assigned(assigned),
            EarlyDrop::PerTask if over_us > 0 => Hop::Drop(EarlyCause::OverBudget),
            EarlyDrop::PerTask => Hop::Assigned(assigned),
            EarlyDrop::LastTask => {
                let need = self.latency_us.get(assigned).copied().unwrap_or(0);
                if child_is_sink && now.saturating_add(need) > deadline {
                    Hop::Drop(EarlyCause::NoTimeLeft)
                } else {
                    Hop::Assigned(assigned)
                }
            }
            EarlyDrop::Rerouting if over_us <= 0 => Hop::Assigned(assigned),
            EarlyDrop::Rerouting => {
                let y = self.latency_us.get(assigned).copied().unwrap_or(0) as i64;
                let within = y - over_us;
                match (within >= 0).then(|| self.reroute(child, within as u64)).flatten() {
                    Some(node) => Hop::Rerouted(node),
                    None => Hop::Drop(EarlyCause::NoFasterWorker),
                }
            }
        }
    }
}

/// Algorithm 1 over `workers` for `demand_qps` requests/s entering the root.
pub fn most_accurate_first(pipeline: &Pipeline, workers: &[Replica], demand_qps: f64) -> RoutingTables {
    most_accurate_first_with(pipeline, workers, demand_qps, |_, _| None)
}

/// [`most_accurate_first_with`] filling each worker only to `utilization` of its
/// capacity: 1 is Algorithm 1 as written, which fills the most accurate workers to
/// exactly their capacity (with Poisson arrivals a worker at 100% queues without
/// bound); below 1 leaves queueing headroom. The backup tables are measured against
/// the full capacities ([`backup_against_full_capacity`]).
pub fn most_accurate_first_filling(
    pipeline: &Pipeline,
    workers: &[Replica],
    demand_qps: f64,
    utilization: f64,
    branching: impl Fn(usize, usize) -> Option<f64>,
) -> RoutingTables {
    let cut: Vec<Replica> =
        workers.iter().map(|w| Replica { capacity_qps: w.capacity_qps * utilization, ..w.clone() }).collect();
    let mut tables = most_accurate_first_with(pipeline, &cut, demand_qps, branching);
    tables.backup = backup_against_full_capacity(&tables, workers);
    tables
}

/// The backup table (Loki §5.1–5.2) of `tables`, measured against each worker's full
/// capacity (`workers`' own). `most_accurate_first` computes leftovers against the
/// capacities it is given, which [`most_accurate_first_filling`] cuts to a share of the
/// real ones so that routing leaves queueing headroom. With that cut and β = 1.2
/// (0.8 × 1.2 < 1) the routed demand exceeds the cut capacity of every task, no worker
/// has anything left, and rerouting could never fire. The paper lists "workers with
/// left-over capacity" after saturating them, and the reference's
/// `remaining_capacity` starts from the worker's `peak_throughput` and is lowered by
/// what MostAccurateFirst routed to it — the real capacity, not a routing share.
pub fn backup_against_full_capacity(tables: &RoutingTables, workers: &[Replica]) -> Vec<Vec<Backup>> {
    let mut backup: Vec<Vec<Backup>> = vec![Vec::new(); tables.backup.len()];
    for (node, w) in workers.iter().enumerate() {
        let leftover = w.capacity_qps - tables.incoming.get(node).copied().unwrap_or(0.0);
        // Under a thousandth of a request per second is rounding, not capacity.
        if leftover > 1e-3 {
            backup[w.task].push(Backup {
                node,
                leftover_qps: leftover,
                latency_us: w.latency_us,
                accuracy: w.accuracy,
            });
        }
    }
    for list in &mut backup {
        list.sort_by(|a, b| b.accuracy.total_cmp(&a.accuracy).then(a.node.cmp(&b.node)));
    }
    backup
}

/// [`most_accurate_first`] with the branching of some workers given: `branching(w, c)`
/// is the requests worker `w` sends to its task's `c`-th child per request it serves,
/// or None for its variant's expected fan-out. The Loki artifact builds its tables on
/// each worker's measured branching, 1 where none is measured yet (its
/// `load_balancer.py`, "we will assume the branching factor is 1").
pub fn most_accurate_first_with(
    pipeline: &Pipeline,
    workers: &[Replica],
    demand_qps: f64,
    branching: impl Fn(usize, usize) -> Option<f64>,
) -> RoutingTables {
    let n = pipeline.tasks.len();
    // Nodes: the workers, then one per pass-through task.
    let mut nodes: Vec<Replica> = workers.to_vec();
    let mut passthrough = vec![None; n];
    for (t, task) in pipeline.tasks.iter().enumerate() {
        if task.is_passthrough() {
            passthrough[t] = Some(nodes.len());
            nodes.push(Replica { task: t, variant: 0, accuracy: 1.0, capacity_qps: f64::INFINITY, latency_us: 0 });
        }
    }
    // Per task, its nodes most accurate first.
    let mut by_task: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in nodes.iter().enumerate() {
        by_task[node.task].push(i);
    }
    for list in &mut by_task {
        list.sort_by(|&a, &b| nodes[b].accuracy.total_cmp(&nodes[a].accuracy).then(a.cmp(&b)));
    }
    let full: Vec<f64> = nodes.iter().map(|w| w.capacity_qps.max(0.0)).collect();
    // Capacity not yet routed to.
    let mut capacity = full.clone();
    let mut incoming = vec![0.0; nodes.len()];
    let fill = |task: usize, amount: f64, left: &mut Vec<f64>, incoming: &mut Vec<f64>| -> Vec<Route> {
        let list = &by_task[task];
        let mut routes: Vec<Route> = Vec::new();
        let add = |node: usize, p: f64, routes: &mut Vec<Route>| match routes.iter_mut().find(|r| r.node == node) {
            Some(r) => r.probability += p,
            None => routes.push(Route { node, probability: p }),
        };
        // A pass-through task has one node of unbounded capacity (all of the share);
        // other tasks' nodes have finite capacities.
        let total_capacity: f64 = list.iter().map(|&w| full[w]).sum();
        let proportional = |w: usize| {
            if total_capacity.is_infinite() {
                if full[w].is_infinite() {
                    1.0
                } else {
                    0.0
                }
            } else if total_capacity > 0.0 {
                full[w] / total_capacity
            } else {
                1.0 / list.len() as f64
            }
        };
        if list.is_empty() {
            return routes;
        }
        if amount <= 0.0 {
            for &w in list {
                let p = proportional(w);
                if p > 0.0 {
                    add(w, p, &mut routes);
                }
            }
            return routes;
        }
        let mut outgoing = amount;
        for &w in list {
            if left[w] > 0.0 && outgoing > 0.0 {
                let routed = outgoing.min(left[w]);
                add(w, routed / amount, &mut routes);
                outgoing -= routed;
                left[w] -= routed;
                incoming[w] += routed;
            }
        }
        // Left over only where every capacity is finite (and used up).
        if outgoing > 1e-12 {
            for &w in list {
                let p = proportional(w);
                if p > 0.0 {
                    add(w, outgoing * p / amount, &mut routes);
                    incoming[w] += outgoing * p;
                }
            }
        }
        routes
    };
    let frontend = fill(0, demand_qps, &mut capacity, &mut incoming);
    let mut tables: Vec<Vec<Vec<Route>>> = vec![Vec::new(); nodes.len()];
    for (t, task) in pipeline.tasks.iter().enumerate() {
        for &node in &by_task[t] {
            tables[node] = task
                .children
                .iter()
                .enumerate()
                .map(|(ci, &child)| {
                    let given = if node < workers.len() { branching(node, ci) } else { None };
                    let outgoing = incoming[node] * given.unwrap_or(task.fanout[nodes[node].variant][ci]);
                    fill(child, outgoing, &mut capacity, &mut incoming)
                })
                .collect();
        }
    }
    let backup = by_task
        .iter()
        .map(|list| {
            list.iter()
                .filter(|&&w| capacity[w] > 1e-9)
                .map(|&w| Backup {
                    node: w,
                    leftover_qps: capacity[w],
                    latency_us: nodes[w].latency_us,
                    accuracy: nodes[w].accuracy,
                })
                .collect()
        })
        .collect();
    let latency_us = nodes.iter().map(|w| w.latency_us).collect();
    RoutingTables { frontend, nodes: tables, passthrough, backup, incoming, latency_us }
}

/// A root worker as a queue-aware dispatcher sees it at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RootQueue {
    /// Its variant's accuracy.
    pub accuracy: f64,
    /// Requests waiting (not in the batch it is serving).
    pub queued: usize,
    /// How long the head of the queue has waited, µs (0 when the queue is empty).
    pub head_wait_us: u64,
    /// Requests/s it serves at its plan's batch size.
    pub capacity_qps: f64,
    /// Its head would finish after its deadline even if the worker started a batch
    /// now: the worker is stuck (a slow or stalled policy or executor) or far behind.
    pub head_late: bool,
}

/// Which root worker a client request goes to, by queue, as the Loki artifact's
/// executor dispatches (`executor.py`, `enqueue_request_maf`; it ignores the client
/// table its load balancer computes): workers in non-increasing order of accuracy,
/// ties to the lower index; the first whose queue is empty, whose head has just
/// arrived, or whose queued requests arrived no faster than it serves them (queue
/// length over the head's wait, against its capacity) takes it. When every worker is
/// over that rate, the least overloaded does. None when there is no worker.
///
/// One guard the artifact lacks: a worker whose head is already late
/// ([`RootQueue::head_late`]) takes a request only when every worker's head is late.
/// The rate test alone cannot tell a stuck worker from slow arrivals: a stalled
/// worker's queue grows only as fast as requests come, so it would keep taking them
/// all until they expired, while another worker idles.
pub fn queue_aware_root(workers: &[RootQueue]) -> Option<usize> {
    let mut order: Vec<usize> = (0..workers.len()).collect();
    order.sort_by(|&a, &b| workers[b].accuracy.total_cmp(&workers[a].accuracy));
    // The fallback: on-time heads before late ones, then the least overloaded.
    let mut least: Option<((bool, f64), usize)> = None;
    let before = |a: (bool, f64), b: (bool, f64)| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).is_lt();
    for i in order {
        let w = &workers[i];
        if w.queued == 0 || w.head_wait_us == 0 {
            return Some(i);
        }
        let arriving_qps = w.queued as f64 / (w.head_wait_us as f64 / 1e6);
        let overload = arriving_qps / w.capacity_qps.max(f64::MIN_POSITIVE);
        if overload <= 1.0 && !w.head_late {
            return Some(i);
        }
        let key = (w.head_late, overload);
        if least.is_none_or(|(k, _)| before(key, k)) {
            least = Some((key, i));
        }
    }
    least.map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::pipeline::PipelineSpec;

    fn pipeline() -> Pipeline {
        let spec: PipelineSpec = toml::from_str(
            r#"
            [[task]]
            name = "detect"
            models = ["fast", "good"]
            fanout.fast = { factor = 2.0 }
            fanout.good = { factor = 3.0 }
            [[task]]
            name = "classify"
            models = ["small", "big"]
            [[edge]]
            from = "detect"
            to = "classify"
            "#,
        )
        .unwrap();
        Pipeline::new(&spec).unwrap()
    }

    fn w(task: usize, variant: usize, accuracy: f64, capacity_qps: f64) -> Replica {
        Replica { task, variant, accuracy, capacity_qps, latency_us: 10_000 * (1 + variant as u64) }
    }

    /// Worked by hand: 10 req/s enter. detect: `good` (acc 0.9, 6/s) is filled first,
    /// then `fast` (acc 0.6, 8/s) takes the other 4. good sends 6 × 3 = 18/s on:
    /// classify `big` (acc 0.95, 10/s) takes 10 (p = 10/18), `small` #1 (acc 0.7,
    /// 5/s) takes 5 (p = 5/18), `small` #2 (5/s) takes 3 (p = 3/18) and keeps 2/s.
    /// fast sends 4 × 2 = 8/s: only small #2's 2/s is left (p = 2/8); the other 6/s
    /// exceed the task's capacity and are spread over big : small : small in
    /// proportion to capacity 10 : 5 : 5 (3, 1.5, 1.5 → p 3/8, 1.5/8, 1.5/8).
    #[test]
    fn most_accurate_first_matches_the_hand_worked_example() {
        let workers = [w(0, 0, 0.6, 8.0), w(0, 1, 0.9, 6.0), w(1, 0, 0.7, 5.0), w(1, 1, 0.95, 10.0), w(1, 0, 0.7, 5.0)];
        let t = most_accurate_first(&pipeline(), &workers, 10.0);
        let probs = |routes: &[Route]| -> Vec<(usize, f64)> {
            routes.iter().map(|r| (r.node, (r.probability * 1e9).round() / 1e9)).collect()
        };
        assert_eq!(probs(&t.frontend), [(1, 0.6), (0, 0.4)]);
        let r = |x: f64| (x * 1e9).round() / 1e9;
        assert_eq!(probs(&t.nodes[1][0]), [(3, r(10.0 / 18.0)), (2, r(5.0 / 18.0)), (4, r(3.0 / 18.0))]);
        assert_eq!(probs(&t.nodes[0][0]), [(4, r(2.0 / 8.0 + 1.5 / 8.0)), (3, r(3.0 / 8.0)), (2, r(1.5 / 8.0))]);
        for table in t.nodes.iter().flatten().chain([&t.frontend]) {
            let sum: f64 = table.iter().map(|r| r.probability).sum();
            assert!((sum - 1.0).abs() < 1e-9, "{table:?}");
        }
        assert_eq!(t.incoming[1], 6.0);
        assert_eq!(t.incoming[0], 4.0);
        assert!((t.incoming[3] - 13.0).abs() < 1e-9);
        // Only detect's fast worker has capacity left (8 − 4).
        assert_eq!(t.backup[0], [Backup { node: 0, leftover_qps: 4.0, latency_us: 10_000, accuracy: 0.6 }]);
        assert!(t.backup[1].is_empty());
        assert_eq!(t.reroute(0, 10_000), Some(0));
        assert_eq!(t.reroute(0, 9_999), None);
    }

    /// The same workers, `good`'s branching given as 1 (the artifact's value for a
    /// worker not yet measured): it sends 6 × 1 = 6/s, all to `big`; `fast` then sends
    /// 4 × 2 = 8/s: big's 4/s left (p 4/8), then small #1's (p 4/8). The tables carry
    /// 14/s to classify where 26/s will come.
    #[test]
    fn given_branching_sizes_a_workers_tables() {
        let workers = [w(0, 0, 0.6, 8.0), w(0, 1, 0.9, 6.0), w(1, 0, 0.7, 5.0), w(1, 1, 0.95, 10.0), w(1, 0, 0.7, 5.0)];
        let t = most_accurate_first_with(&pipeline(), &workers, 10.0, |w, _| (w == 1).then_some(1.0));
        assert_eq!(t.nodes[1][0], [Route { node: 3, probability: 1.0 }]);
        assert_eq!(t.nodes[0][0], [Route { node: 3, probability: 0.5 }, Route { node: 2, probability: 0.5 }]);
        assert_eq!((t.incoming[3], t.incoming[2], t.incoming[4]), (10.0, 4.0, 0.0));
        // Nothing given: the expected fan-outs, as most_accurate_first.
        assert_eq!(
            most_accurate_first_with(&pipeline(), &workers, 10.0, |_, _| None),
            most_accurate_first(&pipeline(), &workers, 10.0)
        );
    }

    #[test]
    fn idle_workers_route_by_capacity_and_passthrough_roots_fan_out() {
        let workers = [w(0, 1, 0.9, 6.0), w(1, 0, 0.7, 5.0), w(1, 1, 0.95, 15.0)];
        let t = most_accurate_first(&pipeline(), &workers, 0.0);
        assert_eq!(t.frontend, [Route { node: 0, probability: 1.0 }]);
        assert_eq!(t.nodes[0][0], [Route { node: 2, probability: 0.75 }, Route { node: 1, probability: 0.25 }]);

        let spec: PipelineSpec = toml::from_str(
            r#"
            [[task]]
            name = "source"
            [[task]]
            name = "a"
            models = ["a1"]
            [[task]]
            name = "b"
            models = ["b1"]
            [[edge]]
            from = "source"
            to = "a"
            [[edge]]
            from = "source"
            to = "b"
            "#,
        )
        .unwrap();
        let p = Pipeline::new(&spec).unwrap();
        let t = most_accurate_first(&p, &[w(1, 0, 1.0, 4.0), w(2, 0, 1.0, 4.0)], 3.0);
        assert_eq!(t.passthrough, [Some(2), None, None]);
        assert_eq!(t.frontend, [Route { node: 2, probability: 1.0 }]);
        assert_eq!(t.nodes[2], [vec![Route { node: 0, probability: 1.0 }], vec![Route { node: 1, probability: 1.0 }]]);
        assert_eq!(t.backup[1][0].leftover_qps, 1.0);
    }

    #[test]
    fn early_dropping_follows_each_mode() {
        // Idle: every classify worker keeps its capacity, so both are backups.
        let workers = [w(0, 1, 0.9, 6.0), w(1, 0, 0.7, 5.0), w(1, 1, 0.95, 15.0)];
        let t = most_accurate_first(&pipeline(), &workers, 0.0);
        assert_eq!(t.latency_us, [20_000, 10_000, 20_000]);
        let hop = |mode, sink, over, deadline| t.hop(mode, 1, sink, 2, over, 100, deadline);
        let far = u64::MAX;
        assert_eq!(hop(EarlyDrop::None, true, 1_000_000, 0), Hop::Assigned(2));
        assert_eq!(hop(EarlyDrop::PerTask, false, 1, far), Hop::Drop(EarlyCause::OverBudget));
        assert_eq!(hop(EarlyDrop::PerTask, false, 0, far), Hop::Assigned(2));
        assert_eq!(hop(EarlyDrop::LastTask, true, 50_000, 20_100), Hop::Assigned(2));
        assert_eq!(hop(EarlyDrop::LastTask, true, 0, 20_099), Hop::Drop(EarlyCause::NoTimeLeft));
        assert_eq!(hop(EarlyDrop::LastTask, false, 0, 0), Hop::Assigned(2));
        // Behind by 5 ms on a 20 ms worker: the 10 ms one (within 15 ms) saves it.
        assert_eq!(hop(EarlyDrop::Rerouting, true, 5_000, far), Hop::Rerouted(1));
        assert_eq!(hop(EarlyDrop::Rerouting, true, 10_000, far), Hop::Rerouted(1));
        assert_eq!(hop(EarlyDrop::Rerouting, true, 10_001, far), Hop::Drop(EarlyCause::NoFasterWorker));
        assert_eq!(hop(EarlyDrop::Rerouting, true, 25_000, far), Hop::Drop(EarlyCause::NoFasterWorker));
        assert_eq!(hop(EarlyDrop::Rerouting, true, -5, far), Hop::Assigned(2));
    }

    #[test]
    fn rerouting_uses_up_a_backup_one_request_at_a_time() {
        // Idle: the classify workers keep 5 and 15 req/s as backups.
        let workers = [w(0, 1, 0.9, 6.0), w(1, 0, 0.7, 5.0), w(1, 1, 0.95, 15.0)];
        let mut t = most_accurate_first(&pipeline(), &workers, 0.0);
        let left = |t: &RoutingTables, node| t.backup[1].iter().find(|b| b.node == node).map(|b| b.leftover_qps);
        assert_eq!(left(&t, 1), Some(5.0));
        t.spend_backup(1, 1);
        assert_eq!(left(&t, 1), Some(4.0));
        for _ in 0..4 {
            t.spend_backup(1, 1);
        }
        // Used up: it leaves the table, and behind by 5 ms nothing saves a request.
        assert_eq!(left(&t, 1), None);
        assert_eq!(left(&t, 2), Some(15.0));
        assert_eq!(
            t.hop(EarlyDrop::Rerouting, 1, true, 2, 5_000, 100, u64::MAX),
            Hop::Drop(EarlyCause::NoFasterWorker)
        );
        // A node or task not in the tables: nothing to spend.
        t.spend_backup(1, 7);
        t.spend_backup(9, 1);
        assert_eq!(t.backup[1].len(), 1);
    }

    /// Worked by hand. A (acc 0.9, 10 req/s) has 3 queued whose head waited 200 ms:
    /// 15 req/s arriving, 1.5× its capacity. B (acc 0.9, 20 req/s) has 2 queued over
    /// 200 ms: 10 req/s, within capacity, so B takes it although A comes first. With B
    /// at 5 queued (25 req/s, 1.25×) both are over: the least overloaded, B. An empty
    /// queue anywhere wins in accuracy order; C (acc 0.5) only when it is the first.
    #[test]
    fn queue_aware_dispatch_takes_the_most_accurate_worker_that_keeps_up() {
        let q = |accuracy, queued, head_wait_us, capacity_qps| RootQueue {
            accuracy,
            queued,
            head_wait_us,
            capacity_qps,
            head_late: false,
        };
        let a = q(0.9, 3, 200_000, 10.0);
        let c = q(0.5, 0, 0, 10.0);
        assert_eq!(queue_aware_root(&[a, q(0.9, 2, 200_000, 20.0), c]), Some(1));
        assert_eq!(queue_aware_root(&[a, q(0.9, 5, 200_000, 20.0)]), Some(1));
        assert_eq!(queue_aware_root(&[a, q(0.9, 5, 200_000, 20.0), c]), Some(2));
        assert_eq!(queue_aware_root(&[c, q(0.9, 0, 0, 20.0)]), Some(1));
        // A head that has just arrived: the artifact takes that worker.
        assert_eq!(queue_aware_root(&[q(0.9, 4, 0, 1.0), c]), Some(0));
        assert_eq!(queue_aware_root(&[]), None);
    }

    /// A stalled worker: one request queued 2 s ago, so by rate it keeps up (0.5 req/s
    /// arriving against 10), but its head is late. The less accurate worker takes the
    /// request; with both heads late, the less overloaded late one does, and an
    /// on-time head that is overloaded still comes before a late one.
    #[test]
    fn queue_aware_dispatch_passes_over_a_worker_whose_head_is_late() {
        let stuck =
            RootQueue { accuracy: 0.9, queued: 1, head_wait_us: 2_000_000, capacity_qps: 10.0, head_late: true };
        let busy = RootQueue { accuracy: 0.5, queued: 3, head_wait_us: 100_000, capacity_qps: 10.0, head_late: false };
        assert_eq!(queue_aware_root(&[RootQueue { head_late: false, ..stuck }, busy]), Some(0), "the artifact's rule");
        assert_eq!(queue_aware_root(&[stuck, busy]), Some(1));
        assert_eq!(queue_aware_root(&[stuck, RootQueue { queued: 30, ..busy }]), Some(1), "overloaded, on time");
        assert_eq!(queue_aware_root(&[stuck, RootQueue { head_late: true, ..busy }]), Some(0), "both late");
        assert_eq!(queue_aware_root(&[stuck, RootQueue { queued: 0, ..busy }]), Some(1));
    }
}

//! A request's way between tasks: routing-table draws, delivery to a worker's queue,
//! early dropping at batch formation and at hops, fan-out, and drops — by the rules
//! of `sluice_core::pipeline::flow`, as the live host.

use super::*;

impl<'a> PipelineSim<'a> {
    pub(super) fn frontend_draw(&mut self) -> Option<usize> {
        let frontend = self.tables.frontend.clone();
        self.draw(usize::MAX, 0, &frontend)
    }

    /// [`RootDispatch::QueueAware`]: the routing node of the root worker to send a
    /// client request to now ([`queue_aware_root`]; None: the root has no worker,
    /// e.g. a pass-through root).
    pub(super) fn root_by_queue(&self) -> Option<usize> {
        // Worker order, so that ties in accuracy go to the earlier worker (the artifact
        // keeps its predictors' insertion order).
        let workers: Vec<&TaskWorker> = self
            .task_workers
            .iter()
            .filter(|s| s.task == 0 && s.state == TaskWorkerState::Active && s.node.is_some())
            .collect();
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

    pub(super) fn bump_task_second(&mut self, task: usize) {
        let sec = (self.now / 1_000_000) as usize;
        if let Some(x) = self.per_second_task[task].get_mut(sec) {
            *x += 1;
        }
    }

    pub(super) fn new_req(&mut self, client: u32, task: usize, accuracy: f64) -> Req {
        self.next_req += 1;
        Req { id: self.next_req, client, task, entry: self.now, deadline: self.now, accuracy }
    }

    /// One destination from a table (`key` identifies the table for smooth routing).
    pub(super) fn draw(&mut self, from: usize, child: usize, routes: &[Route]) -> Option<usize> {
        if routes.is_empty() {
            return None;
        }
        let draw = self.run.system.routing;
        let weights: Vec<f64> = routes.iter().map(|r| r.probability).collect();
        // Smooth credits per table; a sampled draw keeps none.
        let mut no_credit = Vec::new();
        let credit = match draw {
            RoutingDraw::Smooth => self.smooth.entry((from, child)).or_default(),
            RoutingDraw::Sampled => &mut no_credit,
        };
        let rng = &mut self.rng;
        draw.pick(&weights, credit, || rng.uniform()).map(|k| routes[k].node)
    }

    /// Sends a request that entered its task now to `node` (a worker or a
    /// pass-through node, which serves it at once).
    pub(super) fn deliver(&mut self, mut req: Req, node: Option<usize>) {
        let Some(node) = node else {
            self.drop_req(req, flow::Drop::NoWorker);
            return;
        };
        if let Some(worker) = self.node_worker.get(node).copied().flatten() {
            req.deadline = self.now + self.task_workers[worker].budget_us;
            self.loads[req.task].record(self.now);
            let q = &mut self.task_workers[worker].queue;
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
            // An idle worker decides at once (`flow::DECIDES_ON_ARRIVAL`), or, with
            // `children = "together"`, once the finished batch whose child this is
            // has queued all of its children (`flow::ChildArrival`).
            if !self.task_workers[worker].busy {
                match self.handoff.as_mut() {
                    Some(reached) if !reached.contains(&worker) => reached.push(worker),
                    Some(_) => {}
                    None => self.decide(worker),
                }
            }
        } else {
            // A pass-through task: served at once, fans out with its node's table.
            self.served(req, 0, 1.0, node, None, self.now);
        }
    }

    /// The artifact's reroute decision for `r`, queued at worker `i` and finishing at
    /// `finish` in the batch being formed (see [`RerouteRule::Artifact`]). Records the
    /// targets and lowers their leftover capacity by the children `r` is expected to
    /// send them; true when any child was rerouted.
    pub(super) fn plan_reroute(&mut self, i: usize, r: &sdk::Pending, finish: u64) -> bool {
        let (task, variant) = (self.task_workers[i].task, self.task_workers[i].variant);
        let Some(node) = self.task_workers[i].node else { return false };
        let mut targets = Vec::new();
        for ci in 0..self.pipeline.tasks[task].children.len() {
            let child = self.pipeline.tasks[task].children[ci];
            let routes = self.tables.nodes.get(node).and_then(|n| n.get(ci)).cloned().unwrap_or_default();
            // The artifact draws the assigned worker from the routing table here too.
            let assigned = self.draw(node, ci, &routes);
            let budget_of =
                |n: usize| self.node_worker.get(n).copied().flatten().map(|s| self.task_workers[s].budget_us);
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

    /// A request served at its task by `variant` (accuracy `accuracy`) on routing
    /// node `node` (by task worker `worker`, whose branching it records): children are
    /// created and routed, or the sink result recorded.
    pub(super) fn served(
        &mut self,
        r: Req,
        variant: usize,
        accuracy: f64,
        node: usize,
        worker: Option<usize>,
        now: u64,
    ) {
        let t = r.task;
        let pipeline = self.pipeline;
        let task = &pipeline.tasks[t];
        let passthrough = task.is_passthrough();
        self.counters[t].served((!passthrough).then(|| (accuracy, decision::met(now, r.deadline))));
        self.fanout_served[t][variant] += 1;
        let path_accuracy = r.accuracy * accuracy;
        let client = r.client as usize;
        {
            let cl = &mut self.clients[client];
            cl.last_done = cl.last_done.max(now);
        }
        if let Some(o) = self.outcomes.as_mut().and_then(|o| o.get_mut(client)) {
            if let Some(v) = task.models.get(variant) {
                *o.variants.entry(task.name.clone()).or_default().entry(v.clone()).or_default() += 1;
            }
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
        let (mode, over_us) =
            flow::after_passthrough(passthrough, self.run.system.serving.early_drop, now as i64 - r.deadline as i64);
        let planned = self.reroutes.remove(&r.id).unwrap_or_default();
        let mut created = 0;
        for (ci, &child) in children.iter().enumerate() {
            let target = planned.iter().find(|(c, _)| *c == ci).map(|&(_, n)| n);
            let n = fanout_count(expected[ci], self.rng.uniform());
            self.fanout_created[t][variant][ci] += n as u64;
            created += u64::from(n);
            if let Some(seen) = worker.and_then(|i| self.task_workers[i].branching.get_mut(ci)) {
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
                    self.drop_req(child_req, flow::Drop::NoWorker);
                    continue;
                };
                let deadline = self.clients[client].deadline;
                match self.tables.hop(mode, child, is_sink, assigned, over_us, now, deadline) {
                    Hop::Assigned(n) => self.deliver(child_req, Some(n)),
                    Hop::Rerouted(n) => {
                        self.counters[child].rerouted += 1;
                        self.tables.spend_backup(child, n);
                        self.deliver(child_req, Some(n));
                    }
                    Hop::Drop(cause) => self.drop_req(child_req, flow::Drop::Early(cause)),
                }
            }
        }
        if let Some(end) = flow::PathEnd::of(task.is_sink(), created) {
            if let Some(o) = self.outcomes.as_mut().and_then(|o| o.get_mut(client)) {
                match end {
                    flow::PathEnd::Sink => o.sinks += 1,
                    flow::PathEnd::Early => o.early_ends += 1,
                }
            }
        }
        self.done_one(client);
    }

    pub(super) fn drop_req(&mut self, r: Req, why: flow::Drop) {
        self.reroutes.remove(&r.id);
        self.counters[r.task].dropped(why);
        let client = r.client as usize;
        if let Some(o) = self.outcomes.as_mut().and_then(|o| o.get_mut(client)) {
            *o.drops.entry(why).or_default() += 1;
        }
        self.clients[client].dropped = true;
        self.done_one(client);
    }
}

/// What a turn of one worker hands the pipeline ([`worker::Driver`]): a request
/// that leaves unserved is dropped with its worker's reason, a policy fault counted
/// (and the task's policies unbound at `unbind_after`), and at batch formation the
/// artifact's reroute rule ([`RerouteRule::Artifact`]) walks past the requests it
/// reroutes (§5.2's rule looks only at the head).
pub(super) struct TaskWorkerTurn<'s, 'a> {
    pub(super) sim: &'s mut PipelineSim<'a>,
    pub(super) worker: usize,
    pub(super) artifact: bool,
}

impl worker::Driver<Req> for TaskWorkerTurn<'_, '_> {
    fn dropped(&mut self, r: Req, reason: DropReason, _by_safe: bool) {
        self.sim.drop_req(r, flow::Drop::Worker(reason));
    }

    fn decided(&mut self, policy: &mut WorkerPolicy, report: worker::Report) {
        // The turn holds the worker's policy: an unbind reaches it here.
        if report.fault.is_some() && self.sim.fault(self.worker) {
            *policy = WorkerPolicy::Safe;
        }
    }

    fn walk_past(&mut self, head: &sdk::Pending, finish: u64, late: bool) -> bool {
        if !self.artifact {
            return false;
        }
        // A request rerouted at an earlier batch formation is judged again only for
        // lateness (the artifact would plan it again, taking capacity twice).
        let rerouted = self.sim.reroutes.contains_key(&head.id);
        (rerouted && !late) || (!rerouted && self.sim.plan_reroute(self.worker, head, finish))
    }
}

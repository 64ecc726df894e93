//! Plans and placement: the demand estimate, the Loki MILP (or the Proteus
//! baseline's), workers placed make before break, their policy bindings, and the
//! routing tables built over them.

use super::*;

impl<'a> PipelineSim<'a> {
    /// Per task, the requests/s a root demand creates through the most accurate
    /// variants' fan-outs (the Proteus baseline's first plan, before it has measured).
    pub(super) fn expected_task_demand(&self, root: f64) -> Vec<f64> {
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

    /// The EWMA of the last `ewma_window` one-second counts (core's `Ewma`, pandas'
    /// `ewm(com=decay, adjust=True).mean()` as the reference's `add_moving_demand`),
    /// over the seconds completed so far that the counts cover.
    pub(super) fn demand_estimate(&self) -> (f64, Vec<f64>) {
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
    pub(super) fn replan(&mut self, root: f64, per_task: &[f64]) -> Result<()> {
        let s = self.run.system.clone();
        let step = s.demand_step_qps;
        let demand = root.max(s.serving.min_demand_qps);
        let key = (demand / step).ceil().max(1.0) as u64;
        let planned = key as f64 * step;
        let deployment = if s.allocator == PlanningSystem::ProteusPerTask {
            // Per-task demands differ run to run; no cache (the MILP is small).
            let scale = if root > 0.0 { planned / root } else { 1.0 };
            let tasks: Vec<f64> = per_task.iter().map(|d| (d * scale).max(s.serving.min_demand_qps)).collect();
            self.solve_proteus(&tasks)?
        } else if let Some(p) = self.plan_cache.get(&key) {
            self.cache_hits += 1;
            p.clone()
        } else {
            let p = self.solve_loki(planned)?;
            self.plan_cache.insert(key, p.clone());
            p
        };
        let Some(deployment) = deployment else { return Ok(()) };
        self.demand_used = planned;
        self.apply(&deployment, planned);
        self.deployment = Some(deployment);
        Ok(())
    }

    pub(super) fn solve_loki(&mut self, demand: f64) -> Result<Option<Deployment>> {
        let s = &self.run.system;
        let problem = loki::Problem {
            pipeline: self.pipeline.clone(),
            variants: self.loki_variants.clone(),
            demand_qps: demand,
            workers: self.run.workers,
            slo_ms: self.run.slo_ms,
            comm_latency_ms: 0.0,
            scaling: s.allocator.scaling().expect("a Loki scaling"),
            ladder: Ladder { beta: s.serving.beta.unwrap_or(1.0), min_beta: s.min_beta, ..Ladder::default() },
            tie_break: s.tie_break,
            solver: SolverSettings::default(),
        };
        let started = Instant::now();
        let outcome = loki::solve(&problem)?;
        self.solve_seconds += started.elapsed().as_secs_f64();
        self.solves += 1;
        Ok(outcome.plan.map(|plan| Deployment {
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
    pub(super) fn solve_proteus(&mut self, per_task: &[f64]) -> Result<Option<Deployment>> {
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
            ladder: Ladder {
                beta: self.run.system.serving.beta.unwrap_or(1.0),
                min_beta: self.run.system.min_beta,
                ..Ladder::default()
            },
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
        Ok(Some(Deployment { hosted, shares, shed: 1.0 - plan.beta.min(1.0) }))
    }

    pub(super) fn batch_sizes(&self) -> Vec<u32> {
        let mut b: Vec<u32> =
            self.loki_variants.iter().flatten().flat_map(|v| v.latency_us.iter().map(|x| x.0)).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// The policy binding for a worker of (task, variant) at `batch` with `budget`.
    pub(super) fn binding(
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
        // The plan's batch size is the most the worker may run and the task budget
        // its SLO (`flow::task_view`, the live host's rule too).
        let view = flow::task_view(&self.task_models[task], variant, batch, budget);
        let models = Arc::new(view.models);
        let compiled = self.compiled.clone().expect("a compiled policy");
        let config = sdk::Config {
            app: self.pipeline.tasks[task].name.clone(),
            slo: view.slo_us,
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

    pub(super) fn set_slot(&mut self, i: usize, task: usize, variant: usize, batch: u32, latency_us: u64) {
        let stage_us = slo_per_stage_us(self.slo_us, self.depth);
        let budget = if self.run.system.allocator == PlanningSystem::ProteusPerTask {
            stage_us
        } else {
            self.run.system.serving.root_budget.budget_us(task, stage_us, latency_us)
        };
        let same = {
            let s = &self.task_workers[i];
            s.task == task && s.variant == variant && s.batch == batch && s.budget_us == budget
        };
        if same && !matches!(self.task_workers[i].policy, WorkerPolicy::Safe) {
            self.task_workers[i].state = TaskWorkerState::Active;
            return;
        }
        let policy = if self.compiled.is_some() {
            let (binding, _) = self.binding(task, variant, batch, budget);
            match PolicyInstance::new(&self.engine, &binding, i as u32) {
                Ok(p) => WorkerPolicy::Wasm(Box::new(p)),
                Err(_) => WorkerPolicy::Safe,
            }
        } else {
            WorkerPolicy::Safe
        };
        let models = if self.compiled.is_some() {
            self.binding(task, variant, batch, budget).1
        } else {
            Arc::new(flow::task_view(&self.task_models[task], variant, batch, budget).models)
        };
        let s = &mut self.task_workers[i];
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
        s.state = TaskWorkerState::Active;
    }

    /// Places the plan's workers (keeping queues where a (task, variant) stays) and
    /// rebuilds the routing tables for `demand`.
    pub(super) fn apply(&mut self, p: &Deployment, demand: f64) {
        self.account_workers();
        self.replans += 1;
        self.shed_sum += p.shed;
        let mut taken = vec![false; self.task_workers.len()];
        let mut assigned: Vec<Vec<usize>> = Vec::new();
        for &(t, k, replicas, _, _) in &p.hosted {
            // Keep this (task, variant)'s workers, active ones first.
            let mut mine: Vec<usize> = (0..self.task_workers.len())
                .filter(|&i| {
                    !taken[i]
                        && self.task_workers[i].state != TaskWorkerState::Free
                        && self.task_workers[i].task == t
                        && self.task_workers[i].variant == k
                })
                .collect();
            mine.sort_by_key(|&i| (self.task_workers[i].state != TaskWorkerState::Active, i));
            mine.truncate(replicas as usize);
            for &i in &mine {
                taken[i] = true;
            }
            assigned.push(mine);
        }
        // Workers no longer placed retire (serve out their queues, then free:
        // `flow::retired`).
        let now = self.now;
        for (i, s) in self.task_workers.iter_mut().enumerate() {
            if !taken[i] && s.state == TaskWorkerState::Active {
                s.state = TaskWorkerState::Retiring;
                s.retiring_since = now;
            }
            s.node = None;
        }
        for (h, &(t, k, replicas, batch, latency)) in p.hosted.iter().enumerate() {
            while assigned[h].len() < replicas as usize {
                let free = (0..self.task_workers.len())
                    .find(|&i| self.task_workers[i].state == TaskWorkerState::Free && !taken[i]);
                let i = match free {
                    Some(i) => i,
                    None => {
                        self.task_workers.push(TaskWorker {
                            task: usize::MAX,
                            variant: 0,
                            batch: 0,
                            latency_us: 0,
                            budget_us: 0,
                            state: TaskWorkerState::Free,
                            policy: WorkerPolicy::Safe,
                            models: Arc::new(Vec::new()),
                            loaded: Vec::new(),
                            queue: Vec::new(),
                            busy: false,
                            pending: Pending::None,
                            node: None,
                            retiring_since: 0,
                            branching: Vec::new(),
                        });
                        taken.push(false);
                        self.task_workers.len() - 1
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
                self.task_workers[i].node = Some(node);
            }
            self.free_idle();
            self.account_workers();
            return;
        }
        self.table_builds += 1;
        // Nodes in plan order, replica by replica (Plan::routing_workers' order).
        let mut workers = Vec::new();
        self.node_worker.clear();
        for (h, &(t, k, _, batch, latency)) in p.hosted.iter().enumerate() {
            let accuracy = self.task_models[t][k].accuracy;
            for &i in &assigned[h] {
                self.task_workers[i].node = Some(workers.len());
                self.node_worker.push(Some(i));
                workers.push(loki::routing::Replica {
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
            .zip(&self.node_worker)
            .map(|(w, s)| (s.expect("a node's task worker"), w.task, w.variant))
            .collect();
        self.tables = match &p.shares {
            None => {
                let task_workers = &self.task_workers;
                let node_worker = &self.node_worker;
                let measured = self.run.system.branching == Branching::Measured;
                let utilization = self.run.system.serving.routing_utilization;
                most_accurate_first_filling(self.pipeline, &workers, demand, utilization, |w, ci| {
                    if !measured {
                        return None;
                    }
                    let seen = task_workers[node_worker[w]?].branching.get(ci)?;
                    Some(match seen.len() {
                        0 => 1.0,
                        n => seen.iter().map(|&x| x as f64).sum::<f64>() / n as f64,
                    })
                })
            }
            Some(shares) => self.share_tables(p, shares, &workers, &assigned),
        };
        self.node_worker.resize(self.tables.nodes.len(), None);
        self.smooth.clear();
        self.reroutes.clear();
        self.free_idle();
        self.account_workers();
    }

    /// Whether the workers `assigned` to the plan's (task, variant)s are those the
    /// tables in force were built over (same task workers, tasks and variants).
    pub(super) fn same_workers(&self, assigned: &[Vec<usize>]) -> bool {
        if self.table_builds == 0 {
            return false;
        }
        let mut placed: Vec<(usize, usize, usize)> =
            assigned.iter().flatten().map(|&i| (i, self.task_workers[i].task, self.task_workers[i].variant)).collect();
        let mut before = self.table_workers.clone();
        placed.sort_unstable();
        before.sort_unstable();
        before == placed
    }

    /// Pipeline-unaware routing (the Proteus baseline): every request for a task
    /// goes to its workers by the plan's shares, whoever sent it.
    pub(super) fn share_tables(
        &self,
        p: &Deployment,
        shares: &[f64],
        workers: &[loki::routing::Replica],
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

    /// Retiring workers done serving out their queues are freed ([`flow::retired`],
    /// the live host's rule: idle, or at the bound, checked when a worker idles; a
    /// batch running finishes first). What one still holds at the bound is past its
    /// expiry and dropped so.
    pub(super) fn free_idle(&mut self) {
        let mut changed = false;
        let mut left = Vec::new();
        for s in &mut self.task_workers {
            if s.state != TaskWorkerState::Retiring || s.busy {
                continue;
            }
            let waited = self.now.saturating_sub(s.retiring_since);
            if flow::retired(s.queue.is_empty(), waited, self.slo_us, self.expire_us) {
                left.append(&mut s.queue);
                s.state = TaskWorkerState::Free;
                s.policy = WorkerPolicy::Safe;
                changed = true;
            }
        }
        for r in left {
            self.drop_req(r, flow::Drop::Worker(DropReason::Expired));
        }
        if changed {
            self.account_workers();
        }
    }

    pub(super) fn account_workers(&mut self) {
        let now = self.now;
        self.workers_area += self.workers_now as f64 * now.saturating_sub(self.workers_since) as f64;
        self.workers_since = now;
        self.workers_now = self.task_workers.iter().filter(|s| s.state != TaskWorkerState::Free).count() as u32;
        // Before the first plan is applied no worker exists yet; counting that instant
        // made `workers_min` 0 in every run. The extremes are over what plans used.
        if self.replans > 0 {
            self.workers_min = self.workers_min.min(self.workers_now);
            self.workers_max = self.workers_max.max(self.workers_now);
        }
    }
}

//! The event loop of a simulated pipeline: arrivals, batch completions, timers,
//! re-plans and windows, and each worker's turns through the shared worker state
//! machine (`sluice_core::worker`).

use super::routing::TaskWorkerTurn;
use super::*;

impl<'a> PipelineSim<'a> {
    pub(super) fn new(
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
            draw(&run.arrivals, "pipeline", base, duration_us, &mut rng)?.into_iter().map(|a| a.at).collect();
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
        let compiled = match run.system.serving.policy.as_str() {
            sluice_core::decision::SAFE_POLICY => None,
            p => Some(cache.get(p)?),
        };
        let params = match &run.system.serving.params {
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
            events: Events::new(FIRST_WORKER_SLOT),
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
            task_workers: Vec::new(),
            tables: RoutingTables {
                frontend: Vec::new(),
                nodes: Vec::new(),
                passthrough: vec![None; n],
                backup: vec![Vec::new(); n],
                incoming: Vec::new(),
                latency_us: Vec::new(),
            },
            node_worker: Vec::new(),
            smooth: HashMap::new(),
            clients: Vec::new(),
            next_req: 0,
            per_second_root: vec![0; secs],
            per_second_task: vec![vec![0; secs]; n],
            plan_cache: HashMap::new(),
            deployment: None,
            demand_used: 0.0,
            counters: (0..n).map(|_| flow::TaskCounters::default()).collect(),
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
            loads: (0..n).map(|_| LoadWindow::new(flow::LOAD_WINDOW_US)).collect(),
            outcomes: None,
            handoff: None,
        };
        // The first plan: the demand of the first second of arrivals (a warm start:
        // the reference starts from a fixed allocation and its clamp of 50 req/s).
        let first = sim.arrivals.iter().take_while(|&&t| t < 1_000_000).count() as f64;
        let per_task: Vec<f64> = sim.expected_task_demand(first);
        sim.replan(first, &per_task)?;
        if sim.deployment.is_none() {
            bail!("run {}: no feasible plan for the initial demand {first} req/s", run.index);
        }
        if let Some(&t) = sim.arrivals.first() {
            sim.schedule(ARRIVAL_SLOT, t);
        }
        if run.system.solve_interval_s > 0.0 {
            sim.schedule(REPLAN_SLOT, (run.system.solve_interval_s * 1e6) as u64);
        }
        sim.schedule(WINDOW_SLOT, sim.window_us);
        Ok(sim)
    }

    /// Puts an event at `at` in the queue's slot `slot`, replacing what it held.
    pub(super) fn schedule(&mut self, slot: usize, at: u64) {
        // Ties break by scheduling order, which keeps runs deterministic.
        self.seq += 1;
        self.events.set(slot, key(at, self.seq));
    }

    /// Sets worker `i`'s event: `pending` at `at`, or none (`Pending::None`, which
    /// takes no sequence number, as a decision that arms nothing never did).
    fn schedule_worker(&mut self, i: usize, at: u64, pending: Pending<Req>) {
        let slot = FIRST_WORKER_SLOT + i;
        // Plans add workers as they go; a worker's slot is made when it first needs one.
        self.events.grow(slot + 1);
        match pending {
            Pending::None => self.events.set(slot, EMPTY),
            _ => self.schedule(slot, at),
        }
        self.task_workers[i].pending = pending;
    }

    pub(super) fn run(mut self) -> (PipelineResult, Vec<PipelineWindow>) {
        self.run_events();
        self.account_workers();
        self.result()
    }

    /// Handles every event, in time order, until none is left or the run overloads.
    ///
    /// A timer that a later decision replaced never comes up. (With the heap and
    /// side table it was popped and ignored, which moved the clock to its time: the
    /// run's end, the span of `workers_mean`, could be such a timer's time. The
    /// eleven Loki experiments give the same results and time series either way.)
    pub(super) fn run_events(&mut self) {
        while let Some((key, slot)) = self.events.next() {
            let now = event_time(key);
            self.now = now;
            match slot {
                ARRIVAL_SLOT => self.arrive(),
                REPLAN_SLOT => {
                    let (root, tasks) = self.demand_estimate();
                    if let Err(e) = self.replan(root, &tasks) {
                        self.overloaded = Some(format!("re-plan failed: {e:#}"));
                    }
                    let next = now + (self.run.system.solve_interval_s * 1e6) as u64;
                    if next < self.duration_us {
                        self.schedule(REPLAN_SLOT, next);
                    }
                }
                WINDOW_SLOT => {
                    self.close_window();
                    let busy = self.task_workers.iter().any(|s| s.busy || !s.queue.is_empty());
                    if now + self.window_us <= self.duration_us || busy {
                        self.schedule(WINDOW_SLOT, now + self.window_us);
                    }
                }
                _ => {
                    let i = slot - FIRST_WORKER_SLOT;
                    match std::mem::replace(&mut self.task_workers[i].pending, Pending::None) {
                        Pending::Done { model, batch, started } => {
                            self.finish(i, model, batch, started);
                            self.task_workers[i].busy = false;
                            self.after_idle(i);
                        }
                        Pending::Timer => {
                            // Only a decision arms a timer, and one that starts a
                            // batch replaces it with the batch's completion.
                            debug_assert!(!self.task_workers[i].busy);
                            self.decide(i);
                        }
                        Pending::None => unreachable!("worker {i}'s slot fired without an event"),
                    }
                }
            }
            if self.overloaded.is_some() {
                break;
            }
        }
    }

    /// [`Self::run`], returning the client requests' outcomes instead of the results.
    pub(super) fn run_keeping_outcomes(mut self) -> Vec<flow::PipelineOutcome> {
        self.run_events();
        self.outcomes.take().unwrap_or_default()
    }

    pub(super) fn after_idle(&mut self, i: usize) {
        if !self.task_workers[i].queue.is_empty() {
            self.decide(i);
        }
        if self.task_workers[i].state == TaskWorkerState::Retiring {
            self.free_idle();
        }
    }

    pub(super) fn arrive(&mut self) {
        let now = self.now;
        let c = self.clients.len() as u32;
        if let Some(o) = self.outcomes.as_mut() {
            o.push(flow::PipelineOutcome::default());
        }
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
            self.schedule(ARRIVAL_SLOT, next);
        }
        let node = match self.run.system.serving.root_dispatch {
            RootDispatch::QueueAware => self.root_by_queue().or_else(|| self.frontend_draw()),
            RootDispatch::Table => self.frontend_draw(),
        };
        let req = self.new_req(c, 0, 1.0);
        self.counters[0].created += 1;
        self.bump_task_second(0);
        self.deliver(req, node);
    }

    /// A turn of worker `i` ([`worker::Machine::decide`]): early dropping at batch
    /// formation where the run's mode asks for it (`early_drop_at = "batch"`, judged
    /// by [`flow::batch_formation_table`]: the worker's variant's table cut at the
    /// plan's batch), expiry, the policy; what leaves unserved is dropped
    /// ([`TaskWorkerTurn`]), and the worker's next event is scheduled.
    pub(super) fn decide(&mut self, i: usize) {
        let now = self.now;
        let (workers, expire_us) = (self.run.workers, self.expire_us);
        let task = self.task_workers[i].task;
        let at_batch = !self.pipeline.tasks[task].is_passthrough()
            && self
                .run
                .system
                .serving
                .early_drop_at
                .at_batch(self.run.system.serving.early_drop, self.pipeline.is_last_model_task(task));
        // The task's measured arrival rate, as a live task app's (`flow::LOAD_WINDOW_US`).
        let load_qps = self.loads[task].rate(now);
        // The queue, policy and loaded models leave the task worker for the turn, so that
        // the turn's driver may reach the rest of the simulation (routing tables,
        // the other workers of the task); they are moved, not copied.
        let s = &mut self.task_workers[i];
        let mut queue = std::mem::take(&mut s.queue);
        let mut policy = std::mem::replace(&mut s.policy, WorkerPolicy::Safe);
        let loaded = std::mem::take(&mut s.loaded);
        let models = s.models.clone();
        let (variant, batch, latency_us) = (s.variant, s.batch, s.latency_us);
        let draining = s.state == TaskWorkerState::Retiring && flow::RETIRING_AS_SHUTDOWN;
        let table = models.get(variant).map_or(std::slice::from_ref(&latency_us), |m| &m.latency[..]);
        let table = flow::batch_formation_table(table, batch);
        let cx = Context {
            now,
            worker: i as u32,
            workers,
            load_qps,
            loaded: &loaded,
            models: &models[..],
            expire_us,
            draining,
            timed: true,
        };
        let artifact = self.run.system.reroute_rule == RerouteRule::Artifact;
        let mut driver = TaskWorkerTurn { sim: self, worker: i, artifact };
        let turn = worker::Machine::new().decide(&mut queue, &mut policy, &cx, at_batch.then_some(table), &mut driver);
        let s = &mut self.task_workers[i];
        (s.queue, s.policy, s.loaded) = (queue, policy, loaded);
        // The turn's action replaces the worker's event: a timer an earlier turn
        // armed is re-armed or cleared.
        match turn.action {
            worker::Action::Run { model, batch } => {
                s.busy = true;
                let latency = s.models[model as usize].latency[batch.len() - 1];
                self.schedule_worker(i, now + latency, Pending::Done { model, batch, started: now });
            }
            worker::Action::Wait(t) | worker::Action::Idle { expire_at: Some(t) } => {
                self.schedule_worker(i, t, Pending::Timer)
            }
            worker::Action::Idle { expire_at: None } => self.schedule_worker(i, now, Pending::None),
        }
    }

    /// A fault of worker `i`'s policy: counted for its task (as the host counts a
    /// task app's), and with `fail_mode = "unbind"` the task's policies are unbound
    /// at `unbind_after` faults (`FailMode::unbinds`; a pipeline's task apps
    /// take the app defaults). True when it unbound them.
    pub(super) fn fault(&mut self, i: usize) -> bool {
        let task = self.task_workers[i].task;
        self.counters[task].policy_faults += 1;
        if !FailMode::default().unbinds(self.counters[task].policy_faults, DEFAULT_UNBIND_AFTER) {
            return false;
        }
        for s in self.task_workers.iter_mut().filter(|s| s.task == task) {
            s.policy = WorkerPolicy::Safe;
        }
        true
    }

    /// Worker `i` finished its batch: the policy's feedback ([`worker::Finished`]),
    /// then each request served at its task and routed on.
    pub(super) fn finish(&mut self, i: usize, model: u32, batch: Vec<Req>, started: u64) {
        let now = self.now;
        let (accuracy, node) = (self.task_workers[i].models[model as usize].accuracy, self.task_workers[i].node);
        let done = worker::Finished::of(model, &batch, started, now, false);
        // A retiring worker keeps its policy until it frees: the one that formed the batch.
        if done.observe(&batch, Some(&mut self.task_workers[i].policy)).is_err() {
            self.fault(i);
        }
        // A retired worker routes as the first current node of its task would.
        let node = node.or_else(|| {
            let t = self.task_workers[i].task;
            (0..self.node_worker.len()).find(|&n| self.node_worker[n].is_some_and(|s| self.task_workers[s].task == t))
        });
        // With `children = "together"` the batch's children are all queued before
        // the idle workers they reach decide, in the order reached
        // (`flow::ChildArrival`); one by one, each decides at its first. Only a
        // finish queues children, and a decision queues none, so no handoff is
        // open here.
        debug_assert!(self.handoff.is_none());
        if self.run.system.children == flow::ChildArrival::Together {
            self.handoff = Some(Vec::new());
        }
        for r in batch {
            let Some(node) = node else {
                // The task has no worker any more: its descendants cannot be served.
                self.drop_req(r, flow::Drop::NoWorker);
                continue;
            };
            self.served(r, model as usize, accuracy, node, Some(i), now);
        }
        let reached = self.handoff.take().unwrap_or_default();
        for w in reached {
            if !self.task_workers[w].busy && self.overloaded.is_none() {
                self.decide(w);
            }
        }
    }

    pub(super) fn done_one(&mut self, client: usize) {
        let cl = &mut self.clients[client];
        cl.outstanding -= 1;
        if cl.outstanding == 0 {
            assert!(!cl.finished, "client request {client} finished twice");
            cl.finished = true;
            if let Some(o) = self.outcomes.as_mut().and_then(|o| o.get_mut(client)) {
                o.on_time = !cl.dropped && cl.last_done <= cl.deadline;
            }
            if cl.dropped || cl.last_done > cl.deadline {
                let w = (cl.arrival / self.window_us) as usize;
                if self.window_violations.len() <= w {
                    self.window_violations.resize(w + 1, 0);
                }
                self.window_violations[w] += 1;
            }
        }
    }
}

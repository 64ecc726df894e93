//! What a run measures: the result types, the time-series windows and `results.json`.

use super::*;

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
    /// Dropped, by cause (`early-drop-over-budget`, `early-drop-no-time-left`,
    /// `early-drop-no-faster-worker`: early dropping on the way in;
    /// `early-drop-batch-formation`: at a worker's batch formation; `policy`: the
    /// batching policy; `expired`: the host's expiry, a full SLO past the task
    /// deadline; `no-worker`) — the live host's labels (`flow::Drop`).
    pub dropped: BTreeMap<String, u64>,
    /// Rerouted on the way in (opportunistic rerouting).
    pub rerouted: u64,
    /// Faults of its workers' policies (each answered by the safe policy).
    pub policy_faults: u64,
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
    /// Time-weighted mean of workers allocated (placed or still retiring).
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

/// Writes `results.json` and `timeseries.csv` into `dir`.
pub fn write_outputs(dir: &Path, out: &PipelineOutput) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&out.results)? + "\n")?;
    let mut csv = String::from("run,system,t_s,arrivals,demand_qps,workers,violations,accuracy\n");
    for w in &out.timeseries {
        csv.push_str(&format!(
            "{},{},{:.1},{},{:.2},{},{},{}\n",
            w.run,
            crate::stats::csv_field(&w.system),
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

impl<'a> PipelineSim<'a> {
    pub(super) fn close_window(&mut self) {
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

    pub(super) fn result(mut self) -> (PipelineResult, Vec<PipelineWindow>) {
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
                dropped: flow::by_label(&c.dropped).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                rerouted: c.rerouted,
                policy_faults: c.policy_faults,
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
            early_drop: self.run.system.serving.early_drop.as_str().into(),
            early_drop_at: self.run.system.serving.early_drop_at.as_str().into(),
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

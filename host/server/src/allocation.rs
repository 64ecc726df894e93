//! The MILP allocator in the live host: the `[[device]]`s of the config, and the plan
//! that says which variant each device (worker) serves and how each app's requests
//! are shared over its workers (`sluice_alloc`, Proteus §4).
//!
//! With devices, every app has one worker per device (worker w of every app runs on
//! device w) and routes by weights; a device serves the one app the plan gives it,
//! and that app's worker w gets the plan's share while the other apps' worker w get
//! none and load nothing. Each worker sees its own device's latencies (the emulated
//! executor runs them; its policy instance is initialised with them).
//!
//! The first plan is made at startup for `[allocator] demand_qps`. While serving,
//! [`control_loop`] re-plans from each app's forecast demand every `period_s`, and
//! early when a forecast moves past `threshold`, off the request path; [`replan`]
//! applies a new plan make before break: the new variants are loaded and warmed on
//! their workers first, then every app's weights switch at once, then the workers
//! that lost their app drain their queues and unload.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use sluice_alloc::config::DevicePool;
use sluice_alloc::planner::Planner;
use sluice_alloc::{proteus, AnyPlan};
use sluice_sdk as sdk;

use std::sync::atomic::Ordering;

use sluice_core::clock::Clock as _;
use sluice_core::demand::planned_demand;

use crate::app::App;
use crate::config::{AppConfig, Config, ExecutorKind};
use crate::executor::{load_set, AppSources, LoadError, ModelSource};
use crate::metrics::Metrics;

/// The devices of the config (`sluice_alloc::config::DevicePool`).
pub type Devices = DevicePool;

/// Loads the config's devices (None without `[[device]]`).
pub fn load_devices(config: &Config) -> anyhow::Result<Option<Devices>> {
    Ok(DevicePool::load(&config.devices)?)
}

/// One plan put in force, as `GET /admin/allocation`'s `history` lists it (the
/// dashboard draws its re-plan markers from it).
#[derive(Clone, Debug, Serialize)]
pub struct PlanSummary {
    /// Why the allocator planned: `startup`, `period`, `demand shift` or `admin`.
    pub reason: String,
    /// The allocation's status (`optimal`, `time-limit`, `greedy`, ...).
    pub status: String,
    /// The demand planned for, requests/s per app.
    pub demand_qps: BTreeMap<String, f64>,
    /// Seconds the allocation took.
    pub solve_seconds: f64,
    /// The plan's demand-weighted accuracy (None: no plan).
    pub effective_accuracy: Option<f64>,
    /// The plan's demand factor.
    pub beta: Option<f64>,
    /// Per device, `[app, variant]` (`null`s when idle).
    pub devices: Option<Vec<(Option<String>, Option<String>)>>,
}

/// `GET /admin/allocation`'s body: the demand of the plan in force, the last
/// allocation (with its plan) and the plans put in force, oldest first.
#[derive(Clone, Debug, Serialize)]
pub struct AllocationView {
    /// The demand the plan in force was made for, requests/s per app.
    pub demand_qps: BTreeMap<String, f64>,
    /// The last allocation: its status, numbers and plan.
    pub allocation: sluice_alloc::Allocation,
    /// The last [`HISTORY`] plans put in force.
    pub history: std::collections::VecDeque<PlanSummary>,
}

/// Why a re-plan was refused or failed ([`AllocatorService::replan`]); the last plan stays in
/// every case.
#[derive(Debug, thiserror::Error)]
pub enum ReplanError {
    /// The config has no `[[device]]`.
    #[error("no allocator: the config has no [[device]]")]
    NoAllocator,
    /// A demand for an app that is not served.
    #[error("demand_qps.{0}: no app of that name")]
    UnknownApp(String),
    /// A demand out of range: 1e300 requests/s must not reach HiGHS.
    #[error("demand_qps.{app}: expected 0 to {max:e} requests/s", max = sluice_alloc::limits::MAX_DEMAND_QPS)]
    Demand {
        /// The app.
        app: String,
        /// The demand asked for.
        qps: f64,
    },
    /// The solver's task panicked.
    #[error("allocator task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The new plan could not be applied (the old weights are still in force).
    #[error("the new plan could not be applied, the last one stays: {0}")]
    Apply(#[from] ApplyError),
}

impl ReplanError {
    /// Whether the request asked for something wrong (a demand), rather than the
    /// host being unable to re-plan now.
    pub fn is_bad_request(&self) -> bool {
        matches!(self, ReplanError::UnknownApp(_) | ReplanError::Demand { .. })
    }
}

/// Why a plan could not be applied ([`AllocatorService::replan`], make before break).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The plan names an app the host does not serve.
    #[error("plan names unknown app {0}")]
    UnknownApp(String),
    /// A worker's new variant did not load.
    #[error("app {app}, worker {worker}: {source}")]
    Load {
        /// The app.
        app: String,
        /// The worker (= device).
        worker: usize,
        /// Why.
        source: LoadError,
    },
    /// A worker did not take its new models (it has stopped).
    #[error(transparent)]
    Install(#[from] crate::app::InstallError),
    /// The app's router refused the plan's shares.
    #[error("app {app}: {source}")]
    Weights {
        /// The app.
        app: String,
        /// Why.
        source: sluice_core::router::WeightsError,
    },
}

/// The allocation problem for `demand` over `config`'s apps.
fn problem(
    devices: &Devices,
    config: &Config,
    resolved: &[(Vec<sdk::Model>, AppSources)],
    demand: &BTreeMap<String, f64>,
) -> proteus::Problem {
    let apps: Vec<(&AppConfig, Vec<String>)> = config
        .apps
        .iter()
        .zip(resolved)
        .map(|(app, (models, _))| (app, models.iter().map(|m| m.name.clone()).collect()))
        .collect();
    devices.problem(&config.allocator, &apps, demand)
}

/// The allocation in force in the host: the planner, its last allocation (a
/// `sluice_alloc::Allocation`, one solve's product) and the demand it used.
pub struct AllocationInForce {
    planner: Planner,
    last: sluice_alloc::Allocation,
    demand: BTreeMap<String, f64>,
    /// Per-worker variant tables, per app (what the emulated executor runs).
    tables: BTreeMap<String, Vec<Vec<sdk::Model>>>,
    devices: Devices,
    config: Config,
    resolved: Vec<(Vec<sdk::Model>, AppSources)>,
    /// Summaries of the last plans, newest last.
    history: std::collections::VecDeque<PlanSummary>,
}

/// How many plan summaries `GET /admin/allocation` keeps.
const HISTORY: usize = 20;

impl AllocationInForce {
    /// Makes the first plan (None without devices). A config whose demand has no
    /// feasible plan, or that the solver fails on, does not start.
    pub async fn start(
        config: &Config,
        devices: Option<Devices>,
        resolved: &[(Vec<sdk::Model>, AppSources)],
    ) -> anyhow::Result<Option<AllocationInForce>> {
        let Some(devices) = devices else { return Ok(None) };
        let demand: BTreeMap<String, f64> = config
            .apps
            .iter()
            .map(|a| (a.name.clone(), config.allocator.demand_qps.get(&a.name).copied().unwrap_or(1.0)))
            .collect();
        let problem = problem(&devices, config, resolved, &demand);
        let mut planner = Planner::new(&config.allocator);
        let (planner, last) = tokio::task::spawn_blocking(move || {
            let last = planner.plan(problem);
            (planner, last)
        })
        .await
        .context("allocator task")?;
        if let Some(e) = &last.error {
            anyhow::bail!("allocator: {e}");
        }
        if last.plan.is_none() {
            anyhow::bail!("allocator: no feasible plan for the demand {demand:?} on these devices");
        }
        let tables = config
            .apps
            .iter()
            .zip(resolved)
            .map(|(app, (models, _))| (app.name.clone(), devices.models_per_worker(app, models)))
            .collect();
        let mut a = AllocationInForce {
            planner,
            last,
            demand,
            tables,
            devices,
            config: config.clone(),
            resolved: resolved.to_vec(),
            history: Default::default(),
        };
        a.remember("startup");
        if let Some(plan) = a.plan() {
            tracing::info!(
                status = a.last.status,
                effective_accuracy = plan.effective_accuracy,
                devices_used = plan.devices_used,
                solve_s = a.last.solve_seconds,
                "allocator: first plan"
            );
        }
        Ok(Some(a))
    }

    /// The plan in force.
    pub fn plan(&self) -> Option<&proteus::Plan> {
        self.planner.current()
    }

    /// What worker `w` of `app` loads under the plan in force: the variant its
    /// device serves for this app, or nothing.
    pub fn initial_models(&self, app: &AppConfig, w: usize) -> Vec<(u32, ModelSource)> {
        let Some(d) = self.plan().and_then(|p| p.devices.get(w)) else { return Vec::new() };
        if d.app.as_deref() != Some(app.name.as_str()) {
            return Vec::new();
        }
        self.models_for(app, w, d)
    }

    /// How worker `w` of `app` loads the variant the plan puts on device `d` (none:
    /// nothing): on the emulated executor, with the latency of the worker's device,
    /// or the plan's time for it (`service_us`: a core of an n-core replica).
    fn models_for(&self, app: &AppConfig, w: usize, d: &proteus::DevicePlan) -> Vec<(u32, ModelSource)> {
        let Some(i) = self.config.apps.iter().position(|a| a.name == app.name) else { return Vec::new() };
        let (models, source) = &self.resolved[i];
        let Some(id) = d.model.as_deref().and_then(|m| models.iter().position(|x| x.name == m)) else {
            return Vec::new();
        };
        let src = match (source.executor, d.service_us) {
            (ExecutorKind::Emulated, Some(us)) => ModelSource::Emulated(Arc::new(vec![us])),
            // The emulated executor runs the device's latency, not the app profile's.
            (ExecutorKind::Emulated, None) => {
                ModelSource::Emulated(Arc::new(self.tables[&app.name][w][id].latency.clone()))
            }
            (ExecutorKind::Onnx, _) => source.models[id].clone(),
        };
        vec![(id as u32, src)]
    }

    /// The app's routing weights under the plan: each worker's share of its requests.
    pub fn weights(&self, app: &AppConfig) -> Vec<f64> {
        let n = app.workers as usize;
        let Some(plan) = self.plan() else { return vec![0.0; n] };
        (0..n)
            .map(|w| match plan.devices.get(w) {
                Some(d) if d.app.as_deref() == Some(app.name.as_str()) => d.share,
                _ => 0.0,
            })
            .collect()
    }

    /// The per-worker device tables of every app.
    pub fn device_models(&self, app: &str) -> Option<Arc<Vec<Vec<sdk::Model>>>> {
        self.tables.get(app).map(|t| Arc::new(t.clone()))
    }

    fn remember(&mut self, reason: &str) {
        let plan = self.plan();
        self.history.push_back(PlanSummary {
            reason: reason.to_string(),
            status: self.last.status.clone(),
            demand_qps: self.demand.clone(),
            solve_seconds: self.last.solve_seconds,
            effective_accuracy: plan.map(|p| p.effective_accuracy),
            beta: plan.map(|p| p.beta),
            devices: plan.map(|p| p.devices.iter().map(|d| (d.app.clone(), d.model.clone())).collect()),
        });
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
    }

    /// `GET /admin/allocation`'s view.
    pub fn view(&self) -> AllocationView {
        AllocationView { demand_qps: self.demand.clone(), allocation: self.last.clone(), history: self.history.clone() }
    }
}

/// The demand every app is planned for: its forecast once its counts cover the
/// forecaster's window, and until then at least its configured `demand_qps`
/// (`sluice_core::demand::planned_demand`), at least `min_demand_qps`.
fn forecast(apps: &BTreeMap<String, Arc<App>>, config: &Config) -> BTreeMap<String, f64> {
    let a = &config.allocator;
    let f = a.forecaster();
    apps.values()
        .map(|app| {
            let counts = app.demand.per_second(app.clock.now());
            let configured = a.demand_qps.get(app.name()).copied().unwrap_or(0.0);
            let warmup = a.warmup_s.map(|s| s.ceil() as usize);
            (app.name().to_string(), planned_demand(f.as_ref(), &counts, configured, a.min_demand_qps, warmup))
        })
        .collect()
}

/// The `[[device]]` allocator as the host runs it: the allocation in force (locked
/// for the whole of a re-plan, so re-plans never overlap), the view
/// `GET /admin/allocation` shows (updated after every plan, so the admin API never
/// waits on a re-plan), and what a re-plan reads and changes: the apps and the
/// metrics. A service of its own below the state, which holds it.
pub struct AllocatorService {
    apps: BTreeMap<String, Arc<App>>,
    metrics: Arc<Metrics>,
    current: tokio::sync::Mutex<Option<AllocationInForce>>,
    view: parking_lot::Mutex<Option<AllocationView>>,
}

impl AllocatorService {
    /// The allocator of `apps` with the allocation started (`None`: the config has
    /// no `[[device]]`, and every re-plan is refused).
    pub fn new(
        apps: BTreeMap<String, Arc<App>>,
        metrics: Arc<Metrics>,
        allocation: Option<AllocationInForce>,
    ) -> Arc<Self> {
        let view = allocation.as_ref().map(AllocationInForce::view);
        Arc::new(AllocatorService {
            apps,
            metrics,
            current: tokio::sync::Mutex::new(allocation),
            view: parking_lot::Mutex::new(view),
        })
    }

    /// What `GET /admin/allocation` shows (`None` without `[[device]]`s).
    pub fn view(&self) -> Option<AllocationView> {
        self.view.lock().clone()
    }

    /// Re-plans now — for `demand` when given (per app, requests/s; apps it leaves out
    /// get their forecast), else for the forecast demand — and applies the plan. Returns
    /// `GET /admin/allocation`'s view after it.
    pub async fn replan(
        &self,
        reason: &str,
        demand: Option<BTreeMap<String, f64>>,
    ) -> Result<AllocationView, ReplanError> {
        let mut guard = self.current.lock().await;
        let a = guard.as_mut().ok_or(ReplanError::NoAllocator)?;
        let mut forecast = forecast(&self.apps, &a.config);
        for (app, d) in demand.unwrap_or_default() {
            if !forecast.contains_key(&app) {
                return Err(ReplanError::UnknownApp(app));
            }
            // The problem files' and configs' range: 1e300 requests/s must not reach HiGHS.
            if !sluice_alloc::limits::within(d, sluice_alloc::limits::MAX_DEMAND_QPS) {
                return Err(ReplanError::Demand { app, qps: d });
            }
            forecast.insert(app, d.max(a.config.allocator.min_demand_qps));
        }
        let demand = forecast;
        let problem = problem(&a.devices, &a.config, &a.resolved, &demand);
        let mut planner = std::mem::replace(&mut a.planner, Planner::new(&a.config.allocator));
        let (planner, result) = tokio::task::spawn_blocking(move || {
            let r = planner.plan(problem);
            (planner, r)
        })
        .await?;
        a.planner = planner;
        self.metrics.record("sluice_allocator_solve_seconds", &[("status", &result.status)], result.solve_seconds);
        if let Some(origin) = &result.origin {
            // No MILP found a plan in the allocation's time limit: the plan is the
            // greedy or repaired one (docs/allocator.md), which an operator should know.
            tracing::warn!(
                plan = origin.name(),
                reason = origin.reason().unwrap_or("-"),
                reason_for_replan = reason,
                "allocator: a plan made without a solver"
            );
        }
        let old = match &a.last.plan {
            Some(AnyPlan::Proteus(p)) => Some(p.clone()),
            _ => None,
        };
        let new = match &result.plan {
            Some(AnyPlan::Proteus(p)) => Some(p.clone()),
            _ => None,
        };
        if let (true, Some(old), Some(new)) = (result.is_new_plan(), old, new) {
            if let Err(e) = self.apply(a, &old, &new).await {
                // The old weights are still in force: so is the old plan, for the view and
                // as the allocator's fallback.
                a.planner.restore(old);
                return Err(e.into());
            }
            a.last = result;
            a.demand = demand;
            a.remember(reason);
            // The dashboard's re-plan marker.
            self.metrics.event("replan", "allocator", reason);
        } else {
            a.last = result;
            tracing::warn!(status = a.last.status, error = ?a.last.error, "allocator: no new plan; the last one stays");
        }
        let view = a.view();
        *self.view.lock() = Some(view.clone());
        Ok(view)
    }

    /// Applies `new` over `old`, make before break.
    async fn apply(&self, a: &AllocationInForce, old: &proteus::Plan, new: &proteus::Plan) -> Result<(), ApplyError> {
        // A core whose replica is resized keeps its variant but changes its time.
        let key = |d: &proteus::DevicePlan| (d.app.clone(), d.model.clone(), d.service_us);
        // 1. Make: every device whose (app, variant) changes loads the new variant on the
        //    new app's worker (loaded and warmed off the worker; its weight is still 0
        //    there, or it already serves that app and switches between two decisions).
        for (w, (o, n)) in old.devices.iter().zip(&new.devices).enumerate() {
            let Some(app_name) = &n.app else { continue };
            if key(o) == key(n) {
                continue;
            }
            let app = self.apps.get(app_name).ok_or_else(|| ApplyError::UnknownApp(app_name.clone()))?;
            let set = load_set(a.models_for(&app.config, w, n)).await.map_err(|source| ApplyError::Load {
                app: app_name.clone(),
                worker: w,
                source,
            })?;
            app.install_models(w, set).await?;
        }
        // 2. Switch: every app's shares at once.
        for (name, app) in &self.apps {
            let weights: Vec<f64> = new
                .devices
                .iter()
                .map(|d| if d.app.as_deref() == Some(name.as_str()) { d.share } else { 0.0 })
                .collect();
            app.router.set_weights(&weights).map_err(|source| ApplyError::Weights { app: name.clone(), source })?;
        }
        // 3. Break: a worker whose device went to another app (or idle) receives nothing
        //    now; once its queue is empty it unloads. A batch in flight finishes first (a
        //    worker installs models only between decisions).
        for (w, (o, n)) in old.devices.iter().zip(&new.devices).enumerate() {
            let Some(app_name) = &o.app else { continue };
            if o.app == n.app {
                continue;
            }
            let Some(app) = self.apps.get(app_name) else { continue };
            let worker = &app.workers[w];
            let bound =
                std::time::Duration::from_micros(2 * app.slo_us + app.expire_us) + std::time::Duration::from_secs(1);
            let end = tokio::time::Instant::now() + bound;
            while (!worker.queue.is_empty() || worker.in_flight.load(Ordering::Acquire) > 0)
                && tokio::time::Instant::now() < end
            {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            app.install_models(w, sluice_core::executor::ModelSet::default()).await?;
        }
        tracing::info!(
            effective_accuracy = new.effective_accuracy,
            beta = new.beta,
            devices_used = new.devices_used,
            "allocator: plan applied"
        );
        Ok(())
    }

    /// Re-plans every `period_s`, and early when an app's forecast moves more than
    /// `threshold` from the demand of the plan in force; ends when the server drains.
    pub async fn control_loop(this: std::sync::Weak<AllocatorService>) {
        let mut last = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(this) = this.upgrade() else { return };
            if this.apps.values().any(|a| a.draining.load(Ordering::Acquire)) {
                return;
            }
            let Some((used, config)) =
                this.current.try_lock().ok().and_then(|g| {
                    g.as_ref().filter(|a| a.planner.replans()).map(|a| (a.demand.clone(), a.config.clone()))
                })
            else {
                continue;
            };
            let a = &config.allocator;
            let since = last.elapsed().as_secs_f64();
            let due = since >= a.period_s;
            let now = forecast(&this.apps, &config);
            // A shift past the band re-plans early, but not within `min_interval_s` of
            // the last re-plan: a ramp would otherwise re-plan at every step of it.
            let shifted = since >= a.min_interval_s.min(a.period_s) && a.demand_shifted(&used, &now);
            if due || shifted {
                last = tokio::time::Instant::now();
                let reason = if shifted { "demand shift" } else { "period" };
                if let Err(e) = this.replan(reason, None).await {
                    tracing::error!("allocator: re-plan failed, the last plan stays: {e}");
                }
            }
        }
    }
}

//! What the handlers share: the served apps built from a config ([`State::build`]:
//! profiles, models loaded and warmed, policies compiled, workers started), the
//! policy registry, metrics, and the model changes the admin API asks for.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinSet;

use sluice_sdk as sdk;

use crate::app::{App, WorkerStart};
use crate::config::{AppConfig, Config, ExecutorKind, InputSpec, PipelineConfig};
use crate::executor::onnx::{self, OnnxOptions};
use crate::executor::{load_set, model_set, AppSources, LoadedModel, ModelSource, OnnxSource};
use crate::metrics::Metrics;
use crate::pipeline::PipelineApp;
use sluice_core::clock::WallClock;
use sluice_core::profile::Profile;
use sluice_core::registry::Registry;
use sluice_core::runtime::PolicyEngine;

/// Everything the HTTP handlers share.
pub struct State {
    /// The served apps, by name.
    pub apps: BTreeMap<String, Arc<App>>,
    /// Known policies.
    pub registry: Arc<Registry>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Bearer token for `/admin` (none: admin disabled).
    pub admin_token: Option<String>,
    /// The configuration served.
    pub config: Config,
    /// Per-app model sources, to load models on workers at run time.
    pub sources: HashMap<String, AppSources>,
    workers: parking_lot::Mutex<JoinSet<()>>,
    /// The `[[device]]` allocator (without `[[device]]`s, one that refuses re-plans).
    pub allocator: Arc<crate::allocation::AllocatorService>,
    /// The served pipelines, by name (their tasks' internal apps are in `apps`).
    pub pipelines: BTreeMap<String, Arc<PipelineApp>>,
    /// KiB of request bodies being read and parsed at once (`body_budget_bytes`).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// Failed admin logins per client address.
    pub logins: crate::throttle::LoginGuard,
    /// What-if evaluations and the replayer that runs them ([`State::set_replayer`]).
    pub evaluations: Arc<crate::evaluate::Evaluations>,
    /// The cluster as this host sees it, for `GET /admin/dashboard` (set once by a
    /// cluster's frontend; unset outside a cluster): see [`ClusterView`].
    pub cluster_view: std::sync::OnceLock<ClusterView>,
}

/// The cluster as a host in it sees it, for `GET /admin/dashboard`'s `cluster`.
///
/// Why a function set from outside: the roles, the leader and the agents live in
/// the cluster's store, which `sluice_cluster` reads, and `sluice_cluster` depends
/// on this crate, not the other way round. A frontend
/// (`sluice_cluster::frontend::run`) sets one in [`State::cluster_view`] that
/// answers from what it already mirrors (no store round trip per poll); outside
/// a cluster there is none. It is called off the async threads, once per poll.
pub type ClusterView = Box<dyn Fn() -> serde_json::Value + Send + Sync>;

impl State {
    /// Builds every app: profiles, models (loaded and warmed on every worker), policy
    /// instances (initialised), and spawns the workers.
    pub async fn build(config: Config) -> anyhow::Result<Arc<State>> {
        let engine = PolicyEngine::new()?;
        let registry = Arc::new(Registry::open(engine.clone(), &config.builtin_policy_dir, &config.policy_dir)?);
        // Compile the built-ins in the background so a first swap to one of them does
        // not pay the compilation (tens to hundreds of ms) on the admin call.
        let warm = registry.clone();
        tokio::task::spawn_blocking(move || {
            for p in warm.list() {
                if let Err(e) = warm.get(&p.name) {
                    tracing::warn!("built-in policy {}: {e}", p.name);
                }
            }
        });
        let metrics = Arc::new(Metrics::default());
        let clock = WallClock::default();
        let next_id = Arc::new(AtomicU64::new(1));
        let onnx_apps = config.apps.iter().any(|a| a.executor == Some(ExecutorKind::Onnx));
        if onnx_apps || config.pipelines.iter().any(|p| p.executor == ExecutorKind::Onnx) {
            let path = onnx::init_runtime(config.onnxruntime.as_deref())?;
            tracing::info!("ONNX Runtime loaded from {}", path.display());
        }
        let mut apps = BTreeMap::new();
        let mut sources = HashMap::new();
        let mut starts: Vec<(Arc<App>, Vec<WorkerStart>)> = Vec::new();
        let resolved: Vec<(Vec<sdk::Model>, AppSources)> =
            config.apps.iter().map(resolve_models).collect::<anyhow::Result<_>>()?;
        // With [[device]]s, the allocator's first plan says which variant each worker
        // (device) loads and how each app's requests are shared out.
        let devices = crate::allocation::load_devices(&config)?;
        let allocator = crate::allocation::AllocationInForce::start(&config, devices, &resolved).await?;
        let builder = AppBuilder { engine: &engine, registry: &registry, metrics: &metrics, clock, next_id: &next_id };
        for (i, app_config) in config.apps.iter().enumerate() {
            let (models, source) = resolved[i].clone();
            let input = resolve_input(app_config, &source)?;
            let k = app_config.workers as usize;
            // Per worker: which model ids to load, from which source.
            let plan: Vec<Vec<(u32, ModelSource)>> = (0..k)
                .map(|w| match &allocator {
                    Some(a) => a.initial_models(app_config, w),
                    None => source.models.iter().enumerate().map(|(id, s)| (id as u32, s.clone())).collect(),
                })
                .collect();
            let device_models = allocator.as_ref().and_then(|a| a.device_models(&app_config.name));
            let (app, ws) = builder.build(app_config, models, input, plan, device_models).await?;
            if let Some(a) = &allocator {
                app.router
                    .set_weights(&a.weights(app_config))
                    .map_err(|e| anyhow::anyhow!("app {}: the allocator's first plan: {e}", app_config.name))?;
            }
            let _ = app.ring.set(crate::app::ArrivalRing::new(config.arrival_ring));
            apps.insert(app_config.name.clone(), app.clone());
            sources.insert(app_config.name.clone(), source);
            starts.push((app, ws));
        }
        let mut pipelines = BTreeMap::new();
        for pc in &config.pipelines {
            let (p, tasks) = build_pipeline(pc, &builder).await.with_context(|| format!("pipeline {}", pc.name))?;
            for (app, source, ws) in tasks {
                apps.insert(app.name().to_string(), app.clone());
                sources.insert(app.name().to_string(), source);
                starts.push((app, ws));
            }
            pipelines.insert(pc.name.clone(), p);
        }
        let body_budget_kib = config.body_budget_bytes.div_ceil(1024);
        let mut set = JoinSet::new();
        for (app, ws) in starts {
            for w in ws {
                let done = crate::worker::spawn(app.clone(), w).context("starting a worker thread")?;
                set.spawn(async move {
                    let _ = done.await;
                });
            }
        }
        let admin_token =
            std::env::var("SLUICE_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()).or(config.admin_token.clone());
        let with_devices = allocator.is_some();
        let allocator = crate::allocation::AllocatorService::new(apps.clone(), metrics.clone(), allocator);
        let evaluations =
            Arc::new(crate::evaluate::Evaluations::new(config.evaluations_kept, config.evaluation_threads));
        let state = Arc::new(State {
            apps,
            registry,
            metrics,
            admin_token,
            config,
            sources,
            workers: parking_lot::Mutex::new(set),
            allocator,
            pipelines,
            body_budget: Arc::new(tokio::sync::Semaphore::new(body_budget_kib)),
            logins: crate::throttle::LoginGuard::default(),
            evaluations,
            cluster_view: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&state);
        state.metrics.read_gauges_from(Box::new(move |out| {
            if let Some(state) = weak.upgrade() {
                app_gauges(&state, out);
            }
        }));
        for p in state.pipelines.values() {
            tokio::spawn(crate::pipeline::control_loop(Arc::downgrade(p)));
        }
        if with_devices {
            tokio::spawn(crate::allocation::AllocatorService::control_loop(Arc::downgrade(&state.allocator)));
        }
        Ok(state)
    }

    /// Loads `names` for worker `w` of `app` off the worker, then has the worker switch.
    pub async fn set_worker_models(&self, app: &str, w: usize, names: &[String]) -> Result<Vec<u32>, ModelsError> {
        let unknown = || ModelsError::UnknownApp(app.to_string());
        let a = self.apps.get(app).ok_or_else(unknown)?;
        let src = self.sources.get(app).ok_or_else(unknown)?;
        if w >= a.workers.len() {
            return Err(ModelsError::NoWorker { app: app.to_string(), workers: a.workers.len(), worker: w });
        }
        if names.is_empty() {
            return Err(ModelsError::NoModels);
        }
        if a.device_models.is_some() {
            return Err(ModelsError::OnDevices(app.to_string()));
        }
        let mut ids = Vec::new();
        for n in names {
            let id = a.models.iter().position(|m| &m.name == n).ok_or_else(|| ModelsError::UnknownModel {
                app: app.to_string(),
                model: n.clone(),
                known: a.models.iter().map(|m| m.name.clone()).collect(),
            })?;
            // A model named twice would be loaded twice and counted as one: a mistake
            // in the request, refused rather than silently merged.
            if ids.contains(&(id as u32)) {
                return Err(ModelsError::Twice(n.clone()));
            }
            ids.push(id as u32);
        }
        let sources: Vec<(u32, ModelSource)> = ids.iter().map(|&id| (id, src.models[id as usize].clone())).collect();
        a.install_models(w, load_set(sources).await?).await?;
        Ok(ids)
    }

    /// Gives the host what replays what-if evaluations (`sluice serve` gives the
    /// simulator's); without one, `POST /admin/apps/{app}/evaluate` answers 501.
    pub fn set_replayer(&self, replayer: Arc<dyn sluice_core::whatif::Replayer>) {
        if !self.evaluations.set_replayer(replayer) {
            tracing::warn!("a replayer was already set; keeping the first");
        }
    }

    /// Logs every accepted arrival of every app to `path` (for `sluice sim`).
    pub fn record_arrivals(&self, path: &std::path::Path) -> std::io::Result<()> {
        let log = Arc::new(crate::app::ArrivalLog::create(path)?);
        for app in self.apps.values() {
            let _ = app.recorder.set(log.clone());
        }
        Ok(())
    }

    /// Graceful shutdown: stop accepting, let workers answer everything queued, and
    /// after `grace` reject whatever is left (every accepted request gets one answer).
    pub async fn drain(&self, grace: Duration) {
        for p in self.pipelines.values() {
            p.accepting.store(false, Ordering::Release);
        }
        for app in self.apps.values() {
            app.accepting.store(false, Ordering::Release);
            app.draining.store(true, Ordering::Release);
            app.wake_all();
        }
        if let Some(log) = self.apps.values().find_map(|a| a.recorder.get()) {
            if let Err(e) = log.flush() {
                tracing::error!("arrival log: {e}");
            }
        }
        let mut set = std::mem::take(&mut *self.workers.lock());
        let finished = tokio::time::timeout(grace, async { while set.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            // Workers abandon their batches (answered 503) and stop within a policy
            // call's budget; one that does not is left behind, its queue rejected.
            for app in self.apps.values() {
                app.abort();
            }
            let _ = tokio::time::timeout(ABORT_WAIT, async { while set.join_next().await.is_some() {} }).await;
            for app in self.apps.values() {
                for w in &app.workers {
                    let left: Vec<_> = std::mem::take(&mut *w.queue.items.lock());
                    w.queue.sync_len(&[]);
                    for r in left {
                        app.reject_at_shutdown(r);
                    }
                }
            }
        }
    }
}

/// How long a shutdown whose grace ran out waits for the workers to stop.
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// What building an app's workers and policy instances needs from the host.
struct AppBuilder<'a> {
    engine: &'a Arc<PolicyEngine>,
    registry: &'a Arc<Registry>,
    metrics: &'a Arc<Metrics>,
    clock: WallClock,
    next_id: &'a Arc<AtomicU64>,
}

impl AppBuilder<'_> {
    /// Loads (and warms) each worker's models per `plan` off the async threads,
    /// checks them against the input, and builds the app with its policy.
    async fn build(
        &self,
        app_config: &AppConfig,
        models: Vec<sdk::Model>,
        input: InputSpec,
        plan: Vec<Vec<(u32, ModelSource)>>,
        device_models: Option<Arc<Vec<Vec<sdk::Model>>>>,
    ) -> anyhow::Result<(Arc<App>, Vec<WorkerStart>)> {
        let worker_models = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<BTreeMap<u32, LoadedModel>>> {
            plan.into_iter()
                .map(|ms| ms.into_iter().map(|(id, s)| Ok((id, s.load()?))).collect::<anyhow::Result<_>>())
                .collect()
        })
        .await??;
        check_inputs(app_config, &models, &input, &worker_models)?;
        let compiled = self
            .registry
            .get(&app_config.policy)
            .with_context(|| format!("app {}: policy `{}`", app_config.name, app_config.policy))?;
        // Paths in the config were resolved against its directory when it was read.
        let params =
            app_config.params_json(std::path::Path::new("")).with_context(|| format!("app {}", app_config.name))?;
        App::new(
            app_config.clone(),
            models,
            device_models,
            input,
            params,
            worker_models.into_iter().map(model_set).collect(),
            self.engine.clone(),
            Some(compiled),
            self.metrics.clone(),
            self.clock,
            self.next_id.clone(),
        )
        .with_context(|| format!("app {}", app_config.name))
    }
}

/// A pipeline's task apps, their model sources and their workers to start.
type TaskApps = Vec<(Arc<App>, AppSources, Vec<WorkerStart>)>;

/// Builds a pipeline: its problem, the first plan (for the problem's
/// `demand_qps`), and one internal app per task whose workers load what the plan
/// places on them.
async fn build_pipeline(pc: &PipelineConfig, builder: &AppBuilder<'_>) -> anyhow::Result<(Arc<PipelineApp>, TaskApps)> {
    let (mut problem, source) = sluice_alloc::problem::load_loki(&pc.problem)?;
    if let Some(beta) = pc.serving.beta {
        if beta <= problem.ladder.min_beta {
            anyhow::bail!(
                "pipeline `{}`: beta = {beta} is at or below the problem's [ladder] min_beta = {}",
                pc.name,
                problem.ladder.min_beta
            );
        }
        problem.ladder.beta = beta;
    }
    let p = problem.clone();
    let outcome = tokio::task::spawn_blocking(move || sluice_alloc::loki::solve(&p)).await??;
    if let Some(why) = outcome.origin.reason() {
        tracing::warn!(pipeline = %pc.name, origin = outcome.origin.name(), "first plan made without a solver: {why}");
    }
    let origin = outcome.origin.clone();
    let plan = outcome.plan.ok_or_else(|| {
        anyhow::anyhow!(
            "no feasible plan for the problem's demand_qps = {} ({:?})",
            problem.demand_qps,
            outcome.report.status
        )
    })?;
    let workers = problem.workers as usize;
    let devices = crate::pipeline::assign(&problem.pipeline, &plan, &vec![None; workers]);
    // The input: the config's, or (onnx) the root variants' — found as any app's is.
    let mut input = pc.input.clone();
    let mut tasks = Vec::new();
    let mut apps = Vec::new();
    let mut task_sources = Vec::new();
    for (t, task) in problem.pipeline.tasks.iter().enumerate() {
        if task.is_passthrough() {
            apps.push(None);
            task_sources.push(None);
            continue;
        }
        let mut app_config =
            crate::pipeline::task_app_config(pc, &source, task, problem.workers, problem.slo_ms, input.as_ref())?;
        app_config.drop_late_at_batch =
            pc.serving.early_drop_at.at_batch(pc.serving.early_drop, problem.pipeline.is_last_model_task(t));
        let (models, src) = resolve_models(&app_config)?;
        let task_input = match &input {
            Some(i) => i.clone(),
            None => input.insert(resolve_input(&app_config, &src)?).clone(),
        };
        let plan_models: Vec<Vec<(u32, ModelSource)>> = devices
            .iter()
            .map(|d| match d {
                Some(s) if s.task == t => vec![(s.variant as u32, src.models[s.variant].clone())],
                _ => Vec::new(),
            })
            .collect();
        let (app, ws) = builder.build(&app_config, models, task_input, plan_models, None).await?;
        apps.push(Some(app.clone()));
        task_sources.push(Some(src.clone()));
        tasks.push((app, src, ws));
    }
    let input = input.ok_or_else(|| anyhow::anyhow!("every task is a pass-through: no task has models"))?;
    let p = PipelineApp::new(
        pc.clone(),
        problem,
        input,
        apps,
        task_sources,
        (plan, origin),
        devices.clone(),
        builder.clock,
    );
    // Each task worker's policy sees its first plan slot (`flow::task_view`); the
    // workers take the new instances at their first decision.
    p.bind_views(&[], &devices).await;
    Ok((p, tasks))
}

/// An app's variants (from its profile) and how to load each (cluster agents load them
/// one by one as placements say).
pub fn resolve_models(app: &AppConfig) -> anyhow::Result<(Vec<sdk::Model>, AppSources)> {
    let profile = Profile::load(&app.profile)?;
    let selected = profile
        .policy_models(app.models.as_deref(), app.latency_percentile, app.max_batch)
        .map_err(|e| anyhow::anyhow!("app {}: models: {e} ({})", app.name, app.profile.display()))?;
    // Config::validate made sure every app names its executor.
    let executor = app.executor.unwrap_or(ExecutorKind::Emulated);
    let mut models = Vec::new();
    let mut sources = Vec::new();
    for (model, m) in selected {
        sources.push(match executor {
            ExecutorKind::Emulated => ModelSource::Emulated(Arc::new(model.latency.clone())),
            ExecutorKind::Onnx => {
                let dir = app.model_dir.clone().unwrap_or_default();
                let file =
                    m.file.clone().map(PathBuf::from).unwrap_or_else(|| PathBuf::from(format!("{}.onnx", model.name)));
                ModelSource::Onnx(OnnxSource {
                    path: dir.join(file),
                    options: OnnxOptions { intra_threads: app.intra_threads, cuda: app.cuda },
                    warm_up_to: model.max_batch() as usize,
                })
            }
        });
        models.push(model);
    }
    Ok((models, AppSources { executor, models: sources }))
}

/// Every ONNX variant of an app must take the app's input (same datatype and shape):
/// a request is validated once, against the app, whichever variant serves it.
fn check_inputs(
    app: &AppConfig,
    models: &[sdk::Model],
    input: &InputSpec,
    loaded: &[BTreeMap<u32, LoadedModel>],
) -> anyhow::Result<()> {
    for (id, m) in loaded.iter().flatten() {
        if let LoadedModel::Onnx(session, _) = m {
            let s = session.lock();
            let datatype = s.input_datatype().oip_name();
            if s.input_shape() != input.shape.as_slice() || datatype != input.datatype {
                anyhow::bail!(
                    "app {}: model `{}` takes {datatype} {:?} but the app's input is {} {:?}",
                    app.name,
                    models[*id as usize].name,
                    s.input_shape(),
                    input.datatype,
                    input.shape
                );
            }
        }
    }
    Ok(())
}

fn resolve_input(app: &AppConfig, sources: &AppSources) -> anyhow::Result<InputSpec> {
    if let Some(i) = &app.input {
        return Ok(i.clone());
    }
    match sources.models.first() {
        Some(ModelSource::Onnx(src)) => {
            let m = onnx::OnnxModel::load(&src.path, &src.options)?;
            Ok(InputSpec { name: m.input_name().to_string(), datatype: "FP32".into(), shape: m.input_shape().to_vec() })
        }
        _ => anyhow::bail!("app {}: input: required for executor = \"emulated\" (e.g. input = {{ name = \"input\", datatype = \"FP32\", shape = [4] }})", app.name),
    }
}

/// Gauges read from the apps when scraped: each worker's queue, and each variant's
/// accuracy (so a dashboard weighs `sluice_requests_total`'s served answers by it:
/// the accuracy served, as the live page computes it).
fn app_gauges(state: &State, out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP sluice_worker_queued_requests Requests queued per worker, by app and worker (one series, worker 0, for an app whose workers share one queue: router = \"shared\").\n# TYPE sluice_worker_queued_requests gauge"
    );
    for (name, app) in &state.apps {
        for (w, n) in app.queue_lengths().iter().enumerate() {
            let labels = vec![("app", name.clone()), ("worker", w.to_string())];
            let _ = writeln!(out, "sluice_worker_queued_requests{{{}}} {n}", crate::metrics::render_labels(&labels));
        }
    }
    let _ = writeln!(
        out,
        "# HELP sluice_model_accuracy_ratio Each variant's accuracy (0 to 1, from its profile), by app and model: the served answers of sluice_requests_total weighted by it are the accuracy served.\n# TYPE sluice_model_accuracy_ratio gauge"
    );
    for (name, app) in &state.apps {
        for m in &app.models {
            let labels = vec![("app", name.clone()), ("model", m.name.clone())];
            let _ = writeln!(
                out,
                "sluice_model_accuracy_ratio{{{}}} {}",
                crate::metrics::render_labels(&labels),
                m.accuracy
            );
        }
    }
}

/// Why `PUT /admin/apps/{app}/workers/{w}/models` did not change a worker's models
/// ([`State::set_worker_models`]); every case is the request's (400), a model that
/// fails to load included, as the message says which.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// No app of that name.
    #[error("unknown app `{0}`")]
    UnknownApp(String),
    /// The app has fewer workers.
    #[error("app {app} has {workers} workers; no worker {worker}")]
    NoWorker {
        /// The app.
        app: String,
        /// How many workers it has.
        workers: usize,
        /// The index asked for.
        worker: usize,
    },
    /// An empty list of models.
    #[error("a worker needs at least one model")]
    NoModels,
    /// The app runs on `[[device]]`s, whose models the allocator chooses.
    #[error("app {0} runs on [[device]]s: the allocator decides its workers' models (POST /admin/allocation/solve)")]
    OnDevices(String),
    /// A model the app does not have.
    #[error("app {app} has no model `{model}` (models: {})", .known.join(", "))]
    UnknownModel {
        /// The app.
        app: String,
        /// The name asked for.
        model: String,
        /// The app's models.
        known: Vec<String>,
    },
    /// A model named twice in the list.
    #[error("model `{0}` is listed twice")]
    Twice(String),
    /// A model failed to load or warm up.
    #[error(transparent)]
    Load(#[from] crate::executor::LoadError),
    /// The worker did not take the models.
    #[error(transparent)]
    Install(#[from] crate::app::InstallError),
}

#[cfg(test)]
mod models_error_tests {
    use super::ModelsError;
    use crate::app::InstallError;

    /// Each refusal of a worker's models names what was wrong with the request.
    #[test]
    fn models_errors_name_the_bad_input() {
        let e = ModelsError::NoWorker { app: "img".into(), workers: 2, worker: 5 };
        assert_eq!(e.to_string(), "app img has 2 workers; no worker 5");
        let e =
            ModelsError::UnknownModel { app: "img".into(), model: "big".into(), known: vec!["a".into(), "b".into()] };
        assert_eq!(e.to_string(), "app img has no model `big` (models: a, b)");
        assert_eq!(ModelsError::Twice("small".into()).to_string(), "model `small` is listed twice");
        assert_eq!(ModelsError::UnknownApp("x".into()).to_string(), "unknown app `x`");
        let e = ModelsError::from(InstallError::Stopped { app: "img".into(), worker: 1 });
        assert_eq!(e.to_string(), "app img: worker 1 has stopped");
        let e = InstallError::NoWorker { app: "img".into(), worker: 3 };
        assert_eq!(e.to_string(), "app img: no worker 3");
    }
}

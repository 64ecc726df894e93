//! What-if evaluations in the live host: `POST /admin/apps/{app}/evaluate` replays
//! a window of the app's recorded arrivals (its [`crate::app::ArrivalRing`]) with a
//! candidate policy and with the current one, off the request path, and may
//! promote the candidate through the ordinary hot swap.
//!
//! Start here: [`Evaluations`] (the store, the per-app slot and the replayer given
//! at start-up), [`start`] (checks, snapshot, the background thread), [`Evaluation`]
//! (one evaluation's progress, result and promotion record).
//!
//! The replay itself is the simulator's (`sluice_sim::whatif::SimReplayer`), reached
//! through core's [`Replayer`] seam so this crate does not import the simulator;
//! without one (a host built by a test that gives none) the route answers 501.
//!
//! Bounds: one evaluation at a time per app (a second gets 409 naming the first);
//! each runs on a thread of its own, on 1 or 2 cores (`evaluation_threads`); a
//! cancel (`DELETE /admin/evaluations/{id}`) lands within a few thousand simulated
//! events; at most `evaluations_kept` finished ones are remembered.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::app::{App, SwapReport};
use sluice_core::clock::Clock as _;
use sluice_core::registry::{Registry, RegistryError};
use sluice_core::whatif::{
    compare, Comparison, PolicyUnderTest, PromoteIf, ReplayControl, ReplayError, ReplayJob, Replayer,
};

/// The longest window an evaluation may replay (a day).
pub const MAX_WINDOW_S: f64 = 86_400.0;

/// Width of the time series an evaluation reports: a minute.
const SERIES_WINDOW_US: u64 = 60_000_000;

/// The body of `POST /admin/apps/{app}/evaluate`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    /// The candidate: a built-in or uploaded policy name.
    pub policy: String,
    /// Its params, a JSON object (default `{}`).
    #[serde(default)]
    pub params: Option<Value>,
    /// Seconds of recent arrivals to replay (default 600).
    #[serde(default = "default_window")]
    pub window_s: f64,
    /// What to compare against: `"current"` (the default: the app's binding), or
    /// `{"policy": "...", "params": {...}}`.
    #[serde(default)]
    pub against: Option<Value>,
    /// Promote the candidate when the replay says so.
    #[serde(default)]
    pub promote_if: Option<PromoteIf>,
}

fn default_window() -> f64 {
    600.0
}

/// Where an evaluation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvaluationStatus {
    /// Replaying.
    Running,
    /// Replayed (and promoted or not, when asked).
    Done,
    /// The replay could not run (the error says why).
    Failed,
    /// Cancelled by `DELETE /admin/evaluations/{id}`.
    Cancelled,
}

/// What a promotion decided and did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Promotion {
    /// The rule asked for.
    pub rule: PromoteIf,
    /// Whether the candidate now serves.
    pub promoted: bool,
    /// Why, or why not, in words.
    pub reason: String,
    /// The swap, when there was one.
    pub swap: Option<SwapReport>,
}

struct Progress {
    status: EvaluationStatus,
    result: Option<Comparison>,
    error: Option<String>,
    promotion: Option<Promotion>,
    wall_ms: Option<f64>,
}

/// One evaluation.
pub struct Evaluation {
    /// Its id.
    pub id: u64,
    /// The app.
    pub app: String,
    request: Value,
    requests: u64,
    window_s: f64,
    started_unix_ms: u64,
    controls: [ReplayControl; 2],
    progress: Mutex<Progress>,
}

impl Evaluation {
    /// Where it is.
    pub fn status(&self) -> EvaluationStatus {
        self.progress.lock().status
    }

    /// Asks a running evaluation to stop.
    pub fn cancel(&self) {
        self.controls.iter().for_each(ReplayControl::cancel);
    }

    /// Its admin view: progress, the comparison when done, the promotion record.
    pub fn view(&self) -> EvaluationView {
        let p = self.progress.lock();
        let progress = match p.status {
            EvaluationStatus::Running => self.controls.iter().map(ReplayControl::fraction).sum::<f64>() / 2.0,
            _ => 1.0,
        };
        EvaluationView {
            id: self.id,
            app: self.app.clone(),
            status: p.status,
            progress,
            request: self.request.clone(),
            window_s: self.window_s,
            requests: self.requests,
            started_unix_ms: self.started_unix_ms,
            wall_ms: p.wall_ms,
            result: p.result.clone(),
            error: p.error.clone(),
            promotion: p.promotion.clone(),
        }
    }

    /// Its line in `GET /admin/evaluations`.
    pub fn summary(&self) -> EvaluationSummary {
        EvaluationSummary { id: self.id, app: self.app.clone(), status: self.status(), request: self.request.clone() }
    }
}

/// `GET /admin/evaluations/{id}`'s body (and the dashboard's evaluations).
#[derive(Clone, Debug, Serialize)]
pub struct EvaluationView {
    /// The evaluation's id.
    pub id: u64,
    /// The app.
    pub app: String,
    /// Where it is.
    pub status: EvaluationStatus,
    /// How far the replays are, 0 to 1 (1 once finished).
    pub progress: f64,
    /// The request's body, as the client sent it.
    pub request: Value,
    /// Seconds of arrivals replayed.
    pub window_s: f64,
    /// Arrivals in the window.
    pub requests: u64,
    /// When it started, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// Wall-clock time of the replays, ms (None while running).
    pub wall_ms: Option<f64>,
    /// The comparison, once done.
    pub result: Option<Comparison>,
    /// Why the replay failed.
    pub error: Option<String>,
    /// What the promotion decided, when one was asked for.
    pub promotion: Option<Promotion>,
}

/// One evaluation in `GET /admin/evaluations`.
#[derive(Clone, Debug, Serialize)]
pub struct EvaluationSummary {
    /// The evaluation's id.
    pub id: u64,
    /// The app.
    pub app: String,
    /// Where it is.
    pub status: EvaluationStatus,
    /// The request's body, as the client sent it.
    pub request: Value,
}

/// The 202's body of `POST /admin/apps/{app}/evaluate`.
#[derive(Clone, Debug, Serialize)]
pub struct Started {
    /// The evaluation's id.
    pub id: u64,
    /// The app.
    pub app: String,
    /// Always [`EvaluationStatus::Running`].
    pub status: EvaluationStatus,
    /// Arrivals in the window.
    pub requests: u64,
    /// Where to poll it: `/admin/evaluations/{id}`.
    pub location: String,
}

#[derive(Default)]
struct Store {
    all: BTreeMap<u64, Arc<Evaluation>>,
    /// The running evaluation of each app (one at a time).
    running: HashMap<String, u64>,
}

/// Every evaluation of the host, and the replayer that runs them.
pub struct Evaluations {
    replayer: OnceLock<Arc<dyn Replayer>>,
    next_id: AtomicU64,
    store: Mutex<Store>,
    kept: usize,
    threads: usize,
}

impl Evaluations {
    /// An empty store keeping `kept` finished evaluations, replaying on `threads`
    /// threads each.
    pub fn new(kept: usize, threads: usize) -> Evaluations {
        Evaluations {
            replayer: OnceLock::new(),
            next_id: AtomicU64::new(1),
            store: Mutex::new(Store::default()),
            kept: kept.max(1),
            threads: threads.clamp(1, 2),
        }
    }

    /// Gives the host its replayer (once, at start-up); false when it had one.
    pub fn set_replayer(&self, replayer: Arc<dyn Replayer>) -> bool {
        self.replayer.set(replayer).is_ok()
    }

    /// Evaluation `id`.
    pub fn get(&self, id: u64) -> Option<Arc<Evaluation>> {
        self.store.lock().all.get(&id).cloned()
    }

    /// Short views of every evaluation remembered, oldest first.
    pub fn list(&self) -> Vec<EvaluationSummary> {
        self.all().iter().map(|e| e.summary()).collect()
    }

    /// Every evaluation remembered, oldest first.
    pub fn all(&self) -> Vec<Arc<Evaluation>> {
        self.store.lock().all.values().cloned().collect()
    }

    /// Forgets a finished evaluation; false when it is running or unknown.
    pub fn forget(&self, id: u64) -> bool {
        let mut s = self.store.lock();
        match s.all.get(&id) {
            Some(e) if e.status() != EvaluationStatus::Running => {
                s.all.remove(&id);
                true
            }
            _ => false,
        }
    }

    /// Registers a new evaluation of `app` unless one is running; the running one's
    /// id otherwise.
    fn claim(&self, e: Arc<Evaluation>) -> Result<(), u64> {
        let mut s = self.store.lock();
        if let Some(&id) = s.running.get(&e.app) {
            return Err(id);
        }
        s.running.insert(e.app.clone(), e.id);
        s.all.insert(e.id, e);
        // Forget the oldest finished ones beyond the bound (running ones stay).
        let finished: Vec<u64> =
            s.all.iter().filter(|(_, e)| e.status() != EvaluationStatus::Running).map(|(id, _)| *id).collect();
        let excess = finished.len().saturating_sub(self.kept);
        for id in finished.into_iter().take(excess) {
            s.all.remove(&id);
        }
        Ok(())
    }

    fn release(&self, e: &Evaluation) {
        let mut s = self.store.lock();
        if s.running.get(&e.app) == Some(&e.id) {
            s.running.remove(&e.app);
        }
    }
}

/// Why an evaluation did not start. The edge answers each with its status
/// (`From<EvaluateError> for ApiError`): 501, 404, 400 for a malformed request
/// ([`EvaluateError::is_bad_request`]), 409 for one the app cannot be evaluated with
/// (409 with the running evaluation's id when busy), the registry's own, 500.
#[derive(Debug, thiserror::Error)]
pub enum EvaluateError {
    /// The host has no simulator to replay with.
    #[error("what-if evaluation is not available: this host was started without a simulator")]
    Unavailable,
    /// No such app.
    #[error("unknown app `{name}` (served: {})", known.join(", "))]
    UnknownApp {
        /// The name asked for.
        name: String,
        /// The apps served.
        known: Vec<String>,
    },
    /// `window_s` out of (0, [`MAX_WINDOW_S`]].
    #[error("window_s: expected 0 < window_s <= {MAX_WINDOW_S}")]
    Window(f64),
    /// `params` or `against.params` is not a JSON object.
    #[error("{field} must be a JSON object, got {got}")]
    NotAnObject {
        /// The field.
        field: &'static str,
        /// What it was.
        got: Value,
    },
    /// `against` is neither `"current"` nor a policy.
    #[error(r#"against: expected "current" or {{"policy": "...", "params": {{...}}}}"#)]
    Against,
    /// `against` has a field besides `policy` and `params`.
    #[error("against: unknown field `{0}`")]
    AgainstField(String),
    /// `promote_if` out of range (core's `PromoteIf::validate` says how).
    #[error(transparent)]
    PromoteIf(#[from] sluice_core::whatif::PromoteIfError),
    /// `promote_if` with another `against` than the current policy.
    #[error("promote_if compares the candidate with the current policy: leave `against` out or \"current\"")]
    PromoteAgainst,
    /// The app runs on `[[device]]`s, which a replay does not model.
    #[error("app {0} runs on [[device]]s: the allocator places its variants, which a replay does not model")]
    OnDevices(String),
    /// The app is a pipeline's task: its arrivals are not recorded.
    #[error("app {0} is a pipeline's task: its arrivals are not recorded")]
    PipelineTask(String),
    /// `arrival_ring = 0`.
    #[error("arrival recording is off (arrival_ring = 0 in the config)")]
    RecordingOff,
    /// The app's policy was replaced in the registry since it was bound.
    #[error(
        "app {app}: policy `{policy}` was replaced since it was bound (bound {bound}, now {now}); swap it again first"
    )]
    PolicyReplaced {
        /// The app.
        app: String,
        /// The policy.
        policy: String,
        /// The digest bound.
        bound: String,
        /// The registry's digest now.
        now: String,
    },
    /// Nothing was recorded in the window.
    #[error("app {app}: no arrivals recorded in the last {window_s} s; nothing to replay")]
    NoArrivals {
        /// The app.
        app: String,
        /// The window asked for, s.
        window_s: f64,
    },
    /// Another evaluation of the app is running.
    #[error("app {app}: evaluation {running} is running; one at a time per app")]
    Busy {
        /// The app.
        app: String,
        /// The running evaluation's id.
        running: u64,
    },
    /// A policy could not be resolved.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A blocking task of the host failed (logged by the edge).
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
    /// The evaluation's thread could not be started (logged by the edge).
    #[error("cannot start an evaluation thread: {0}")]
    Thread(std::io::Error),
}

impl EvaluateError {
    /// Whether the request is malformed (400), as opposed to well formed for an app
    /// that cannot be evaluated so now (409) or the host's failure.
    pub fn is_bad_request(&self) -> bool {
        use EvaluateError as E;
        matches!(
            self,
            E::Window(_)
                | E::NotAnObject { .. }
                | E::Against
                | E::AgainstField(_)
                | E::PromoteIf(_)
                | E::PromoteAgainst
        )
    }

    /// Whether the app cannot be evaluated so now (409).
    pub fn is_conflict(&self) -> bool {
        use EvaluateError as E;
        matches!(
            self,
            E::OnDevices(_) | E::PipelineTask(_) | E::RecordingOff | E::PolicyReplaced { .. } | E::NoArrivals { .. }
        )
    }
}

fn busy(app: &str, running: u64) -> EvaluateError {
    EvaluateError::Busy { app: app.to_string(), running }
}

fn params_of(v: Option<Value>, field: &'static str) -> Result<String, EvaluateError> {
    match v {
        None => Ok("{}".into()),
        Some(v @ Value::Object(_)) => Ok(v.to_string()),
        Some(got) => Err(EvaluateError::NotAnObject { field, got }),
    }
}

/// What `against` names: the current binding, or another policy.
enum Against {
    Current,
    Policy(String, String),
}

fn against_of(v: Option<Value>) -> Result<Against, EvaluateError> {
    let bad = || EvaluateError::Against;
    match v {
        None => Ok(Against::Current),
        Some(Value::String(s)) if s == "current" => Ok(Against::Current),
        Some(Value::Object(mut m)) => {
            let policy = match m.remove("policy") {
                Some(Value::String(p)) => p,
                _ => return Err(bad()),
            };
            let params = params_of(m.remove("params"), "against.params")?;
            if let Some(k) = m.keys().next() {
                return Err(EvaluateError::AgainstField(k.clone()));
            }
            Ok(Against::Policy(policy, params))
        }
        Some(_) => Err(bad()),
    }
}

/// Resolves a policy name to what a replay runs (`safe` is the native fallback).
async fn policy(registry: &Arc<Registry>, name: &str, params: String) -> Result<PolicyUnderTest, EvaluateError> {
    if name == sluice_core::decision::SAFE_POLICY {
        return Ok(PolicyUnderTest { name: name.into(), compiled: None, params });
    }
    let registry = registry.clone();
    let n = name.to_string();
    // A built-in's first use compiles it: off the async threads.
    let compiled = tokio::task::spawn_blocking(move || registry.get(&n)).await??;
    Ok(PolicyUnderTest { name: name.into(), compiled: Some(compiled), params })
}

/// `POST /admin/apps/{app}/evaluate`: checks the request (parsed by the edge, with
/// the body as JSON for the evaluation's view) against `apps` (the host's) and the
/// policies of `registry`, snapshots the window and starts the replays on a thread
/// of their own. Answers the 202's body, with the evaluation's id.
pub async fn start(
    evaluations: &Arc<Evaluations>,
    apps: &BTreeMap<String, Arc<App>>,
    registry: &Arc<Registry>,
    app_name: &str,
    (req, request_view): (EvaluateRequest, Value),
) -> Result<Started, EvaluateError> {
    let Some(replayer) = evaluations.replayer.get().cloned() else {
        return Err(EvaluateError::Unavailable);
    };
    let app = apps
        .get(app_name)
        .ok_or_else(|| EvaluateError::UnknownApp { name: app_name.into(), known: apps.keys().cloned().collect() })?
        .clone();
    if let Some(&running) = evaluations.store.lock().running.get(app_name) {
        return Err(busy(app_name, running));
    }
    if !(req.window_s.is_finite() && req.window_s > 0.0 && req.window_s <= MAX_WINDOW_S) {
        return Err(EvaluateError::Window(req.window_s));
    }
    let against = against_of(req.against)?;
    if let Some(rule) = &req.promote_if {
        rule.validate().map_err(EvaluateError::PromoteIf)?;
        if !matches!(against, Against::Current) {
            return Err(EvaluateError::PromoteAgainst);
        }
    }
    let candidate_params = params_of(req.params, "params")?;
    if app.device_models.is_some() {
        return Err(EvaluateError::OnDevices(app_name.to_string()));
    }
    let Some(ring) = app.ring.get() else {
        return Err(EvaluateError::PipelineTask(app_name.to_string()));
    };
    if ring.capacity() == 0 {
        return Err(EvaluateError::RecordingOff);
    }
    let candidate = policy(registry, &req.policy, candidate_params).await?;
    let generation = app.binding.lock().generation;
    let current = match against {
        Against::Policy(name, params) => policy(registry, &name, params).await?,
        Against::Current => {
            let b = app.binding.lock().clone();
            let p = policy(registry, &b.policy, b.params.clone()).await?;
            if let (Some(c), Some(d)) = (&p.compiled, &b.digest) {
                if &c.digest != d {
                    return Err(EvaluateError::PolicyReplaced {
                        app: app_name.to_string(),
                        policy: b.policy.clone(),
                        bound: d.clone(),
                        now: c.digest.clone(),
                    });
                }
            }
            p
        }
    };
    // The window, in order, from its first arrival (a few ms for a full ring).
    let now = app.clock.now();
    let from = now.saturating_sub((req.window_s * 1e6) as u64);
    let ring_app = app.clone();
    let mut arrivals =
        tokio::task::spawn_blocking(move || ring_app.ring.get().map(|r| r.since(from)).unwrap_or_default()).await?;
    let Some(&first) = arrivals.first() else {
        return Err(EvaluateError::NoArrivals { app: app_name.to_string(), window_s: req.window_s });
    };
    arrivals.iter_mut().for_each(|t| *t -= first);
    let loaded: Vec<Vec<u32>> = app.workers.iter().map(|w| w.loaded.lock().clone()).collect();
    let job = ReplayJob {
        app: app.config.clone(),
        loaded: Some(loaded),
        duration_us: arrivals.last().copied().unwrap_or(0) + 1,
        arrivals_us: Arc::new(arrivals),
        series_window_us: SERIES_WINDOW_US,
        engine: registry.engine().clone(),
        policy: candidate,
    };
    let current_job = ReplayJob { policy: current, ..job.clone() };
    let evaluation = Arc::new(Evaluation {
        id: evaluations.next_id.fetch_add(1, Ordering::Relaxed),
        app: app_name.to_string(),
        request: request_view,
        requests: job.arrivals_us.len() as u64,
        window_s: req.window_s,
        started_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        controls: [ReplayControl::default(), ReplayControl::default()],
        progress: Mutex::new(Progress {
            status: EvaluationStatus::Running,
            result: None,
            error: None,
            promotion: None,
            wall_ms: None,
        }),
    });
    evaluations.claim(evaluation.clone()).map_err(|running| busy(app_name, running))?;
    let parallel = evaluations.threads > 1;
    let handle = tokio::runtime::Handle::current();
    let (evaluations2, e) = (evaluations.clone(), evaluation.clone());
    let rule = req.promote_if;
    let spawned = std::thread::Builder::new().name(format!("sluice-evaluate-{}", e.id)).spawn(move || {
        run_in_background();
        let started = Instant::now();
        let outcome = compare(&*replayer, &job, &current_job, &e.controls, parallel);
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        let (status, result, error) = match outcome {
            Ok(c) => (EvaluationStatus::Done, Some(c), None),
            Err(ReplayError::Cancelled) => (EvaluationStatus::Cancelled, None, None),
            Err(ReplayError::Failed(m)) => (EvaluationStatus::Failed, None, Some(m)),
        };
        let promotion = match (&result, rule) {
            (Some(c), Some(rule)) => Some(handle.block_on(promote(&app, &job.policy, generation, c, rule))),
            _ => None,
        };
        tracing::info!(
            app = e.app,
            evaluation = e.id,
            status = ?status,
            wall_ms,
            promoted = promotion.as_ref().map(|p| p.promoted),
            "what-if evaluation finished"
        );
        *e.progress.lock() = Progress { status, result, error, promotion, wall_ms: Some(wall_ms) };
        evaluations2.release(&e);
    });
    if let Err(err) = spawned {
        evaluation.progress.lock().status = EvaluationStatus::Failed;
        evaluations.release(&evaluation);
        return Err(EvaluateError::Thread(err));
    }
    tracing::info!(app = app_name, evaluation = evaluation.id, policy = req.policy, "what-if evaluation started");
    Ok(Started {
        id: evaluation.id,
        app: app_name.to_string(),
        status: EvaluationStatus::Running,
        requests: evaluation.requests,
        location: format!("/admin/evaluations/{}", evaluation.id),
    })
}

/// Swaps the candidate in when `rule` holds and nobody swapped the app since the
/// evaluation started; says why in every case.
async fn promote(
    app: &Arc<App>,
    candidate: &PolicyUnderTest,
    generation: u64,
    c: &Comparison,
    rule: PromoteIf,
) -> Promotion {
    let (ok, reason) = c.verdict(&rule);
    let refused = |reason: String| Promotion { rule, promoted: false, reason, swap: None };
    if !ok {
        return refused(reason);
    }
    let now = app.binding.lock().generation;
    if now != generation {
        return refused(format!(
            "not promoted: the app's policy changed while the replay ran (generation {generation} -> {now}); the comparison no longer holds"
        ));
    }
    let Some(compiled) = candidate.compiled.clone() else {
        return refused("not promoted: the candidate is the safe policy, which is not swapped in".into());
    };
    match app.swap_policy(compiled, candidate.params.clone()).await {
        Ok(report) => {
            tracing::info!(app = app.name(), policy = report.policy, generation = report.generation, "{reason}");
            Promotion { rule, promoted: true, reason, swap: Some(report) }
        }
        Err(e) => refused(format!("not promoted: the swap failed, the app keeps its policy: {e}")),
    }
}

/// The nice value of an evaluation's threads.
const EVALUATION_NICE: i32 = 10;

/// An evaluation is background work: its thread runs at nice [`EVALUATION_NICE`], so
/// that when the cores are contended the scheduler serves the workers and the
/// HTTP front first (on Linux the nice value is per thread; the threads a split
/// replay starts inherit it). Where it cannot be lowered the evaluation runs anyway.
fn run_in_background() {
    // `None`: the calling thread (Linux applies `setpriority(PRIO_PROCESS, 0)` to the
    // calling thread only, see setpriority(2), BUGS).
    if let Err(e) = rustix::process::setpriority_process(None, EVALUATION_NICE) {
        tracing::debug!("an evaluation thread could not lower its priority: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluate_errors_name_the_field_and_say_whose_fault() {
        let e = params_of(Some(Value::from(3)), "against.params").unwrap_err();
        assert_eq!(e.to_string(), "against.params must be a JSON object, got 3");
        assert!(e.is_bad_request() && !e.is_conflict());
        let e = against_of(Some(serde_json::json!({ "policy": "fixed", "mode": 1 }))).err().expect("an error");
        assert_eq!(e.to_string(), "against: unknown field `mode`");
        let e = against_of(Some(Value::from("previous"))).err().expect("an error");
        assert_eq!(e.to_string(), r#"against: expected "current" or {"policy": "...", "params": {...}}"#);
        assert_eq!(EvaluateError::Window(0.0).to_string(), "window_s: expected 0 < window_s <= 86400");
        let e = EvaluateError::NoArrivals { app: "img".into(), window_s: 60.0 };
        assert_eq!(e.to_string(), "app img: no arrivals recorded in the last 60 s; nothing to replay");
        assert!(e.is_conflict() && !e.is_bad_request());
        let busy = busy("img", 4);
        assert!(!busy.is_conflict() && !busy.is_bad_request(), "busy has its own answer, with the running id");
    }
}

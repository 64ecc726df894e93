//! The operator's dashboard: `GET /dashboard` serves the page (its files are
//! embedded in the binary by `sluice_dashboard`), and `GET /admin/dashboard`
//! (behind the admin token, like all of `/admin`) is the one JSON the page polls.
//!
//! Why the page itself is served without the token: it holds no data, only the
//! login form and the script. The token typed into the form stays in the
//! script's memory and goes out as an `Authorization` header on each poll; it is
//! never put in a URL, a cookie or storage, so closing the tab forgets it. Every
//! string the page shows is set as text (`textContent`), never parsed as HTML,
//! and the Content-Security-Policy ([`sluice_dashboard::CSP`]) forbids inline
//! script and any other origin, so a policy's `status` or a name cannot run code.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};

use crate::api::{app_of, ApiError, Body};
use crate::state::State;
use sluice_core::clock::Clock as _;
use sluice_core::decision::WorkerPolicy;
use sluice_core::outcome::Outcome;

/// Serves `/dashboard` (the page) and `/dashboard/<file>` (what it loads).
pub fn asset(file: Option<&str>) -> Result<Response<Body>, ApiError> {
    let name = file.unwrap_or("index.html");
    let asset =
        sluice_dashboard::asset(name).ok_or_else(|| ApiError::not_found(format!("no dashboard file `{name}`")))?;
    let mut r = Response::new(Full::new(Bytes::from_static(asset.bytes)));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    h.insert(HeaderName::from_static("content-security-policy"), HeaderValue::from_static(sluice_dashboard::CSP));
    h.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    h.insert(HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY"));
    h.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
    // The files change only with the binary; the page is re-read on each visit so
    // an upgraded host serves its own script.
    let cache = if name == "index.html" { "no-store" } else { "private, max-age=300" };
    h.insert(hyper::header::CACHE_CONTROL, HeaderValue::from_static(cache));
    Ok(r)
}

/// `GET /admin/dashboard?since=<seq>`: everything the page draws, in one answer,
/// so ten open pages cost the host ten requests a poll rather than dozens.
///
/// - `apps`: each app's `GET /admin/apps/{app}` view, plus `outcomes` (answered
///   requests by outcome, summed over models), `served_by_model` (served and late
///   answers by the variant that served them: the variant mix) and
///   `latency_buckets` (cumulative counts of `sluice_latency_seconds`, with `le`);
///   the page differences two polls for rates and quantiles.
/// - `unserved_outcomes`: the `outcome` values of requests not served, in the
///   order the drops chart draws them ([`Outcome::unserved_metric_labels`]: every
///   drop reason's, then every refusal's), so the page names none itself.
/// - `events`: swaps and re-plans after `since`, for the markers.
/// - `allocation`, `pipelines`, `evaluations`: as their admin routes show them.
/// - `cluster`: the cluster as this host sees it ([`crate::state::ClusterView`]: a frontend's
///   roles, leader, agents and their devices, routing table), or `{"role":
///   "standalone"}` outside a cluster.
///
/// It asks every worker's policy for its `status`: call it off the async threads.
pub fn snapshot(state: &Arc<State>, since: u64) -> Result<Value, ApiError> {
    let mut apps = Vec::new();
    for name in state.apps.keys() {
        let view = app_view_of(state, name)?;
        let mut outcomes = BTreeMap::new();
        let mut served_by_model = BTreeMap::new();
        for (model, outcome, n) in state.metrics.requests_of(name) {
            if outcome == Outcome::METRIC_SERVED || outcome == Outcome::METRIC_LATE {
                *served_by_model.entry(model).or_default() += n;
            }
            *outcomes.entry(outcome).or_default() += n;
        }
        let latency_buckets = LatencyBuckets {
            le: crate::metrics::LATENCY_BUCKETS,
            counts: state.metrics.buckets_of("sluice_latency_seconds", name),
        };
        apps.push(SnapshotApp { view, outcomes, served_by_model, latency_buckets });
    }
    let unix_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let snapshot = Snapshot {
        unix_ms,
        version: env!("CARGO_PKG_VERSION"),
        // Still JSON from its maker: the cluster's view is built in
        // `sluice_cluster`, which this crate cannot name (`state::ClusterView`).
        cluster: state.cluster_view.get().map_or_else(|| json!({ "role": "standalone" }), |view| view()),
        connections_open: state.metrics.connections.open.load(Ordering::Relaxed),
        apps,
        unserved_outcomes: Outcome::unserved_metric_labels(),
        events: state.metrics.events_after(since),
        allocation: state.allocator.view(),
        pipelines: state.pipelines.values().map(|p| p.status()).collect(),
        evaluations: state.evaluations.all().iter().map(|e| e.view()).collect(),
    };
    serde_json::to_value(snapshot).map_err(ApiError::internal)
}

// The views below reach the client through `serde_json::Value` (`api::ok`), whose
// maps sort their keys: the bytes do not depend on the order of the fields, which
// follows the hand-built `json!` they replaced.

/// `GET /admin/dashboard`'s body ([`snapshot`]).
#[derive(Serialize)]
struct Snapshot<'a> {
    /// When it was taken, ms since the Unix epoch.
    unix_ms: u64,
    /// The host's version.
    version: &'static str,
    /// [`crate::state::ClusterView`]'s answer, or `{"role": "standalone"}`.
    cluster: Value,
    /// Connections open now.
    connections_open: u64,
    /// One per app.
    apps: Vec<SnapshotApp<'a>>,
    /// [`Outcome::unserved_metric_labels`].
    unserved_outcomes: Vec<String>,
    /// Swaps and re-plans after `since`.
    events: Vec<crate::metrics::Event>,
    /// As `GET /admin/allocation` shows it.
    allocation: Option<crate::allocation::AllocationView>,
    /// As `GET /admin/pipelines` shows them.
    pipelines: Vec<crate::pipeline::PipelineStatus>,
    /// As `GET /admin/evaluations` shows them.
    evaluations: Vec<crate::evaluate::EvaluationView>,
}

/// An app in the [`Snapshot`]: its [`AppView`] and what the page charts.
#[derive(Serialize)]
struct SnapshotApp<'a> {
    /// `GET /admin/apps/{app}`'s view, its fields at this level.
    #[serde(flatten)]
    view: AppView<'a>,
    /// Answered requests by `sluice_requests_total`'s outcome, summed over models.
    outcomes: BTreeMap<String, u64>,
    /// Served and late answers by the variant that served them.
    served_by_model: BTreeMap<String, u64>,
    /// The cumulative counts of `sluice_latency_seconds`.
    latency_buckets: LatencyBuckets,
}

/// A histogram's cumulative bucket counts and their upper bounds.
#[derive(Serialize)]
struct LatencyBuckets {
    /// Each bucket's upper bound, s.
    le: &'static [f64],
    /// Each bucket's count, then the total.
    counts: Vec<u64>,
}

/// `GET /admin/apps/{app}`'s body (the dashboard's snapshot carries one per app).
/// It asks each worker's policy for its `status` under the worker's slot lock: call
/// it off the async threads.
pub(crate) fn app_view(state: &State, name: &str) -> Result<Value, ApiError> {
    serde_json::to_value(app_view_of(state, name)?).map_err(ApiError::internal)
}

/// An app as `GET /admin/apps/{app}` shows it ([`app_view`]).
#[derive(Serialize)]
struct AppView<'a> {
    /// Its name.
    app: &'a str,
    /// The bound policy's name.
    policy: String,
    /// The bound component's digest.
    digest: Option<String>,
    /// The binding's parameters (null when not JSON).
    params: Value,
    /// The swap generation.
    generation: u64,
    /// Why the policy was unbound, if it was.
    unbound_reason: Option<String>,
    /// What a fault does.
    fail_mode: sluice_core::app_config::FailMode,
    /// How arrivals are spread.
    router: sluice_core::router::RouterMode,
    /// The weighted router's weights (null for another router).
    weights: Option<Vec<f64>>,
    /// The SLO, ms.
    slo_ms: f64,
    /// The arrival rate now, requests/s.
    load_qps: f64,
    /// Each worker's queue length.
    queue_lengths: Vec<usize>,
    /// Requests queued in all.
    queued: usize,
    /// Each worker.
    workers: Vec<WorkerStatus<'a>>,
    /// Each variant as policies see it.
    models: Vec<ModelStatus<'a>>,
    /// The app's counters.
    counters: CountersView,
    /// Requests admitted to check a refusal (`admission_audit`), and how many of
    /// them made their deadline: refusals that would have been false.
    admission_audit: AuditView,
    /// The longest a worker waited on a swap, µs.
    swap_max_wait_us: f64,
    /// The bytes in the binding's shared store.
    shared_store_bytes: Option<usize>,
    /// The arrival ring, when the app keeps one.
    arrival_ring: Option<crate::app::RingView>,
}

/// A worker in an [`AppView`].
#[derive(Serialize)]
struct WorkerStatus<'a> {
    /// Its index.
    index: u32,
    /// The variants it has loaded.
    loaded: Vec<&'a str>,
    /// Its queue's length.
    queue: usize,
    /// Requests in its running batch.
    in_flight: usize,
    /// Its policy's `status` (JSON when it parses; null for none).
    policy_status: Value,
    /// Times its policy instance was re-instantiated after a fault.
    revivals: u64,
    /// Whether it is being re-instantiated now.
    reviving: bool,
}

/// A variant in an [`AppView`].
#[derive(Serialize)]
struct ModelStatus<'a> {
    /// Its id.
    id: u32,
    /// Its name.
    name: &'a str,
    /// Its profiled accuracy.
    accuracy: f64,
    /// Its profiled latency by batch size, µs.
    latency_us: &'a [u64],
}

/// [`crate::app::AppCounters`] read once.
#[derive(Serialize)]
struct CountersView {
    accepted: u64,
    served: u64,
    late: u64,
    dropped: u64,
    rejected: u64,
    faults: u64,
    swaps: u64,
    reviving_decisions: u64,
    inline_decisions: u64,
    rejected_overload: u64,
}

/// The admission audit's counts.
#[derive(Serialize)]
struct AuditView {
    /// Requests admitted to check a refusal.
    audited: u64,
    /// Of them, served by their deadline.
    met: u64,
}

/// App `name`'s [`AppView`].
fn app_view_of<'a>(state: &'a State, name: &str) -> Result<AppView<'a>, ApiError> {
    let a = app_of(state, name)?;
    let b = a.binding.lock().clone();
    let c = &a.counters;
    let load = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    let workers = a
        .workers
        .iter()
        .map(|w| {
            let loaded = w.loaded.lock().iter().map(|id| a.models[*id as usize].name.as_str()).collect();
            // Asked under the worker's slot lock, between two of its decisions.
            let (policy_status, revivals, reviving) = match &mut w.slot.lock().current {
                WorkerPolicy::Wasm(instance) => {
                    let status = match instance.status() {
                        Ok(Some(s)) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
                        Ok(None) => Value::Null,
                        Err(fault) => json!({ "error": fault.to_string() }),
                    };
                    (status, instance.revivals(), instance.reviving())
                }
                WorkerPolicy::Safe => (Value::Null, 0, false),
            };
            WorkerStatus {
                index: w.index,
                loaded,
                queue: w.queue.len(),
                in_flight: w.in_flight.load(Ordering::Relaxed),
                policy_status,
                revivals,
                reviving,
            }
        })
        .collect();
    Ok(AppView {
        app: a.name(),
        params: serde_json::from_str::<Value>(&b.params).unwrap_or(Value::Null),
        policy: b.policy,
        digest: b.digest,
        generation: b.generation,
        unbound_reason: b.unbound_reason,
        fail_mode: a.config.fail_mode,
        router: a.config.router,
        weights: (a.router.mode() == sluice_core::router::RouterMode::Weighted).then(|| a.router.weights()),
        slo_ms: a.config.slo_ms,
        load_qps: a.load.rate(a.clock.now()),
        queue_lengths: a.queue_lengths(),
        queued: a.queued.load(Ordering::Relaxed),
        workers,
        models: a
            .models
            .iter()
            .map(|m| ModelStatus { id: m.id, name: &m.name, accuracy: m.accuracy, latency_us: &m.latency })
            .collect(),
        counters: CountersView {
            accepted: load(&c.accepted),
            served: load(&c.served),
            late: load(&c.late),
            dropped: load(&c.dropped),
            rejected: load(&c.rejected),
            faults: load(&c.faults),
            swaps: load(&c.swaps),
            reviving_decisions: load(&c.reviving_decisions),
            inline_decisions: load(&c.inline_decisions),
            rejected_overload: load(&c.rejected_overload),
        },
        admission_audit: AuditView { audited: load(&c.audited), met: load(&c.audited_met) },
        swap_max_wait_us: load(&c.swap_max_wait_ns) as f64 / 1e3,
        shared_store_bytes: b.shared.as_ref().map(|s| s.bytes()),
        arrival_ring: a.ring.get().map(|r| r.view()),
    })
}

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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use crate::api::{app_of, ApiError, Body};
use crate::state::State;
use sluice_core::clock::Clock as _;
use sluice_core::decision::WorkerPolicy;

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
        let mut view = app_view(state, name)?;
        let mut outcomes = serde_json::Map::new();
        let mut by_model = serde_json::Map::new();
        for (model, outcome, n) in state.metrics.requests_of(name) {
            let o = outcomes.entry(outcome.clone()).or_insert(json!(0));
            *o = json!(o.as_u64().unwrap_or(0) + n);
            if outcome == "served" || outcome == "late" {
                let m = by_model.entry(model).or_insert(json!(0));
                *m = json!(m.as_u64().unwrap_or(0) + n);
            }
        }
        if let Value::Object(v) = &mut view {
            v.insert("outcomes".into(), Value::Object(outcomes));
            v.insert("served_by_model".into(), Value::Object(by_model));
            v.insert(
                "latency_buckets".into(),
                json!({
                    "le": crate::metrics::LATENCY_BUCKETS,
                    "counts": state.metrics.buckets_of("sluice_latency_seconds", name),
                }),
            );
        }
        apps.push(view);
    }
    let pipelines: Vec<crate::pipeline::PipelineStatus> = state.pipelines.values().map(|p| p.status()).collect();
    let evaluations: Vec<crate::evaluate::EvaluationView> = state.evaluations.all().iter().map(|e| e.view()).collect();
    let unix_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    Ok(json!({
        "unix_ms": unix_ms,
        "version": env!("CARGO_PKG_VERSION"),
        "cluster": state.cluster_view.get().map_or_else(|| json!({ "role": "standalone" }), |view| view()),
        "connections_open": state.metrics.connections.open.load(Ordering::Relaxed),
        "apps": apps,
        "events": state.metrics.events_after(since),
        "allocation": state.allocator.view(),
        "pipelines": pipelines,
        "evaluations": evaluations,
    }))
}

/// `GET /admin/apps/{app}`'s body (the dashboard's snapshot carries one per app).
/// It asks each worker's policy for its `status` under the worker's slot lock: call
/// it off the async threads.
pub(crate) fn app_view(state: &State, name: &str) -> Result<Value, ApiError> {
    let a = app_of(state, name)?;
    let b = a.binding.lock().clone();
    let c = &a.counters;
    let load = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    let workers: Vec<Value> = a
        .workers
        .iter()
        .map(|w| {
            let loaded: Vec<&str> = w.loaded.lock().iter().map(|id| a.models[*id as usize].name.as_str()).collect();
            // Asked under the worker's slot lock, between two of its decisions.
            let (status, revivals, reviving) = match &mut w.slot.lock().current {
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
            json!({
                "index": w.index,
                "loaded": loaded,
                "queue": w.queue.len(),
                "in_flight": w.in_flight.load(Ordering::Relaxed),
                "policy_status": status,
                "revivals": revivals,
                "reviving": reviving,
            })
        })
        .collect();
    Ok(json!({
        "app": a.name(),
        "policy": b.policy,
        "digest": b.digest,
        "params": serde_json::from_str::<Value>(&b.params).unwrap_or(Value::Null),
        "generation": b.generation,
        "unbound_reason": b.unbound_reason,
        "fail_mode": a.config.fail_mode,
        "router": a.config.router,
        "weights": (a.router.mode() == sluice_core::router::RouterMode::Weighted).then(|| a.router.weights()),
        "slo_ms": a.config.slo_ms,
        "load_qps": a.load.rate(a.clock.now()),
        "queue_lengths": a.queue_lengths(),
        "queued": a.queued.load(Ordering::Relaxed),
        "workers": workers,
        "models": a.models.iter().map(|m| json!({ "id": m.id, "name": m.name, "accuracy": m.accuracy, "latency_us": m.latency })).collect::<Vec<_>>(),
        "counters": {
            "accepted": load(&c.accepted),
            "served": load(&c.served),
            "late": load(&c.late),
            "dropped": load(&c.dropped),
            "rejected": load(&c.rejected),
            "faults": load(&c.faults),
            "swaps": load(&c.swaps),
            "reviving_decisions": load(&c.reviving_decisions),
            "inline_decisions": load(&c.inline_decisions),
            "rejected_overload": load(&c.rejected_overload),
        },
        // Requests admitted to check a refusal (`admission_audit`), and how many of
        // them made their deadline: refusals that would have been false.
        "admission_audit": { "audited": load(&c.audited), "met": load(&c.audited_met) },
        "swap_max_wait_us": load(&c.swap_max_wait_ns) as f64 / 1e3,
        "shared_store_bytes": b.shared.as_ref().map(|s| s.bytes()),
        "arrival_ring": a.ring.get().map(|r| r.view()),
    }))
}

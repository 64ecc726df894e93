//! The admin API (behind the bearer token): upload and list policies, hot-swap an
//! app's policy, inspect an app, change a worker's loaded models, and what-if
//! evaluations ([`crate::evaluate`]).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{app_of, ok, parse_json, read_body, read_body_up_to, registry_error, ApiError, Body};
use crate::state::State;
use sluice_core::runtime::PolicyError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SwapRequest {
    policy: String,
    #[serde(default)]
    params: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsRequest {
    models: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SolveRequest {
    /// Demand per app to plan for instead of the forecast.
    demand_qps: std::collections::BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineSolveRequest {
    /// Requests/s entering the pipeline to plan for instead of the measured demand.
    demand_qps: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsRequest {
    weights: Vec<f64>,
}

fn query_param(req: &Request<Incoming>, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

/// Routes `/admin/...` (the token was already checked).
pub async fn route(state: &Arc<State>, req: Request<Incoming>, rest: &[&str]) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::GET, ["policies"]) => ok(json!({ "policies": state.registry.list() })),
        (&Method::POST, ["policies"]) => {
            // The name is judged from the head: a refused upload (no name, a bad,
            // reserved or built-in one) costs no transfer.
            let refusal = match query_param(&req, "name") {
                None => ApiError::bad_request("missing ?name=<policy name>"),
                Some(name) => match state.registry.check_upload_name(&name) {
                    Ok(()) => return upload(state, req, name).await,
                    Err(e) => registry_error(e),
                },
            };
            Ok(crate::api::refuse_before_body(state, req, refusal).await)
        }
        (&Method::GET, ["apps"]) => ok(json!({ "apps": state.apps.keys().collect::<Vec<_>>() })),
        // Off the async threads: a policy's `status` runs under its worker's slot
        // lock, which a deciding worker holds for up to one call's budget.
        (&Method::GET, ["apps", app]) => {
            let (state, app) = (state.clone(), app.to_string());
            tokio::task::spawn_blocking(move || app_status(&state, &app)).await.map_err(ApiError::internal)?
        }
        (&Method::PUT, ["apps", app, "policy"]) => {
            let a = app_of(state, app)?.clone();
            let body = read_body(state, req).await?;
            let swap: SwapRequest = parse_json(&body)?;
            let params = match swap.params {
                None => "{}".to_string(),
                Some(v @ Value::Object(_)) => v.to_string(),
                Some(other) => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("params must be a JSON object, got {other}"),
                    ))
                }
            };
            let registry = state.registry.clone();
            let name = swap.policy.clone();
            let lookup = std::time::Instant::now();
            let compiled = tokio::task::spawn_blocking(move || registry.get(&name))
                .await
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                .map_err(registry_error)?;
            // Compiled now, or found in the cache: what this swap actually paid.
            let compile_ms = lookup.elapsed().as_secs_f64() * 1e3;
            let mut report = a.swap_policy(compiled, params).await.map_err(|e| {
                let status = match e {
                    PolicyError::Init { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                    _ => StatusCode::BAD_REQUEST,
                };
                ApiError {
                    status,
                    message: format!("swap refused, {} keeps its policy: {e}", a.name()),
                    extra: None,
                    allow: None,
                }
            })?;
            report.compile_ms = compile_ms;
            tracing::info!(app = a.name(), policy = report.policy, generation = report.generation, "policy swapped");
            ok(serde_json::to_value(report).unwrap_or(Value::Null))
        }
        (&Method::POST, ["apps", app, "evaluate"]) => {
            let app = app.to_string();
            let body = read_body(state, req).await?;
            let request = (parse_json(&body)?, serde_json::from_slice(&body).unwrap_or(Value::Null));
            let started =
                crate::evaluate::start(&state.evaluations, &state.apps, &state.registry, &app, request).await?;
            Ok(with_status(StatusCode::ACCEPTED, serde_json::to_value(started).map_err(ApiError::internal)?))
        }
        // The dashboard's one poll: every app's view, the counters it draws, the
        // events after `?since=`, the allocator, pipelines and evaluations.
        (&Method::GET, ["dashboard"]) => {
            let since = query_param(&req, "since").and_then(|s| s.parse().ok()).unwrap_or(0);
            let state = state.clone();
            tokio::task::spawn_blocking(move || crate::dashboard::snapshot(&state, since).and_then(ok))
                .await
                .map_err(ApiError::internal)?
        }
        (&Method::GET, ["evaluations"]) => ok(json!({ "evaluations": state.evaluations.list() })),
        (&Method::GET, ["evaluations", id]) => view(&evaluation_of(state, id)?.view()),
        (&Method::DELETE, ["evaluations", id]) => {
            let e = evaluation_of(state, id)?;
            if e.status() == crate::evaluate::EvaluationStatus::Running {
                e.cancel();
                tracing::info!(app = e.app, evaluation = e.id, "what-if evaluation cancelled");
                Ok(with_status(StatusCode::ACCEPTED, json!({ "id": e.id, "status": "cancelling" })))
            } else {
                state.evaluations.forget(e.id);
                ok(json!({ "id": e.id, "status": "forgotten" }))
            }
        }
        (&Method::PUT, ["apps", app, "workers", w, "models"]) => {
            let w: usize = w
                .parse()
                .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("worker index `{w}` is not a number")))?;
            let app = app.to_string();
            let body = read_body(state, req).await?;
            let m: ModelsRequest = parse_json(&body)?;
            let ids = state
                .set_worker_models(&app, w, &m.models)
                .await
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
            ok(json!({ "app": app, "worker": w, "loaded": ids }))
        }
        (&Method::POST, ["allocation", "solve"]) => {
            let body = read_body(state, req).await?;
            let demand = if body.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                Some(parse_json::<SolveRequest>(&body)?.demand_qps)
            };
            view(&state.allocator.replan("admin", demand).await?)
        }
        (&Method::GET, ["pipelines"]) => ok(json!({ "pipelines": state.pipelines.keys().collect::<Vec<_>>() })),
        (&Method::GET, ["pipelines", name]) => view(&pipeline_of(state, name)?.status()),
        (&Method::POST, ["pipelines", name, "solve"]) => {
            let p = pipeline_of(state, name)?.clone();
            let body = read_body(state, req).await?;
            let demand = if body.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                Some(parse_json::<PipelineSolveRequest>(&body)?.demand_qps)
            };
            p.replan("admin", demand).await.map(|s| view(&s)).map_err(|e| ApiError {
                status: if e.is_bad_request() { StatusCode::BAD_REQUEST } else { StatusCode::CONFLICT },
                message: format!("pipeline {}: {e}", p.name()),
                extra: None,
                allow: None,
            })?
        }
        (&Method::GET, ["allocation"]) => match &state.allocator.view() {
            Some(v) => view(v),
            None => Err(ApiError::new(StatusCode::NOT_FOUND, "no allocator: the config has no [[device]]")),
        },
        (&Method::PUT, ["apps", app, "weights"]) => {
            let a = app_of(state, app)?.clone();
            let body = read_body(state, req).await?;
            let m: WeightsRequest = parse_json(&body)?;
            a.router
                .set_weights(&m.weights)
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("app {}: weights: {e}", a.name())))?;
            tracing::info!(app = a.name(), weights = ?m.weights, "routing weights set");
            ok(json!({ "app": a.name(), "weights": a.router.weights() }))
        }
        _ => {
            Err(ApiError::new(StatusCode::NOT_FOUND, format!("no admin route for {method} /admin/{}", rest.join("/"))))
        }
    }
}

/// `POST /admin/policies?name=...` once the name was accepted: reads, compiles and
/// stores the component.
async fn upload(state: &State, req: Request<Incoming>, name: String) -> Result<Response<Body>, ApiError> {
    // Up to the registry's limit, not `max_body_bytes` (a limit for inference
    // bodies): a Python component carries CPython (~18 MB), and the upload is an
    // operator's, behind the admin token.
    let body = read_body_up_to(state, req, sluice_core::registry::MAX_POLICY_BYTES).await?;
    let registry = state.registry.clone();
    let n = name.clone();
    // Compilation takes tens of milliseconds: keep it off the async threads.
    let compiled = tokio::task::spawn_blocking(move || registry.upload(&n, &body))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(registry_error)?;
    tracing::info!(policy = name, digest = compiled.digest, "policy uploaded");
    Ok(with_status(
        StatusCode::CREATED,
        json!({
            "name": compiled.name,
            "digest": compiled.digest,
            "size": compiled.size,
            "compile_ms": compiled.compile_time.as_secs_f64() * 1e3,
        }),
    ))
}

fn pipeline_of<'a>(state: &'a State, name: &str) -> Result<&'a Arc<crate::pipeline::PipelineApp>, ApiError> {
    state.pipelines.get(name).ok_or_else(|| {
        let known: Vec<&str> = state.pipelines.keys().map(String::as_str).collect();
        ApiError::not_found(format!("unknown pipeline `{name}` (served: {})", known.join(", ")))
    })
}

fn evaluation_of(state: &State, id: &str) -> Result<Arc<crate::evaluate::Evaluation>, ApiError> {
    let n: u64 = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("evaluation id `{id}` is not a number")))?;
    state.evaluations.get(n).ok_or_else(|| {
        ApiError::not_found(format!(
            "no evaluation {n} (finished ones are kept up to evaluations_kept = {})",
            state.config.evaluations_kept
        ))
    })
}

/// A re-plan refused: a bad demand is the client's (400); no allocator, or a plan that
/// could not be applied, is a conflict with the host's state (409).
impl From<crate::allocation::ReplanError> for ApiError {
    fn from(e: crate::allocation::ReplanError) -> ApiError {
        let status = if e.is_bad_request() { StatusCode::BAD_REQUEST } else { StatusCode::CONFLICT };
        ApiError::new(status, e.to_string())
    }
}

/// A typed admin view answered as JSON: the views are serialised here, at the edge.
fn view<T: serde::Serialize>(v: &T) -> Result<Response<Body>, ApiError> {
    ok(serde_json::to_value(v).map_err(ApiError::internal)?)
}

fn with_status(status: StatusCode, body: Value) -> Response<Body> {
    let mut r = ok(body).unwrap_or_else(|e| Response::new(Body::from(e.message)));
    *r.status_mut() = status;
    r
}

fn app_status(state: &State, name: &str) -> Result<Response<Body>, ApiError> {
    ok(crate::dashboard::app_view(state, name)?)
}

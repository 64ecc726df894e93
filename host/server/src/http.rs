//! The HTTP front: routing, the Open Inference Protocol, the simple `/infer`
//! endpoint and metrics; `/admin` is handed to [`crate::admin`]. Errors are
//! [`ApiError`]s (`crate::api`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{app_of, json_response, ok, parse_json, read_body, ApiError, Body};
use crate::app::{AdmitError, App};
use crate::binary;
use crate::config::InputSpec;
use crate::pipeline::PipelineApp;
use crate::state::State;
use sluice_core::executor::OUTPUT_NAME;
use sluice_core::queue::{DropReason, Reply};
use sluice_core::tensor::{DataType, Tensor, TensorData};

/// Routes one request.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    match route(&state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn route(state: &Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    // With a separate admin listener, each listener serves its own half.
    if state.config.admin_listen.is_some() {
        let on_admin = req.extensions().get::<crate::api::AdminListener>().is_some();
        let admin_route = matches!(segments.as_slice(), ["admin", ..] | ["metrics"]);
        if on_admin && !admin_route {
            return Err(ApiError::not_found(format!(
                "no route for {method} {path} on the admin listener (it serves /admin and /metrics)"
            )));
        }
        if !on_admin && segments.first() == Some(&"admin") {
            return Err(ApiError::not_found(format!("no route for {method} {path}")));
        }
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v2", "health", "live"]) => ok(json!({ "live": true })),
        (&Method::GET, ["v2", "health", "ready"]) => {
            let ready = state.apps.values().all(|a| a.accepting.load(Ordering::Acquire));
            let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            Ok(json_response(status, &json!({ "ready": ready })))
        }
        (&Method::GET, ["v2"]) => {
            ok(json!({ "name": "sluice", "version": env!("CARGO_PKG_VERSION"), "extensions": [] }))
        }
        (&Method::GET, ["v2", "models", app]) => match state.pipelines.get(*app) {
            Some(p) => pipeline_metadata(p),
            None => model_metadata(app_of(state, app)?),
        },
        (&Method::GET, ["v2", "models", app, "ready"]) => {
            let ready = match state.pipelines.get(*app) {
                Some(p) => p.accepting.load(Ordering::Acquire),
                None => app_of(state, app)?.accepting.load(Ordering::Acquire),
            };
            let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            Ok(json_response(status, &json!({ "name": app, "ready": ready })))
        }
        (&Method::POST, ["v2", "models", app, "infer"]) => {
            let arrived = std::time::Instant::now();
            // Errors found before the body is read (an unknown app, an overloaded
            // one, a bad framing header, no room to read it) are answered after
            // reading it, so a client still sending sees the answer, not a reset.
            let admitted = target(state, app).and_then(|t| t.precheck().map_err(admit_error).map(|()| t));
            let early = admitted.and_then(|t| {
                let budget = crate::api::reserve_body(state, &req)?;
                Ok((t, budget, binary::header_length(&req)?))
            });
            let (target, budget, json_len) = match early {
                Ok(x) => x,
                Err(e) => return Err(discard_body(state, req, e).await),
            };
            let (request, data) = {
                let _budget = budget;
                let (json, data) = binary::split(read_body(state, req).await?, json_len)?;
                (parse_off_thread::<InferRequest>(json).await?, data)
            };
            target.infer(request, data, arrived).await
        }
        (&Method::POST, ["infer"]) => {
            let arrived = std::time::Instant::now();
            let (request, data) = {
                let _budget = crate::api::reserve_body(state, &req)?;
                let json_len = binary::header_length(&req)?;
                let (json, data) = binary::split(read_body(state, req).await?, json_len)?;
                (parse_off_thread::<SimpleInferRequest>(json).await?, data)
            };
            let target = target(state, &request.app)?;
            let request = InferRequest {
                id: request.id,
                inputs: request.inputs,
                outputs: request.outputs,
                parameters: request.parameters,
            };
            target.infer(request, data, arrived).await
        }
        (&Method::GET, ["metrics"]) => {
            let mut text = state.metrics.render();
            queue_gauges(state, &mut text);
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(r)
        }
        (_, ["admin", ..]) => {
            authorize(state, &req)?;
            crate::admin::route(state, req, &segments[1..]).await
        }
        (_, route) => match allowed(route) {
            // A known route with another method: 405 naming the one it takes, unless
            // it names an app that does not exist (then 404, as for every method).
            Some(allow) => {
                if let ["v2", "models", app, ..] = route {
                    if !state.pipelines.contains_key(*app) {
                        app_of(state, app)?;
                    }
                }
                Err(ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("{method} not allowed on {path}; use {allow}"),
                )
                .with_allow(allow))
            }
            None => Err(ApiError::not_found(format!("no route for {method} {path}"))),
        },
    }
}

/// Gauges read from the apps when scraped: requests queued and in running batches.
fn queue_gauges(state: &State, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "# HELP sluice_queue_depth Requests queued, by app.\n# TYPE sluice_queue_depth gauge");
    for (name, app) in &state.apps {
        let _ = writeln!(out, "sluice_queue_depth{{app=\"{name}\"}} {}", app.queued.load(Ordering::Relaxed));
    }
    let _ =
        writeln!(out, "# HELP sluice_in_flight Requests in running batches, by app.\n# TYPE sluice_in_flight gauge");
    for (name, app) in &state.apps {
        let running: usize = app.workers.iter().map(|w| w.in_flight.load(Ordering::Relaxed)).sum();
        let _ = writeln!(out, "sluice_in_flight{{app=\"{name}\"}} {running}");
    }
}

/// The method a known route takes (None: no such route).
fn allowed(route: &[&str]) -> Option<&'static str> {
    match route {
        ["v2"]
        | ["v2", "health", "live" | "ready"]
        | ["v2", "models", _]
        | ["v2", "models", _, "ready"]
        | ["metrics"] => Some("GET"),
        ["v2", "models", _, "infer"] | ["infer"] => Some("POST"),
        _ => None,
    }
}

fn authorize(state: &State, req: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(token) = &state.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin API disabled: set admin_token in the config or SLUICE_ADMIN_TOKEN",
        ));
    };
    let ip = req.extensions().get::<crate::api::Peer>().map(|p| p.0.ip());
    if let Some(wait) = ip.and_then(|ip| state.logins.blocked(ip)) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("too many failed admin logins from this address; retry in {wait} s"),
        ));
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let refused = match given {
        // Constant-time comparison: the token must not leak through timing.
        Some(g)
            if g.len() == token.len() && g.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0 =>
        {
            return Ok(());
        }
        Some(_) => "invalid admin token",
        None => "admin API requires `Authorization: Bearer <token>`",
    };
    if let Some(ip) = ip {
        state.logins.failed(ip, refused);
    }
    Err(ApiError::new(StatusCode::UNAUTHORIZED, refused))
}

/// An Open Inference Protocol inference request.
#[derive(Deserialize)]
struct InferRequest {
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<InputTensor>,
    /// Requested outputs: every app answers with one, [`OUTPUT_NAME`]; another
    /// name is refused. `parameters.binary_data` asks for it in binary.
    #[serde(default)]
    outputs: Option<Vec<RequestedOutput>>,
    /// Request parameters: `binary_data_output` is honoured; others are accepted
    /// and not used.
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct RequestedOutput {
    name: String,
    #[serde(default)]
    parameters: Option<Value>,
}

/// The simple `/infer` request: the OIP body plus the app name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimpleInferRequest {
    app: String,
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<InputTensor>,
    #[serde(default)]
    outputs: Option<Vec<RequestedOutput>>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct InputTensor {
    name: String,
    shape: Vec<usize>,
    datatype: String,
    /// JSON data; absent when `parameters.binary_data_size` puts it after the JSON.
    #[serde(default)]
    data: Option<FlatNumbers>,
    #[serde(default)]
    parameters: Option<Value>,
}

/// Tensor data, flat or nested (the protocol allows both), flattened while parsing
/// so a large image never becomes a tree of `serde_json::Value`s.
struct FlatNumbers(Vec<f64>);

impl<'de> Deserialize<'de> for FlatNumbers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(&'a mut Vec<f64>);
        impl<'de> de::DeserializeSeed<'de> for V<'_> {
            type Value = ();
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(self)
            }
        }
        impl<'de> Visitor<'de> for V<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("numbers or (nested) arrays of numbers")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
                self.0.push(v);
                Ok(())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
                self.0.push(v as f64);
                Ok(())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
                self.0.push(v as f64);
                Ok(())
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
                self.0.push(if v { 1.0 } else { 0.0 });
                Ok(())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                if let Some(n) = seq.size_hint() {
                    self.0.reserve(n);
                }
                while seq.next_element_seed(V(&mut *self.0))?.is_some() {}
                Ok(())
            }
        }
        let mut out = Vec::new();
        de::DeserializeSeed::deserialize(V(&mut out), d)?;
        Ok(FlatNumbers(out))
    }
}

/// Checks a request's tensor against the app's input and converts it.
fn to_tensor(app: &str, spec: &InputSpec, inputs: Vec<InputTensor>, binary: Bytes) -> Result<Tensor, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("app {app}: {m}"));
    let mut inputs = inputs;
    if inputs.len() != 1 {
        return Err(bad(format!("expected exactly 1 input tensor (`{}`), got {}", spec.name, inputs.len())));
    }
    let input = inputs.pop().expect("one input");
    if !binary.is_empty() && input.parameters.as_ref().and_then(|p| p.get("binary_data_size")).is_none() {
        return Err(bad(format!("{} bytes of binary data but no input has binary_data_size", binary.len())));
    }
    if input.name != spec.name {
        return Err(bad(format!("unknown input `{}`; expected `{}`", input.name, spec.name)));
    }
    let datatype = DataType::from_oip(&input.datatype)
        .ok_or_else(|| bad(format!("input `{}`: unknown datatype `{}`", input.name, input.datatype)))?;
    if datatype.oip_name() != spec.datatype {
        return Err(bad(format!(
            "input `{}`: datatype {} but the app expects {}",
            input.name, input.datatype, spec.datatype
        )));
    }
    // One sample per request: `[1, ...spec]` or `[...spec]`.
    let shape = if input.shape.len() == spec.shape.len() {
        let mut s = vec![1];
        s.extend(&input.shape);
        s
    } else {
        input.shape.clone()
    };
    if shape.len() != spec.shape.len() + 1 || shape[0] != 1 || shape[1..] != spec.shape[..] {
        let mut want = vec![1];
        want.extend(&spec.shape);
        return Err(bad(format!(
            "input `{}`: shape {:?} but the app expects {:?} (one sample per request; sluice forms batches itself)",
            input.name, input.shape, want
        )));
    }
    let n: usize = shape.iter().product();
    let size = binary::data_size(input.parameters.as_ref()).map_err(|m| bad(format!("input `{}`: {m}", input.name)))?;
    let data = match (input.data, size) {
        (Some(_), Some(_)) => {
            return Err(bad(format!("input `{}`: both `data` and binary_data_size given", input.name)));
        }
        (None, None) => return Err(bad(format!("input `{}`: no `data` (nor binary_data_size)", input.name))),
        (Some(FlatNumbers(values)), None) => {
            if values.len() != n {
                return Err(bad(format!(
                    "input `{}`: shape {:?} needs {n} elements, data has {}",
                    input.name,
                    input.shape,
                    values.len()
                )));
            }
            convert(datatype, values).map_err(|m| bad(format!("input `{}`: {m}", input.name)))?
        }
        (None, Some(size)) => {
            // One input per request, so its bytes are all the binary data there is.
            let want = n * TensorData::width(datatype);
            if size != want || binary.len() != size {
                return Err(bad(format!(
                    "input `{}`: shape {:?} of {} needs {want} bytes; binary_data_size is {size} and the body carries {}",
                    input.name,
                    input.shape,
                    datatype.oip_name(),
                    binary.len()
                )));
            }
            let data = TensorData::from_le_bytes(datatype, &binary)
                .map_err(|m| bad(format!("input `{}`: {m}", input.name)))?;
            if let Some(i) = data.first_non_finite() {
                return Err(bad(format!("input `{}`: element {i} is not a finite number", input.name)));
            }
            data
        }
    };
    Ok(Tensor { name: input.name, shape, data })
}

fn convert(datatype: DataType, values: Vec<f64>) -> Result<TensorData, String> {
    let int = |v: f64, lo: f64, hi: f64| -> Result<f64, String> {
        if v.fract() != 0.0 || v < lo || v > hi {
            Err(format!("{v} is not a valid {}", datatype.oip_name()))
        } else {
            Ok(v)
        }
    };
    Ok(match datatype {
        // JSON numbers parse as f64; one beyond the FP32 range would become ±inf (and
        // an output of `null`s, which is not valid JSON tensor data): refuse it.
        DataType::F32 => {
            if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite() || v.abs() > f32::MAX as f64) {
                return Err(format!("element {i}: {v:e} is outside the FP32 range"));
            }
            TensorData::F32(values.into_iter().map(|v| v as f32).collect())
        }
        DataType::F64 => TensorData::F64(values),
        DataType::I32 => TensorData::I32(
            values
                .into_iter()
                .map(|v| int(v, i32::MIN as f64, i32::MAX as f64).map(|v| v as i32))
                .collect::<Result<_, _>>()?,
        ),
        // Above 2^53 a JSON number is not exact in f64; refuse rather than corrupt.
        DataType::I64 => TensorData::I64(
            values
                .into_iter()
                .map(|v| int(v, -9007199254740992.0, 9007199254740992.0).map(|v| v as i64))
                .collect::<Result<_, _>>()?,
        ),
        DataType::U8 => {
            TensorData::U8(values.into_iter().map(|v| int(v, 0.0, 255.0).map(|v| v as u8)).collect::<Result<_, _>>()?)
        }
    })
}

fn tensor_json(t: &Tensor) -> Value {
    let data = match &t.data {
        TensorData::F32(v) => json!(v),
        TensorData::F64(v) => json!(v),
        TensorData::I32(v) => json!(v),
        TensorData::I64(v) => json!(v),
        TensorData::U8(v) => json!(v),
    };
    json!({ "name": t.name, "datatype": t.datatype().oip_name(), "shape": t.shape, "data": data })
}

/// Whom an inference request is for: an app, or a pipeline.
enum Target {
    App(Arc<App>),
    Pipeline(Arc<PipelineApp>),
}

/// The app or pipeline `name`; a pipeline's task apps take no requests of their own.
fn target(state: &State, name: &str) -> Result<Target, ApiError> {
    if let Some(p) = state.pipelines.get(name) {
        return Ok(Target::Pipeline(p.clone()));
    }
    if let Some((pipeline, _)) = name.split_once('.').filter(|(p, _)| state.pipelines.contains_key(*p)) {
        return Err(ApiError::not_found(format!(
            "app `{name}` is a task of pipeline `{pipeline}`: send requests to `{pipeline}`"
        )));
    }
    Ok(Target::App(app_of(state, name)?.clone()))
}

impl Target {
    async fn infer(
        self,
        request: InferRequest,
        data: Bytes,
        arrived: std::time::Instant,
    ) -> Result<Response<Body>, ApiError> {
        match self {
            Target::App(app) => infer(&app, request, data, arrived).await,
            Target::Pipeline(p) => pipeline_infer(&p, request, data).await,
        }
    }

    /// Whether a request would be admitted now (apps only: a pipeline's tasks
    /// judge their intermediate requests by its early dropping).
    fn precheck(&self) -> Result<(), AdmitError> {
        match self {
            Target::App(app) => app.precheck(),
            Target::Pipeline(_) => Ok(()),
        }
    }
}

/// Bodies larger than this are parsed on the blocking pool: parsing a JSON image
/// takes milliseconds, which on the async threads would hold up every connection.
const PARSE_INLINE_MAX: usize = 64 << 10;

async fn parse_off_thread<T: for<'de> Deserialize<'de> + Send + 'static>(json: Bytes) -> Result<T, ApiError> {
    if json.len() <= PARSE_INLINE_MAX {
        return parse_json(&json);
    }
    tokio::task::spawn_blocking(move || parse_json(&json)).await.map_err(ApiError::internal)?
}

/// Reads and throws away a request's body (within the body timeout) before
/// answering `error`, so an ordinary client sees the answer rather than a reset
/// connection while it is still sending.
async fn discard_body(state: &State, req: Request<Incoming>, error: ApiError) -> ApiError {
    use http_body_util::BodyExt as _;
    let mut body = req.into_body();
    let limit = state.config.max_body_bytes;
    let timeout = std::time::Duration::from_millis(state.config.body_read_timeout_ms);
    let _ = tokio::time::timeout(timeout, async {
        let mut read = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len());
            if read > limit {
                break;
            }
        }
    })
    .await;
    error
}

/// Which outputs go back in binary: every output when the request says
/// `binary_data_output`, or the requested ones that say `binary_data`.
fn binary_outputs(request: &InferRequest) -> impl Fn(&str) -> bool + '_ {
    let all_binary = binary::flag(request.parameters.as_ref(), "binary_data_output");
    move |name: &str| {
        all_binary
            || request
                .outputs
                .iter()
                .flatten()
                .any(|o| o.name == name && binary::flag(o.parameters.as_ref(), "binary_data"))
    }
}

/// The outputs as JSON entries and the binary tail. A non-finite value is a model
/// fault (JSON has no NaN or infinity), not a 200.
fn encode_outputs<'a>(
    what: &str,
    tensors: impl IntoIterator<Item = &'a Tensor>,
    binary_out: impl Fn(&str) -> bool,
) -> Result<(Vec<Value>, Vec<u8>), ApiError> {
    let mut tail = Vec::new();
    let mut outputs = Vec::new();
    for t in tensors {
        if let Some(i) = t.data.first_non_finite() {
            return Err(ApiError::internal(format!("{what} produced a non-finite output (element {i})")));
        }
        if binary_out(&t.name) {
            let bytes = t.data.to_le_bytes();
            outputs.push(json!({ "name": t.name, "datatype": t.datatype().oip_name(), "shape": t.shape,
                                 "parameters": { "binary_data_size": bytes.len() } }));
            tail.extend(bytes);
        } else {
            outputs.push(tensor_json(t));
        }
    }
    Ok((outputs, tail))
}

/// A 200 with `body`, and the binary tail after it when there is one.
fn respond(body: Value, tail: Vec<u8>) -> Result<Response<Body>, ApiError> {
    if tail.is_empty() {
        return ok(body);
    }
    let mut bytes = body.to_string().into_bytes();
    let json_len = bytes.len();
    bytes.extend(tail);
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    let h = r.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/octet-stream"));
    h.insert(binary::HEADER, hyper::header::HeaderValue::from(json_len));
    Ok(r)
}

fn admit_error(e: AdmitError) -> ApiError {
    match e {
        AdmitError::QueueFull { .. } => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
        AdmitError::ShuttingDown(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        AdmitError::WouldMissDeadline { .. } => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
    }
}

async fn infer(
    app: &Arc<App>,
    mut request: InferRequest,
    binary_data: Bytes,
    arrived: std::time::Instant,
) -> Result<Response<Body>, ApiError> {
    for o in request.outputs.iter().flatten() {
        if o.name != OUTPUT_NAME {
            return Err(ApiError::bad_request(format!(
                "app {}: unknown output `{}`; every variant answers with `{OUTPUT_NAME}`",
                app.name(),
                o.name
            )));
        }
    }
    let tensor = to_tensor(app.name(), &app.input, std::mem::take(&mut request.inputs), binary_data)?;
    let rx = app.submit_arrived(tensor, arrived).map_err(admit_error)?;
    // Workers answer every request, at shutdown too; a closed channel means a worker
    // stopped abnormally. The client still gets the shutdown's documented 503, and
    // the request is counted.
    let Ok(reply) = rx.await else {
        app.count_unanswered();
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the request's worker stopped before serving it"));
    };
    match reply {
        Reply::Served(s) => {
            let what = format!("app {}: variant {}", app.name(), s.variant);
            let (outputs, tail) = encode_outputs(&what, &s.outputs, binary_outputs(&request))?;
            let body = json!({
            "model_name": app.name(),
            "model_version": s.variant,
            "id": request.id,
            "outputs": outputs,
            "parameters": {
                "variant": s.variant,
                "policy": s.policy,
                "worker": s.worker,
                "batch_size": s.batch_size,
                "queue_us": s.queue_us,
                "latency_us": s.latency_us,
                "deadline_us": s.deadline_us,
                "deadline_met": s.deadline_met,
            }
            });
            respond(body, tail)
        }
        Reply::Dropped { reason: DropReason::ExecutorError, detail, .. } => Err(ApiError::internal(detail)),
        Reply::Dropped { reason, detail, policy } => Err(ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!("app {}: request dropped ({}): {detail}", app.name(), reason.as_str()),
            extra: Some(json!({ "dropped": true, "reason": reason.as_str(), "policy": policy, "id": request.id })),
            allow: None,
        }),
        Reply::Rejected { message } => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)),
    }
}

/// A pipeline request: answered once every intermediate request is served or
/// dropped. The outputs are one tensor per sink task (named after it), the sink's
/// answers stacked along the first dimension; the parameters say which variants
/// served each task, the path accuracy, and every drop with its task and reason.
/// Nothing served at all: 504 naming the task and reason of a drop (503 when the
/// server shut down first).
async fn pipeline_infer(
    p: &Arc<PipelineApp>,
    mut request: InferRequest,
    data: Bytes,
) -> Result<Response<Body>, ApiError> {
    let sinks: Vec<&str> = p.graph.sinks().into_iter().map(|t| p.graph.tasks[t].name.as_str()).collect();
    for o in request.outputs.iter().flatten() {
        if !sinks.contains(&o.name.as_str()) {
            return Err(ApiError::bad_request(format!(
                "pipeline {}: unknown output `{}`; its outputs are its last tasks: {}",
                p.name(),
                o.name,
                sinks.join(", ")
            )));
        }
    }
    let tensor = to_tensor(p.name(), &p.input, std::mem::take(&mut request.inputs), data)?;
    let answer = p.infer(tensor).await.map_err(admit_error)?;
    let params = json!({
        "pipeline": true,
        "variants": answer.variants,
        "accuracy": answer.accuracy(),
        "paths": answer.paths.len(),
        "late_paths": answer.late_paths,
        "dropped": answer.drops,
        "rerouted": answer.rerouted,
        "rejected": answer.rejected,
        "early_drop": p.config.early_drop.as_str(),
        "latency_us": answer.latency_us,
        "deadline_us": answer.deadline_us,
        "deadline_met": answer.deadline_met(),
    });
    if answer.paths.is_empty() {
        let Some((task, reason)) = answer.first_drop() else {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("pipeline {}: the server shut down before the request could be served", p.name()),
            ));
        };
        return Err(ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!("pipeline {}: request dropped at task {task} ({reason})", p.name()),
            extra: Some(
                json!({ "dropped": true, "task": task, "reason": reason, "id": request.id, "parameters": params }),
            ),
            allow: None,
        });
    }
    let mut stacked = Vec::new();
    for (task, outputs) in &answer.outputs {
        let refs: Vec<&Tensor> = outputs.iter().collect();
        let mut t = Tensor::concat(&refs)
            .map_err(|e| ApiError::internal(format!("pipeline {}: task {task}: outputs: {e}", p.name())))?;
        t.name = task.clone();
        stacked.push(t);
    }
    let what = format!("pipeline {}", p.name());
    let (outputs, tail) = encode_outputs(&what, &stacked, binary_outputs(&request))?;
    let body = json!({
        "model_name": p.name(),
        "model_version": "pipeline",
        "id": request.id,
        "outputs": outputs,
        "parameters": params,
    });
    respond(body, tail)
}

fn pipeline_metadata(p: &Arc<PipelineApp>) -> Result<Response<Body>, ApiError> {
    let mut shape: Vec<i64> = vec![-1];
    shape.extend(p.input.shape.iter().map(|d| *d as i64));
    let outputs: Vec<Value> = p
        .graph
        .sinks()
        .into_iter()
        .map(|t| json!({ "name": p.graph.tasks[t].name, "datatype": "FP32", "shape": [-1, -1] }))
        .collect();
    ok(json!({
        "name": p.name(),
        "versions": ["pipeline"],
        "platform": "sluice-pipeline",
        "inputs": [{ "name": p.input.name, "datatype": p.input.datatype, "shape": shape }],
        "outputs": outputs,
        "parameters": {
            "slo_ms": p.problem.slo_ms,
            "workers": p.problem.workers,
            "early_drop": p.config.early_drop.as_str(),
            "tasks": p.graph.tasks.iter().map(|t| json!({ "name": t.name, "models": t.models,
                "children": t.children.iter().map(|&c| p.graph.tasks[c].name.clone()).collect::<Vec<_>>() })).collect::<Vec<_>>(),
        }
    }))
}

fn model_metadata(app: &Arc<App>) -> Result<Response<Body>, ApiError> {
    let mut shape: Vec<i64> = vec![-1];
    shape.extend(app.input.shape.iter().map(|d| *d as i64));
    ok(json!({
        "name": app.name(),
        "versions": app.models.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
        "platform": format!("sluice-{}", match app.config.executor {
            Some(crate::config::ExecutorKind::Onnx) => "onnx",
            _ => "emulated",
        }),
        "inputs": [{ "name": app.input.name, "datatype": app.input.datatype, "shape": shape }],
        "outputs": [{ "name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, -1] }],
        "parameters": {
            "slo_ms": app.config.slo_ms,
            "workers": app.workers.len(),
            "policy": app.binding.lock().policy.clone(),
            "variants": app.models.iter().map(|m| json!({ "name": m.name, "accuracy": m.accuracy })).collect::<Vec<_>>(),
        }
    }))
}

/// Property-based fuzzing of request parsing (JSON and binary tensors): seeds from
/// `tests/fuzz-corpus/requests/`, mutated. No body panics the parser; a body it
/// accepts is exactly the app's input.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn seeds() -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz-corpus/requests");
        let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .expect("the seed corpus")
            .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
            .collect();
        out.sort();
        assert!(out.len() >= 4, "seeds in {}", dir.display());
        out
    }

    /// Values that have broken parsers: out of every range, not numbers at all.
    const TOKENS: &[&str] = &[
        "1e39",
        "-1e400",
        "NaN",
        "Infinity",
        "18446744073709551616",
        "-0",
        "[]",
        "[[[[[[[[[[1]]]]]]]]]]",
        "null",
        "\"\\u0000\"",
        "{}",
        "1.7976931348623157e308",
        "3.4028236e38",
        "\"binary_data_size\"",
        "-1",
    ];

    /// One mutation: flip a byte, cut, splice a token in, or duplicate a span.
    fn mutate(body: &mut Vec<u8>, op: u8, at: usize, byte: u8) {
        if body.is_empty() {
            body.push(byte);
            return;
        }
        let at = at % body.len();
        match op % 4 {
            0 => body[at] ^= byte | 1,
            1 => body.truncate(at),
            2 => {
                let token = TOKENS[byte as usize % TOKENS.len()].as_bytes();
                body.splice(at..(at + 1).min(body.len()), token.iter().copied());
            }
            _ => {
                let span: Vec<u8> = body[at..].iter().take(32).copied().collect();
                body.splice(at..at, span);
            }
        }
    }

    fn parse(body: &[u8], json_len: Option<usize>) -> Result<Tensor, ApiError> {
        let spec = InputSpec { name: "x".into(), datatype: "FP32".into(), shape: vec![4] };
        let (json, data) = binary::split(Bytes::copy_from_slice(body), json_len)?;
        let request: InferRequest = parse_json(&json)?;
        to_tensor("fuzz", &spec, request.inputs, data)
    }

    proptest! {
        #[test]
        fn no_body_panics_the_parser_and_what_it_accepts_is_the_input(
            seed in any::<prop::sample::Index>(),
            mutations in prop::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 0..6),
            tail in prop::collection::vec(any::<u8>(), 0..40),
            framed in any::<bool>(),
        ) {
            let seeds = seeds();
            let mut body = seeds[seed.index(seeds.len())].clone();
            for (op, at, byte) in mutations {
                mutate(&mut body, op, at, byte);
            }
            // Binary framing: the JSON header's length, then the tensor bytes.
            let json_len = framed.then_some(body.len());
            if framed {
                body.extend(&tail);
            }
            match parse(&body, json_len) {
                Ok(t) => {
                    prop_assert_eq!(&t.shape, &vec![1, 4]);
                    prop_assert_eq!(t.data.len(), 4);
                    prop_assert!(t.data.first_non_finite().is_none());
                }
                Err(e) => {
                    prop_assert!(!e.message.is_empty());
                    prop_assert!(e.status.is_client_error(), "{} {}", e.status, e.message);
                }
            }
        }
    }
}

//! The inference path both fronts share — HTTP ([`crate::http`]) and gRPC
//! ([`crate::grpc`]): whom a request is for ([`target`]), checking its tensor
//! against the app's input ([`to_tensor`]), admission, batched requests, and the
//! answer ([`Answer`]), protocol-neutral. A front decodes its wire format into
//! [`Input`]s and encodes an [`Answer`] or an [`ApiError`] back; everything between
//! — the messages a client sees included — is here once.
//!
//! **Batched requests.** An input whose leading dimension is B > 1 becomes B
//! requests, one per sample, queued with the same arrival (so the same deadline)
//! and answered together: the output concatenates the samples' outputs in order.
//! If any sample is refused at admission, dropped or rejected, the whole request
//! gets that sample's status (the first in sample order); samples already admitted
//! are still served — a queued request cannot be taken back — and their answers
//! discarded. B is at most the app's `max_queue` (more could never be admitted).
//! Pipelines take one sample per request.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{json, Map, Value};

use crate::api::{app_of, ApiError};
use crate::app::{AdmitError, App};
use crate::config::InputSpec;
use crate::pipeline::PipelineApp;
use crate::state::State;
use sluice_core::executor::OUTPUT_NAME;
use sluice_core::queue::{DropReason, Reply, Served};
use sluice_core::tensor::{DataType, Tensor, TensorData};

/// An input tensor as a front decoded it, not yet checked.
pub(crate) struct Input {
    /// Its name.
    pub name: String,
    /// Its datatype as the request names it (`FP32`, ...).
    pub datatype: String,
    /// Its shape as the request gives it.
    pub shape: Vec<i64>,
    /// Its data.
    pub data: Data,
}

/// An input's data, in one of the forms the protocols carry.
pub(crate) enum Data {
    /// JSON numbers (HTTP), range-checked against the datatype.
    Numbers(Vec<f64>),
    /// Little-endian bytes: HTTP's binary tensor data extension (`declared`: its
    /// `binary_data_size`) or gRPC's `raw_input_contents` (`source` names it).
    Bytes { bytes: Bytes, declared: Option<usize>, source: &'static str },
    /// Typed values (gRPC's `contents`), already of the declared datatype.
    Typed(TensorData),
}

/// A served request, protocol-neutral.
pub(crate) struct Answer {
    /// The app or pipeline.
    pub model_name: String,
    /// The variant that served it (the first sample's in a batch; `pipeline` for a
    /// pipeline).
    pub model_version: String,
    /// The output tensors, leading dimension = the request's samples.
    pub outputs: Vec<Tensor>,
    /// What sluice tells about the serving (variant, latency, deadline, ...).
    pub parameters: Map<String, Value>,
}

/// Whom an inference request is for: an app, or a pipeline.
pub(crate) enum Target {
    /// A served app.
    App(Arc<App>),
    /// A pipeline (its task apps take no requests of their own).
    Pipeline(Arc<PipelineApp>),
}

/// The app or pipeline `name`; a pipeline's task apps take no requests of their own.
pub(crate) fn target(state: &State, name: &str) -> Result<Target, ApiError> {
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

/// The status of a refusal at admission: 429 for overload (retry later), 503 at
/// shutdown.
pub(crate) fn admit_error(e: AdmitError) -> ApiError {
    match e {
        AdmitError::QueueFull { .. } => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
        AdmitError::ShuttingDown(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        AdmitError::WouldMissDeadline { .. } => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
    }
}

/// The refusal of a version-pinned inference: the policy picks the variant.
pub(crate) fn pinned_version(name: &str, version: &str) -> ApiError {
    ApiError::bad_request(format!(
        "app {name}: inference on version `{version}` is not supported: sluice's policy picks the variant of \
         every request; send it to the app (no version), and the answer's model_version names the variant"
    ))
}

impl Target {
    /// The app's or pipeline's name.
    pub(crate) fn name(&self) -> &str {
        match self {
            Target::App(app) => app.name(),
            Target::Pipeline(p) => p.name(),
        }
    }

    /// Whether a request would be admitted now (apps only: a pipeline's tasks
    /// judge their intermediate requests by its early dropping).
    /// Hold the returned guard until the request is submitted or refused.
    pub(crate) fn precheck(&self) -> Result<Option<crate::app::Incoming>, ApiError> {
        match self {
            Target::App(app) => app.precheck().map(Some).map_err(admit_error),
            Target::Pipeline(_) => Ok(None),
        }
    }

    /// Whether the target has the variant `version` (an empty version is the app).
    pub(crate) fn check_version(&self, version: &str) -> Result<(), ApiError> {
        let known = match self {
            _ if version.is_empty() => return Ok(()),
            Target::App(app) => app.models.iter().any(|m| m.name == version),
            Target::Pipeline(_) => version == "pipeline",
        };
        if known {
            return Ok(());
        }
        let versions = match self {
            Target::App(app) => app.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            Target::Pipeline(_) => "pipeline".into(),
        };
        Err(ApiError::not_found(format!("{} has no version `{version}` (its versions: {versions})", self.name())))
    }

    /// Refuses a requested output the target does not have.
    pub(crate) fn check_outputs(&self, requested: &[&str]) -> Result<(), ApiError> {
        match self {
            Target::App(app) => match requested.iter().find(|o| **o != OUTPUT_NAME) {
                Some(o) => Err(ApiError::bad_request(format!(
                    "app {}: unknown output `{o}`; every variant answers with `{OUTPUT_NAME}`",
                    app.name()
                ))),
                None => Ok(()),
            },
            Target::Pipeline(p) => {
                let sinks: Vec<&str> = p.graph.sinks().into_iter().map(|t| p.graph.tasks[t].name.as_str()).collect();
                match requested.iter().find(|o| !sinks.contains(o)) {
                    Some(o) => Err(ApiError::bad_request(format!(
                        "pipeline {}: unknown output `{o}`; its outputs are its last tasks: {}",
                        p.name(),
                        sinks.join(", ")
                    ))),
                    None => Ok(()),
                }
            }
        }
    }

    /// Checks the inputs, admits the request (each sample of a batch) and waits for
    /// its answer. `arrived` is when the request's head came in (its deadline runs
    /// from then); `id` is the client's request id, echoed in a drop's error.
    pub(crate) async fn infer(
        &self,
        id: Option<&str>,
        inputs: Vec<Input>,
        arrived: std::time::Instant,
    ) -> Result<Answer, ApiError> {
        match self {
            Target::App(app) => {
                let limit = (app.config.max_queue, "its max_queue");
                let tensor = to_tensor(app.name(), &app.input, inputs, limit)?;
                app_infer(app, tensor, id, arrived).await
            }
            Target::Pipeline(p) => {
                let tensor = to_tensor(p.name(), &p.input, inputs, (1, "a pipeline takes one sample per request"))?;
                pipeline_infer(p, tensor, id).await
            }
        }
    }

    /// How errors and logs name the target: `app NAME` or `pipeline NAME`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::App(app) => format!("app {}", app.name()),
            Target::Pipeline(p) => format!("pipeline {}", p.name()),
        }
    }
}

/// Checks a request's inputs against the app's input and converts them: exactly
/// one input, its name, datatype, shape (`[B, ...spec]` with 1 ≤ B ≤ `limit.0`, or
/// `[...spec]` for one sample) and data. Messages name the app, the input and what
/// was wrong.
pub(crate) fn to_tensor(
    app: &str,
    spec: &InputSpec,
    mut inputs: Vec<Input>,
    limit: (usize, &str),
) -> Result<Tensor, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("app {app}: {m}"));
    if inputs.len() != 1 {
        return Err(bad(format!("expected exactly 1 input tensor (`{}`), got {}", spec.name, inputs.len())));
    }
    let input = inputs.pop().expect("one input");
    if input.name != spec.name {
        return Err(bad(format!("unknown input `{}`; expected `{}`", input.name, spec.name)));
    }
    let name = &input.name;
    let datatype = DataType::from_oip(&input.datatype)
        .ok_or_else(|| bad(format!("input `{name}`: unknown datatype `{}`", input.datatype)))?;
    if datatype.oip_name() != spec.datatype {
        return Err(bad(format!("input `{name}`: datatype {} but the app expects {}", input.datatype, spec.datatype)));
    }
    let want = || {
        let lead = if limit.0 == 1 { "1".to_string() } else { "-1".to_string() };
        let dims: Vec<String> = std::iter::once(lead).chain(spec.shape.iter().map(|d| d.to_string())).collect();
        format!("[{}]", dims.join(", "))
    };
    if let Some(d) = input.shape.iter().find(|d| **d < 0) {
        return Err(bad(format!("input `{name}`: shape {:?} has a negative dimension {d}", input.shape)));
    }
    let given: Vec<usize> = input.shape.iter().map(|d| *d as usize).collect();
    // `[...spec]` is one sample; `[B, ...spec]` is B of them.
    let shape = if given.len() == spec.shape.len() {
        std::iter::once(1).chain(given.iter().copied()).collect::<Vec<_>>()
    } else {
        given.clone()
    };
    if shape.len() != spec.shape.len() + 1 || shape[1..] != spec.shape[..] {
        let per = if limit.0 == 1 { "one sample per request" } else { "samples along the first dimension" };
        return Err(bad(format!(
            "input `{name}`: shape {given:?} but the app expects {} ({per}; sluice forms batches itself)",
            want()
        )));
    }
    let samples = shape[0];
    if samples == 0 || samples > limit.0 {
        return Err(bad(format!(
            "input `{name}`: shape {given:?} is a batch of {samples} samples; {app} takes 1 to {} per request ({})",
            limit.0, limit.1
        )));
    }
    let n: usize = shape.iter().product();
    let data = match input.data {
        Data::Numbers(values) => {
            if values.len() != n {
                return Err(bad(format!(
                    "input `{name}`: shape {given:?} needs {n} elements, data has {}",
                    values.len()
                )));
            }
            convert(datatype, values).map_err(|m| bad(format!("input `{name}`: {m}")))?
        }
        Data::Bytes { bytes, declared, source } => {
            let want = n * TensorData::width(datatype);
            if declared.is_some_and(|d| d != want) || bytes.len() != want {
                let carried = match declared {
                    Some(size) => format!("binary_data_size is {size} and the body carries {}", bytes.len()),
                    None => format!("{source} has {}", bytes.len()),
                };
                return Err(bad(format!(
                    "input `{name}`: shape {given:?} of {} needs {want} bytes; {carried}",
                    datatype.oip_name()
                )));
            }
            TensorData::from_le_bytes(datatype, &bytes).map_err(|m| bad(format!("input `{name}`: {m}")))?
        }
        Data::Typed(data) => {
            if data.len() != n {
                return Err(bad(format!(
                    "input `{name}`: shape {given:?} needs {n} elements, contents has {}",
                    data.len()
                )));
            }
            data
        }
    };
    if let Some(i) = data.first_non_finite() {
        return Err(bad(format!("input `{name}`: element {i} is not a finite number")));
    }
    Ok(Tensor { name: input.name, shape, data })
}

/// JSON numbers to a tensor of `datatype`, refusing what does not fit it.
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

/// Submits the request's samples and waits for every answer (see the module doc
/// for batches).
async fn app_infer(
    app: &Arc<App>,
    tensor: Tensor,
    id: Option<&str>,
    arrived: std::time::Instant,
) -> Result<Answer, ApiError> {
    let samples = tensor.shape[0];
    let parts = if samples == 1 {
        vec![tensor]
    } else {
        tensor.split(samples).map_err(|e| ApiError::internal(format!("app {}: {e}", app.name())))?
    };
    let mut receivers = Vec::with_capacity(parts.len());
    for part in parts {
        // A refusal ends the request at once; the samples already queued are served
        // and their answers discarded (the receivers drop here).
        receivers.push(app.submit_arrived(part, arrived).map_err(admit_error)?);
    }
    let mut served = Vec::with_capacity(receivers.len());
    let mut failed = None;
    for rx in receivers {
        // Every answer is awaited, so each sample's outcome is counted before the
        // client hears back, even once one failed.
        match rx.await {
            Ok(Reply::Served(s)) => served.push(s),
            Ok(reply) => {
                if failed.is_none() {
                    failed = Some(reply_error(app, reply, id));
                }
            }
            // Workers answer every request, at shutdown too; a closed channel means a
            // worker stopped abnormally. The client still gets the shutdown's
            // documented 503, and the request is counted (each part of a batched one).
            Err(_) => {
                app.count_unanswered();
                if failed.is_none() {
                    failed = Some(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the request's worker stopped before serving it",
                    ));
                }
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let outputs = if served.len() == 1 { served[0].outputs.clone() } else { concat_outputs(app.name(), &served)? };
    let first = &served[0];
    let mut parameters = json!({
        "variant": first.variant,
        "policy": first.policy,
        "worker": first.worker,
        "batch_size": first.batch_size,
        "queue_us": served.iter().map(|s| s.queue_us).max().unwrap_or(0),
        "latency_us": served.iter().map(|s| s.latency_us).max().unwrap_or(0),
        "deadline_us": first.deadline_us,
        "deadline_met": served.iter().all(|s| s.deadline_met),
    });
    if served.len() > 1 {
        parameters["samples"] = json!(served.len());
        parameters["variants"] = json!(served.iter().map(|s| s.variant.as_str()).collect::<Vec<_>>());
    }
    let Value::Object(parameters) = parameters else { unreachable!("an object literal") };
    Ok(Answer { model_name: app.name().to_string(), model_version: first.variant.clone(), outputs, parameters })
}

/// The samples' outputs stacked in sample order, output by output.
fn concat_outputs(app: &str, served: &[Box<Served>]) -> Result<Vec<Tensor>, ApiError> {
    (0..served[0].outputs.len())
        .map(|i| {
            let parts: Vec<&Tensor> = served.iter().filter_map(|s| s.outputs.get(i)).collect();
            if parts.len() != served.len() {
                return Err(ApiError::internal(format!("app {app}: samples answered with different outputs")));
            }
            // Variants of one app may differ in output width; then the samples of one
            // request cannot be stacked.
            Tensor::concat(&parts).map_err(|e| ApiError::internal(format!("app {app}: stacking the samples: {e}")))
        })
        .collect()
}

/// The error a request gets for a reply other than `Served`.
fn reply_error(app: &App, reply: Reply, id: Option<&str>) -> ApiError {
    match reply {
        Reply::Served(_) => ApiError::internal("a served reply taken for an error"),
        // The worker logged the cause with the batch; the client gets the generic
        // message of a server error (a non-finite output is one).
        Reply::Dropped { reason: DropReason::ExecutorError, .. } => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal server error (see the server log)")
        }
        Reply::Dropped { reason, detail, policy } => ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!("app {}: request dropped ({}): {detail}", app.name(), reason.as_str()),
            extra: Some(json!({ "dropped": true, "reason": reason.as_str(), "policy": policy, "id": id })),
            allow: None,
        },
        Reply::Rejected { message } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message),
    }
}

/// A pipeline request: answered once every intermediate request is served or
/// dropped. The outputs are one tensor per sink task (named after it), the sink's
/// answers stacked along the first dimension; the parameters say which variants
/// served each task, the path accuracy, and every drop with its task and reason.
/// Nothing served at all: 504 naming the task and reason of a drop (503 when the
/// server shut down first).
async fn pipeline_infer(p: &Arc<PipelineApp>, tensor: Tensor, id: Option<&str>) -> Result<Answer, ApiError> {
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
        "early_drop_at": p.config.early_drop_at.as_str(),
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
            extra: Some(json!({ "dropped": true, "task": task, "reason": reason, "id": id, "parameters": params })),
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
    let Value::Object(parameters) = params else { unreachable!("an object literal") };
    Ok(Answer { model_name: p.name().to_string(), model_version: "pipeline".into(), outputs: stacked, parameters })
}

/// An app's or pipeline's metadata (the protocol's model metadata, sluice's
/// parameters beside it): the fronts encode it each in their form.
pub(crate) struct Metadata {
    /// The name.
    pub name: String,
    /// Its versions: the app's variants (`pipeline` for a pipeline).
    pub versions: Vec<String>,
    /// `sluice-onnx`, `sluice-emulated` or `sluice-pipeline`.
    pub platform: String,
    /// Inputs: name, datatype, shape (-1: any number of samples).
    pub inputs: Vec<(String, String, Vec<i64>)>,
    /// Outputs, as the inputs.
    pub outputs: Vec<(String, String, Vec<i64>)>,
    /// Extra facts (SLO, workers, policy, variants, tasks).
    pub parameters: Value,
}

impl Target {
    /// The metadata; with a `version`, only that variant is listed.
    pub(crate) fn metadata(&self, version: &str) -> Result<Metadata, ApiError> {
        self.check_version(version)?;
        Ok(match self {
            Target::App(app) => {
                let shape: Vec<i64> = std::iter::once(-1).chain(app.input.shape.iter().map(|d| *d as i64)).collect();
                Metadata {
                    name: app.name().to_string(),
                    versions: app
                        .models
                        .iter()
                        .filter(|m| version.is_empty() || m.name == version)
                        .map(|m| m.name.clone())
                        .collect(),
                    platform: platform(app).to_string(),
                    inputs: vec![(app.input.name.clone(), app.input.datatype.clone(), shape)],
                    outputs: vec![(OUTPUT_NAME.to_string(), "FP32".to_string(), vec![-1, -1])],
                    parameters: json!({
                        "slo_ms": app.config.slo_ms,
                        "workers": app.workers.len(),
                        "policy": app.binding.lock().policy.clone(),
                        "max_batch_size": app.config.max_queue,
                        "variants": app.models.iter().map(|m| json!({ "name": m.name, "accuracy": m.accuracy })).collect::<Vec<_>>(),
                    }),
                }
            }
            Target::Pipeline(p) => {
                // One sample per request (module doc).
                let shape: Vec<i64> = std::iter::once(1).chain(p.input.shape.iter().map(|d| *d as i64)).collect();
                Metadata {
                    name: p.name().to_string(),
                    versions: vec!["pipeline".into()],
                    platform: "sluice-pipeline".into(),
                    inputs: vec![(p.input.name.clone(), p.input.datatype.clone(), shape)],
                    outputs: p
                        .graph
                        .sinks()
                        .into_iter()
                        .map(|t| (p.graph.tasks[t].name.clone(), "FP32".to_string(), vec![-1, -1]))
                        .collect(),
                    parameters: json!({
                        "slo_ms": p.problem.slo_ms,
                        "workers": p.problem.workers,
                        "early_drop": p.config.early_drop.as_str(),
                        "early_drop_at": p.config.early_drop_at.as_str(),
                        "tasks": p.graph.tasks.iter().map(|t| json!({ "name": t.name, "models": t.models,
                            "children": t.children.iter().map(|&c| p.graph.tasks[c].name.clone()).collect::<Vec<_>>() })).collect::<Vec<_>>(),
                    }),
                }
            }
        })
    }

    /// Whether the target (or its variant `version`) takes requests now: an app
    /// accepting, and for a variant, loaded on at least one worker.
    pub(crate) fn ready(&self, version: &str) -> Result<bool, ApiError> {
        self.check_version(version)?;
        Ok(match self {
            Target::Pipeline(p) => p.accepting.load(Ordering::Acquire),
            Target::App(app) => app.accepting.load(Ordering::Acquire) && (version.is_empty() || loaded(app, version)),
        })
    }
}

/// `sluice-onnx` or `sluice-emulated`.
pub(crate) fn platform(app: &App) -> &'static str {
    match app.config.executor {
        Some(crate::config::ExecutorKind::Onnx) => "sluice-onnx",
        _ => "sluice-emulated",
    }
}

/// Whether the variant `version` is loaded on any of the app's workers.
pub(crate) fn loaded(app: &App, version: &str) -> bool {
    let Some(id) = app.models.iter().position(|m| m.name == version) else { return false };
    app.workers.iter().any(|w| w.loaded.lock().contains(&(id as u32)))
}

/// One entry of the model repository index.
pub(crate) struct IndexEntry {
    /// App or pipeline.
    pub name: String,
    /// The variant (`pipeline` for a pipeline).
    pub version: String,
    /// `READY` or `UNAVAILABLE`.
    pub state: &'static str,
    /// Why it is unavailable (empty when ready).
    pub reason: String,
}

/// The repository index: one entry per app variant and per pipeline, as Triton
/// lists one per model version; `ready_only` keeps the ready ones.
pub(crate) fn repository_index(state: &State, ready_only: bool) -> Vec<IndexEntry> {
    let mut out = Vec::new();
    for (name, app) in &state.apps {
        // A pipeline's task apps are internal.
        if name.split_once('.').is_some_and(|(p, _)| state.pipelines.contains_key(p)) {
            continue;
        }
        let accepting = app.accepting.load(Ordering::Acquire);
        for m in &app.models {
            let reason = if !accepting {
                "the app is shutting down".to_string()
            } else if !loaded(app, &m.name) {
                "not loaded on any worker (the policy or the allocator may load it later)".to_string()
            } else {
                String::new()
            };
            let state = if reason.is_empty() { "READY" } else { "UNAVAILABLE" };
            out.push(IndexEntry { name: name.clone(), version: m.name.clone(), state, reason });
        }
    }
    for (name, p) in &state.pipelines {
        let ready = p.accepting.load(Ordering::Acquire);
        out.push(IndexEntry {
            name: name.clone(),
            version: "pipeline".into(),
            state: if ready { "READY" } else { "UNAVAILABLE" },
            reason: if ready { String::new() } else { "the pipeline is shutting down".into() },
        });
    }
    if ready_only {
        out.retain(|e| e.state == "READY");
    }
    out
}

/// An app's statistics in Triton's terms, from sluice's counters and metrics.
pub(crate) struct Stats {
    /// The app.
    pub name: String,
    /// Requests served (on time or late): Triton's `inference_count` and `success.count`.
    pub served: u64,
    /// Batches executed: `execution_count`.
    pub executions: u64,
    /// Total ns from arrival to answer of the served requests: `success.ns`.
    pub latency_ns: u64,
    /// Requests dropped (a failed execution included: the executor error behind a
    /// 500) or refused: `fail.count`.
    pub failed: u64,
    /// Total ns the served requests waited in the queue: `queue.ns`.
    pub queue_ns: u64,
}

/// The statistics of an app (pipelines have none of their own: their task apps do).
pub(crate) fn stats(state: &State, app: &App) -> Stats {
    let c = &app.counters;
    let name = app.name();
    let hist = |family: &str| state.metrics.histogram_totals(family, &[("app", name)]);
    let (_, latency_s) = hist("sluice_latency_seconds");
    let (_, queue_s) = hist("sluice_queue_seconds");
    let (executions, _) = hist("sluice_batch_size");
    Stats {
        name: name.to_string(),
        served: c.served.load(Ordering::Relaxed),
        executions,
        latency_ns: (latency_s * 1e9) as u64,
        failed: c.dropped.load(Ordering::Relaxed) + c.rejected.load(Ordering::Relaxed),
        queue_ns: (queue_s * 1e9) as u64,
    }
}

/// A target's model configuration in Triton's terms (the model configuration
/// extension); the fronts encode it each in their form.
pub(crate) struct ModelConfig {
    /// The name.
    pub name: String,
    /// As in the metadata.
    pub platform: String,
    /// The largest leading dimension a request may carry (the app's `max_queue`);
    /// 0 for a pipeline (one sample per request, the dims then include it).
    pub max_batch_size: i32,
    /// Inputs: name, datatype (`FP32`, ...), dims (without the batch dimension when
    /// `max_batch_size` > 0).
    pub inputs: Vec<(String, String, Vec<i64>)>,
    /// Outputs, as the inputs.
    pub outputs: Vec<(String, String, Vec<i64>)>,
    /// Sluice's settings as strings (SLO, workers, policy, router, variants).
    pub parameters: Vec<(String, String)>,
}

impl Target {
    /// The model configuration.
    pub(crate) fn config(&self, version: &str) -> Result<ModelConfig, ApiError> {
        let m = self.metadata(version)?;
        Ok(match self {
            Target::App(app) => ModelConfig {
                name: m.name,
                platform: m.platform,
                max_batch_size: i32::try_from(app.config.max_queue).unwrap_or(i32::MAX),
                inputs: m.inputs.into_iter().map(|(n, d, s)| (n, d, s[1..].to_vec())).collect(),
                outputs: m.outputs.into_iter().map(|(n, d, s)| (n, d, s[1..].to_vec())).collect(),
                parameters: vec![
                    ("slo_ms".into(), app.config.slo_ms.to_string()),
                    ("workers".into(), app.workers.len().to_string()),
                    ("policy".into(), app.binding.lock().policy.clone()),
                    (
                        "router".into(),
                        serde_json::to_value(app.config.router)
                            .ok()
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default(),
                    ),
                    ("max_queue".into(), app.config.max_queue.to_string()),
                    ("variants".into(), m.versions.join(",")),
                ],
            },
            Target::Pipeline(p) => ModelConfig {
                name: m.name,
                platform: m.platform,
                max_batch_size: 0,
                inputs: m.inputs,
                outputs: m.outputs,
                parameters: vec![
                    ("slo_ms".into(), p.problem.slo_ms.to_string()),
                    ("workers".into(), p.problem.workers.to_string()),
                    ("early_drop".into(), p.config.early_drop.as_str().to_string()),
                    ("early_drop_at".into(), p.config.early_drop_at.as_str().to_string()),
                ],
            },
        })
    }
}

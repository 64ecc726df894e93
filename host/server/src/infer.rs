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
use sluice_core::outcome::Refusal;
use sluice_core::queue::{DropReason, Reply, Served};
use sluice_core::tensor::{DataType, Tensor, TensorData};

/// The protocol extensions both fronts serve (`GET /v2`, `ServerMetadata`).
pub const EXTENSIONS: &[&str] =
    &["classification", "binary_tensor_data", "model_repository", "model_configuration", "statistics"];

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
    /// JSON numbers (HTTP), range-checked against the datatype: the elements in
    /// row-major order, and how the array nested them (`Ok(dims)`: the length at
    /// each depth, one entry for a flat array; `Err`: what made it no tensor, a
    /// boolean, a string or a ragged array, reported naming the input once its
    /// name, datatype and shape are known good).
    Numbers { values: Vec<f64>, nesting: Result<Vec<usize>, NotATensor> },
    /// Little-endian bytes: HTTP's binary tensor data extension (`declared`: its
    /// `binary_data_size`) or gRPC's `raw_input_contents` (`source` names it).
    /// Taken as bytes, as Triton takes them: any bit pattern is an element (a NaN
    /// in an FP32 image is the model's business, not a malformed request).
    Bytes { bytes: Bytes, declared: Option<usize>, source: &'static str },
    /// Typed values (gRPC's `contents`), already of the declared datatype (protobuf
    /// carries any float, so these are taken as they come too).
    Typed(TensorData),
}

/// Why JSON tensor data is no tensor (HTTP's `data`): reported naming the input, once
/// its name, datatype and shape are known good ([`Data::Numbers`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum NotATensor {
    /// Numbers and arrays side by side at one depth (1 = the outer array's elements).
    #[error("is a ragged array: numbers and arrays side by side at depth {depth}")]
    Mixed {
        /// The depth.
        depth: usize,
    },
    /// Arrays of different lengths at one depth.
    #[error("is a ragged array: arrays of {first} and {len} elements at depth {depth}")]
    Ragged {
        /// The length of the first array at that depth.
        first: usize,
        /// The length of the one that differs.
        len: usize,
        /// The depth.
        depth: usize,
    },
    /// An element that is not a number.
    #[error("element {index} is {what}, not a number")]
    NotANumber {
        /// Its index in row-major order.
        index: usize,
        /// What it is (`a boolean (false)`, `a string`, `null`, ...).
        what: String,
    },
}

/// A JSON number that is no element of the input's datatype ([`convert`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum ValueError {
    /// Beyond the FP32 range (it would become an infinity).
    #[error("element {index}: {value:e} is outside the FP32 range")]
    OutsideF32 {
        /// Its index in row-major order.
        index: usize,
        /// The number.
        value: f64,
    },
    /// Not an integer of the datatype's range (UINT8, INT32, INT64 within 2^53).
    #[error("{value} is not a valid {datatype}")]
    NotInteger {
        /// The number.
        value: f64,
        /// The datatype's protocol name.
        datatype: &'static str,
    },
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

/// The answer to a refusal at admission ([`ApiError::refused`]: 429 for overload
/// or a full queue, 503 at shutdown, with its typed reason).
pub(crate) fn admit_error(e: AdmitError) -> ApiError {
    ApiError::refused(e.refusal(), e.to_string())
}

/// The refusal of a version-pinned inference: the policy picks the variant.
pub(crate) fn pinned_version(name: &str, version: &str) -> ApiError {
    ApiError::bad_request(format!(
        "app {name}: inference on version `{version}` is not supported: sluice's policy picks the variant of \
         every request; send it to the app (no version), and the answer's model_version names the variant"
    ))
}

/// What the protocol offers that sluice does not serve. Each is refused on both
/// fronts with the same message (HTTP 501, gRPC UNIMPLEMENTED), naming what is not
/// supported and what to do instead: a client must never read a refusal as a
/// success (Triton's C++ client takes a gRPC error with an empty message for OK, so
/// perf_analyzer "registered" shared memory it then could not use, issue 39).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsupported {
    /// System shared memory (status, register, unregister).
    SystemSharedMemory,
    /// CUDA shared memory (status, register, unregister).
    CudaSharedMemory,
    /// Trace settings.
    Trace,
    /// Log settings.
    Logging,
    /// Streaming inference (`ModelStreamInfer`).
    Streaming,
    /// The generate extension (`/v2/models/{m}/generate[_stream]`).
    Generate,
    /// Model repository control (load, unload).
    RepositoryControl,
}

impl Unsupported {
    /// The refusal.
    pub(crate) fn error(self, detail: &str) -> ApiError {
        let message = match self {
            Unsupported::SystemSharedMemory | Unsupported::CudaSharedMemory => {
                let kind = if self == Unsupported::CudaSharedMemory { "CUDA" } else { "system" };
                format!(
                    "{kind} shared memory is not supported by sluice ({detail}): nothing was registered; send the \
                     tensor data in the request (JSON, the binary tensor data extension, or gRPC raw_input_contents)"
                )
            }
            Unsupported::Trace => format!(
                "trace settings are not supported by sluice ({detail}): it has no request tracing; \
                 /metrics and each answer's parameters say where the time went"
            ),
            Unsupported::Logging => {
                format!("log settings are not supported by sluice ({detail}): set RUST_LOG when starting it")
            }
            Unsupported::Streaming => format!(
                "streaming inference is not supported by sluice ({detail}): send each request as a ModelInfer \
                 call (or POST /v2/models/{{m}}/infer); each is answered by its deadline"
            ),
            Unsupported::Generate => format!(
                "the generate extension is not supported by sluice ({detail}): send tensors to \
                 POST /v2/models/{{m}}/infer"
            ),
            Unsupported::RepositoryControl => format!(
                "model repository control is not supported by sluice ({detail}): it serves the apps of its \
                 config; change a worker's models with PUT /admin/apps/{{app}}/workers/{{w}}/models"
            ),
        };
        ApiError::new(StatusCode::NOT_IMPLEMENTED, message)
    }
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
    /// from then); `id` is the client's request id, echoed in a drop's error;
    /// `audited`, whether its precheck admitted it only as an audit
    /// ([`crate::app::Incoming::audited`]).
    pub(crate) async fn infer(
        &self,
        id: Option<&str>,
        inputs: Vec<Input>,
        arrived: std::time::Instant,
        audited: bool,
    ) -> Result<Answer, ApiError> {
        match self {
            Target::App(app) => {
                let limit = (app.config.max_queue, "its max_queue");
                let tensor = to_tensor(app.name(), &app.input, inputs, limit)?;
                app_infer(app, tensor, id, arrived, audited).await
            }
            Target::Pipeline(p) => {
                let tensor = to_tensor(p.name(), &p.input, inputs, (1, "a pipeline takes one sample per request"))?;
                pipeline_infer(p, tensor, id).await
            }
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
        Data::Numbers { values, nesting } => {
            let dims = nesting.map_err(|m| {
                bad(format!(
                    "input `{name}`: data {m}; {} data is JSON numbers, flat or nested as the shape",
                    spec.datatype
                ))
            })?;
            // A nested array is the tensor's shape as the request gives it; a flat
            // one is the elements in row-major order.
            if dims.len() > 1 && dims != given {
                return Err(bad(format!("input `{name}`: data nested as {dims:?} but the shape is {given:?}")));
            }
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
    // No finiteness check: JSON numbers were range-checked by `convert` (JSON has no
    // NaN or infinity), and bytes are bytes (see [`Data::Bytes`]).
    Ok(Tensor { name: input.name, shape, data })
}

/// JSON numbers to a tensor of `datatype`, refusing what does not fit it.
fn convert(datatype: DataType, values: Vec<f64>) -> Result<TensorData, ValueError> {
    let int = |v: f64, lo: f64, hi: f64| -> Result<f64, ValueError> {
        if v.fract() != 0.0 || v < lo || v > hi {
            Err(ValueError::NotInteger { value: v, datatype: datatype.oip_name() })
        } else {
            Ok(v)
        }
    };
    Ok(match datatype {
        // JSON numbers parse as f64; one beyond the FP32 range would become ±inf (and
        // an output of `null`s, which is not valid JSON tensor data): refuse it.
        DataType::F32 => {
            if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite() || v.abs() > f32::MAX as f64) {
                return Err(ValueError::OutsideF32 { index: i, value: *v });
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
    audited: bool,
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
        receivers.push(app.submit_arrived(part, arrived, audited).map_err(admit_error)?);
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
                    failed = Some(ApiError::refused(
                        Refusal::ShuttingDown,
                        "the request's worker stopped before serving it",
                    ));
                }
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    // The answer is here: how long after its batch ended (the front's wake-up on
    // the runtime), for admission to keep back (`App::record_edge`).
    if let Some(last) = served.iter().map(|s| s.latency_us).max() {
        app.record_edge((arrived.elapsed().as_micros() as u64).saturating_sub(last));
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
        // The wire keeps `deadline_us` (tests/serve.rs and clients read it); it is the SLO.
        "deadline_us": first.slo_us,
        "deadline_met": served.iter().all(|s| s.deadline_met),
    });
    // Only on an audit's answer (`admission_audit`): a client, or a benchmark,
    // can then judge by its own clock whether the refusal it stood in for was
    // false.
    if served.iter().any(|s| s.audited) {
        parameters["admission_audit"] = json!(true);
    }
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

/// `body` with the request's `id`, absent when it sent none (as Triton: not `null`).
fn with_id(mut body: Value, id: Option<&str>) -> Value {
    if let Some(id) = id {
        body["id"] = json!(id);
    }
    body
}

/// The error a request gets for a reply other than `Served`.
fn reply_error(app: &App, reply: Reply, id: Option<&str>) -> ApiError {
    match reply {
        Reply::Served(_) => ApiError::internal("a served reply taken for an error"),
        // The executor's own words, as Triton passes on its backends' errors: an
        // operator (and a client) needs to know that an agent was unreachable and no
        // other copy of the variant was left, not only that something failed.
        Reply::Dropped { reason: DropReason::ExecutorError, detail, .. } => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("app {}: {detail}", app.name()))
        }
        Reply::Dropped { reason, detail, policy } => ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!("app {}: request dropped ({}): {detail}", app.name(), reason.as_str()),
            extra: Some(with_id(json!({ "dropped": true, "reason": reason.as_str(), "policy": policy }), id)),
            allow: None,
        },
        Reply::Rejected { message } => ApiError::refused(Refusal::ShuttingDown, message),
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
        "early_drop": p.config.serving.early_drop.as_str(),
        "early_drop_at": p.config.serving.early_drop_at.as_str(),
        "latency_us": answer.latency_us,
        "deadline_us": answer.slo_us,
        "deadline_met": answer.deadline_met(),
    });
    if answer.paths.is_empty() {
        let Some((task, reason)) = answer.first_drop() else {
            return Err(ApiError::refused(
                Refusal::ShuttingDown,
                format!("pipeline {}: the server shut down before the request could be served", p.name()),
            ));
        };
        return Err(ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!("pipeline {}: request dropped at task {task} ({reason})", p.name()),
            extra: Some(with_id(json!({ "dropped": true, "task": task, "reason": reason, "parameters": params }), id)),
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
                        "early_drop": p.config.serving.early_drop.as_str(),
                        "early_drop_at": p.config.serving.early_drop_at.as_str(),
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

/// The version an app's statistics are reported under. Triton numbers a model's
/// versions and perf_analyzer parses the statistics' `version` as an integer
/// (`std::stoll`: an empty one aborted it, issue 39); sluice's versions are its
/// variants, and its statistics are the app's as a whole (the counters are per
/// app), so they are reported as the one version `1`, and a statistics request for
/// `1` (or for any variant) gets them.
pub(crate) const STATS_VERSION: &str = "1";

/// An app's statistics in Triton's terms, from sluice's counters and metrics.
pub(crate) struct Stats {
    /// The app (a pipeline's task app: `pipeline.task`).
    pub name: String,
    /// Requests served (on time or late): Triton's `inference_count`, and the count
    /// of `success`, `queue` and the three compute phases (Triton counts each per
    /// request, and perf_analyzer requires the compute counts to agree).
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
    /// Total ns of the served requests' batches: `compute_infer.ns`. Preparing the
    /// inputs and outputs (concatenating the samples, splitting the outputs) is not
    /// measured apart and is in it; `compute_input.ns` and `compute_output.ns` are 0.
    pub compute_ns: u64,
}

/// The statistics of an app (pipelines have none of their own: their task apps do).
pub(crate) fn stats(state: &State, app: &App) -> Stats {
    let c = &app.counters;
    let name = app.name();
    let hist = |family: &str| state.metrics.histogram_totals(family, &[("app", name)]);
    let (_, latency_s) = hist("sluice_latency_seconds");
    let (_, queue_s) = hist("sluice_queue_seconds");
    let (executions, _) = hist("sluice_batch_size");
    let latency_ns = (latency_s * 1e9) as u64;
    let queue_ns = (queue_s * 1e9) as u64;
    Stats {
        name: name.to_string(),
        served: c.served.load(Ordering::Relaxed),
        executions,
        latency_ns,
        failed: c.dropped.load(Ordering::Relaxed) + c.rejected.load(Ordering::Relaxed),
        queue_ns,
        compute_ns: latency_ns.saturating_sub(queue_ns),
    }
}

/// The statistics extension for both fronts: every app (no name), one app (a
/// `version` of `1`, [`STATS_VERSION`], or one of its variants, names the app as a
/// whole), or a pipeline's task apps (a pipeline's statistics are theirs: it runs
/// no model of its own).
pub(crate) fn statistics(state: &State, name: &str, version: &str) -> Result<Vec<Stats>, ApiError> {
    if name.is_empty() {
        return Ok(state.apps.values().map(|app| stats(state, app)).collect());
    }
    let target = target(state, name)?;
    if version != STATS_VERSION {
        target.check_version(version)?;
    }
    Ok(match target {
        Target::App(app) => vec![stats(state, &app)],
        Target::Pipeline(p) => p.tasks.iter().flatten().map(|app| stats(state, app)).collect(),
    })
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
    /// The outputs' labels file ([`LABELS_FILE`]) where the model directory has one
    /// (Triton's `label_filename`: the classification extension names its classes).
    pub label_filename: Option<String>,
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
                label_filename: app.config.model_dir.as_deref().and_then(labels_in).map(|_| LABELS_FILE.to_string()),
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
                label_filename: None,
                parameters: vec![
                    ("slo_ms".into(), p.problem.slo_ms.to_string()),
                    ("workers".into(), p.problem.workers.to_string()),
                    ("early_drop".into(), p.config.serving.early_drop.as_str().to_string()),
                    ("early_drop_at".into(), p.config.serving.early_drop_at.as_str().to_string()),
                ],
            },
        })
    }
}

/// The file of class labels the classification extension reads, in a model
/// directory (`model_dir`): one label per line, line i naming class i, as Triton's
/// `label_filename`. Without it a class is `score:index`.
pub(crate) const LABELS_FILE: &str = "labels.txt";

/// An output as the fronts send it: a tensor the model produced, or its
/// classification.
pub(crate) enum Output {
    /// A tensor as served.
    Tensor(Tensor),
    /// The classification extension's answer for a tensor: per sample, its `k`
    /// highest elements as `"score:index"` or `"score:index:label"`, highest first;
    /// BYTES of shape `[samples, k]`.
    Classes {
        /// The output's name.
        name: String,
        /// `[samples, k]`.
        shape: Vec<usize>,
        /// Row-major.
        values: Vec<String>,
    },
}

impl Output {
    /// Its name.
    pub(crate) fn name(&self) -> &str {
        match self {
            Output::Tensor(t) => &t.name,
            Output::Classes { name, .. } => name,
        }
    }

    /// Its datatype as the protocol names it.
    pub(crate) fn datatype(&self) -> &'static str {
        match self {
            Output::Tensor(t) => t.datatype().oip_name(),
            Output::Classes { .. } => "BYTES",
        }
    }

    /// Its shape.
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Output::Tensor(t) => &t.shape,
            Output::Classes { shape, .. } => shape,
        }
    }
}

/// BYTES elements in the binary form (the binary tensor data extension's and
/// gRPC's raw contents): each a little-endian u32 length, then its bytes.
pub(crate) fn bytes_elements(values: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.iter().map(|v| v.len() + 4).sum());
    for v in values {
        out.extend((v.len() as u32).to_le_bytes());
        out.extend(v.as_bytes());
    }
    out
}

/// The classification extension (Triton's `class_count`): each output given a
/// count above 0 in `counts` becomes its classification ([`Output::Classes`]),
/// k = the count clamped to the elements per sample, as Triton does; the others
/// stay tensors. Labels come from the model directory's [`LABELS_FILE`] where
/// there is one.
pub(crate) fn classify(target: &Target, outputs: Vec<Tensor>, counts: &[(String, u64)]) -> Vec<Output> {
    outputs
        .into_iter()
        .map(|t| match counts.iter().find(|(name, k)| *name == t.name && *k > 0) {
            None => Output::Tensor(t),
            Some((_, k)) => {
                let labels = labels_for(target, &t.name);
                classes(t, *k, labels.as_deref().map(Vec::as_slice))
            }
        })
        .collect()
}

/// One tensor's top-k per sample (the leading dimension).
fn classes(t: Tensor, k: u64, labels: Option<&[String]>) -> Output {
    let rows = t.shape.first().copied().unwrap_or(1).max(1);
    let per = t.data.len() / rows;
    let k = usize::try_from(k).unwrap_or(usize::MAX).min(per);
    let mut values = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let range = r * per..(r + 1) * per;
        // Highest first; ties in index order; NaN last (Triton's comparison leaves
        // them wherever its sort put them). Triton's score is std::to_string of the
        // element: six decimals for floats.
        let top: Vec<(usize, String)> = match &t.data {
            TensorData::F32(v) => {
                let s = &v[range];
                let order = top(s.len(), k, |a, b| float_order(f64::from(s[a]), f64::from(s[b])));
                order.into_iter().map(|i| (i, format!("{:.6}", s[i]))).collect()
            }
            TensorData::F64(v) => {
                let s = &v[range];
                top(s.len(), k, |a, b| float_order(s[a], s[b]))
                    .into_iter()
                    .map(|i| (i, format!("{:.6}", s[i])))
                    .collect()
            }
            TensorData::I32(v) => {
                let s = &v[range];
                top(s.len(), k, |a, b| s[b].cmp(&s[a])).into_iter().map(|i| (i, s[i].to_string())).collect()
            }
            TensorData::I64(v) => {
                let s = &v[range];
                top(s.len(), k, |a, b| s[b].cmp(&s[a])).into_iter().map(|i| (i, s[i].to_string())).collect()
            }
            TensorData::U8(v) => {
                let s = &v[range];
                top(s.len(), k, |a, b| s[b].cmp(&s[a])).into_iter().map(|i| (i, s[i].to_string())).collect()
            }
        };
        for (i, score) in top {
            match labels.and_then(|l| l.get(i)) {
                Some(label) => values.push(format!("{score}:{i}:{label}")),
                None => values.push(format!("{score}:{i}")),
            }
        }
    }
    Output::Classes { name: t.name, shape: vec![rows, k], values }
}

/// Descending, NaN last (a total order: Rust's sort needs one).
fn float_order(a: f64, b: f64) -> std::cmp::Ordering {
    a.is_nan().cmp(&b.is_nan()).then_with(|| b.total_cmp(&a))
}

/// The indices of the first `k` of `0..n` in `order` (stable: ties keep index order).
fn top(n: usize, k: usize, order: impl Fn(usize, usize) -> std::cmp::Ordering) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|a, b| order(*a, *b));
    idx.truncate(k);
    idx
}

/// The labels for `output` of `target`: its model directory's [`LABELS_FILE`] (a
/// pipeline's output is its sink task's, whose app has the directory).
fn labels_for(target: &Target, output: &str) -> Option<Arc<Vec<String>>> {
    let app = match target {
        Target::App(app) => app.clone(),
        Target::Pipeline(p) => {
            let t = p.graph.tasks.iter().position(|t| t.name == output)?;
            p.tasks.get(t)?.clone()?
        }
    };
    labels_in(app.config.model_dir.as_deref()?)
}

/// The labels file of a model directory, read once and kept (None: there is none,
/// or it cannot be read: classes are then `score:index`, as Triton's without labels).
pub(crate) fn labels_in(dir: &std::path::Path) -> Option<Arc<Vec<String>>> {
    type Cache = parking_lot::Mutex<std::collections::HashMap<std::path::PathBuf, Option<Arc<Vec<String>>>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let path = dir.join(LABELS_FILE);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(labels) = cache.lock().get(&path) {
        return labels.clone();
    }
    let labels = match std::fs::read_to_string(&path) {
        Ok(text) => Some(Arc::new(text.lines().map(|l| l.trim_end_matches('\r').to_string()).collect())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!("{}: cannot read the class labels ({e}); classes are answered without them", path.display());
            None
        }
    };
    cache.lock().insert(path, labels.clone());
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal's answer keeps its words in `error` and adds its typed reason,
    /// with the status it always had; the gRPC status carries the same message.
    #[test]
    fn refusals_answer_their_typed_reason() {
        let overload = AdmitError::WouldMissDeadline {
            app: "emu".into(),
            ahead: 3,
            wait_ms: 120.0,
            margin_ms: 20.0,
            slo_ms: 100.0,
            pushes_back: false,
        };
        let cases = [
            (AdmitError::QueueFull { app: "emu".into(), limit: 5 }, 429, "queue-full", "queue full"),
            (overload, 429, "overload", "overloaded"),
            (AdmitError::ShuttingDown("emu".into()), 503, "shutting-down", "shutting down"),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for (e, status, reason, words) in cases {
            let text = e.to_string();
            assert!(text.contains(words), "{text}");
            let r = admit_error(e).into_response();
            assert_eq!(r.status().as_u16(), status, "{reason}");
            let body = runtime.block_on(http_body_util::BodyExt::collect(r.into_body())).unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body, json!({ "error": text, "refused": true, "reason": reason }));
        }
        let grpc = crate::grpc::status(admit_error(AdmitError::QueueFull { app: "emu".into(), limit: 5 }));
        assert_eq!(grpc.code(), tonic::Code::ResourceExhausted);
        assert_eq!(grpc.message(), "app emu: queue full (5 requests waiting); retry later");
        let trailer = grpc.metadata().get("sluice-refusal-reason").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(trailer.as_deref(), Some("queue-full"));
        assert!(grpc.metadata().get("sluice-drop-reason").is_none(), "a refusal is not a drop");
    }

    #[test]
    fn values_that_do_not_fit_the_datatype_are_named() {
        let e = convert(DataType::U8, vec![1.0, 256.0]).unwrap_err();
        assert_eq!(e, ValueError::NotInteger { value: 256.0, datatype: "UINT8" });
        assert_eq!(e.to_string(), "256 is not a valid UINT8");
        let e = convert(DataType::F32, vec![0.0, 1e39]).unwrap_err();
        assert_eq!(e.to_string(), "element 1: 1e39 is outside the FP32 range");
        assert_eq!(convert(DataType::I32, vec![2.5]).unwrap_err().to_string(), "2.5 is not a valid INT32");
        assert!(convert(DataType::I64, vec![-3.0]).is_ok());
    }

    #[test]
    fn classes_are_the_top_k_per_sample_in_tritons_format() {
        let t = Tensor::new("output", vec![2, 3], TensorData::F32(vec![0.1, 0.7, 0.2, 0.5, f32::NAN, 0.5])).unwrap();
        let Output::Classes { shape, values, .. } = classes(t.clone(), 2, None) else { panic!("classes") };
        assert_eq!(shape, vec![2, 2]);
        assert_eq!(values, ["0.700000:1", "0.200000:2", "0.500000:0", "0.500000:2"]);
        let labels: Vec<String> = ["cat", "dog", "cup"].map(String::from).to_vec();
        let Output::Classes { shape, values, .. } = classes(t, 9, Some(&labels)) else { panic!("classes") };
        assert_eq!(shape, vec![2, 3], "k is clamped to the elements per sample");
        assert_eq!(values[0], "0.700000:1:dog");
        assert_eq!(values[5], "NaN:1:dog", "NaN last");
        let ints = Tensor::new("o", vec![1, 3], TensorData::I64(vec![3, 9, -1])).unwrap();
        let Output::Classes { values, .. } = classes(ints, 1, None) else { panic!("classes") };
        assert_eq!(values, ["9:1"]);
        assert_eq!(bytes_elements(&["ab".into(), "".into()]), vec![2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
    }
}

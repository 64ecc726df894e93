//! The KServe v2 gRPC front (`inference.GRPCInferenceService`, the protocol
//! `tritonclient.grpc` speaks), beside the HTTP one on `grpc_listen`.
//!
//! Start here: [`serve`] (the listener, connection limit and graceful shutdown) and
//! [`Service`] (one method per RPC). Inference goes through the same path as HTTP
//! ([`crate::infer`]: admission, deadline, batches, the one answer), and errors are
//! the same [`ApiError`]s with the same messages, mapped to gRPC codes by
//! [`status`]: 400 → INVALID_ARGUMENT, 404 → NOT_FOUND, 429 (overload) →
//! RESOURCE_EXHAUSTED, 503 (shutdown) → UNAVAILABLE, 504 (a drop; the reason is in
//! the message and the `sluice-drop-reason` metadata) → DEADLINE_EXCEEDED, 500 →
//! INTERNAL. The protocol file is `host/server/proto/grpc_predict_v2.proto`; what is
//! and is not served is in docs/host.md, "Protocol".

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::OwnedSemaphorePermit;
use tonic::codec::CompressionEncoding;
use tonic::{Code, Request, Response, Status};

use crate::api::ApiError;
use crate::conn::{ConnInfo, Socket};
use crate::infer::{self, pinned_version, target, Data, Input, Output, Target, Unsupported};
use crate::state::State;
use sluice_core::tensor::{DataType, Tensor, TensorData};

/// The types and stubs generated from `proto/grpc_predict_v2.proto` (package
/// `inference`); a Rust client uses `grpc_inference_service_client`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("inference");
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::infer_parameter::ParameterChoice;
use proto::*;

/// Serves gRPC on `listener` until `shutdown` resolves, then finishes the calls in
/// progress (h2 GOAWAY: no new calls on open connections) and returns. Each
/// connection holds one of `slots` (the `max_connections` the HTTP front shares,
/// with each client's share of them: `crate::conn::Connections`); one refused is
/// closed at once and counted, and one asked to give its slot up ends once no call
/// is in progress on it.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<crate::conn::Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Socket>>(16);
    let metrics = state.metrics.clone();
    let idle = std::time::Duration::from_millis(state.config.idle_timeout_ms.max(1));
    // The accept loop: tonic takes connections from a stream; this one applies the
    // connection limit and counts them first.
    let accept = tokio::spawn(async move {
        let errors = crate::throttle::RateLimitedLog::default();
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    errors.warn(|n| tracing::warn!("gRPC accept failed: {e} ({n} more not logged)"));
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let activity = crate::conn::Activity::start();
            let Some(slot) = slots.admit(peer.ip(), &activity, &metrics) else {
                // No HTTP/2 answer can be written before the handshake: closing is
                // the refusal (the client sees UNAVAILABLE).
                metrics.connections.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            metrics.connections.open.fetch_add(1, Ordering::Relaxed);
            let conn = Socket::calls(stream, slot, metrics.clone(), activity, idle);
            if tx.send(Ok(conn)).await.is_err() {
                break;
            }
        }
    });
    let config = &state.config;
    let service = Budgeted { inner: Service::new(state.clone()), state: state.clone() };
    let result = tonic::transport::Server::builder()
        // Dead peers are found by keep-alive pings; a connection with no call in
        // progress for `idle_timeout_ms` is closed (`conn::Idleness::Calls`), and every connection
        // is retired (GOAWAY) at its age bound.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .max_connection_age(std::time::Duration::from_millis(config.idle_timeout_ms.max(1000) * 10))
        .add_service(service)
        .serve_with_incoming_shutdown(Incoming(rx), shutdown)
        .await;
    accept.abort();
    result.map_err(|e| anyhow::anyhow!("gRPC server: {e}"))
}

/// The service with every call's request body counted against `body_budget_bytes`,
/// the budget the HTTP front reserves from: gRPC bodies carry no length up front, so
/// each frame takes its KiB as it arrives, and a call that finds the budget full
/// fails UNAVAILABLE with the HTTP front's message (its 503). What a body took is
/// given back when tonic drops it, once the message is decoded.
#[derive(Clone)]
struct Budgeted<S> {
    inner: S,
    state: Arc<State>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Budgeted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Budgeted<S>
where
    S: tonic::codegen::Service<tonic::codegen::http::Request<BudgetedBody<B>>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let state = self.state.clone();
        // The call keeps its connection from being idle until it is answered.
        let in_flight = req.extensions().get::<ConnInfo>().map(|c| c.activity.begin());
        // A compressed message inflates inside tonic, up to `max_body_bytes`, where
        // no frame shows it: the call takes that much from the budget up front, as
        // the HTTP front does for a body of unknown length, and fails UNAVAILABLE
        // at its first frame without room.
        let compressed =
            req.headers().get("grpc-encoding").is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let (held, refused) = if compressed {
            let kib = u32::try_from(state.config.max_body_bytes.div_ceil(1024)).unwrap_or(u32::MAX);
            match state.body_budget.clone().try_acquire_many_owned(kib) {
                Ok(p) => (Some(p), false),
                Err(_) => (None, true),
            }
        } else {
            (None, false)
        };
        let call = self.inner.call(req.map(|inner| BudgetedBody { inner, state, held, taken_bytes: 0, refused }));
        Box::pin(async move {
            let response = call.await;
            drop(in_flight);
            response
        })
    }
}

/// A request body whose frames hold their share of `body_budget_bytes` (see
/// [`Budgeted`]).
struct BudgetedBody<B> {
    inner: B,
    state: Arc<State>,
    held: Option<OwnedSemaphorePermit>,
    /// Bytes received; the permits held cover them rounded up to KiB (beyond what a
    /// compressed call took up front).
    taken_bytes: usize,
    /// A compressed call that found no room for its inflated message: it fails at
    /// its first frame.
    refused: bool,
}

impl<B> http_body::Body for BudgetedBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.refused {
            return Poll::Ready(Some(Err(Box::new(status(crate::api::budget_full(&self.state))))));
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => f,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            let before = self.taken_bytes.div_ceil(1024);
            self.taken_bytes += data.len();
            let more = self.taken_bytes.div_ceil(1024) - before;
            if more > 0 {
                let kib = u32::try_from(more).unwrap_or(u32::MAX);
                match self.state.body_budget.clone().try_acquire_many_owned(kib) {
                    Ok(p) => match &mut self.held {
                        Some(h) => h.merge(p),
                        None => self.held = Some(p),
                    },
                    Err(_) => {
                        let busy = status(crate::api::budget_full(&self.state));
                        return Poll::Ready(Some(Err(Box::new(busy))));
                    }
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connections the accept loop admitted, as tonic takes them.
struct Incoming(tokio::sync::mpsc::Receiver<std::io::Result<Socket>>);

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<Socket>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// The gRPC status of an error the shared path returned: the same message, the
/// code that matches its HTTP status.
pub fn status(e: ApiError) -> Status {
    let code = match e.status {
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => Code::DeadlineExceeded,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        StatusCode::NOT_IMPLEMENTED => Code::Unimplemented,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        StatusCode::INTERNAL_SERVER_ERROR => Code::Internal,
        _ => Code::Unknown,
    };
    let mut status = Status::new(code, e.message);
    if let Some(extra) = e.extra.as_ref() {
        // A refusal's reason and a drop's are different kinds (one name, one
        // meaning): each has its own trailer, as its HTTP body says `refused` or
        // `dropped`.
        let key = if extra.get("refused").and_then(Value::as_bool) == Some(true) {
            "sluice-refusal-reason"
        } else {
            "sluice-drop-reason"
        };
        if let Some(Ok(v)) = extra.get("reason").and_then(Value::as_str).map(str::parse) {
            status.metadata_mut().insert(key, v);
        }
    }
    status
}

/// The gRPC service over a server's state.
pub struct Service {
    state: Arc<State>,
}

impl Service {
    /// The service for `state` (tests mount it on a server of their own): messages
    /// up to `max_body_bytes` (tonic refuses a larger one OUT_OF_RANGE before
    /// decoding it), gzip- or deflate-compressed requests accepted (tritonclient's
    /// `compression_algorithm`; tonic bounds the decompressed message by the same
    /// limit as it inflates), answers uncompressed: Triton's C++ client announces
    /// `grpc-accept-encoding: gzip` on every call, so compressing whatever a client
    /// accepts would spend CPU on every answer for a loopback's sake, and Triton
    /// compresses answers only when configured to.
    pub fn new(state: Arc<State>) -> GrpcInferenceServiceServer<Service> {
        let max = state.config.max_body_bytes;
        GrpcInferenceServiceServer::new(Service { state })
            .max_decoding_message_size(max)
            .max_encoding_message_size(usize::MAX)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Deflate)
    }

    fn target(&self, name: &str) -> Result<Target, ApiError> {
        target(&self.state, name)
    }

    /// `ModelInfer`, its answer counted by [`GrpcInferenceService::model_infer`].
    async fn infer(&self, req: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        // The message is in: its arrival is now (tonic has read and decoded it).
        let arrived = Instant::now();
        let r = req.into_inner();
        let target = self.target(&r.model_name).map_err(status)?;
        if !r.model_version.is_empty() {
            target.check_version(&r.model_version).map_err(status)?;
            return Err(status(pinned_version(&r.model_name, &r.model_version)));
        }
        // Counted as incoming while its inputs are decoded.
        let incoming = target.precheck().map_err(status)?;
        let requested: Vec<&str> = r.outputs.iter().map(|o| o.name.as_str()).collect();
        target.check_outputs(&requested).map_err(status)?;
        let counts = class_counts(&r.outputs).map_err(status)?;
        let raw = !r.raw_input_contents.is_empty();
        let inputs = decode_inputs(target.name(), r.inputs, r.raw_input_contents).map_err(status)?;
        let audited = incoming.as_ref().is_some_and(crate::app::Incoming::audited);
        drop(incoming);
        let id = (!r.id.is_empty()).then_some(r.id.as_str());
        let answer = target.infer(id, inputs, arrived, audited).await.map_err(status)?;
        let answered = infer::classify(&target, answer.outputs, &counts);
        let mut outputs = Vec::with_capacity(answered.len());
        let mut raw_outputs = Vec::new();
        // Protobuf carries any float, NaN and infinities included: what the model
        // answered goes back as it is, raw or typed as the request came.
        for o in answered {
            let (contents, bytes) = if raw { (None, Some(raw_bytes(&o))) } else { (Some(contents(&o)), None) };
            raw_outputs.extend(bytes);
            outputs.push(model_infer_response::InferOutputTensor {
                name: o.name().to_string(),
                datatype: o.datatype().into(),
                shape: o.shape().iter().map(|d| *d as i64).collect(),
                parameters: HashMap::new(),
                contents,
            });
        }
        Ok(Response::new(ModelInferResponse {
            model_name: answer.model_name,
            model_version: answer.model_version,
            id: r.id,
            parameters: answer.parameters.into_iter().map(|(k, v)| (k, parameter(v))).collect(),
            outputs,
            raw_output_contents: raw_outputs,
        }))
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        let ready = self.state.apps.values().all(|a| a.accepting.load(Ordering::Acquire));
        Ok(Response::new(ServerReadyResponse { ready }))
    }

    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let r = req.into_inner();
        let ready = self.target(&r.name).and_then(|t| t.ready(&r.version)).map_err(status)?;
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "sluice".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: infer::EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        let m = self.target(&r.name).and_then(|t| t.metadata(&r.version)).map_err(status)?;
        let tensors = |ts: Vec<(String, String, Vec<i64>)>| {
            ts.into_iter()
                .map(|(name, datatype, shape)| model_metadata_response::TensorMetadata { name, datatype, shape })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
        }))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let answer = self.infer(req).await;
        // The code's name as `Code`'s `Debug` writes it; a success's without
        // formatting one per call.
        match &answer {
            Ok(_) => self.state.metrics.response("grpc", "Ok"),
            Err(s) => self.state.metrics.response("grpc", &format!("{:?}", s.code())),
        }
        answer
    }

    async fn model_config(&self, req: Request<ModelConfigRequest>) -> Result<Response<ModelConfigResponse>, Status> {
        let r = req.into_inner();
        let c = self.target(&r.name).and_then(|t| t.config(&r.version)).map_err(status)?;
        let data_type = |d: &str| -> i32 {
            let t = match DataType::from_oip(d) {
                Some(DataType::F32) => proto::DataType::TypeFp32,
                Some(DataType::F64) => proto::DataType::TypeFp64,
                Some(DataType::I32) => proto::DataType::TypeInt32,
                Some(DataType::I64) => proto::DataType::TypeInt64,
                Some(DataType::U8) => proto::DataType::TypeUint8,
                None => proto::DataType::TypeInvalid,
            };
            t as i32
        };
        Ok(Response::new(ModelConfigResponse {
            config: Some(proto::ModelConfig {
                name: c.name,
                platform: c.platform,
                backend: "sluice".into(),
                version_policy: Some(ModelVersionPolicy {
                    policy_choice: Some(model_version_policy::PolicyChoice::All(model_version_policy::All {})),
                }),
                max_batch_size: c.max_batch_size,
                input: c
                    .inputs
                    .iter()
                    .map(|(name, d, dims)| ModelInput {
                        name: name.clone(),
                        data_type: data_type(d),
                        dims: dims.clone(),
                    })
                    .collect(),
                output: c
                    .outputs
                    .iter()
                    .map(|(name, d, dims)| ModelOutput {
                        name: name.clone(),
                        data_type: data_type(d),
                        dims: dims.clone(),
                        label_filename: c.label_filename.clone().unwrap_or_default(),
                    })
                    .collect(),
                dynamic_batching: Some(ModelDynamicBatching::default()),
                parameters: c.parameters.into_iter().map(|(k, v)| (k, ModelParameter { string_value: v })).collect(),
            }),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let r = req.into_inner();
        let d = |count: u64, ns: u64| Some(StatisticDuration { count, ns });
        let model_stats = infer::statistics(&self.state, &r.name, &r.version)
            .map_err(status)?
            .into_iter()
            .map(|s| ModelStatistics {
                name: s.name,
                version: infer::STATS_VERSION.into(),
                last_inference: 0,
                inference_count: s.served,
                execution_count: s.executions,
                inference_stats: Some(InferStatistics {
                    success: d(s.served, s.latency_ns),
                    fail: d(s.failed, 0),
                    queue: d(s.served, s.queue_ns),
                    compute_input: d(s.served, 0),
                    compute_infer: d(s.served, s.compute_ns),
                    compute_output: d(s.served, 0),
                    cache_hit: d(0, 0),
                    cache_miss: d(0, 0),
                }),
                batch_stats: Vec::new(),
            })
            .collect();
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let r = req.into_inner();
        let models = infer::repository_index(&self.state, r.ready)
            .into_iter()
            .map(|e| repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state.into(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    // What sluice does not serve: UNIMPLEMENTED with the message the HTTP front's
    // 501 carries (`infer::Unsupported`), never an empty one.

    type ModelStreamInferStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<ModelStreamInferResponse, Status>> + Send + 'static>>;

    async fn model_stream_infer(
        &self,
        req: Request<tonic::Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        // Refusing before the client has finished sending races its half-close:
        // grpcio's aio client then reports its own "Internal error from Core"
        // instead of this status. So read what the client sends first, bounded
        // (a pause, a count and a total time) so that a stream held open costs
        // at most `STREAM_DRAIN_TOTAL`.
        const STREAM_DRAIN_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);
        const STREAM_DRAIN_TOTAL: std::time::Duration = std::time::Duration::from_secs(2);
        const STREAM_DRAIN_MESSAGES: usize = 64;
        let mut stream = req.into_inner();
        let until = tokio::time::Instant::now() + STREAM_DRAIN_TOTAL;
        for _ in 0..STREAM_DRAIN_MESSAGES {
            let next =
                tokio::time::timeout_at(until.min(tokio::time::Instant::now() + STREAM_DRAIN_PAUSE), stream.message());
            match next.await {
                Ok(Ok(Some(_))) => continue,
                _ => break,
            }
        }
        Err(status(Unsupported::Streaming.error("ModelStreamInfer")))
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let m = req.into_inner().model_name;
        Err(status(Unsupported::RepositoryControl.error(&format!("RepositoryModelLoad: cannot load `{m}`"))))
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let m = req.into_inner().model_name;
        Err(status(Unsupported::RepositoryControl.error(&format!("RepositoryModelUnload: cannot unload `{m}`"))))
    }

    async fn system_shared_memory_status(
        &self,
        _: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        Err(status(Unsupported::SystemSharedMemory.error("SystemSharedMemoryStatus")))
    }

    async fn system_shared_memory_register(
        &self,
        _: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        Err(status(Unsupported::SystemSharedMemory.error("SystemSharedMemoryRegister")))
    }

    async fn system_shared_memory_unregister(
        &self,
        _: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        Err(status(Unsupported::SystemSharedMemory.error("SystemSharedMemoryUnregister")))
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        Err(status(Unsupported::CudaSharedMemory.error("CudaSharedMemoryStatus")))
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        Err(status(Unsupported::CudaSharedMemory.error("CudaSharedMemoryRegister")))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        Err(status(Unsupported::CudaSharedMemory.error("CudaSharedMemoryUnregister")))
    }

    async fn trace_setting(&self, _: Request<TraceSettingRequest>) -> Result<Response<TraceSettingResponse>, Status> {
        Err(status(Unsupported::Trace.error("TraceSetting")))
    }

    async fn log_settings(&self, _: Request<LogSettingsRequest>) -> Result<Response<LogSettingsResponse>, Status> {
        Err(status(Unsupported::Logging.error("LogSettings")))
    }
}

/// The classification extension's counts: each requested output's
/// `parameters["classification"]` (tritonclient's `class_count`, an int64).
fn class_counts(outputs: &[model_infer_request::InferRequestedOutputTensor]) -> Result<Vec<(String, u64)>, ApiError> {
    let mut counts = Vec::new();
    for o in outputs {
        let Some(p) = o.parameters.get("classification") else { continue };
        let k = match p.parameter_choice {
            Some(ParameterChoice::Int64Param(k)) => u64::try_from(k).ok(),
            Some(ParameterChoice::Uint64Param(k)) => Some(k),
            _ => None,
        };
        let k = k.ok_or_else(|| {
            ApiError::bad_request(format!(
                "output `{}`: parameters[\"classification\"]: expected a class count (an int64 >= 0), got {:?}",
                o.name, p.parameter_choice
            ))
        })?;
        counts.push((o.name.clone(), k));
    }
    Ok(counts)
}

/// The request's inputs in the shared form: `raw_input_contents` (one entry per
/// input, in order; tritonclient's default) or each input's typed `contents`.
fn decode_inputs(
    app: &str,
    inputs: Vec<model_infer_request::InferInputTensor>,
    raw: Vec<Bytes>,
) -> Result<Vec<Input>, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("app {app}: {m}"));
    if !raw.is_empty() && raw.len() != inputs.len() {
        return Err(bad(format!("raw_input_contents has {} entries for {} inputs", raw.len(), inputs.len())));
    }
    let mut raw = raw.into_iter();
    inputs
        .into_iter()
        .map(|input| {
            let data = match raw.next() {
                Some(bytes) => {
                    if input.contents.is_some() {
                        return Err(bad(format!("input `{}`: both contents and raw_input_contents given", input.name)));
                    }
                    Data::Bytes { bytes, declared: None, source: "raw_input_contents" }
                }
                None => typed(&input).map_err(|m| bad(format!("input `{}`: {m}", input.name)))?,
            };
            Ok(Input { name: input.name, datatype: input.datatype, shape: input.shape, data })
        })
        .collect()
}

/// Why an input's typed `contents` cannot be used ([`typed`]); the caller names the
/// input.
#[derive(Debug, PartialEq, thiserror::Error)]
enum ContentsError {
    /// A `uint_contents` value above 255 for a UINT8 input.
    #[error("uint_contents: a value is outside UINT8 ({0})")]
    OutsideU8(u32),
    /// Neither `contents` nor `raw_input_contents`.
    #[error("no contents (nor raw_input_contents)")]
    Empty,
    /// Contents in another field than the datatype's, or in several.
    #[error("datatype {datatype} takes {field}; the request filled {}", filled.join(", "))]
    WrongField {
        /// The input's datatype.
        datatype: String,
        /// The field it takes.
        field: &'static str,
        /// The fields the request filled.
        filled: Vec<&'static str>,
    },
}

/// An input's typed contents: the field its datatype takes (UINT8 travels in
/// `uint_contents`, as Triton sends it).
fn typed(input: &model_infer_request::InferInputTensor) -> Result<Data, ContentsError> {
    let c = input.contents.clone().unwrap_or_default();
    let Some(datatype) = DataType::from_oip(&input.datatype) else {
        // The shared check names the unknown datatype.
        return Ok(Data::Typed(TensorData::F32(Vec::new())));
    };
    let filled: Vec<&'static str> = [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(f, _)| f)
    .collect();
    let (field, data) = match datatype {
        DataType::F32 => ("fp32_contents", TensorData::F32(c.fp32_contents)),
        DataType::F64 => ("fp64_contents", TensorData::F64(c.fp64_contents)),
        DataType::I32 => ("int_contents", TensorData::I32(c.int_contents)),
        DataType::I64 => ("int64_contents", TensorData::I64(c.int64_contents)),
        DataType::U8 => {
            let bytes: Result<Vec<u8>, _> =
                c.uint_contents.iter().map(|&v| u8::try_from(v).map_err(|_| ContentsError::OutsideU8(v))).collect();
            ("uint_contents", TensorData::U8(bytes?))
        }
    };
    if filled.is_empty() {
        return Err(ContentsError::Empty);
    }
    if filled != [field] {
        return Err(ContentsError::WrongField { datatype: input.datatype.clone(), field, filled });
    }
    Ok(Data::Typed(data))
}

/// An output's raw contents: a tensor's little-endian elements, or BYTES elements
/// each after its u32 length.
fn raw_bytes(o: &Output) -> Bytes {
    match o {
        Output::Tensor(t) => Bytes::from(t.data.to_le_bytes()),
        Output::Classes { values, .. } => Bytes::from(infer::bytes_elements(values)),
    }
}

/// An output's typed contents (answering a request that sent typed contents).
fn contents(o: &Output) -> InferTensorContents {
    let mut c = InferTensorContents::default();
    let t: &Tensor = match o {
        Output::Tensor(t) => t,
        Output::Classes { values, .. } => {
            c.bytes_contents = values.iter().map(|v| v.as_bytes().to_vec()).collect();
            return c;
        }
    };
    match &t.data {
        TensorData::F32(v) => c.fp32_contents = v.clone(),
        TensorData::F64(v) => c.fp64_contents = v.clone(),
        TensorData::I32(v) => c.int_contents = v.clone(),
        TensorData::I64(v) => c.int64_contents = v.clone(),
        TensorData::U8(v) => c.uint_contents = v.iter().map(|x| u32::from(*x)).collect(),
    }
    c
}

/// A response parameter: scalars as themselves, anything else as its JSON text.
fn parameter(v: Value) -> InferParameter {
    let choice = match v {
        Value::Bool(b) => ParameterChoice::BoolParam(b),
        Value::Number(n) if n.is_i64() => ParameterChoice::Int64Param(n.as_i64().unwrap_or_default()),
        Value::Number(n) if n.is_u64() => ParameterChoice::Uint64Param(n.as_u64().unwrap_or_default()),
        Value::Number(n) => ParameterChoice::DoubleParam(n.as_f64().unwrap_or_default()),
        Value::String(s) => ParameterChoice::StringParam(s),
        other => ParameterChoice::StringParam(other.to_string()),
    };
    InferParameter { parameter_choice: Some(choice) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_errors_name_the_field_and_the_value() {
        let input = |datatype: &str, contents: proto::InferTensorContents| model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: datatype.into(),
            shape: vec![1],
            contents: Some(contents),
            ..Default::default()
        };
        let uint = |v: Vec<u32>| proto::InferTensorContents { uint_contents: v, ..Default::default() };
        let e = typed(&input("UINT8", uint(vec![3, 300]))).err().expect("an error");
        assert_eq!(e, ContentsError::OutsideU8(300));
        assert_eq!(e.to_string(), "uint_contents: a value is outside UINT8 (300)");
        let e = typed(&input("FP32", uint(vec![3]))).err().expect("an error");
        assert_eq!(e.to_string(), "datatype FP32 takes fp32_contents; the request filled uint_contents");
        let e = typed(&input("FP32", proto::InferTensorContents::default())).err().expect("an error");
        assert_eq!(e, ContentsError::Empty);
    }
}

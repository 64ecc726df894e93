//! The remote executor: a batch run on another process (a cluster agent) over the
//! Open Inference Protocol, and the agent's side of it.
//!
//! The wire format is the protocol's own, batched: `POST
//! /v2/models/{app}/versions/{variant}/infer` with one input whose leading dimension
//! is the batch, in the binary tensor data extension (a JSON header of
//! `Inference-Header-Content-Length` bytes, then the raw little-endian data), and
//! `parameters.device` naming the agent's device. The answer is the app's one output,
//! `[batch, n]`, in binary too. Any OIP client can call an agent; sluice's frontends
//! do through [`RemoteExecutor`].
//!
//! - [`RemoteExecutor`] implements core's `Executor` for one (agent, device, app,
//!   variant): it sends the worker's batch, bounded by a timeout, and on a transport
//!   failure (connection refused or reset, no answer in time) tries once more on the
//!   fallback its owner names (another device serving the same variant). A batch that
//!   still fails is a clear `ExecError::Backend` naming the agent, and the worker
//!   answers each of its requests with that reason — never twice, never not at all.
//! - [`AgentModels`] holds what an agent has loaded, per device, and [`serve_agent`]
//!   is the agent's HTTP server: no queue and no policy (the frontend's worker decided
//!   the batch); batches on one device run one at a time, as on a real accelerator.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};

use sluice_core::executor::{BatchFuture, ExecError, Executor, OUTPUT_NAME};
use sluice_core::tensor::{DataType, Tensor, TensorData};

use super::LoadedModel;
use crate::binary;

/// Where a batch goes: a variant of an app on one device of one agent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteTarget {
    /// The agent's address, `host:port` (an `http://` prefix is accepted).
    pub addr: String,
    /// The device on the agent.
    pub device: u32,
    /// The app.
    pub app: String,
    /// The variant (model name).
    pub variant: String,
}

impl RemoteTarget {
    fn host_port(&self) -> &str {
        self.addr.trim_start_matches("http://").trim_end_matches('/')
    }
}

/// Another target for a batch whose target failed (None: no other).
pub type Fallback = Arc<dyn Fn(&RemoteTarget) -> Option<RemoteTarget> + Send + Sync>;

/// Kept-alive HTTP/1.1 connections to agents, shared by every remote executor of a
/// process (one per batch in flight per agent; idle ones are reused).
#[derive(Default)]
pub struct AgentPool {
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
    /// Batches that failed on their first target and were sent to a fallback.
    pub retried: AtomicU64,
}

/// How long connecting to an agent may take: on loopback or a cluster network a
/// connect answers in well under a millisecond, so a second means the agent is gone.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Idle connections kept per agent; more are closed when returned.
const IDLE_PER_AGENT: usize = 64;

/// Why one attempt failed.
#[derive(Debug)]
enum SendError {
    /// The agent could not be reached or stopped answering: worth a retry elsewhere.
    Transport(String),
    /// The agent answered with an error: it said what was wrong.
    Status(StatusCode, String),
}

impl AgentPool {
    /// A new, empty pool.
    pub fn new() -> Arc<AgentPool> {
        Arc::new(AgentPool::default())
    }

    async fn connection(&self, host_port: &str) -> Result<SendRequest<Full<Bytes>>, SendError> {
        loop {
            let idle = self.idle.lock().get_mut(host_port).and_then(Vec::pop);
            match idle {
                // A connection the agent closed while idle is dropped; take the next.
                Some(c) if !c.is_closed() && c.is_ready() => return Ok(c),
                Some(_) => continue,
                None => break,
            }
        }
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(host_port))
            .await
            .map_err(|_| SendError::Transport(format!("connecting to {host_port} timed out")))?
            .map_err(|e| SendError::Transport(format!("connecting to {host_port}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Transport(format!("{host_port}: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }

    /// Sends one request and reads the whole answer within `timeout`.
    async fn send(
        &self,
        host_port: &str,
        req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Option<usize>, Bytes), SendError> {
        let attempt = async {
            let mut c = self.connection(host_port).await?;
            let resp = c.send_request(req).await.map_err(|e| SendError::Transport(format!("{host_port}: {e}")))?;
            let status = resp.status();
            let json_len = resp
                .headers()
                .get(binary::HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<usize>().ok());
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| SendError::Transport(format!("{host_port}: reading the answer: {e}")))?
                .to_bytes();
            let mut idle = self.idle.lock();
            let list = idle.entry(host_port.to_string()).or_default();
            if list.len() < IDLE_PER_AGENT {
                list.push(c);
            }
            Ok((status, json_len, body))
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| SendError::Transport(format!("{host_port}: no answer within {} ms", timeout.as_millis())))?
    }
}

/// A variant on a remote agent's device, as one worker's executor (see the module docs).
pub struct RemoteExecutor {
    target: RemoteTarget,
    pool: Arc<AgentPool>,
    timeout: Duration,
    fallback: Option<Fallback>,
}

impl RemoteExecutor {
    /// An executor sending batches to `target` through `pool`, each bounded by
    /// `timeout`, retrying once on `fallback`'s choice after a transport failure.
    pub fn new(
        target: RemoteTarget,
        pool: Arc<AgentPool>,
        timeout: Duration,
        fallback: Option<Fallback>,
    ) -> RemoteExecutor {
        RemoteExecutor { target, pool, timeout, fallback }
    }

    /// Where its batches go.
    pub fn target(&self) -> &RemoteTarget {
        &self.target
    }

    async fn run_on(
        &self,
        target: &RemoteTarget,
        body: Bytes,
        json_len: usize,
        n: usize,
    ) -> Result<Vec<Vec<Tensor>>, SendError> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("/v2/models/{}/versions/{}/infer", target.app, target.variant))
            .header(hyper::header::HOST, target.host_port())
            .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
            .header(binary::HEADER, json_len)
            .body(Full::new(body))
            .map_err(|e| SendError::Transport(e.to_string()))?;
        let (status, out_len, answer) = self.pool.send(target.host_port(), req, self.timeout).await?;
        if status != StatusCode::OK {
            let message = serde_json::from_slice::<Value>(&answer)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&answer).chars().take(200).collect());
            return Err(SendError::Status(status, message));
        }
        let output =
            decode_output(answer, out_len).map_err(|e| SendError::Status(StatusCode::BAD_GATEWAY, e.to_string()))?;
        let parts = output.split(n).map_err(|e| SendError::Status(StatusCode::BAD_GATEWAY, e.to_string()))?;
        Ok(parts.into_iter().map(|p| vec![p]).collect())
    }
}

impl Executor for RemoteExecutor {
    fn run(&self, _model: u32, samples: Vec<Tensor>) -> BatchFuture<'_> {
        Box::pin(async move {
            let n = samples.len();
            let refs: Vec<&Tensor> = samples.iter().collect();
            let batch = Tensor::concat(&refs).map_err(|e| ExecError::Backend(format!("remote batch: {e}")))?;
            let (body, json_len) = encode_batch(&batch, self.target.device);
            let describe = |t: &RemoteTarget, e: SendError| match e {
                SendError::Transport(m) => format!("agent {} (device {}): {m}", t.addr, t.device),
                SendError::Status(s, m) => {
                    format!("agent {} (device {}) answered {}: {m}", t.addr, t.device, s.as_u16())
                }
            };
            match self.run_on(&self.target, body.clone(), json_len, n).await {
                Ok(out) => Ok(out),
                // A transport failure, or a variant the agent no longer has (it was
                // unloaded under a plan this frontend has not seen yet): inference is
                // idempotent, so the batch may run elsewhere.
                Err(e @ (SendError::Transport(_) | SendError::Status(StatusCode::NOT_FOUND, _))) => {
                    let first = describe(&self.target, e);
                    let Some(other) = self.fallback.as_ref().and_then(|f| f(&self.target)) else {
                        return Err(ExecError::Backend(format!(
                            "{first}; no other copy of {} on a live agent",
                            self.target.variant
                        )));
                    };
                    self.pool.retried.fetch_add(1, Ordering::Relaxed);
                    let (body, json_len) = encode_batch(&batch, other.device);
                    self.run_on(&other, body, json_len, n)
                        .await
                        .map_err(|e| ExecError::Backend(format!("{first}; retried on {}", describe(&other, e))))
                }
                Err(e) => Err(ExecError::Backend(describe(&self.target, e))),
            }
        })
    }
}

/// The batch request's body and its JSON header's length.
fn encode_batch(batch: &Tensor, device: u32) -> (Bytes, usize) {
    let data = batch.data.to_le_bytes();
    let header = json!({
        "inputs": [{
            "name": batch.name,
            "shape": batch.shape,
            "datatype": batch.datatype().oip_name(),
            "parameters": { "binary_data_size": data.len() },
        }],
        "outputs": [{ "name": OUTPUT_NAME, "parameters": { "binary_data": true } }],
        "parameters": { "device": device },
    });
    let mut body = header.to_string().into_bytes();
    let json_len = body.len();
    body.extend(data);
    (Bytes::from(body), json_len)
}

#[derive(Deserialize)]
struct WireTensor {
    name: String,
    shape: Vec<usize>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Value>,
}

/// A tensor of the batch protocol that cannot be read: in a batch an agent was
/// sent (its client's error, 400) or in the answer it gave (502 at the host).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A datatype the protocol does not have.
    #[error("tensor `{tensor}`: unknown datatype `{datatype}`")]
    Datatype {
        /// The tensor.
        tensor: String,
        /// The datatype given.
        datatype: String,
    },
    /// `binary_data_size` is not a byte count.
    #[error("tensor `{tensor}`: {source}")]
    DataSize {
        /// The tensor.
        tensor: String,
        /// What was wrong with it.
        source: binary::BinaryError,
    },
    /// A tensor in JSON: the batch protocol carries them in binary.
    #[error("tensor `{0}`: the batch protocol carries tensors in binary (binary_data_size)")]
    NotBinary(String),
    /// `binary_data_size` is not the number of bytes after the header.
    #[error("tensor `{tensor}`: binary_data_size is {size} but {follow} bytes follow")]
    SizeMismatch {
        /// The tensor.
        tensor: String,
        /// `binary_data_size`.
        size: usize,
        /// The bytes after the header.
        follow: usize,
    },
    /// The bytes are not whole elements of the datatype.
    #[error("tensor `{tensor}`: {reason}")]
    Data {
        /// The tensor.
        tensor: String,
        /// Why (core's `TensorData::from_le_bytes`).
        reason: sluice_core::tensor::PartialElementError,
    },
    /// The shape does not hold the elements.
    #[error(transparent)]
    Shape(#[from] sluice_core::tensor::TensorError),
    /// The agent's answer has no JSON header length.
    #[error("the agent's answer is not in binary")]
    AnswerNotBinary,
    /// The agent's answer is shorter than its header says.
    #[error("the agent's answer is cut short ({len} bytes, header {header})")]
    AnswerShort {
        /// The answer's length, bytes.
        len: usize,
        /// The header's, bytes.
        header: usize,
    },
    /// The agent's answer's JSON header is not an answer.
    #[error("the agent's answer: {0}")]
    AnswerJson(serde_json::Error),
    /// The agent's answer has no output tensor.
    #[error("the agent's answer has no output")]
    NoOutput,
}

/// One binary tensor from a JSON header entry and the bytes after the header.
fn wire_tensor(t: WireTensor, data: &[u8]) -> Result<Tensor, WireError> {
    let datatype = DataType::from_oip(&t.datatype)
        .ok_or_else(|| WireError::Datatype { tensor: t.name.clone(), datatype: t.datatype.clone() })?;
    let size = binary::data_size(t.parameters.as_ref())
        .map_err(|source| WireError::DataSize { tensor: t.name.clone(), source })?
        .ok_or_else(|| WireError::NotBinary(t.name.clone()))?;
    if size != data.len() {
        return Err(WireError::SizeMismatch { tensor: t.name, size, follow: data.len() });
    }
    let values = TensorData::from_le_bytes(datatype, data)
        .map_err(|reason| WireError::Data { tensor: t.name.clone(), reason })?;
    Ok(Tensor::new(t.name, t.shape, values)?)
}

fn decode_output(answer: Bytes, json_len: Option<usize>) -> Result<Tensor, WireError> {
    let json_len = json_len.ok_or(WireError::AnswerNotBinary)?;
    if json_len > answer.len() {
        return Err(WireError::AnswerShort { len: answer.len(), header: json_len });
    }
    #[derive(Deserialize)]
    struct Answer {
        outputs: Vec<WireTensor>,
    }
    let a: Answer = serde_json::from_slice(&answer[..json_len]).map_err(WireError::AnswerJson)?;
    let out = a.outputs.into_iter().next().ok_or(WireError::NoOutput)?;
    wire_tensor(out, &answer[json_len..])
}

/// What a device has loaded: per (app, variant), its load id and the model.
type Loaded = BTreeMap<(String, String), (u32, Arc<LoadedModel>)>;

/// One device of an agent: what it has loaded, and the lock that runs its batches
/// one at a time.
#[derive(Default)]
struct Device {
    busy: tokio::sync::Mutex<()>,
    loaded: Mutex<Loaded>,
}

/// What an agent has loaded on each of its devices.
pub struct AgentModels {
    devices: Vec<Device>,
    /// Whether the agent serves (false before its first load and while draining).
    pub ready: AtomicBool,
    /// Batches run, for metrics and tests.
    pub batches: AtomicU64,
}

impl AgentModels {
    /// An agent with `devices` devices and nothing loaded.
    pub fn new(devices: usize) -> Arc<AgentModels> {
        Arc::new(AgentModels {
            devices: (0..devices).map(|_| Device::default()).collect(),
            ready: AtomicBool::new(false),
            batches: AtomicU64::new(0),
        })
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Installs a loaded (and warmed) variant on `device` as model `id` of `app`.
    pub fn install(
        &self,
        device: u32,
        app: &str,
        variant: &str,
        id: u32,
        model: LoadedModel,
    ) -> Result<(), AgentError> {
        let d = self.devices.get(device as usize).ok_or_else(|| {
            AgentError::NotFound(format!("no device {device} (the agent has {})", self.devices.len()))
        })?;
        d.loaded.lock().insert((app.to_string(), variant.to_string()), (id, Arc::new(model)));
        Ok(())
    }

    /// Unloads a variant (a batch running on it finishes first: it holds its own reference).
    pub fn unload(&self, device: u32, app: &str, variant: &str) -> bool {
        self.devices
            .get(device as usize)
            .is_some_and(|d| d.loaded.lock().remove(&(app.to_string(), variant.to_string())).is_some())
    }

    /// What is loaded: (device, app, variant).
    pub fn loaded(&self) -> Vec<(u32, String, String)> {
        let mut out = Vec::new();
        for (i, d) in self.devices.iter().enumerate() {
            for (app, variant) in d.loaded.lock().keys() {
                out.push((i as u32, app.clone(), variant.clone()));
            }
        }
        out
    }

    /// Runs one batch on `device`'s `variant` of `app`.
    pub async fn run(&self, device: u32, app: &str, variant: &str, batch: Tensor) -> Result<Tensor, AgentError> {
        let d = self.devices.get(device as usize).ok_or_else(|| {
            AgentError::NotFound(format!("no device {device} (the agent has {})", self.devices.len()))
        })?;
        let (id, model) = d.loaded.lock().get(&(app.to_string(), variant.to_string())).cloned().ok_or_else(|| {
            AgentError::NotFound(format!("variant `{variant}` of app `{app}` is not loaded on device {device}"))
        })?;
        let n = batch.shape.first().copied().unwrap_or(0);
        if n == 0 {
            return Err(AgentError::BadRequest("an empty batch".into()));
        }
        let samples = batch.split(n).map_err(|e| AgentError::BadRequest(e.to_string()))?;
        let outputs = {
            let _busy = d.busy.lock().await;
            model.run(id, samples).await.map_err(|e| AgentError::Failed(e.to_string()))?
        };
        self.batches.fetch_add(1, Ordering::Relaxed);
        let firsts: Vec<Tensor> = outputs
            .into_iter()
            .map(|mut o| {
                if o.is_empty() {
                    Err(AgentError::Failed("a sample has no output".into()))
                } else {
                    Ok(o.swap_remove(0))
                }
            })
            .collect::<Result<_, _>>()?;
        let refs: Vec<&Tensor> = firsts.iter().collect();
        Tensor::concat(&refs).map_err(|e| AgentError::Failed(e.to_string()))
    }
}

/// Why an agent refused or failed a batch.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The request is malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// No such device or variant here (404): the frontend's plan is stale.
    #[error("{0}")]
    NotFound(String),
    /// The variant failed to run the batch (500).
    #[error("{0}")]
    Failed(String),
    /// The agent is draining or not ready (503).
    #[error("{0}")]
    Unavailable(String),
}

impl AgentError {
    fn status(&self) -> StatusCode {
        match self {
            AgentError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AgentError::NotFound(_) => StatusCode::NOT_FOUND,
            AgentError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            AgentError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The largest batch body an agent reads (a batch of 64 ImageNet images in FP32 is
/// 38 MiB).
pub const AGENT_MAX_BODY: usize = 256 << 20;

fn error_response(e: AgentError) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(json!({ "error": e.to_string() }).to_string())));
    *r.status_mut() = e.status();
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

fn json_ok(v: Value, status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

/// One request to an agent.
async fn agent_handle(models: Arc<AgentModels>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["v2", "health", "live"]) => json_ok(json!({ "live": true }), StatusCode::OK),
        (&Method::GET, ["v2", "health", "ready"]) => {
            let ready = models.ready.load(Ordering::Acquire);
            json_ok(json!({ "ready": ready }), if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE })
        }
        (&Method::GET, ["v2", "agent", "loaded"]) => {
            let loaded: Vec<Value> =
                models.loaded().into_iter().map(|(d, a, v)| json!({ "device": d, "app": a, "variant": v })).collect();
            json_ok(json!({ "loaded": loaded, "batches": models.batches.load(Ordering::Relaxed) }), StatusCode::OK)
        }
        (&Method::POST, ["v2", "models", app, "versions", variant, "infer"]) => {
            let (app, variant) = (app.to_string(), variant.to_string());
            match agent_infer(&models, &app, &variant, req).await {
                Ok(r) => r,
                Err(e) => error_response(e),
            }
        }
        _ => error_response(AgentError::NotFound(format!("no route for {} {path} on an agent", req.method()))),
    }
}

async fn agent_infer(
    models: &AgentModels,
    app: &str,
    variant: &str,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, AgentError> {
    let json_len = req
        .headers()
        .get(binary::HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<usize>().ok())
        .ok_or_else(|| AgentError::BadRequest(format!("an agent takes binary batches ({} header)", binary::HEADER)))?;
    let body = Limited::new(req.into_body(), AGENT_MAX_BODY)
        .collect()
        .await
        .map_err(|e| AgentError::BadRequest(format!("reading the batch: {e}")))?
        .to_bytes();
    let (json, data) = binary::split(body, Some(json_len)).map_err(|e| AgentError::BadRequest(e.to_string()))?;
    #[derive(Deserialize)]
    struct BatchRequest {
        inputs: Vec<WireTensor>,
        #[serde(default)]
        parameters: Option<Value>,
    }
    let request: BatchRequest =
        serde_json::from_slice(&json).map_err(|e| AgentError::BadRequest(format!("the batch's JSON header: {e}")))?;
    let device = match request.parameters.as_ref().and_then(|p| p.get("device")) {
        None => 0,
        Some(v) => v
            .as_u64()
            .and_then(|d| u32::try_from(d).ok())
            .ok_or_else(|| AgentError::BadRequest(format!("parameters.device: expected a device index, got {v}")))?,
    };
    let mut inputs = request.inputs;
    if inputs.len() != 1 {
        return Err(AgentError::BadRequest(format!("expected exactly 1 input tensor, got {}", inputs.len())));
    }
    let batch =
        wire_tensor(inputs.pop().expect("one input"), &data).map_err(|e| AgentError::BadRequest(e.to_string()))?;
    let output = models.run(device, app, variant, batch).await?;
    let bytes = output.data.to_le_bytes();
    let header = json!({
        "model_name": app,
        "model_version": variant,
        "outputs": [{
            "name": output.name,
            "shape": output.shape,
            "datatype": output.datatype().oip_name(),
            "parameters": { "binary_data_size": bytes.len() },
        }],
    })
    .to_string()
    .into_bytes();
    let header_len = header.len();
    let mut body = header;
    body.extend(bytes);
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let h = r.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/octet-stream"));
    h.insert(binary::HEADER, hyper::header::HeaderValue::from(header_len));
    Ok(r)
}

/// Serves an agent's batches on `listener` until `shutdown` resolves; connections
/// still open then are closed after at most `grace`.
pub async fn serve_agent(
    listener: tokio::net::TcpListener,
    models: Arc<AgentModels>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (stream, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("agent: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let models = models.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let models = models.clone();
                async move { Ok::<_, std::convert::Infallible>(agent_handle(models, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    conns.abort_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_goes_to_an_agent_and_back_and_failures_are_named() {
        let models = AgentModels::new(2);
        models.install(1, "img", "small", 3, LoadedModel::Emulated(Arc::new(vec![0]))).unwrap();
        models.ready.store(true, Ordering::Release);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_agent(
            listener,
            models.clone(),
            async move {
                let _ = stopped.await;
            },
            Duration::from_secs(1),
        ));
        let pool = AgentPool::new();
        let target =
            RemoteTarget { addr: format!("http://{addr}"), device: 1, app: "img".into(), variant: "small".into() };
        let exec = RemoteExecutor::new(target.clone(), pool.clone(), Duration::from_secs(5), None);
        let sample = |v: f32| Tensor::new("x", vec![1, 2], TensorData::F32(vec![v, 1.0])).unwrap();
        let out = exec.run(3, vec![sample(1.0), sample(2.0), sample(5.0)]).await.unwrap();
        assert_eq!(out.len(), 3);
        // The emulated executor answers [model id, sum of the sample] per sample.
        assert_eq!(out[2][0].data, TensorData::F32(vec![3.0, 6.0]));
        assert_eq!(out[0][0].shape, vec![1, 2]);
        assert_eq!(models.batches.load(Ordering::Relaxed), 1);

        // A variant the agent does not have: a 404 naming it, with no fallback.
        let missing = RemoteTarget { variant: "large".into(), ..target.clone() };
        let e = RemoteExecutor::new(missing, pool.clone(), Duration::from_secs(5), None)
            .run(0, vec![sample(1.0)])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("404") && e.contains("`large`"), "{e}");

        // A dead agent with a fallback: retried there, once.
        let dead_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dead = RemoteTarget { addr: format!("127.0.0.1:{dead_port}"), ..target.clone() };
        let alive = target.clone();
        let fallback: Fallback = Arc::new(move |_| Some(alive.clone()));
        let out = RemoteExecutor::new(dead.clone(), pool.clone(), Duration::from_secs(5), Some(fallback))
            .run(3, vec![sample(4.0)])
            .await
            .unwrap();
        assert_eq!(out[0][0].data, TensorData::F32(vec![3.0, 5.0]));
        assert_eq!(pool.retried.load(Ordering::Relaxed), 1);
        // Without one: a clear error naming the agent.
        let e =
            RemoteExecutor::new(dead, pool, Duration::from_secs(5), None).run(3, vec![sample(4.0)]).await.unwrap_err();
        assert!(e.to_string().contains(&format!("127.0.0.1:{dead_port}")), "{e}");
        let _ = stop.send(());
        server.await.unwrap();
    }

    #[test]
    fn wire_errors_name_the_tensor_and_the_numbers() {
        let tensor = |size: Value| WireTensor {
            name: "pixels".into(),
            shape: vec![2],
            datatype: "FP32".into(),
            parameters: Some(serde_json::json!({ "binary_data_size": size })),
        };
        let e = wire_tensor(tensor(serde_json::json!(8)), &[0; 4]).unwrap_err();
        assert!(matches!(e, WireError::SizeMismatch { size: 8, follow: 4, .. }), "{e:?}");
        assert_eq!(e.to_string(), "tensor `pixels`: binary_data_size is 8 but 4 bytes follow");
        let e = wire_tensor(tensor(serde_json::json!(-1)), &[]).unwrap_err();
        assert_eq!(e.to_string(), "tensor `pixels`: binary_data_size: expected a byte count, got -1");
        let e = wire_tensor(tensor(serde_json::json!(3)), &[0; 3]).unwrap_err();
        assert!(matches!(e, WireError::Data { .. }) && e.to_string().starts_with("tensor `pixels`: "), "{e}");
        let e = wire_tensor(WireTensor { datatype: "FP8".into(), ..tensor(serde_json::json!(8)) }, &[]).unwrap_err();
        assert_eq!(e.to_string(), "tensor `pixels`: unknown datatype `FP8`");
        let e = decode_output(Bytes::from_static(b"{}"), None).unwrap_err();
        assert!(matches!(e, WireError::AnswerNotBinary));
        let e = decode_output(Bytes::from_static(b"{}"), Some(9)).unwrap_err();
        assert_eq!(e.to_string(), "the agent's answer is cut short (2 bytes, header 9)");
        let e = decode_output(Bytes::from_static(br#"{"outputs": []}"#), Some(15)).unwrap_err();
        assert!(matches!(e, WireError::NoOutput));
        let e = AgentModels::new(1).install(4, "img", "small", 0, LoadedModel::Emulated(Arc::new(vec![0])));
        assert_eq!(e.unwrap_err().to_string(), "no device 4 (the agent has 1)");
    }
}

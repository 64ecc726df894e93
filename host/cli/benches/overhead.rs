//! Host overhead: `sluice serve` on zero-latency emulated models against a bare
//! hyper/tonic server, in the same run, on the same cores, under the same load.
//!
//! Two servers, each a separate process:
//! - **sluice**: `sluice serve --config examples/bench-zero.toml --grpc-listen
//!   127.0.0.1:0` (cargo builds the binary for the bench): the app `zero`, four
//!   workers, the Jellyfish policy, models that take 0 µs.
//! - **bare**: this bench's own executable started again as a child (the
//!   `SLUICE_OVERHEAD_BARE` environment variable), with a multi-threaded tokio
//!   runtime as `sluice serve` builds: a hyper HTTP/1.1 server that reads the body,
//!   splits the binary-tensor extension's tail off, parses the OIP JSON, checks the
//!   input tensor against its shape and decodes its numbers; and a tonic server of
//!   the same KServe v2 proto whose `ModelInfer` checks and decodes the input the
//!   same way. Both answer with sluice's own answer to the same request (taken
//!   from sluice at the start), so the two send the same bytes. A child process and
//!   not a server inside the bench: sluice runs in a process of its own with its
//!   own runtime threads, and so must the baseline, or the load generator's tasks
//!   would share the baseline's runtime and the comparison would not be fair.
//!
//! The load comes from this process (its own multi-threaded runtime), the same
//! driver for both servers:
//! - **closed loop** at concurrency 1, 2, 4, 8, 16: that many clients, each on its
//!   own connection ([`sluice_loadgen::Client`] for HTTP; for gRPC h2's own client
//!   sending a pre-encoded `ModelInfer` and decoding each answer with prost,
//!   [`RawGrpc`], or a tonic channel with `OVERHEAD_GRPC_CLIENT=tonic`),
//!   sending back to back; throughput is answers per second, for HTTP with a JSON
//!   body (`http`), HTTP with the binary-tensor extension (`http-bin`) and gRPC
//!   with `raw_input_contents` (`grpc`, as tritonclient sends);
//! - **open loop** at 1k, 5k and 10k requests/s over a pool of 64 requests in
//!   flight (64 HTTP connections; 64 gRPC calls over 4 HTTP/2 connections), arrivals paced by
//!   a thread of their own (`std::thread::sleep`, tens of µs late at worst, where
//!   tokio's 1 ms timer would send bursts of ten at 10k/s); client-observed
//!   latency percentiles.
//!
//! Every point runs both servers back to back, in alternating order, so that
//! whatever else the machine does falls on both alike. Beside each figure: the
//! server process's CPU time per answer (`/proc/<pid>/stat`), and the driver's own
//! (this process's: the clients share the 2 cores with the server).
//!
//! Run: `cargo bench -p sluice --bench overhead` (needs `cargo xtask policies`).
//! `OVERHEAD_SECONDS` (default 3) sets a phase's length, `OVERHEAD_ROUNDS`
//! (default 1) how many times the whole grid runs (figures: the medians);
//! `OVERHEAD_PERF=DIR` profiles instead (`perf record -g` on each server under 8
//! clients per protocol, into `DIR/<server>-<proto>.perf.data`, and the driver
//! meanwhile into `DIR/driver-<server>-<proto>.perf.data`, DIR relative to the
//! workspace root; `OVERHEAD_PERF_ARGS` replaces `-g`); `OVERHEAD_SLUICE=EXE`
//! runs another build of sluice (an A/B against the same baseline). Prints
//! the tables, one JSON line, and last
//! `overhead: http peak X % of bare, grpc peak Y % of bare, added p99 Z ms at 10k req/s`
//! (Z: the larger of HTTP's and gRPC's). Goals: peak >= 80 % of bare on both
//! protocols, added p99 <= 0.1 ms at 10k req/s, gRPC's peak within 10 % of HTTP's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::json;
use sluice_loadgen::Client;
use sluice_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice_server::grpc::proto::{ModelInferRequest, ModelInferResponse};
use tonic::transport::Channel;

mod common;

const CONCURRENCY: [usize; 5] = [1, 2, 4, 8, 16];
const RATES: [f64; 3] = [1_000.0, 5_000.0, 10_000.0];
/// Requests in flight at most in the open loop (HTTP connections; gRPC calls).
const POOL: usize = 64;
/// gRPC channels (HTTP/2 connections) the open loop's calls share.
const GRPC_CHANNELS: usize = 4;
const APP: &str = "zero";
const GOAL_PEAK: f64 = 0.80;
const GOAL_ADDED_P99_MS: f64 = 0.1;
const GOAL_GRPC_VS_HTTP: f64 = 0.10;
/// The environment variable that makes this executable the bare server; its value
/// is the directory holding the answers to send.
const BARE_ENV: &str = "SLUICE_OVERHEAD_BARE";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The protocols loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
enum Proto {
    /// HTTP/1.1, the OIP JSON body.
    Http,
    /// HTTP/1.1, the binary-tensor extension (JSON header, raw little-endian tail).
    HttpBin,
    /// gRPC `ModelInfer` with `raw_input_contents`.
    Grpc,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Http => "http",
            Proto::HttpBin => "http-bin",
            Proto::Grpc => "grpc",
        }
    }
}

/// One server under test: where it listens and its process.
struct Server {
    name: &'static str,
    process: common::ServerProcess,
    grpc: SocketAddr,
}

/// What a request carries, the same for both servers.
struct Work {
    path: String,
    json_body: Vec<u8>,
    /// The binary-tensor extension's body and the length of its JSON part.
    bin_body: Vec<u8>,
    bin_json_len: String,
    grpc: ModelInferRequest,
    /// `grpc` encoded once, as gRPC frames a message (flag, length, bytes), for
    /// [`RawGrpc`].
    grpc_frame: Bytes,
}

/// A client connection of either protocol.
enum Conn {
    Http(Client),
    Grpc(GrpcInferenceServiceClient<Channel>),
    RawGrpc(RawGrpc),
}

async fn grpc_client(addr: SocketAddr) -> Result<GrpcInferenceServiceClient<Channel>> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true).connect().await?;
    Ok(GrpcInferenceServiceClient::new(channel).max_decoding_message_size(usize::MAX))
}

/// Which gRPC client the driver uses: h2's own (the default) or tonic's
/// (`OVERHEAD_GRPC_CLIENT=tonic`), the same for both servers either way.
fn tonic_driver() -> bool {
    std::env::var("OVERHEAD_GRPC_CLIENT").is_ok_and(|v| v == "tonic")
}

/// A gRPC client on one HTTP/2 connection through h2's own client, the layer under
/// tonic and hyper: it sends a `ModelInfer` encoded once ([`Work::grpc_frame`]) and
/// decodes each answer with prost. It does what a gRPC client must (HTTP/2 framing,
/// flow control, the status in the trailers, decoding the answer) without tonic's
/// channel, tower buffer and codec, which cost the shared cores as much again as
/// the server's own work: a heavier client there slows whichever server it drives
/// and hides their difference. Clones share the connection, as a tonic channel's do.
#[derive(Clone)]
struct RawGrpc {
    send: h2::client::SendRequest<Bytes>,
    head: Arc<hyper::http::request::Parts>,
}

impl RawGrpc {
    async fn connect(addr: SocketAddr) -> Result<RawGrpc> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(tcp).await?;
        // The connection's frames are read and written by a task of its own, as in
        // any h2 client.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let (head, ()) = hyper::http::Request::post(format!("http://{addr}/inference.GRPCInferenceService/ModelInfer"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?
            .into_parts();
        Ok(RawGrpc { send, head: Arc::new(head) })
    }

    /// One call: the framed message out, the answer's message back, decoded.
    async fn call(&mut self, frame: &Bytes) -> Result<ModelInferResponse> {
        std::future::poll_fn(|cx| self.send.poll_ready(cx)).await?;
        let mut req = hyper::http::Request::new(());
        *req.method_mut() = self.head.method.clone();
        *req.uri_mut() = self.head.uri.clone();
        *req.headers_mut() = self.head.headers.clone();
        let (answer, mut stream) = self.send.send_request(req, false)?;
        stream.send_data(frame.clone(), true)?;
        let answer = answer.await?;
        let grpc_status = |h: &hyper::http::HeaderMap| -> Result<bool> {
            match h.get("grpc-status") {
                None => Ok(false),
                Some(v) if v == "0" => Ok(true),
                Some(v) => bail!("gRPC status {v:?}: {:?}", h.get("grpc-message")),
            }
        };
        if answer.status() != 200 {
            bail!("gRPC over HTTP {}", answer.status());
        }
        // A trailers-only answer (an error) carries its status in the headers.
        grpc_status(answer.headers())?;
        let mut body = answer.into_body();
        let mut message: Option<Bytes> = None;
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            let _ = body.flow_control().release_capacity(chunk.len());
            message = Some(match message {
                None => chunk,
                Some(m) => [&m[..], &chunk[..]].concat().into(),
            });
        }
        let ok = match body.trailers().await? {
            Some(t) => grpc_status(&t)?,
            None => false,
        };
        if !ok {
            bail!("gRPC answer without a status");
        }
        let message = message.context("gRPC answer without a message")?;
        // The length-prefixed message: compression flag 0, length, bytes.
        if message.len() < 5 || message[0] != 0 {
            bail!("gRPC answer not an uncompressed message");
        }
        let len = u32::from_be_bytes([message[1], message[2], message[3], message[4]]) as usize;
        let bytes = message.get(5..5 + len).context("gRPC answer shorter than its length")?;
        Ok(prost::Message::decode(bytes)?)
    }
}

impl Conn {
    async fn open(server: &Server, proto: Proto) -> Result<Conn> {
        Ok(match proto {
            Proto::Http | Proto::HttpBin => Conn::Http(Client::connect(server.process.addr).await?),
            Proto::Grpc if tonic_driver() => Conn::Grpc(grpc_client(server.grpc).await?),
            Proto::Grpc => Conn::RawGrpc(RawGrpc::connect(server.grpc).await?),
        })
    }

    /// One inference; an error unless answered with success. The answer is parsed
    /// (JSON; protobuf by tonic or prost) as a client would, the same work for both
    /// servers.
    async fn call(&mut self, proto: Proto, work: &Work) -> Result<()> {
        match (self, proto) {
            (Conn::Http(c), Proto::Http) => {
                let r = c.request("POST", &work.path, &[("content-type", "application/json")], &work.json_body).await?;
                if r.status != 200 {
                    bail!("HTTP {}: {}", r.status, r.text());
                }
                std::hint::black_box(r.json());
            }
            (Conn::Http(c), Proto::HttpBin) => {
                let headers = [
                    ("content-type", "application/octet-stream"),
                    ("inference-header-content-length", work.bin_json_len.as_str()),
                ];
                let r = c.request("POST", &work.path, &headers, &work.bin_body).await?;
                if r.status != 200 {
                    bail!("HTTP {}: {}", r.status, r.text());
                }
                std::hint::black_box(r.json());
            }
            (Conn::Grpc(c), Proto::Grpc) => {
                let r = c.model_infer(work.grpc.clone()).await?;
                std::hint::black_box(r.into_inner());
            }
            (Conn::RawGrpc(c), Proto::Grpc) => {
                std::hint::black_box(c.call(&work.grpc_frame).await?);
            }
            _ => bail!("a connection of another protocol"),
        }
        Ok(())
    }
}

/// What one phase saw.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Phase {
    server: &'static str,
    proto: &'static str,
    /// Closed loop: clients; open loop: 0.
    concurrency: usize,
    /// Open loop: requests/s; closed loop: 0.
    rate: f64,
    ok: u64,
    errors: u64,
    skipped: u64,
    throughput: f64,
    latency_ms: BTreeMap<String, f64>,
    server_cpu_us_per_answer: f64,
    /// The driver's own CPU time per answer (this process: clients, pacer, parsing).
    driver_cpu_us_per_answer: f64,
    first_error: Option<String>,
}

impl Phase {
    fn lat(&self, k: &str) -> f64 {
        self.latency_ms.get(k).copied().unwrap_or(f64::NAN)
    }
}

/// Percentiles as `sluice_loadgen` reports them (nearest rank).
fn percentiles(mut v: Vec<f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if v.is_empty() {
        return out;
    }
    v.sort_by(f64::total_cmp);
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)] {
        out.insert(name.to_string(), v[((v.len() - 1) as f64 * q).round() as usize]);
    }
    out
}

#[derive(Default)]
struct Tally {
    latencies: Vec<f64>,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn record(&mut self, sent: Instant, r: Result<()>) {
        match r {
            Ok(()) => {
                self.ok += 1;
                self.latencies.push(sent.elapsed().as_secs_f64() * 1e3);
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
}

/// `clients` clients back to back for `seconds`, each on its own connection.
async fn closed_loop(server: &Server, proto: Proto, work: &Arc<Work>, clients: usize, seconds: f64) -> Result<Phase> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Conn::open(server, proto).await?);
    }
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let (work, tally) = (work.clone(), tally.clone());
        tasks.spawn(async move {
            let mut mine = Tally::default();
            while Instant::now() < end {
                let sent = Instant::now();
                let r = conn.call(proto, &work).await;
                let failed = r.is_err();
                mine.record(sent, r);
                if failed {
                    break;
                }
            }
            let mut t = tally.lock();
            t.latencies.extend(mine.latencies);
            t.ok += mine.ok;
            t.errors += mine.errors;
            if t.first_error.is_none() {
                t.first_error = mine.first_error;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let t = std::mem::take(&mut *tally.lock());
    Ok(Phase {
        server: server.name,
        proto: proto.name(),
        concurrency: clients,
        throughput: t.ok as f64 / elapsed,
        ok: t.ok,
        errors: t.errors,
        latency_ms: percentiles(t.latencies),
        first_error: t.first_error,
        ..Phase::default()
    })
}

/// Arrivals at `rate` per second for `seconds`, each on a free connection of the
/// pool (skipped when none is), paced by a thread of their own.
async fn open_loop(server: &Server, proto: Proto, work: &Arc<Work>, rate: f64, seconds: f64) -> Result<Phase> {
    let pool: Arc<Mutex<Vec<Conn>>> = Arc::default();
    match proto {
        Proto::Grpc if tonic_driver() => {
            let mut channels = Vec::new();
            for _ in 0..GRPC_CHANNELS {
                channels.push(grpc_client(server.grpc).await?);
            }
            pool.lock().extend((0..POOL).map(|i| Conn::Grpc(channels[i % GRPC_CHANNELS].clone())));
        }
        Proto::Grpc => {
            let mut channels = Vec::new();
            for _ in 0..GRPC_CHANNELS {
                channels.push(RawGrpc::connect(server.grpc).await?);
            }
            pool.lock().extend((0..POOL).map(|i| Conn::RawGrpc(channels[i % GRPC_CHANNELS].clone())));
        }
        _ => {
            for _ in 0..POOL {
                let c = Conn::open(server, proto).await?;
                pool.lock().push(c);
            }
        }
    }
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let handle = tokio::runtime::Handle::current();
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let (pacer_pool, pacer_tally, pacer_work) = (pool.clone(), tally.clone(), work.clone());
    let pacer = tokio::task::spawn_blocking(move || {
        let (mut next, mut skipped) = (started, 0u64);
        let mut tasks = Vec::new();
        while next < end {
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
            next += interval;
            let Some(mut conn) = pacer_pool.lock().pop() else {
                skipped += 1;
                continue;
            };
            let (pool, tally, work) = (pacer_pool.clone(), pacer_tally.clone(), pacer_work.clone());
            tasks.push(handle.spawn(async move {
                let sent = Instant::now();
                let r = conn.call(proto, &work).await;
                let ok = r.is_ok();
                tally.lock().record(sent, r);
                if ok {
                    pool.lock().push(conn);
                }
            }));
        }
        (skipped, tasks)
    });
    let (skipped, tasks) = pacer.await?;
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let t = std::mem::take(&mut *tally.lock());
    Ok(Phase {
        server: server.name,
        proto: proto.name(),
        rate,
        throughput: t.ok as f64 / elapsed,
        ok: t.ok,
        errors: t.errors,
        skipped,
        latency_ms: percentiles(t.latencies),
        first_error: t.first_error,
        ..Phase::default()
    })
}

/// Runs one phase on `server` and adds its CPU time per answer.
async fn measure(server: &Server, proto: Proto, work: &Arc<Work>, point: Point, seconds: f64) -> Result<Phase> {
    let ticks = common::clock_ticks();
    let cpu = server.process.cpu_seconds(ticks);
    let driver = own_cpu_seconds(ticks);
    let mut p = match point {
        Point::Closed(c) => closed_loop(server, proto, work, c, seconds).await?,
        Point::Open(r) => open_loop(server, proto, work, r, seconds).await?,
    };
    p.server_cpu_us_per_answer = (server.process.cpu_seconds(ticks) - cpu) * 1e6 / p.ok.max(1) as f64;
    p.driver_cpu_us_per_answer = (own_cpu_seconds(ticks) - driver) * 1e6 / p.ok.max(1) as f64;
    Ok(p)
}

/// This process's user + system CPU seconds so far (`/proc/self/stat`).
fn own_cpu_seconds(ticks_per_second: f64) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i - 3).and_then(|x| x.parse::<f64>().ok()).unwrap_or(f64::NAN);
    (ticks(14) + ticks(15)) / ticks_per_second
}

#[derive(Clone, Copy)]
enum Point {
    Closed(usize),
    Open(f64),
}

/// The request bodies for the app's input (from its metadata, batch dimension 1,
/// zeros) and sluice's own answers to them, which the bare server sends back.
async fn prepare(sluice: &Server) -> Result<(Work, Vec<u8>, Vec<u8>)> {
    let mut c = Client::connect(sluice.process.addr).await?;
    let meta = c.get(&format!("/v2/models/{APP}")).await?;
    if meta.status != 200 {
        bail!("GET /v2/models/{APP}: {} {}", meta.status, meta.text());
    }
    let meta = meta.json();
    let input = &meta["inputs"][0];
    let name = input["name"].as_str().context("metadata has no input name")?.to_string();
    let mut shape: Vec<usize> = input["shape"]
        .as_array()
        .context("no shape")?
        .iter()
        .map(|d| d.as_i64().unwrap_or(1).max(1) as usize)
        .collect();
    shape[0] = 1;
    let n: usize = shape.iter().product();
    let json_body = sluice_loadgen::infer_body(&name, &shape, &vec![0.0; n]).to_string().into_bytes();
    let header = json!({ "inputs": [{
        "name": name, "datatype": "FP32", "shape": shape, "parameters": { "binary_data_size": 4 * n }
    }] })
    .to_string();
    let mut bin_body = header.clone().into_bytes();
    bin_body.extend(std::iter::repeat_n(0u8, 4 * n));
    use sluice_server::grpc::proto::model_infer_request::InferInputTensor;
    let grpc = ModelInferRequest {
        model_name: APP.into(),
        inputs: vec![InferInputTensor {
            name,
            datatype: "FP32".into(),
            shape: shape.iter().map(|d| *d as i64).collect(),
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(vec![0u8; 4 * n])],
        ..Default::default()
    };
    let message = prost::Message::encode_to_vec(&grpc);
    let mut grpc_frame = Vec::with_capacity(5 + message.len());
    grpc_frame.push(0);
    grpc_frame.extend_from_slice(&u32::try_from(message.len())?.to_be_bytes());
    grpc_frame.extend_from_slice(&message);
    let work = Work {
        path: format!("/v2/models/{APP}/infer"),
        json_body,
        bin_body,
        bin_json_len: header.len().to_string(),
        grpc,
        grpc_frame: grpc_frame.into(),
    };
    let r = c.request("POST", &work.path, &[("content-type", "application/json")], &work.json_body).await?;
    if r.status != 200 {
        bail!("sluice's answer: HTTP {} {}", r.status, r.text());
    }
    let http_answer = r.body;
    let grpc_answer = grpc_client(sluice.grpc).await?.model_infer(work.grpc.clone()).await?.into_inner();
    Ok((work, http_answer, prost::Message::encode_to_vec(&grpc_answer)))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> Result<()> {
    if let Some(dir) = std::env::var_os(BARE_ENV) {
        return bare::main(Path::new(&dir));
    }
    let seconds = env_f64("OVERHEAD_SECONDS", 3.0);
    let rounds = env_f64("OVERHEAD_ROUNDS", 1.0).max(1.0) as usize;
    let root = root();
    for name in ["jellyfish", "fixed"] {
        let p = root.join("target/policies").join(format!("{name}.wasm"));
        if !p.exists() {
            bail!("{} is missing: run `cargo xtask policies` first", p.display());
        }
    }
    let config = root.join("examples/bench-zero.toml");
    // Another build of sluice for an A/B against the same baseline (a copy of an
    // earlier `target/release/sluice`).
    let exe = std::env::var_os("OVERHEAD_SLUICE").unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into());
    let mut command = Command::new(&exe);
    command
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--grpc-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn");
    let mut process = common::start_process(command)?;
    let grpc = process.grpc_addr()?;
    let sluice = Server { name: "sluice", process, grpc };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (work, http_answer, grpc_answer) = runtime.block_on(prepare(&sluice))?;
    let work = Arc::new(work);
    let answers = tempfile::tempdir()?;
    std::fs::write(answers.path().join("http"), &http_answer)?;
    std::fs::write(answers.path().join("grpc"), &grpc_answer)?;
    let mut command = Command::new(std::env::current_exe()?);
    command.env(BARE_ENV, answers.path());
    let mut process = common::start_process(command)?;
    let grpc = process.grpc_addr()?;
    let bare = Server { name: "bare", process, grpc };
    let load_before = load_average();
    let started_at = Instant::now();

    let mut phases: Vec<Phase> = Vec::new();
    runtime.block_on(async {
        // Warm-up: connections, allocators, the policy's first decisions.
        for server in [&sluice, &bare] {
            for proto in [Proto::Http, Proto::HttpBin, Proto::Grpc] {
                let p = measure(server, proto, &work, Point::Closed(4), 0.5).await?;
                if p.ok == 0 {
                    bail!("{} {}: no answer ({:?})", server.name, proto.name(), p.first_error);
                }
            }
        }
        if let Some(dir) = std::env::var_os("OVERHEAD_PERF") {
            // Cargo runs a bench in its package's directory: a relative path is the
            // caller's, so it is taken from the workspace root.
            let dir = root.join(dir);
            std::fs::create_dir_all(&dir)?;
            // `-g` by default; `--call-graph dwarf` walks the release build's stacks
            // through its unwind tables (it has no frame pointers).
            let perf_args = std::env::var("OVERHEAD_PERF_ARGS").unwrap_or_else(|_| "-g".into());
            // Profiles instead of the grid: each server under 8 clients, per protocol.
            for proto in [Proto::Http, Proto::HttpBin, Proto::Grpc] {
                for server in [&sluice, &bare] {
                    let out = Path::new(&dir).join(format!("{}-{}.perf.data", server.name, proto.name()));
                    // The driver too, into `driver-<server>-<proto>.perf.data`: its
                    // client shares the cores, so its cost per answer matters as
                    // much as the server's.
                    let driver_out = Path::new(&dir).join(format!("driver-{}-{}.perf.data", server.name, proto.name()));
                    let mut perfs = Vec::new();
                    for (pid, out) in [(server.process.pid(), &out), (std::process::id(), &driver_out)] {
                        perfs.push(
                            Command::new("perf")
                                .args(["record", "-F", "1999", "-o"])
                                .arg(out)
                                .args(perf_args.split_whitespace())
                                .args(["-p", &pid.to_string()])
                                .spawn()
                                .context("perf record")?,
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let p = measure(server, proto, &work, Point::Closed(8), seconds).await?;
                    for perf in &mut perfs {
                        Command::new("kill").args(["-INT", &perf.id().to_string()]).status()?;
                        perf.wait()?;
                    }
                    println!(
                        "profiled {} {}: {:.0} answers/s, {:.1} µs CPU per answer (driver {:.1}) -> {}",
                        server.name,
                        proto.name(),
                        p.throughput,
                        p.server_cpu_us_per_answer,
                        p.driver_cpu_us_per_answer,
                        out.display()
                    );
                }
            }
            return anyhow::Ok(());
        }
        let mut grid: Vec<(Proto, Point)> = Vec::new();
        for proto in [Proto::Http, Proto::HttpBin, Proto::Grpc] {
            grid.extend(CONCURRENCY.iter().map(|c| (proto, Point::Closed(*c))));
        }
        for proto in [Proto::Http, Proto::Grpc] {
            grid.extend(RATES.iter().map(|r| (proto, Point::Open(*r))));
        }
        // Both servers at every point, back to back, the first one alternating.
        let mut flip = false;
        for _ in 0..rounds {
            for (proto, point) in &grid {
                let order = if flip { [&bare, &sluice] } else { [&sluice, &bare] };
                flip = !flip;
                for server in order {
                    phases.push(measure(server, *proto, &work, *point, seconds).await?);
                }
            }
        }
        anyhow::Ok(())
    })?;
    if std::env::var_os("OVERHEAD_PERF").is_some() {
        return Ok(());
    }
    let wall = started_at.elapsed().as_secs_f64();
    let load_after = load_average();
    drop(sluice);
    drop(bare);

    // Medians over the rounds.
    let summary = |server: &str, proto: Proto, pick: &dyn Fn(&Phase) -> bool, f: &dyn Fn(&Phase) -> f64| -> f64 {
        let mut v: Vec<f64> =
            phases.iter().filter(|p| p.server == server && p.proto == proto.name() && pick(p)).map(f).collect();
        median(&mut v)
    };
    println!(
        "overhead: sluice (zero-latency emulated app, 4 workers) against a bare hyper/tonic server, each its own \
         process; {seconds} s per phase, {rounds} round(s), medians; load average {load_before} before, {load_after} after, {wall:.0} s"
    );
    println!(
        "closed loop: answers/s (server CPU µs per answer; the driver's, this process's; gRPC client: {})",
        if tonic_driver() { "tonic" } else { "h2" }
    );
    println!(
        "{:<9} {:>5} | {:>9} {:>7} {:>7} | {:>9} {:>7} {:>7} | {:>7} | {:>8} {:>8}",
        "proto", "conc", "sluice/s", "cpu µs", "drv µs", "bare/s", "cpu µs", "drv µs", "ratio", "s p50 ms", "b p50 ms"
    );
    let mut peaks: BTreeMap<Proto, (f64, f64)> = BTreeMap::new();
    for proto in [Proto::Http, Proto::HttpBin, Proto::Grpc] {
        for c in CONCURRENCY {
            let pick = |p: &Phase| p.concurrency == c;
            let s = summary("sluice", proto, &pick, &|p| p.throughput);
            let b = summary("bare", proto, &pick, &|p| p.throughput);
            let peak = peaks.entry(proto).or_insert((0.0, 0.0));
            peak.0 = peak.0.max(s);
            peak.1 = peak.1.max(b);
            println!(
                "{:<9} {:>5} | {:>9.0} {:>7.1} {:>7.1} | {:>9.0} {:>7.1} {:>7.1} | {:>6.1}% | {:>8.3} {:>8.3}",
                proto.name(),
                c,
                s,
                summary("sluice", proto, &pick, &|p| p.server_cpu_us_per_answer),
                summary("sluice", proto, &pick, &|p| p.driver_cpu_us_per_answer),
                b,
                summary("bare", proto, &pick, &|p| p.server_cpu_us_per_answer),
                summary("bare", proto, &pick, &|p| p.driver_cpu_us_per_answer),
                100.0 * s / b,
                summary("sluice", proto, &pick, &|p| p.lat("p50")),
                summary("bare", proto, &pick, &|p| p.lat("p50")),
            );
        }
    }
    println!("open loop: client-observed latency, ms");
    println!(
        "{:<6} {:>6} | {:>8} {:>8} {:>8} {:>7} | {:>8} {:>8} {:>8} {:>7} | {:>9}",
        "proto", "rate", "s p50", "s p99", "s resp/s", "cpu µs", "b p50", "b p99", "b resp/s", "cpu µs", "added p99"
    );
    let mut added: BTreeMap<Proto, f64> = BTreeMap::new();
    for proto in [Proto::Http, Proto::Grpc] {
        for rate in RATES {
            let pick = |p: &Phase| p.rate == rate;
            let s99 = summary("sluice", proto, &pick, &|p| p.lat("p99"));
            let b99 = summary("bare", proto, &pick, &|p| p.lat("p99"));
            if rate == 10_000.0 {
                added.insert(proto, s99 - b99);
            }
            println!(
                "{:<6} {:>6} | {:>8.3} {:>8.3} {:>8.0} {:>7.1} | {:>8.3} {:>8.3} {:>8.0} {:>7.1} | {:>+9.3}",
                proto.name(),
                rate,
                summary("sluice", proto, &pick, &|p| p.lat("p50")),
                s99,
                summary("sluice", proto, &pick, &|p| p.throughput),
                summary("sluice", proto, &pick, &|p| p.server_cpu_us_per_answer),
                summary("bare", proto, &pick, &|p| p.lat("p50")),
                b99,
                summary("bare", proto, &pick, &|p| p.throughput),
                summary("bare", proto, &pick, &|p| p.server_cpu_us_per_answer),
                s99 - b99,
            );
        }
    }
    for p in phases.iter().filter(|p| p.errors > 0 || p.skipped > 0) {
        println!(
            "note: {} {} conc {} rate {}: {} errors, {} arrivals skipped (first error: {:?})",
            p.server, p.proto, p.concurrency, p.rate, p.errors, p.skipped, p.first_error
        );
    }
    let pct = |proto: Proto| peaks.get(&proto).map_or(f64::NAN, |(s, b)| 100.0 * s / b);
    let (http_pct, grpc_pct) = (pct(Proto::Http), pct(Proto::Grpc));
    let worst_added = added.values().copied().fold(f64::NAN, f64::max);
    let (http_peak, grpc_peak) = (peaks[&Proto::Http].0, peaks[&Proto::Grpc].0);
    let grpc_vs_http = grpc_peak / http_peak;
    println!(
        "peaks: sluice http {:.0}/s, http-bin {:.0}/s, grpc {:.0}/s (grpc {:.1} % of http); bare http {:.0}/s, http-bin {:.0}/s, grpc {:.0}/s",
        http_peak,
        peaks[&Proto::HttpBin].0,
        grpc_peak,
        100.0 * grpc_vs_http,
        peaks[&Proto::Http].1,
        peaks[&Proto::HttpBin].1,
        peaks[&Proto::Grpc].1
    );
    println!(
        "added p99 at 10k req/s: http {:+.3} ms, grpc {:+.3} ms",
        added.get(&Proto::Http).copied().unwrap_or(f64::NAN),
        added.get(&Proto::Grpc).copied().unwrap_or(f64::NAN)
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "goals: peak >= {:.0} % of bare: http {}, grpc {}; added p99 <= {GOAL_ADDED_P99_MS} ms at 10k: {}; grpc within {:.0} % of http: {}",
        100.0 * GOAL_PEAK,
        met(http_pct >= 100.0 * GOAL_PEAK),
        met(grpc_pct >= 100.0 * GOAL_PEAK),
        met(worst_added <= GOAL_ADDED_P99_MS),
        100.0 * GOAL_GRPC_VS_HTTP,
        met((1.0 - grpc_vs_http).abs() <= GOAL_GRPC_VS_HTTP),
    );
    let line = json!({
        "bench": "overhead",
        "seconds": seconds,
        "rounds": rounds,
        "load_average": { "before": load_before, "after": load_after },
        "phases": phases,
        "peak_pct_of_bare": { "http": http_pct, "http-bin": pct(Proto::HttpBin), "grpc": grpc_pct },
        "added_p99_ms_at_10k": { "http": added.get(&Proto::Http), "grpc": added.get(&Proto::Grpc) },
        "grpc_peak_vs_http": grpc_vs_http,
    });
    println!("{line}");
    println!(
        "overhead: http peak {http_pct:.1} % of bare, grpc peak {grpc_pct:.1} % of bare, added p99 {worst_added:.3} ms at 10k req/s"
    );
    Ok(())
}

/// The bare baseline: what any OIP server must do for this request (read it, parse
/// it, check and decode the tensor, answer), and nothing else: no admission, no
/// queue, no policy, no worker, no metrics, no connection limits or timeouts.
mod bare {
    use std::convert::Infallible;
    use std::io::Write as _;
    use std::path::Path;
    use std::pin::Pin;

    use anyhow::{Context as _, Result};
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full};
    use hyper::{Request, Response, StatusCode};
    use serde::Deserialize;
    use serde_json::Value;
    use sluice_server::grpc::proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
    use sluice_server::grpc::proto::*;
    use tonic::Status;

    /// The OIP request, as much of it as a server must read.
    #[derive(Deserialize)]
    struct InferRequest {
        #[serde(default)]
        #[allow(dead_code)] // Read, as a server reads it.
        id: Option<String>,
        inputs: Vec<InputTensor>,
        #[serde(default)]
        #[allow(dead_code)]
        outputs: Option<Value>,
        #[serde(default)]
        #[allow(dead_code)]
        parameters: Option<Value>,
    }

    #[derive(Deserialize)]
    struct InputTensor {
        name: String,
        shape: Vec<usize>,
        datatype: String,
        #[serde(default)]
        data: Option<Vec<f32>>,
        #[serde(default)]
        parameters: Option<Value>,
    }

    /// The input's numbers, checked against its shape (FP32 only: the bench's app).
    fn tensor(
        name: &str,
        datatype: &str,
        elements: usize,
        data: Option<Vec<f32>>,
        raw: Option<&[u8]>,
    ) -> Result<Vec<f32>, String> {
        if datatype != "FP32" {
            return Err(format!("input `{name}`: datatype {datatype}, expected FP32"));
        }
        let values = match (data, raw) {
            (Some(v), None) => v,
            (None, Some(raw)) if raw.len() == 4 * elements => {
                raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            }
            (None, Some(raw)) => {
                return Err(format!("input `{name}`: {} bytes for {elements} FP32 elements", raw.len()))
            }
            _ => return Err(format!("input `{name}`: no data")),
        };
        if values.len() != elements {
            return Err(format!("input `{name}`: {} values for shape's {elements}", values.len()));
        }
        Ok(values)
    }

    fn http_infer(body: Bytes, json_len: Option<usize>) -> Result<(), String> {
        let (json, mut tail) = match json_len {
            Some(n) if n <= body.len() => (body.slice(..n), body.slice(n..)),
            Some(n) => return Err(format!("header length {n} beyond the body")),
            None => (body, Bytes::new()),
        };
        let r: InferRequest = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
        for i in r.inputs {
            let size = i.parameters.as_ref().and_then(|p| p.get("binary_data_size")).and_then(Value::as_u64);
            let raw = size.map(|s| tail.split_to((s as usize).min(tail.len())));
            let elements = i.shape.iter().product();
            std::hint::black_box(tensor(&i.name, &i.datatype, elements, i.data, raw.as_deref())?);
        }
        Ok(())
    }

    async fn handle(answer: Bytes, req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let reply = |status: StatusCode, body: Bytes| {
            let mut r = Response::new(Full::new(body));
            *r.status_mut() = status;
            r.headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
            Ok(r)
        };
        if req.method() != hyper::Method::POST || req.uri().path() != "/v2/models/zero/infer" {
            return reply(StatusCode::NOT_FOUND, Bytes::from_static(b"{\"error\":\"no route\"}"));
        }
        let json_len = req
            .headers()
            .get("inference-header-content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return reply(StatusCode::BAD_REQUEST, Bytes::from(e.to_string())),
        };
        match http_infer(body, json_len) {
            Ok(()) => reply(StatusCode::OK, answer),
            Err(e) => reply(StatusCode::BAD_REQUEST, Bytes::from(serde_json::json!({ "error": e }).to_string())),
        }
    }

    struct Bare {
        answer: ModelInferResponse,
    }

    /// The service's impl with every RPC but those given answered UNIMPLEMENTED (the
    /// bench calls none of them). The whole impl comes from the macro: `async_trait`
    /// rewrites the methods it sees, before any macro inside the impl expands.
    macro_rules! service_with_stubs {
        ($($method:ident($req:ty) -> $resp:ty;)* { $($given:tt)* }) => {
            #[tonic::async_trait]
            impl GrpcInferenceService for Bare {
                $(async fn $method(&self, _: tonic::Request<$req>) -> Result<tonic::Response<$resp>, Status> {
                    Err(Status::unimplemented("bare"))
                })*
                $($given)*
            }
        };
    }

    service_with_stubs! {
        server_live(ServerLiveRequest) -> ServerLiveResponse;
        server_ready(ServerReadyRequest) -> ServerReadyResponse;
        model_ready(ModelReadyRequest) -> ModelReadyResponse;
        server_metadata(ServerMetadataRequest) -> ServerMetadataResponse;
        model_metadata(ModelMetadataRequest) -> ModelMetadataResponse;
        model_config(ModelConfigRequest) -> ModelConfigResponse;
        model_statistics(ModelStatisticsRequest) -> ModelStatisticsResponse;
        repository_index(RepositoryIndexRequest) -> RepositoryIndexResponse;
        repository_model_load(RepositoryModelLoadRequest) -> RepositoryModelLoadResponse;
        repository_model_unload(RepositoryModelUnloadRequest) -> RepositoryModelUnloadResponse;
        system_shared_memory_status(SystemSharedMemoryStatusRequest) -> SystemSharedMemoryStatusResponse;
        system_shared_memory_register(SystemSharedMemoryRegisterRequest) -> SystemSharedMemoryRegisterResponse;
        system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest) -> SystemSharedMemoryUnregisterResponse;
        cuda_shared_memory_status(CudaSharedMemoryStatusRequest) -> CudaSharedMemoryStatusResponse;
        cuda_shared_memory_register(CudaSharedMemoryRegisterRequest) -> CudaSharedMemoryRegisterResponse;
        cuda_shared_memory_unregister(CudaSharedMemoryUnregisterRequest) -> CudaSharedMemoryUnregisterResponse;
        trace_setting(TraceSettingRequest) -> TraceSettingResponse;
        log_settings(LogSettingsRequest) -> LogSettingsResponse;
        {
        type ModelStreamInferStream =
            Pin<Box<dyn tonic::codegen::tokio_stream::Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

        async fn model_stream_infer(
            &self,
            _: tonic::Request<tonic::Streaming<ModelInferRequest>>,
        ) -> Result<tonic::Response<Self::ModelStreamInferStream>, Status> {
            Err(Status::unimplemented("bare"))
        }

        async fn model_infer(
            &self,
            req: tonic::Request<ModelInferRequest>,
        ) -> Result<tonic::Response<ModelInferResponse>, Status> {
            let r = req.into_inner();
            if r.model_name != "zero" {
                return Err(Status::not_found(format!("no model {}", r.model_name)));
            }
            for (k, i) in r.inputs.into_iter().enumerate() {
                let elements = i.shape.iter().map(|d| usize::try_from(*d).unwrap_or(0)).product();
                let data = i.contents.map(|c| c.fp32_contents).filter(|v| !v.is_empty());
                let raw = r.raw_input_contents.get(k).map(|b| &b[..]).filter(|_| data.is_none());
                let values = tensor(&i.name, &i.datatype, elements, data, raw).map_err(Status::invalid_argument)?;
                std::hint::black_box(values);
            }
            let mut answer = self.answer.clone();
            answer.id = r.id;
            Ok(tonic::Response::new(answer))
        }
        }
    }

    /// Serves both protocols until killed; prints the addresses as `sluice serve` does.
    pub fn main(answers: &Path) -> Result<()> {
        let http_answer = Bytes::from(std::fs::read(answers.join("http")).context("the HTTP answer")?);
        let grpc_answer: ModelInferResponse =
            prost::Message::decode(&std::fs::read(answers.join("grpc")).context("the gRPC answer")?[..])?;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(async move {
            let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let grpc = tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse()?)?.with_nodelay(Some(true));
            let mut out = std::io::stdout();
            writeln!(out, "bare listening on http://{}", http.local_addr()?)?;
            writeln!(out, "bare gRPC listening on {}", grpc.local_addr()?)?;
            out.flush()?;
            let service = GrpcInferenceServiceServer::new(Bare { answer: grpc_answer })
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX);
            // `OVERHEAD_BARE_GRPC` (an A/B of tonic's HTTP/2 settings on the bare
            // server alone): any of `adaptive` (BDP-sized windows), `windows`
            // (4 MiB per stream, 8 MiB per connection), `frame` (1 MiB frames),
            // `streams` (1,000 concurrent streams); unset, tonic's defaults.
            let tuned = std::env::var("OVERHEAD_BARE_GRPC").unwrap_or_default();
            let mut builder = tonic::transport::Server::builder();
            if tuned.contains("adaptive") {
                builder = builder.http2_adaptive_window(Some(true));
            }
            if tuned.contains("windows") {
                builder = builder.initial_stream_window_size(4 << 20).initial_connection_window_size(8 << 20);
            }
            if tuned.contains("frame") {
                builder = builder.max_frame_size(1 << 20);
            }
            if tuned.contains("streams") {
                builder = builder.max_concurrent_streams(1000);
            }
            tokio::spawn(builder.add_service(service).serve_with_incoming(grpc));
            loop {
                let (stream, _) = http.accept().await?;
                let _ = stream.set_nodelay(true);
                let answer = http_answer.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(answer.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    }
}

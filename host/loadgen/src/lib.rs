//! sluice-loadgen: a load generator and tiny HTTP/1.1 client for sluice's own API
//! (`sluice loadgen`).
//!
//! Start here: [`Client`] (one keep-alive connection), [`run`] with [`LoadArgs`]
//! (a whole load run), [`Summary`] (what it measured), [`poisson::run_poisson`]
//! (Poisson open loop against any HTTP server, per-request records).
//!
//! It drives the demo (real image tensors, policy swaps under traffic) and the
//! host-overhead benchmark, and integration tests use [`Client`]. Open loop
//! (`--rate`, arrivals on a fixed schedule over a pool of keep-alive connections) or
//! closed loop (`--concurrency` clients back to back).

pub mod poisson;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A keep-alive HTTP/1.1 client connection.
pub struct Client {
    stream: BufReader<TcpStream>,
    addr: SocketAddr,
}

/// A response: status and body.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Header lines, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
}

/// When a request went out on its connection ([`Client::request_timed`]).
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    /// Just before its first byte was written.
    pub started: Instant,
    /// When its last body byte was handed to the kernel: a large body waits here
    /// for the server to read it (the socket's buffer holds only part of it).
    pub written: Instant,
}

impl HttpResponse {
    /// The first header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body as text (invalid UTF-8 replaced), for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Client {
    /// Connects (with Nagle off: a request is written in one piece anyway).
    pub async fn connect(addr: SocketAddr) -> Result<Client> {
        let s = TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Client { stream: BufReader::new(s), addr })
    }

    /// Sends one request and reads the response. `headers` are extra header lines.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse> {
        Ok(self.request_timed(method, path, headers, body).await?.0)
    }

    /// [`Client::request`], also returning when the request went out ([`Sent`]):
    /// an open-loop client's latency from its *scheduled* send counts its own
    /// scheduling delay, which the server never sees; from [`Sent::started`] it
    /// counts the server and the network stack (and the client only in reading
    /// the answer).
    pub async fn request_timed(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(HttpResponse, Sent)> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n", self.addr, body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut buf = Vec::with_capacity(head.len() + body.len());
        buf.extend_from_slice(head.as_bytes());
        buf.extend_from_slice(body);
        // A kept-alive connection the server closed while it sat idle (servers close
        // idle keep-alive connections; sluice after `header_read_timeout_ms`) is
        // replaced before sending, as HTTP clients' pools do: the server never saw
        // this request, so this is not a retry.
        let mut probe = [0u8; 1];
        match self.stream.get_ref().try_read(&mut probe) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => *self = Client::connect(self.addr).await?,
        }
        // Taken after any reconnect: a connection's setup is the client's, the
        // bytes in flight from here on are the server's and the network's.
        let started = Instant::now();
        self.stream.get_mut().write_all(&buf).await?;
        let sent = Sent { started, written: Instant::now() };
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            bail!("connection closed by the server");
        }
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("bad status line")?;
        let mut len = 0usize;
        let mut chunked = false;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.stream.read_line(&mut line).await?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().context("bad content-length")?;
                }
                if k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked") {
                    chunked = true;
                }
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let body = if chunked {
            // Servers that stream their answers (Ray Serve's proxy) send them chunked:
            // `SIZE-IN-HEX\r\n DATA \r\n` ... `0\r\n` then trailers up to an empty line.
            // Reading only a content-length would leave the chunks on the connection
            // and break the next request on it.
            let mut body = Vec::new();
            loop {
                line.clear();
                self.stream.read_line(&mut line).await?;
                let size = line.trim_end().split(';').next().unwrap_or("");
                let size =
                    usize::from_str_radix(size.trim(), 16).with_context(|| format!("bad chunk size {line:?}"))?;
                if size == 0 {
                    loop {
                        line.clear();
                        if self.stream.read_line(&mut line).await? == 0 || line.trim_end().is_empty() {
                            break;
                        }
                    }
                    break body;
                }
                let at = body.len();
                body.resize(at + size, 0);
                self.stream.read_exact(&mut body[at..]).await?;
                let mut crlf = [0u8; 2];
                self.stream.read_exact(&mut crlf).await?;
            }
        } else {
            let mut body = vec![0; len];
            self.stream.read_exact(&mut body).await?;
            body
        };
        Ok((HttpResponse { status, body, headers }, sent))
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<HttpResponse> {
        self.request("GET", path, &[], b"").await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(&mut self, path: &str, body: &Value) -> Result<HttpResponse> {
        self.request("POST", path, &[("content-type", "application/json")], body.to_string().as_bytes()).await
    }
}

/// The OIP request body for one sample of `data` with the app's input name and shape.
pub fn infer_body(input: &str, shape: &[usize], data: &[f32]) -> Value {
    json!({ "inputs": [{ "name": input, "datatype": "FP32", "shape": shape, "data": data }] })
}

/// `sluice loadgen` arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// Server address, e.g. 127.0.0.1:8080.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// App to load.
    #[arg(long, default_value = "imagenet")]
    pub app: String,
    /// Open-loop rate (requests/s); 0 runs closed loop with --concurrency clients.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Closed-loop clients, or the connection pool size in open loop.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// How long to send, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Samples to send: a file of little-endian f32 samples of the app's input size
    /// (cycled), or none for zeros.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Swap the policy during the run: `SECONDS:POLICY` or `SECONDS:POLICY:{json params}`.
    #[arg(long = "swap")]
    pub swaps: Vec<String>,
    /// Admin token for swaps (default: SLUICE_ADMIN_TOKEN).
    #[arg(long)]
    pub admin_token: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What a load run saw.
#[derive(Default, Debug, serde::Serialize)]
pub struct Summary {
    /// Requests sent.
    pub sent: u64,
    /// Responses by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Served requests by variant.
    pub by_variant: BTreeMap<String, u64>,
    /// Served requests by the policy that decided them.
    pub by_policy: BTreeMap<String, u64>,
    /// Served requests that missed their deadline.
    pub late: u64,
    /// Mean profiled accuracy of the variants that served on time (per satisfied query).
    pub accuracy: f64,
    /// Open loop: arrivals skipped because every connection was busy.
    pub skipped: u64,
    /// Client-observed latency percentiles, ms.
    pub latency_ms: BTreeMap<String, f64>,
    /// Host-reported queueing percentiles, ms.
    pub queue_ms: BTreeMap<String, f64>,
    /// Swap reports, in order.
    pub swaps: Vec<Value>,
    /// Wall time, s.
    pub seconds: f64,
    /// Responses per second.
    pub throughput: f64,
}

#[derive(Default)]
struct Tally {
    summary: Summary,
    latencies: Vec<f64>,
    queues: Vec<f64>,
    accuracy_sum: f64,
    on_time: u64,
}

fn percentiles(mut v: Vec<f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if v.is_empty() {
        return out;
    }
    v.sort_by(f64::total_cmp);
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)] {
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        out.insert(name.to_string(), v[i]);
    }
    out
}

/// Runs a load and returns what it saw.
pub async fn run(args: LoadArgs) -> Result<Summary> {
    let mut meta_client = Client::connect(args.addr).await?;
    let meta = meta_client.get(&format!("/v2/models/{}", args.app)).await?;
    if meta.status != 200 {
        bail!("GET /v2/models/{}: {} {}", args.app, meta.status, String::from_utf8_lossy(&meta.body));
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
    let per: usize = shape.iter().product();
    let accuracy: BTreeMap<String, f64> = meta["parameters"]["variants"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| Some((v["name"].as_str()?.to_string(), v["accuracy"].as_f64()?))).collect())
        .unwrap_or_default();
    let samples: Vec<Vec<f32>> = match &args.input {
        Some(path) => {
            let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
            let floats: Vec<f32> =
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if floats.len() < per || !floats.len().is_multiple_of(per) {
                bail!("{}: {} floats is not a whole number of samples of {per}", path.display(), floats.len());
            }
            floats.chunks(per).map(<[f32]>::to_vec).collect()
        }
        None => vec![vec![0.0; per]],
    };
    let bodies: Arc<Vec<Vec<u8>>> =
        Arc::new(samples.iter().map(|s| infer_body(&name, &shape, s).to_string().into_bytes()).collect());
    let path: Arc<str> = format!("/v2/models/{}/infer", args.app).into();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let accuracy = Arc::new(accuracy);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(args.duration);

    // Swaps run beside the traffic.
    let token = args.admin_token.clone().or_else(|| std::env::var("SLUICE_ADMIN_TOKEN").ok());
    let mut swap_plan = Vec::new();
    for s in &args.swaps {
        let mut parts = s.splitn(3, ':');
        let at: f64 = parts
            .next()
            .and_then(|x| x.parse().ok())
            .with_context(|| format!("--swap {s}: expected SECONDS:POLICY[:PARAMS]"))?;
        let policy = parts.next().with_context(|| format!("--swap {s}: missing policy"))?.to_string();
        let params: Value = match parts.next() {
            Some(p) => serde_json::from_str(p).with_context(|| format!("--swap {s}: params are not JSON"))?,
            None => json!({}),
        };
        swap_plan.push((at, policy, params));
    }
    let swapper = {
        let tally = tally.clone();
        let app = args.app.clone();
        let addr = args.addr;
        tokio::spawn(async move {
            if swap_plan.is_empty() {
                return Ok::<_, anyhow::Error>(());
            }
            let token = token.context("--swap needs --admin-token or SLUICE_ADMIN_TOKEN")?;
            let mut c = Client::connect(addr).await?;
            for (at, policy, params) in swap_plan {
                tokio::time::sleep_until((started + Duration::from_secs_f64(at)).into()).await;
                let body = json!({ "policy": policy, "params": params }).to_string();
                let auth = format!("Bearer {token}");
                let r = c
                    .request(
                        "PUT",
                        &format!("/admin/apps/{app}/policy"),
                        &[("authorization", &auth), ("content-type", "application/json")],
                        body.as_bytes(),
                    )
                    .await?;
                let mut report = r.json();
                if let Value::Object(m) = &mut report {
                    m.insert("at_seconds".into(), json!(started.elapsed().as_secs_f64()));
                    m.insert("status".into(), json!(r.status));
                }
                tally.lock().summary.swaps.push(report);
            }
            Ok(())
        })
    };

    let record = {
        let tally = tally.clone();
        let accuracy = accuracy.clone();
        move |sent_at: Instant, r: Result<HttpResponse>| {
            let mut t = tally.lock();
            let latency = sent_at.elapsed().as_secs_f64() * 1e3;
            match r {
                Ok(r) => {
                    *t.summary.by_status.entry(r.status).or_default() += 1;
                    if r.status == 200 {
                        let v = r.json();
                        let p = &v["parameters"];
                        let variant = p["variant"].as_str().unwrap_or("?").to_string();
                        let met = p["deadline_met"].as_bool().unwrap_or(false);
                        if met {
                            t.on_time += 1;
                            t.accuracy_sum += accuracy.get(&variant).copied().unwrap_or(0.0);
                        } else {
                            t.summary.late += 1;
                        }
                        *t.summary.by_policy.entry(p["policy"].as_str().unwrap_or("?").to_string()).or_default() += 1;
                        *t.summary.by_variant.entry(variant).or_default() += 1;
                        t.queues.push(p["queue_us"].as_f64().unwrap_or(0.0) / 1e3);
                        t.latencies.push(latency);
                    }
                }
                Err(_) => *t.summary.by_status.entry(0).or_default() += 1,
            }
        }
    };

    let mut tasks = tokio::task::JoinSet::new();
    if args.rate > 0.0 {
        // Open loop: arrivals on a fixed schedule; a pool of connections carries them.
        let pool: Arc<Mutex<Vec<Client>>> = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..args.concurrency.max(1) {
            let c = Client::connect(args.addr).await?;
            pool.lock().push(c);
        }
        let interval = Duration::from_secs_f64(1.0 / args.rate);
        let mut next = Instant::now();
        // The schedule starts once the pool is connected: `duration · rate` arrivals.
        let end = next + Duration::from_secs_f64(args.duration);
        let mut i = 0usize;
        let mut skipped = 0u64;
        while next < end {
            tokio::time::sleep_until(next.into()).await;
            next += interval;
            let free = pool.lock().pop();
            match free {
                Some(mut c) => {
                    let body = bodies.clone();
                    let path = path.clone();
                    let pool = pool.clone();
                    let record = record.clone();
                    let idx = i % body.len();
                    tasks.spawn(async move {
                        let sent = Instant::now();
                        let r = c.request("POST", &path, &[("content-type", "application/json")], &body[idx]).await;
                        let ok = r.is_ok();
                        record(sent, r);
                        if ok {
                            pool.lock().push(c);
                        }
                    });
                }
                None => skipped += 1,
            }
            i += 1;
            while tasks.try_join_next().is_some() {}
        }
        tally.lock().summary.skipped = skipped;
        tally.lock().summary.sent = i as u64 - skipped;
    } else {
        for w in 0..args.concurrency.max(1) {
            let body = bodies.clone();
            let path = path.clone();
            let record = record.clone();
            let tally = tally.clone();
            let addr = args.addr;
            tasks.spawn(async move {
                let Ok(mut c) = Client::connect(addr).await else { return };
                let mut i = w;
                while Instant::now() < end {
                    let sent = Instant::now();
                    let r =
                        c.request("POST", &path, &[("content-type", "application/json")], &body[i % body.len()]).await;
                    tally.lock().summary.sent += 1;
                    let failed = r.is_err();
                    record(sent, r);
                    if failed {
                        match Client::connect(addr).await {
                            Ok(n) => c = n,
                            Err(_) => return,
                        }
                    }
                    i += 1;
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    swapper.await??;
    let elapsed = started.elapsed().as_secs_f64();
    let mut t = std::mem::take(&mut *tally.lock());
    t.summary.accuracy = if t.on_time > 0 { t.accuracy_sum / t.on_time as f64 } else { 0.0 };
    t.summary.latency_ms = percentiles(std::mem::take(&mut t.latencies));
    t.summary.queue_ms = percentiles(std::mem::take(&mut t.queues));
    t.summary.seconds = elapsed;
    t.summary.throughput = t.summary.by_status.values().sum::<u64>() as f64 / elapsed;
    Ok(t.summary)
}

/// The answers a sluice server counted with `outcome` (`served`, `late`,
/// `dropped-expired`, …) across its apps, read from its `/metrics`; `None` if
/// they cannot be read within 5 s. Benchmarks set this, the server's own clock,
/// beside what their clients measured.
pub async fn server_count(addr: SocketAddr, outcome: &str) -> Option<u64> {
    let read = async {
        let mut client = Client::connect(addr).await.ok()?;
        Some(client.get("/metrics").await.ok()?.text())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), read).await.ok()??;
    let label = format!("outcome=\"{outcome}\"");
    let count = text
        .lines()
        .filter(|l| l.starts_with("sluice_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Some(count as u64)
}

/// Prints a summary for people.
pub fn print_summary(s: &Summary) {
    println!("requests sent      {}", s.sent);
    println!("responses          {:?} (by HTTP status)", s.by_status);
    println!("throughput         {:.1} responses/s over {:.1} s", s.throughput, s.seconds);
    println!("variants used      {:?}", s.by_variant);
    println!("decided by policy  {:?}", s.by_policy);
    let served: u64 = s.by_variant.values().sum();
    let late_pct = if served > 0 { 100.0 * s.late as f64 / served as f64 } else { 0.0 };
    println!("SLO violations     {} of {served} served ({late_pct:.2}%)", s.late);
    println!("accuracy           {:.4} (mean profiled top-1 per on-time response)", s.accuracy);
    println!("latency ms         {:?}", s.latency_ms);
    println!("queueing ms        {:?}", s.queue_ms);
    if s.skipped > 0 {
        println!("skipped arrivals   {} (all connections busy)", s.skipped);
    }
    for sw in &s.swaps {
        println!(
            "swap at {:>5.2}s    -> {} (HTTP {}): compile {:.2} ms, init {:.2} ms, install {:.1} µs, longest slot hold {:.1} µs",
            sw["at_seconds"].as_f64().unwrap_or(0.0),
            sw["policy"].as_str().unwrap_or("?"),
            sw["status"],
            sw["compile_ms"].as_f64().unwrap_or(0.0),
            sw["init_ms"].as_f64().unwrap_or(0.0),
            sw["install_us"].as_f64().unwrap_or(0.0),
            sw["max_slot_hold_us"].as_f64().unwrap_or(0.0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A chunked answer is read whole, and the connection stays usable for the next
    /// request (the chunks are not left on it).
    #[tokio::test]
    async fn reads_chunked_answers_and_keeps_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.expect("accept");
            let mut s = BufReader::new(s);
            for _ in 0..2 {
                let mut line = String::new();
                loop {
                    line.clear();
                    s.read_line(&mut line).await.expect("read");
                    if line.trim_end().is_empty() {
                        break;
                    }
                }
                let answer =
                    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=y\r\n:1}\r\n0\r\n\r\n";
                s.get_mut().write_all(answer.as_bytes()).await.expect("write");
            }
        });
        let mut c = Client::connect(addr).await.expect("connect");
        for _ in 0..2 {
            let r = c.get("/").await.expect("request");
            assert_eq!(r.status, 200);
            assert_eq!(r.body, b"{\"a\":1}");
        }
        server.await.expect("server");
    }
}

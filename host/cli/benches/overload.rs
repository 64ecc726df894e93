//! Overload at admission (issues 13 and 40): on-time goodput, late answers,
//! latency and memory when the offered load is five times what the workers serve.
//!
//! Starts the real binary (`sluice serve`, cargo builds it for the bench) as a
//! separate process with one emulated app of real image-sized inputs (FP32
//! [3, 224, 224]: ~600 KB of JSON or 602 KB of binary tensor per request, parsed
//! for real) on the light ImageNet CPU profile: 2 workers, batches of at most 4, a
//! 400 ms SLO (the setting of the independent comparison quoted in issue 13). For
//! each policy, each body (JSON, and the binary tensor extension) and each machine
//! (idle, and with a background load of one busy process, half of a 2-core
//! machine), it drives the server with Poisson arrivals for 10 s at the capacity
//! the profile gives, then 10 s at five times that, and reports:
//! - on-time goodput (answers 200 within the SLO at the client, per second) at 5×
//!   against the goodput at 1× in the same run (goal ≥ 0.9);
//! - the share of answers 200 that came after the SLO at 5× (goal ≤ 1 %), and the
//!   p99 latency of the answers 200 (goal ≤ the SLO);
//! - the server's RSS after start and after each phase (goal: flat);
//! - every status the clients got;
//! - how late the client's own timer woke (p99 and max of a 5 ms timer on the
//!   client's runtime): latency runs from the scheduled send, so the client's
//!   scheduling delay is counted in it and never seen by the server.
//!
//! Run: `cargo bench -p sluice --bench overload` (needs `cargo xtask policies`).
//! Prints a table, then one JSON line, then the summary line
//! `overload: worst 5x/1x goodput X, worst late share Y % (JSON and binary, idle and loaded)`.

use std::collections::BTreeMap;
use std::process::Child;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use sluice_loadgen::poisson::{run_poisson, PoissonArgs};
use sluice_loadgen::{self as loadgen};

mod common;
#[path = "common/image_app.rs"]
mod image_app;

use image_app::{scenarios, Server, SLO_MS};

const SECONDS: f64 = 10.0;
const POOL: usize = 512;
const ELEMENTS: usize = 3 * 224 * 224;

/// A request's body and its header lines.
type Request = (Arc<Vec<u8>>, Arc<Vec<(String, String)>>);

/// The request body of a phase.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Body {
    /// OIP JSON, the tensor as a JSON array.
    Json,
    /// The binary tensor data extension: a JSON header, then the raw FP32 bytes.
    Binary,
}

impl Body {
    /// The body and its header lines.
    fn request(self) -> Request {
        // Varied values (not all zeros), finite, in the range of normalised pixels.
        let data: Vec<f32> = (0..ELEMENTS).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        match self {
            Body::Json => {
                let body = serde_json::to_vec(&loadgen::infer_body("data_0", &[1, 3, 224, 224], &data)).expect("JSON");
                (Arc::new(body), Arc::default())
            }
            Body::Binary => {
                let head = json!({ "inputs": [{ "name": "data_0", "datatype": "FP32", "shape": [1, 3, 224, 224],
                    "parameters": { "binary_data_size": ELEMENTS * 4 } }] })
                .to_string();
                let mut body = head.clone().into_bytes();
                for x in &data {
                    body.extend(x.to_le_bytes());
                }
                let headers = vec![
                    ("content-type".to_string(), "application/octet-stream".to_string()),
                    ("inference-header-content-length".to_string(), head.len().to_string()),
                ];
                (Arc::new(body), Arc::new(headers))
            }
        }
    }
}

/// A background CPU load of `n` busy processes (killed when dropped): what a
/// noisy neighbour or a second service does to a machine sluice shares.
struct Background(Vec<Child>);

impl Background {
    fn start(n: usize) -> Result<Background> {
        let spin = || std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn();
        Ok(Background((0..n).map(|_| spin()).collect::<std::io::Result<_>>()?))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one phase saw.
#[derive(Debug, serde::Serialize)]
struct Phase {
    rate: f64,
    sent: u64,
    by_status: BTreeMap<u16, u64>,
    goodput: f64,
    /// Answers 200 after the SLO (client's clock).
    late: u64,
    /// Their share of the answers 200.
    late_share: f64,
    /// Answers the server counted late (its clock: arrival to answer), this phase.
    server_late: Option<u64>,
    p50_ms: f64,
    p99_ms: f64,
    rss_mib: f64,
    /// How late the client's own 5 ms timer woke during the phase, p99 and max
    /// (ms): time the client's latency counts that the server never sees (its
    /// arrivals are sent on the same runtime's timer, and latency runs from the
    /// scheduled send).
    client_lag_p99_ms: f64,
    client_lag_max_ms: f64,
}

/// Wakes every 5 ms on the client's runtime until `stop`, and returns how late
/// each wake-up was (ms): the client's own scheduling delay beside the server and
/// any background load.
async fn timer_lag(stop: Arc<std::sync::atomic::AtomicBool>) -> Vec<f64> {
    let mut lags = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let due = tokio::time::Instant::now() + Duration::from_millis(5);
        tokio::time::sleep_until(due).await;
        lags.push(due.elapsed().as_secs_f64() * 1e3);
    }
    lags
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

async fn phase(server: &Server, body: Body, rate: f64, seed: u64) -> Result<Phase> {
    let late_before = loadgen::server_count(server.addr, "late").await;
    let (bytes, headers) = body.request();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = tokio::spawn(timer_lag(stop.clone()));
    let records = run_poisson(PoissonArgs {
        addr: server.addr,
        path: "/v2/models/img/infer".into(),
        body: bytes,
        headers,
        rate,
        duration: Duration::from_secs_f64(SECONDS),
        seed,
        timeout: Duration::from_secs(10),
        max_connections: POOL,
    })
    .await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut lags = probe.await?;
    lags.sort_by(f64::total_cmp);
    let late_after = loadgen::server_count(server.addr, "late").await;
    let mut by_status = BTreeMap::new();
    for r in &records {
        *by_status.entry(r.status).or_insert(0) += 1;
    }
    let mut ok: Vec<f64> = records.iter().filter(|r| r.status == 200).map(|r| r.latency_ms).collect();
    ok.sort_by(f64::total_cmp);
    let late = ok.iter().filter(|&&ms| ms > SLO_MS).count() as u64;
    Ok(Phase {
        server_late: late_before.zip(late_after).map(|(b, a)| a.saturating_sub(b)),
        rate,
        sent: records.len() as u64,
        goodput: (ok.len() as u64 - late) as f64 / SECONDS,
        late,
        late_share: late as f64 / ok.len().max(1) as f64,
        p50_ms: quantile(&ok, 0.5),
        p99_ms: quantile(&ok, 0.99),
        by_status,
        rss_mib: server.rss_mib(),
        client_lag_p99_ms: quantile(&lags, 0.99),
        client_lag_max_ms: lags.last().copied().unwrap_or(f64::NAN),
    })
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let scenarios = scenarios();
    let mut rows = Vec::new();
    let mut seed = 1;
    for s in &scenarios {
        let server = Server::spawn(s, "", "")?;
        let start_rss = server.rss_mib();
        for background in [0, 1] {
            for body in [Body::Json, Body::Binary] {
                let _load = Background::start(background)?;
                seed += 2;
                let (at, over) = runtime.block_on(async {
                    Ok::<_, anyhow::Error>((
                        phase(&server, body, s.capacity, seed).await?,
                        phase(&server, body, 5.0 * s.capacity, seed + 1).await?,
                    ))
                })?;
                rows.push((s, body, background, start_rss, at, over));
            }
        }
    }
    println!(
        "| policy | body | background | capacity req/s | goodput 1× | goodput 5× | 5× / 1× (goal ≥ 0.9) | late 200s at 5× (goal ≤ 1 %) | p99 200s at 5× ms (SLO {SLO_MS}) | statuses at 5× | RSS start / 1× / 5× MiB | client timer lag at 5×, p99 / max ms |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|");
    let mut out = Vec::new();
    let (mut worst_ratio, mut worst_late) = (f64::INFINITY, 0.0f64);
    for (s, body, background, start_rss, at, over) in &rows {
        let ratio = over.goodput / at.goodput;
        worst_ratio = worst_ratio.min(ratio);
        worst_late = worst_late.max(over.late_share);
        println!(
            "| {} | {:?} | {} busy | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} % ({} of {}; server {}) | {:.0} | {:?} | {:.0} / {:.0} / {:.0} | {:.1} / {:.1} |",
            s.policy,
            body,
            background,
            s.capacity,
            at.goodput,
            over.goodput,
            ratio,
            over.late_share * 100.0,
            over.late,
            over.by_status.get(&200).copied().unwrap_or(0),
            over.server_late.map_or("-".to_string(), |n| n.to_string()),
            over.p99_ms,
            over.by_status,
            start_rss,
            at.rss_mib,
            over.rss_mib,
            over.client_lag_p99_ms,
            over.client_lag_max_ms
        );
        out.push(json!({ "policy": s.policy, "body": body, "background_busy": background, "capacity": s.capacity,
            "start_rss_mib": start_rss, "at_capacity": at, "at_5x": over }));
    }
    println!("{}", json!({ "bench": "overload", "slo_ms": SLO_MS, "seconds": SECONDS, "scenarios": out }));
    println!(
        "overload: worst 5x/1x goodput {worst_ratio:.2}, worst late share {:.2} % (JSON and binary, idle and loaded)",
        worst_late * 100.0
    );
    Ok(())
}

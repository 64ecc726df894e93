//! What open dashboards cost the host: ten pages polling `GET /admin/dashboard`
//! (the page's one request, every 500 ms, with the token) while the host serves
//! 1,000 requests/s.
//!
//! Starts the real binary (`sluice serve --config examples/bench-zero.toml`, cargo
//! builds it for the bench) as a separate process and drives it from this one:
//! `sluice_loadgen::run` open loop at 1,000 req/s on the zero-latency app, in
//! alternating phases of [`SECONDS`] s, without dashboards (the baseline) and
//! with [`PAGES`] pollers, [`ROUNDS`] times each. The server's CPU (user + system,
//! from `/proc/<pid>/stat`) over each phase's wall time is its CPU share, in % of
//! one core. Prints both, the extra the dashboards cost (percentage points of
//! one core) and the ratio with/without, then the compressed page weight and one
//! JSON line. Goal (issue 38): extra <= 2 % of one core.
//!
//! Run: `cargo bench -p sluice --bench dashboard` (needs `cargo xtask policies`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;
use sluice_loadgen::{self as loadgen, Client, LoadArgs};

mod common;

/// Open dashboards.
const PAGES: usize = 10;
/// Each page's poll period (the page's `POLL_MS`).
const POLL: Duration = Duration::from_millis(500);
/// The host's load, requests/s.
const RATE: f64 = 1_000.0;
/// One phase.
const SECONDS: f64 = 5.0;
/// Baseline and dashboard phases, alternated so drift hits both alike.
const ROUNDS: usize = 4;
/// The bench config's admin token.
const TOKEN: &str = "bench-token";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One page: polls as dashboard.js does (one GET, the events after the last seen).
async fn page(addr: SocketAddr, stop: Arc<AtomicBool>, polls: Arc<AtomicU64>, bytes: Arc<AtomicU64>) -> Result<()> {
    let mut c = Client::connect(addr).await?;
    let auth = format!("Bearer {TOKEN}");
    let mut since = 0u64;
    let mut tick = tokio::time::interval(POLL);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let r = c.request("GET", &format!("/admin/dashboard?since={since}"), &[("authorization", &auth)], b"").await?;
        if r.status != 200 {
            bail!("GET /admin/dashboard: {} {}", r.status, r.text());
        }
        if let Some(last) = r.json()["events"].as_array().and_then(|e| e.last()).and_then(|e| e["seq"].as_u64()) {
            since = last;
        }
        polls.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(r.body.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// One phase: the load, with `pages` dashboards; the server's CPU share (% of one
/// core), the answers/s, and the polls made.
async fn phase(server: &common::ServerProcess, pages: usize, ticks: f64) -> Result<(f64, f64, u64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..pages {
        tasks.spawn(page(server.addr, stop.clone(), polls.clone(), bytes.clone()));
    }
    let (cpu0, t0) = (server.cpu_seconds(ticks), Instant::now());
    let s = loadgen::run(LoadArgs {
        addr: server.addr,
        app: "zero".into(),
        rate: RATE,
        concurrency: 64,
        duration: SECONDS,
        input: None,
        swaps: Vec::new(),
        admin_token: None,
        json: false,
    })
    .await?;
    let (cpu1, wall) = (server.cpu_seconds(ticks), t0.elapsed().as_secs_f64());
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let ok = s.by_status.get(&200).copied().unwrap_or(0) as f64;
    Ok((100.0 * (cpu1 - cpu0) / wall, ok / wall, polls.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed)))
}

fn page_weight_gzip() -> Result<usize> {
    let mut total = 0;
    for a in sluice_dashboard::ASSETS.iter().filter(|a| a.name != "report.js" && a.name != "uPlot.LICENSE") {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(a.bytes)?;
        total += gz.finish()?.len();
    }
    Ok(total)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let root = root();
    if !root.join("target/policies/jellyfish.wasm").exists() {
        bail!("target/policies/jellyfish.wasm is missing: run `cargo xtask policies` first");
    }
    let server = common::start_server(&root.join("examples/bench-zero.toml"))?;
    let ticks = common::clock_ticks();
    // Warm up: the first seconds after start cost the server far more than the
    // rest (measured: 90 % of a core in the first phase, 10-20 % after), which
    // would swamp the difference measured here.
    for _ in 0..3 {
        phase(&server, PAGES, ticks).await?;
    }
    let (mut base, mut with) = (Vec::new(), Vec::new());
    let (mut polls, mut bytes) = (0, 0);
    for _ in 0..ROUNDS {
        base.push(phase(&server, 0, ticks).await?);
        let p = phase(&server, PAGES, ticks).await?;
        polls += p.2;
        bytes += p.3;
        with.push(p);
    }
    let mean =
        |v: &[(f64, f64, u64, u64)], f: fn(&(f64, f64, u64, u64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let (cpu_base, cpu_with) = (mean(&base, |p| p.0), mean(&with, |p| p.0));
    let (rps_base, rps_with) = (mean(&base, |p| p.1), mean(&with, |p| p.1));
    let extra = cpu_with - cpu_base;
    let weight = page_weight_gzip()?;
    println!("dashboard: `sluice serve` (bench-zero.toml) at {RATE} req/s, {ROUNDS} x {SECONDS} s per phase");
    println!("{:<28} {:>12} {:>12}", "", "CPU (% core)", "answers/s");
    for (i, (b, w)) in base.iter().zip(&with).enumerate() {
        println!("{:<28} {:>12.2} {:>12.0}", format!("round {i}: no dashboard"), b.0, b.1);
        println!("{:<28} {:>12.2} {:>12.0}", format!("round {i}: {PAGES} dashboards"), w.0, w.1);
    }
    println!("{:<28} {:>12.2} {:>12.0}", "mean: no dashboard", cpu_base, rps_base);
    println!("{:<28} {:>12.2} {:>12.0}", format!("mean: {PAGES} dashboards"), cpu_with, rps_with);
    println!(
        "extra CPU for {PAGES} dashboards: {extra:.2} % of one core (ratio {:.3}); {} polls, {:.1} KB per poll; goal <= 2 %",
        cpu_with / cpu_base,
        polls,
        bytes as f64 / polls.max(1) as f64 / 1024.0
    );
    println!("page weight: {weight} bytes gzip-compressed (goal <= 300 KB)");
    println!(
        "{}",
        json!({
            "bench": "dashboard", "rate": RATE, "pages": PAGES, "poll_ms": POLL.as_millis() as u64,
            "cpu_percent_baseline": cpu_base, "cpu_percent_dashboards": cpu_with, "extra_percent": extra,
            "ratio": cpu_with / cpu_base, "answers_per_s": [rps_base, rps_with], "polls": polls,
            "bytes_per_poll": bytes / polls.max(1), "page_weight_gzip": weight,
        })
    );
    Ok(())
}

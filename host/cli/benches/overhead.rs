//! Host overhead on the emulated executor with zero-latency models.
//!
//! Starts the real binary (`sluice serve --config examples/bench-zero.toml`, cargo
//! builds it for the bench) as a separate process, then from this process drives
//! it open loop at 1,000 and 5,000 requests/s for 5 s each over a pool of 64
//! keep-alive connections:
//! - `infer`: [`sluice_loadgen::run`] posting `/v2/models/zero/infer` (what a
//!   client sees is the host's added latency plus loopback HTTP, since the models
//!   take 0 µs);
//! - `live` (baseline): the same open loop (same schedule, pool and client) doing
//!   `GET /v2/health/live`, the pure HTTP floor.
//!
//! Prints achieved responses/s, client-observed latency percentiles, the
//! host-reported queueing time (arrival to batch start, from the responses), the
//! server process's CPU time per response, the ratio infer/live, and what
//! `tokio::time::sleep(Duration::ZERO)` costs (the emulated executor sleeps even a
//! 0 µs batch, and tokio's timer is 1 ms grained). Goal: infer p99 <= 1 ms at
//! 5,000 req/s.
//!
//! Run: `cargo bench -p sluice --bench overhead` (needs `cargo xtask policies`).
//! Prints a table, then one JSON line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use parking_lot::Mutex;
use serde_json::json;
use sluice_loadgen::{self as loadgen, Client, LoadArgs};

mod common;

const RATES: [f64; 2] = [1_000.0, 5_000.0];
const SECONDS: f64 = 5.0;
const POOL: usize = 64;
const GOAL_P99_MS: f64 = 1.0;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Starts the bench config (`examples/bench-zero.toml`) once the policies it
/// serves are built.
fn spawn_server() -> Result<common::ServerProcess> {
    let root = root();
    for name in ["jellyfish", "fixed"] {
        let p = root.join("target/policies").join(format!("{name}.wasm"));
        if !p.exists() {
            bail!("{} is missing: run `cargo xtask policies` first", p.display());
        }
    }
    // Cargo builds the `sluice` binary (bench profile = release) for every bench target.
    common::start_server(&root.join("examples/bench-zero.toml"))
}

/// What one phase saw.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Phase {
    endpoint: &'static str,
    rate: f64,
    sent: u64,
    skipped: u64,
    by_status: BTreeMap<u16, u64>,
    throughput: f64,
    latency_ms: BTreeMap<String, f64>,
    /// Host-reported time from arrival to the start of the request's batch (infer only).
    queue_ms: BTreeMap<String, f64>,
    server_cpu_us_per_response: f64,
}

impl Phase {
    fn lat(&self, k: &str) -> f64 {
        self.latency_ms.get(k).copied().unwrap_or(f64::NAN)
    }

    fn queue(&self, k: &str) -> f64 {
        self.queue_ms.get(k).copied().unwrap_or(f64::NAN)
    }
}

/// The percentiles `sluice_loadgen` reports, computed the same way.
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

/// The baseline: `GET path` open loop, structured exactly like `loadgen::run`'s
/// open loop (arrivals on a fixed schedule, a pool of keep-alive connections, one
/// task per request, an arrival skipped when every connection is busy).
async fn open_loop_get(
    addr: SocketAddr,
    path: &'static str,
    rate: f64,
    pool_size: usize,
    seconds: f64,
) -> Result<Phase> {
    type Tally = (Vec<f64>, BTreeMap<u16, u64>);
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let pool: Arc<Mutex<Vec<Client>>> = Arc::default();
    for _ in 0..pool_size {
        let c = Client::connect(addr).await?;
        pool.lock().push(c);
    }
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut next = Instant::now();
    let (mut sent, mut skipped) = (0u64, 0u64);
    let mut tasks = tokio::task::JoinSet::new();
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        next += interval;
        let free = pool.lock().pop();
        match free {
            Some(mut c) => {
                sent += 1;
                let pool = pool.clone();
                let tally = tally.clone();
                tasks.spawn(async move {
                    let t = Instant::now();
                    let r = c.get(path).await;
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    let mut tally = tally.lock();
                    match r {
                        Ok(r) => {
                            // Parsed as loadgen parses every response, to keep the client's work alike.
                            std::hint::black_box(r.json());
                            *tally.1.entry(r.status).or_default() += 1;
                            if r.status == 200 {
                                tally.0.push(ms);
                            }
                            drop(tally);
                            pool.lock().push(c);
                        }
                        Err(_) => *tally.1.entry(0).or_default() += 1,
                    }
                });
            }
            None => skipped += 1,
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let (latencies, by_status) = std::mem::take(&mut *tally.lock());
    Ok(Phase {
        endpoint: "live",
        rate,
        sent,
        skipped,
        throughput: by_status.values().sum::<u64>() as f64 / elapsed,
        by_status,
        latency_ms: percentiles(latencies),
        queue_ms: BTreeMap::new(),
        server_cpu_us_per_response: f64::NAN,
    })
}

async fn infer(addr: SocketAddr, rate: f64, seconds: f64) -> Result<Phase> {
    let s = loadgen::run(LoadArgs {
        addr,
        app: "zero".into(),
        rate,
        concurrency: POOL,
        duration: seconds,
        input: None,
        swaps: Vec::new(),
        admin_token: None,
        json: false,
    })
    .await?;
    Ok(Phase {
        endpoint: "infer",
        rate,
        sent: s.sent,
        skipped: s.skipped,
        by_status: s.by_status,
        throughput: s.throughput,
        latency_ms: s.latency_ms,
        queue_ms: s.queue_ms,
        server_cpu_us_per_response: f64::NAN,
    })
}

/// What `tokio::time::sleep(Duration::ZERO)` costs on this runtime, in ms (p50,
/// p99): the emulated executor sleeps a batch's profiled latency, zero here, and
/// tokio's timer rounds every deadline up to its next 1 ms tick, so this is a floor
/// under every emulated batch that the live baseline does not pay.
async fn zero_sleep_ms() -> (f64, f64) {
    let mut v: Vec<f64> = Vec::with_capacity(1_000);
    for _ in 0..1_000 {
        let t = Instant::now();
        tokio::time::sleep(Duration::ZERO).await;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let p = percentiles(v);
    (p["p50"], p["p99"])
}

fn main() -> Result<()> {
    let ticks = common::clock_ticks();
    let server = spawn_server()?;
    let addr = server.addr;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut phases: Vec<Phase> = Vec::new();
    let mut zero_sleep = (f64::NAN, f64::NAN);
    runtime.block_on(async {
        zero_sleep = zero_sleep_ms().await;
        // Warm-up: connections, allocator, the policy's first decisions.
        infer(addr, 1_000.0, 1.0).await?;
        for rate in RATES {
            for endpoint in ["live", "infer"] {
                let cpu = server.cpu_seconds(ticks);
                let mut p = if endpoint == "live" {
                    open_loop_get(addr, "/v2/health/live", rate, POOL, SECONDS).await?
                } else {
                    infer(addr, rate, SECONDS).await?
                };
                let responses: u64 = p.by_status.values().sum();
                p.server_cpu_us_per_response = (server.cpu_seconds(ticks) - cpu) * 1e6 / responses.max(1) as f64;
                phases.push(p);
            }
        }
        anyhow::Ok(())
    })?;
    drop(server);

    println!(
        "overhead: `sluice serve` (zero-latency emulated models, 4 workers) driven open loop from another process, pool {POOL}, {SECONDS} s per phase"
    );
    println!(
        "{:>6} {:<6} | {:>7} {:>7} {:>10} | {:>8} {:>8} {:>8} {:>8} | {:>9} {:>9} | {:>12} | statuses",
        "rate",
        "path",
        "sent",
        "skipped",
        "resp/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "queue p50",
        "queue p99",
        "srv CPU µs/r"
    );
    for p in &phases {
        println!(
            "{:>6} {:<6} | {:>7} {:>7} {:>10.0} | {:>8.3} {:>8.3} {:>8.3} {:>8.3} | {:>9.3} {:>9.3} | {:>12.1} | {:?}",
            p.rate,
            p.endpoint,
            p.sent,
            p.skipped,
            p.throughput,
            p.lat("p50"),
            p.lat("p90"),
            p.lat("p99"),
            p.lat("max"),
            p.queue("p50"),
            p.queue("p99"),
            p.server_cpu_us_per_response,
            p.by_status
        );
    }
    let mut ratios = Vec::new();
    for rate in RATES {
        let get = |e: &str| phases.iter().find(|p| p.rate == rate && p.endpoint == e);
        if let (Some(live), Some(inf)) = (get("live"), get("infer")) {
            let r = |k: &str| inf.lat(k) / live.lat(k);
            println!(
                "{rate:>6} infer/live: p50 x{:.2}, p99 x{:.2}; added by the host: p50 {:+.3} ms, p99 {:+.3} ms; server CPU x{:.2}",
                r("p50"),
                r("p99"),
                inf.lat("p50") - live.lat("p50"),
                inf.lat("p99") - live.lat("p99"),
                inf.server_cpu_us_per_response / live.server_cpu_us_per_response
            );
            ratios.push(json!({
                "rate": rate,
                "ratio_p50": r("p50"),
                "ratio_p99": r("p99"),
                "added_p50_ms": inf.lat("p50") - live.lat("p50"),
                "added_p99_ms": inf.lat("p99") - live.lat("p99"),
            }));
        }
    }
    println!(
        "timer floor: tokio::time::sleep(Duration::ZERO) takes p50 {:.3} ms, p99 {:.3} ms (the emulated executor sleeps even a 0 µs batch)",
        zero_sleep.0, zero_sleep.1
    );
    let goal = phases.iter().find(|p| p.rate == 5_000.0 && p.endpoint == "infer").map(|p| p.lat("p99"));
    if let Some(p99) = goal {
        println!(
            "goal: infer p99 <= {GOAL_P99_MS} ms at 5000 req/s: p99 = {p99:.3} ms -> {}",
            if p99 <= GOAL_P99_MS { "MET" } else { "NOT MET" }
        );
    }
    let line = json!({
        "bench": "overhead",
        "pool": POOL,
        "seconds": SECONDS,
        "phases": phases,
        "ratios": ratios,
        "zero_sleep_ms": { "p50": zero_sleep.0, "p99": zero_sleep.1 },
        "goal_p99_ms": GOAL_P99_MS,
        "goal_met": goal.map(|p| p <= GOAL_P99_MS),
    });
    println!("{line}");
    Ok(())
}

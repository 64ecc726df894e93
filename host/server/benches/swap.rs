//! Policy swap costs: compiling a component, instantiating it, and hot-swapping it
//! under load.
//!
//! 1. Compile `jellyfish.wasm` and `fixed.wasm` from bytes with a fresh
//!    [`PolicyEngine`] each time (uncached), median of 10; then the cached path
//!    (same bytes, same engine: a SHA-256 of the bytes and a map lookup), and a
//!    fresh engine loading the code from the disk compile cache (a restart).
//! 2. Instantiate + `init` one instance ([`PolicyInstance::new`]), its first and
//!    second `decide`, and dropping it (a worker drops the replaced instance itself).
//! 3. Under load: an in-process server (`examples/bench-zero.toml`: emulated
//!    zero-latency models, 4 workers) with closed-loop clients; 50 swaps alternating
//!    `fixed`/`jellyfish` through [`App::swap_policy`]. Reports the longest slot
//!    hold of any swap, the app's `swap_max_wait_ns` (goal <= 1 ms) and, as the
//!    baseline, client-observed latency of the same load without swaps. (The host
//!    does not record how long a worker ordinarily waits for its slot, so that
//!    cannot be the baseline; see BENCHMARKS.md.)
//!
//! Run: `cargo bench -p sluice-server --bench swap`. Asserts nothing; prints a table,
//! then one JSON line.

#[path = "../../core/benches/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use common::{component, config, root, SLO_US};
use serde_json::json;
use sluice_core::runtime::{Binding, Limits, PolicyEngine, PolicyInstance};
use sluice_loadgen::{self as loadgen, LoadArgs, Summary};
use sluice_sdk::{Pending, View};
use sluice_server::app::SwapReport;

const COMPILE_REPS: usize = 10;
const CACHED_REPS: usize = 1_000;
const INSTANCE_REPS: usize = 200;
const SWAPS: usize = 50;
/// Pause between two swaps, so requests flow under each policy.
const SWAP_GAP: Duration = Duration::from_millis(40);
/// Closed-loop clients.
const CLIENTS: usize = 4;
/// Length of each load phase (with and without swaps), seconds.
const LOAD_SECONDS: f64 = 2.5;
/// Goal for the longest time a worker waited on a swap.
const GOAL_WAIT_NS: u64 = 1_000_000;

fn params(name: &str) -> &'static str {
    if name == "fixed" {
        r#"{"model": "resnet50"}"#
    } else {
        "{}"
    }
}

fn view() -> View {
    let now = 10_000_000;
    let queue = (0..8u64)
        .map(|i| {
            let arrival = now - (8 - i) * 500;
            Pending { id: i, arrival, deadline: arrival + SLO_US }
        })
        .collect();
    View { now, worker: 0, workers: 4, load_qps: 400.0, loaded: vec![0, 1, 2, 3], queue }
}

/// p50, p99 and max of durations, in µs.
fn pct(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99), at(1.0))
}

struct CompileRow {
    name: &'static str,
    bytes: usize,
    /// µs: p50, min, max over fresh engines.
    fresh: (f64, f64, f64),
    /// µs: p50, p99 of the cached path.
    cached: (f64, f64),
    /// ms: p50 of a fresh engine loading the compiled code from the disk cache.
    disk: f64,
}

fn compile_costs(name: &'static str) -> CompileRow {
    let bytes = component(name);
    let mut fresh = Vec::new();
    for _ in 0..COMPILE_REPS {
        let engine = PolicyEngine::with_cache(None).expect("engine");
        let t = Instant::now();
        let c = engine.compile(name, &bytes).expect("compile");
        fresh.push(t.elapsed());
        drop(c);
    }
    // A restart: a fresh engine whose disk cache holds the component.
    let dir = tempfile::tempdir().expect("cache dir");
    PolicyEngine::with_cache(Some(dir.path())).expect("engine").compile(name, &bytes).expect("compile");
    let disk: Vec<Duration> = (0..COMPILE_REPS)
        .map(|_| {
            let engine = PolicyEngine::with_cache(Some(dir.path())).expect("engine");
            let t = Instant::now();
            engine.compile(name, &bytes).expect("compile");
            t.elapsed()
        })
        .collect();
    let engine = PolicyEngine::new().expect("engine");
    engine.compile(name, &bytes).expect("compile");
    let cached: Vec<Duration> = (0..CACHED_REPS)
        .map(|_| {
            let t = Instant::now();
            let c = engine.compile(name, &bytes).expect("cached compile");
            let d = t.elapsed();
            drop(c);
            d
        })
        .collect();
    let min = fresh.iter().min().copied().unwrap_or_default().as_secs_f64() * 1e6;
    let (f50, _, fmax) = pct(fresh);
    let (c50, c99, _) = pct(cached);
    let (d50, _, _) = pct(disk);
    CompileRow { name, bytes: bytes.len(), fresh: (f50, min, fmax), cached: (c50, c99), disk: d50 / 1e3 }
}

struct InstanceRow {
    name: &'static str,
    /// µs p50, p99 of each measure.
    new: (f64, f64),
    first_decide: (f64, f64),
    second_decide: (f64, f64),
    drop: (f64, f64),
}

fn instance_costs(engine: &Arc<PolicyEngine>, name: &'static str) -> InstanceRow {
    let compiled = engine.compile(name, &component(name)).expect("compile");
    let v = view();
    let (mut new, mut first, mut second, mut dropped) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..INSTANCE_REPS {
        let t = Instant::now();
        let mut i =
            PolicyInstance::new(engine, &Binding::new(compiled.clone(), config(params(name)), Limits::default()), 0)
                .expect("init");
        new.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(i.decide(&v).expect("decide"));
        first.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(i.decide(&v).expect("decide"));
        second.push(t.elapsed());
        let t = Instant::now();
        drop(i);
        dropped.push(t.elapsed());
    }
    let two = |v| {
        let (a, b, _) = pct(v);
        (a, b)
    };
    InstanceRow { name, new: two(new), first_decide: two(first), second_decide: two(second), drop: two(dropped) }
}

fn load_args(addr: SocketAddr, seconds: f64) -> LoadArgs {
    LoadArgs {
        addr,
        app: "zero".into(),
        rate: 0.0,
        concurrency: CLIENTS,
        duration: seconds,
        input: None,
        swaps: Vec::new(),
        admin_token: None,
        json: false,
    }
}

struct UnderLoad {
    baseline: Summary,
    during: Summary,
    reports: Vec<SwapReport>,
    failed_swaps: Vec<String>,
    swap_max_wait_ns: u64,
    swap_seconds: f64,
}

async fn under_load() -> Result<UnderLoad> {
    let path = root().join("examples/bench-zero.toml");
    let mut config = sluice_server::config::Config::load(&path)?;
    config.apps[0].workers = 4;
    let state = sluice_server::state::State::build(config).await.context("build the bench server")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sluice_server::server::run(listener, state.clone(), async {
        let _ = stopped.await;
    }));
    let app = state.apps.get("zero").context("app `zero`")?.clone();
    let jellyfish = state.registry.get("jellyfish")?;
    let fixed = state.registry.get("fixed")?;

    loadgen::run(load_args(addr, 0.5)).await?; // warm-up
    let baseline = loadgen::run(load_args(addr, LOAD_SECONDS)).await?;

    app.counters.swap_max_wait_ns.store(0, Ordering::Relaxed);
    let load = tokio::spawn(loadgen::run(load_args(addr, LOAD_SECONDS)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut reports = Vec::new();
    let mut failed_swaps = Vec::new();
    let started = Instant::now();
    for k in 0..SWAPS {
        let (compiled, params) =
            if k % 2 == 0 { (fixed.clone(), r#"{"model":"medium"}"#) } else { (jellyfish.clone(), "{}") };
        match app.swap_policy(compiled, params.to_string()).await {
            Ok(r) => reports.push(r),
            Err(e) => failed_swaps.push(e.to_string()),
        }
        tokio::time::sleep(SWAP_GAP).await;
    }
    let swap_seconds = started.elapsed().as_secs_f64();
    let during = load.await??;
    let swap_max_wait_ns = app.counters.swap_max_wait_ns.load(Ordering::Relaxed);
    let _ = stop.send(());
    server.await??;
    Ok(UnderLoad { baseline, during, reports, failed_swaps, swap_max_wait_ns, swap_seconds })
}

fn lat(s: &Summary, k: &str) -> f64 {
    s.latency_ms.get(k).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<()> {
    let compile: Vec<CompileRow> = ["jellyfish", "fixed"].into_iter().map(compile_costs).collect();
    let engine = PolicyEngine::new()?;
    let instances: Vec<InstanceRow> = ["jellyfish", "fixed"].into_iter().map(|n| instance_costs(&engine, n)).collect();
    drop(engine);

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let load = runtime.block_on(under_load())?;

    println!("swap: compile ({COMPILE_REPS} fresh engines, median) vs cached ({CACHED_REPS} lookups)");
    println!(
        "{:<10} {:>8} | {:>12} {:>10} {:>10} | {:>12} {:>10} | {:>12} | {:>13}",
        "component",
        "bytes",
        "fresh p50 ms",
        "min ms",
        "max ms",
        "cached p50 µs",
        "p99 µs",
        "x fresh/cached",
        "disk p50 ms"
    );
    for r in &compile {
        println!(
            "{:<10} {:>8} | {:>12.1} {:>10.1} {:>10.1} | {:>13.1} {:>10.1} | {:>12.0} | {:>13.2}",
            r.name,
            r.bytes,
            r.fresh.0 / 1e3,
            r.fresh.1 / 1e3,
            r.fresh.2 / 1e3,
            r.cached.0,
            r.cached.1,
            r.fresh.0 / r.cached.0.max(1e-3),
            r.disk
        );
    }
    println!();
    println!("instance ({INSTANCE_REPS} per policy), µs p50 / p99");
    println!(
        "{:<10} | {:>17} | {:>17} | {:>17} | {:>17}",
        "policy", "instantiate+init", "first decide", "second decide", "drop"
    );
    for r in &instances {
        let f = |(a, b): (f64, f64)| format!("{a:>7.1} / {b:>7.1}");
        println!(
            "{:<10} | {:>17} | {:>17} | {:>17} | {:>17}",
            r.name,
            f(r.new),
            f(r.first_decide),
            f(r.second_decide),
            f(r.drop)
        );
    }
    println!();
    let reports = &load.reports;
    let holds: Vec<f64> = reports.iter().map(|r| r.max_slot_hold_us).collect();
    let max_hold = holds.iter().copied().fold(0.0, f64::max);
    let max_of = |f: fn(&SwapReport) -> f64| reports.iter().map(f).fold(0.0, f64::max);
    let med_of = |f: fn(&SwapReport) -> f64| {
        let mut v: Vec<f64> = reports.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!(
        "under load: {SWAPS} swaps fixed<->jellyfish over {:.2} s, {CLIENTS} closed-loop clients, 4 workers, zero-latency models",
        load.swap_seconds
    );
    println!(
        "  swaps ok {} / failed {}; per swap: init (4 instances) p50 {:.2} ms max {:.2} ms; install p50 {:.1} µs max {:.1} µs",
        reports.len(),
        load.failed_swaps.len(),
        med_of(|r| r.init_ms),
        max_of(|r| r.init_ms),
        med_of(|r| r.install_us),
        max_of(|r| r.install_us)
    );
    println!(
        "  longest slot hold of any swap (max_slot_hold_us): {max_hold:.2} µs (median over swaps {:.2} µs)",
        med_of(|r| r.max_slot_hold_us)
    );
    println!(
        "  longest wait of a worker on a swap (swap_max_wait_ns): {:.2} µs -> goal <= 1 ms {}",
        load.swap_max_wait_ns as f64 / 1e3,
        if load.swap_max_wait_ns <= GOAL_WAIT_NS { "MET" } else { "NOT MET" }
    );
    println!("  client latency, ms     {:>9} {:>9} {:>9} {:>9} {:>11}", "p50", "p90", "p99", "max", "responses/s");
    for (label, s) in [("without swaps (base)", &load.baseline), ("with swaps", &load.during)] {
        println!(
            "  {label:<22} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>11.0}",
            lat(s, "p50"),
            lat(s, "p90"),
            lat(s, "p99"),
            lat(s, "max"),
            s.throughput
        );
    }
    let ratio = |k: &str| lat(&load.during, k) / lat(&load.baseline, k);
    println!(
        "  ratio with/without      {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>11.2}",
        ratio("p50"),
        ratio("p90"),
        ratio("p99"),
        ratio("max"),
        load.during.throughput / load.baseline.throughput
    );
    println!(
        "  statuses without {:?}, with {:?}; decided by (with swaps) {:?}",
        load.baseline.by_status, load.during.by_status, load.during.by_policy
    );
    for e in &load.failed_swaps {
        println!("  failed swap: {e}");
    }

    let line = json!({
        "bench": "swap",
        "compile": compile.iter().map(|r| json!({
            "component": r.name, "bytes": r.bytes,
            "fresh_ms": { "p50": r.fresh.0 / 1e3, "min": r.fresh.1 / 1e3, "max": r.fresh.2 / 1e3 },
            "cached_us": { "p50": r.cached.0, "p99": r.cached.1 },
            "disk_cache_ms": { "p50": r.disk },
            "ratio_fresh_cached": r.fresh.0 / r.cached.0.max(1e-3),
        })).collect::<Vec<_>>(),
        "instance_us": instances.iter().map(|r| json!({
            "policy": r.name,
            "instantiate_init": { "p50": r.new.0, "p99": r.new.1 },
            "first_decide": { "p50": r.first_decide.0, "p99": r.first_decide.1 },
            "second_decide": { "p50": r.second_decide.0, "p99": r.second_decide.1 },
            "drop": { "p50": r.drop.0, "p99": r.drop.1 },
        })).collect::<Vec<_>>(),
        "under_load": {
            "swaps_ok": reports.len(),
            "swaps_failed": load.failed_swaps.len(),
            "init_ms": { "p50": med_of(|r| r.init_ms), "max": max_of(|r| r.init_ms) },
            "install_us": { "p50": med_of(|r| r.install_us), "max": max_of(|r| r.install_us) },
            "max_slot_hold_us": max_hold,
            "swap_max_wait_us": load.swap_max_wait_ns as f64 / 1e3,
            "goal_wait_met": load.swap_max_wait_ns <= GOAL_WAIT_NS,
            "latency_ms_without_swaps": load.baseline.latency_ms,
            "latency_ms_with_swaps": load.during.latency_ms,
            "throughput_without": load.baseline.throughput,
            "throughput_with": load.during.throughput,
            "ratio_p99_with_without": ratio("p99"),
        },
    });
    println!("{line}");
    Ok(())
}

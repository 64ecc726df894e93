//! What a Python policy costs against the same policy in Rust (issue 37).
//!
//! For Jellyfish+ and spread-drop, the Rust components (`target/policies/<name>.wasm`)
//! and their Python ports built by componentize-py (`<name>-py.wasm`; both from
//! `cargo xtask policies`), in one run on one machine:
//!
//! 1. `decide` p50/p99 at queue depth 32, every call timed through
//!    [`PolicyInstance::decide`] (what a worker pays); goal p99 <= 100 µs.
//! 2. compile time without a cache, and load time from wasmtime's on-disk cache (a
//!    fresh engine on a warm cache directory: a restart); instantiate + `init`
//!    (median of 20); goal: instantiate <= 50 ms with the component loaded from the
//!    cache (the load itself happens once per process and component).
//! 3. memory: resident set growth per extra instance, over 60 instances (one app's
//!    60 workers); goal <= 20 MB per extra instance.
//!
//! Each figure is printed with its ratio to the Rust component's. Run:
//! `cargo bench -p sluice-core --bench python`. Prints a table, then one JSON line.

mod common;

use std::time::{Duration, Instant};

use common::{component, config, SLO_US};
use serde_json::json;
use sluice_core::runtime::{Binding, Limits, PolicyEngine, PolicyInstance};
use sluice_sdk::{Pending, View};

const CALLS: usize = 20_000;
const WARMUP: usize = 2_000;
const DEPTH: usize = 32;
const WORKERS: u32 = 60;

fn view(now: u64) -> View {
    View {
        now,
        worker: 0,
        workers: 4,
        load_qps: 800.0,
        loaded: vec![0, 1, 2, 3],
        queue: (0..DEPTH as u64)
            .map(|i| Pending { id: i, arrival: now - 1_000 + i, deadline: now - 1_000 + i + SLO_US })
            .collect(),
    }
}

/// Resident set size of this process, bytes (Linux).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6
}

struct Figures {
    p50_us: f64,
    p99_us: f64,
    live_p50_us: f64,
    live_p99_us: f64,
    compile_ms: f64,
    cached_ms: f64,
    instantiate_ms: f64,
    per_instance_mb: f64,
    sixty_mb: f64,
    size_mb: f64,
}

fn measure(name: &str, cache: &std::path::Path) -> Figures {
    let bytes = component(name);
    // Compile without a cache, then load it in a fresh engine from a warm cache.
    let cold = PolicyEngine::with_cache(None).unwrap();
    let compile_ms = cold.compile(name, &bytes).unwrap().compile_time.as_secs_f64() * 1e3;
    drop(cold);
    PolicyEngine::with_cache(Some(cache)).unwrap().compile(name, &bytes).unwrap();
    let engine = PolicyEngine::with_cache(Some(cache)).unwrap();
    let compiled = engine.compile(name, &bytes).unwrap();
    let cached_ms = compiled.compile_time.as_secs_f64() * 1e3;
    let binding = Binding::new(compiled, config("{}"), Limits::default());
    let mut times: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let i = PolicyInstance::new(&engine, &binding, 0).unwrap();
            let e = t.elapsed();
            drop(i);
            e
        })
        .collect();
    times.sort_unstable();
    let instantiate_ms = times[times.len() / 2].as_secs_f64() * 1e3;

    let mut instance = PolicyInstance::new(&engine, &binding, 0).unwrap();
    let v = view(10_000_000);
    for _ in 0..WARMUP {
        instance.decide(&v).unwrap();
    }
    let mut calls: Vec<Duration> = (0..CALLS)
        .map(|_| {
            let t = Instant::now();
            instance.decide(&v).unwrap();
            t.elapsed()
        })
        .collect();
    calls.sort_unstable();
    // The live host's worker threads call from inside a tokio `block_on`, where a
    // WASI-importing instance's calls go through a scoped thread (runtime.rs,
    // `outside_runtime`): timed the same way there.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let handle = rt.handle().clone();
    // As the server's workers do: a thread of its own driving `Handle::block_on`.
    let mut live: Vec<Duration> = std::thread::scope(|s| {
        s.spawn(|| {
            handle.block_on(async {
                (0..CALLS / 4)
                    .map(|_| {
                        let t = Instant::now();
                        instance.decide(&v).unwrap();
                        t.elapsed()
                    })
                    .collect()
            })
        })
        .join()
        .unwrap()
    });
    drop(rt);
    live.sort_unstable();

    // Memory: one instance per worker of a 60-worker app, each having decided once
    // (the pages a call touches are what a serving instance keeps).
    let before = rss();
    let mut instances = Vec::new();
    for w in 0..WORKERS {
        let mut i = PolicyInstance::new(&engine, &binding, w).unwrap();
        i.decide(&v).unwrap();
        instances.push(i);
    }
    let grown = rss().saturating_sub(before) as f64 / (1 << 20) as f64;
    drop(instances);
    Figures {
        p50_us: percentile(&calls, 0.5),
        p99_us: percentile(&calls, 0.99),
        live_p50_us: percentile(&live, 0.5),
        live_p99_us: percentile(&live, 0.99),
        compile_ms,
        cached_ms,
        instantiate_ms,
        per_instance_mb: grown / f64::from(WORKERS),
        sixty_mb: grown,
        size_mb: bytes.len() as f64 / (1 << 20) as f64,
    }
}

fn main() {
    let cache = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    println!(
        "{:<16} {:>9} {:>9} {:>11} {:>10} {:>12} {:>10} {:>10} {:>8}",
        "policy", "p50 µs", "p99 µs", "compile ms", "cached ms", "instantiate", "MB/inst", "60 inst", "size MB"
    );
    for base in ["jellyfish", "spread-drop"] {
        let rust = measure(base, cache.path());
        let python = measure(&format!("{base}-py"), cache.path());
        for (label, f) in [(base.to_string(), &rust), (format!("{base}-py"), &python)] {
            println!(
                "{label:<16} {:>9.2} {:>9.2} {:>11.1} {:>10.2} {:>10.2}ms {:>10.2} {:>9.1}M {:>8.2}",
                f.p50_us,
                f.p99_us,
                f.compile_ms,
                f.cached_ms,
                f.instantiate_ms,
                f.per_instance_mb,
                f.sixty_mb,
                f.size_mb
            );
        }
        println!(
            "  in a tokio block_on (the live worker's thread): {base} p50 {:.2} µs p99 {:.2} µs, {base}-py p50 {:.2} µs p99 {:.2} µs",
            rust.live_p50_us, rust.live_p99_us, python.live_p50_us, python.live_p99_us
        );
        let ratio = |p: f64, r: f64| if r > 0.0 { p / r } else { f64::NAN };
        println!(
            "  python/rust: p50 {:.0}x, p99 {:.0}x, compile {:.0}x, cached {:.0}x, instantiate {:.0}x, memory {:.0}x; \
             goals p99 <= 100 µs: {}, instantiate <= 50 ms: {}, <= 20 MB/instance: {}",
            ratio(python.p50_us, rust.p50_us),
            ratio(python.p99_us, rust.p99_us),
            ratio(python.compile_ms, rust.compile_ms),
            ratio(python.cached_ms, rust.cached_ms),
            ratio(python.instantiate_ms, rust.instantiate_ms),
            ratio(python.per_instance_mb, rust.per_instance_mb.max(0.01)),
            if python.p99_us <= 100.0 { "met" } else { "MISSED" },
            if python.instantiate_ms <= 50.0 { "met" } else { "MISSED" },
            if python.per_instance_mb <= 20.0 { "met" } else { "MISSED" },
        );
        for (label, f) in [(base.to_string(), &rust), (format!("{base}-py"), &python)] {
            rows.push(json!({
                "policy": label, "decide_p50_us": f.p50_us, "decide_p99_us": f.p99_us, "live_p50_us": f.live_p50_us, "live_p99_us": f.live_p99_us, "queue": DEPTH,
                "compile_ms": f.compile_ms, "cached_load_ms": f.cached_ms, "instantiate_ms": f.instantiate_ms,
                "mb_per_instance": f.per_instance_mb, "mb_60_instances": f.sixty_mb, "component_mb": f.size_mb,
            }));
        }
    }
    println!("{}", json!({ "bench": "python", "rows": rows }));
}

//! `decide` through Wasm vs the same policy called natively.
//!
//! For the `jellyfish` and `fixed` components (`target/policies/*.wasm`, built by
//! `cargo xtask policies`) and queue depths 1, 8 and 32, times every call
//! individually through [`PolicyInstance::decide`] (view conversion, guest call,
//! decision conversion: what a worker pays) and through the policy crate's native
//! type via [`sluice_sdk::Policy`] (the baseline), and prints ns per call p50/p99,
//! a bulk mean (one timer around the whole loop, no per-call timer cost) and the
//! ratio wasm/native. Goal: jellyfish p99 <= 5 µs at depth 32.
//!
//! Run: `cargo bench -p sluice-core --bench decide`. Prints a table, then one JSON line.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use common::{component, config, SLO_US};
use serde_json::json;
use sluice_core::runtime::{Binding, Limits, PolicyEngine, PolicyInstance};
use sluice_sdk::{Decision, Pending, Policy, View};

/// Timed calls per (policy, depth, path), after the warm-up.
const CALLS: usize = 50_000;
/// Untimed calls first (JIT-free, but caches, allocator and branch predictors).
const WARMUP: usize = 5_000;
const DEPTHS: [usize; 3] = [1, 8, 32];
/// Goal: jellyfish through Wasm at depth 32, p99.
const GOAL_P99_NS: u64 = 5_000;
/// Distinct load estimates cycled through the views: the host's estimate moves with
/// every arrival, so jellyfish's per-load cache misses on each call (the model
/// choice itself stays the same, so nothing is logged).
const LOADS: usize = 16;

/// A view of `depth` requests that arrived 500 µs apart (the oldest first, so
/// deadlines increase), all four models loaded, load estimate `load`.
fn view(depth: usize, load: f64) -> View {
    let now = 10_000_000;
    let queue = (0..depth as u64)
        .map(|i| {
            let arrival = now - (depth as u64 - i) * 500;
            Pending { id: 1_000 + i, arrival, deadline: arrival + SLO_US }
        })
        .collect();
    View { now, worker: 0, workers: 4, load_qps: load, loaded: vec![0, 1, 2, 3], queue }
}

fn views(depth: usize) -> Vec<View> {
    (0..LOADS).map(|k| view(depth, 400.0 + 2.0 * k as f64)).collect()
}

#[derive(Clone, Copy)]
struct Stats {
    p50: u64,
    p99: u64,
    max: u64,
    /// Bulk mean: total time of `CALLS` back-to-back calls / `CALLS`.
    mean: f64,
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Times `call` individually `CALLS` times and then in bulk, after a warm-up.
fn measure(views: &[View], mut call: impl FnMut(&View) -> Decision) -> Stats {
    for i in 0..WARMUP {
        black_box(call(&views[i % views.len()]));
    }
    let mut ns = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let v = &views[i % views.len()];
        let t = Instant::now();
        let d = call(v);
        ns.push(t.elapsed().as_nanos() as u64);
        black_box(d);
    }
    let t = Instant::now();
    for i in 0..CALLS {
        black_box(call(&views[i % views.len()]));
    }
    let mean = t.elapsed().as_nanos() as f64 / CALLS as f64;
    ns.sort_unstable();
    Stats { p50: percentile(&ns, 0.5), p99: percentile(&ns, 0.99), max: *ns.last().unwrap_or(&0), mean }
}

/// The cost of the per-call timer itself (two `Instant::now()`), p50.
fn timer_overhead_ns() -> u64 {
    let mut ns: Vec<u64> = (0..CALLS)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    ns.sort_unstable();
    percentile(&ns, 0.5)
}

struct Row {
    policy: &'static str,
    depth: usize,
    wasm: Stats,
    native: Stats,
    agree: bool,
}

fn bench_policy<P: Policy>(engine: &Arc<PolicyEngine>, name: &'static str, params: &str, rows: &mut Vec<Row>) {
    let compiled = engine.compile(name, &component(name)).expect("compile");
    let mut instance =
        PolicyInstance::new(engine, &Binding::new(compiled.clone(), config(params), Limits::default()), 0)
            .expect("init");
    let mut native = P::init(config(params)).expect("native init");
    for depth in DEPTHS {
        let views = views(depth);
        let agree = views.iter().all(|v| instance.decide(v).ok() == Some(native.decide(v)));
        let wasm = measure(&views, |v| instance.decide(v).expect("wasm decide"));
        let nat = measure(&views, |v| native.decide(v));
        rows.push(Row { policy: name, depth, wasm, native: nat, agree });
    }
}

fn us(ns: f64) -> String {
    format!("{:.2}", ns / 1e3)
}

fn main() {
    let engine = PolicyEngine::new().expect("engine");
    let timer = timer_overhead_ns();
    let mut rows = Vec::new();
    bench_policy::<policy_jellyfish::Jellyfish>(&engine, "jellyfish", "{}", &mut rows);
    bench_policy::<policy_fixed::Fixed>(&engine, "fixed", r#"{"model": "resnet50"}"#, &mut rows);

    println!("decide: Wasm component (PolicyInstance::decide) vs native (sluice_sdk::Policy), µs per call");
    println!("{CALLS} timed calls per cell after {WARMUP} warm-up calls; per-call timer cost ≈ {timer} ns (included)");
    println!(
        "{:<10} {:>5} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>7} {:>7} {:>7} | {:>5}",
        "policy",
        "depth",
        "wasm p50",
        "p99",
        "max",
        "mean",
        "nat p50",
        "p99",
        "mean",
        "x p50",
        "x p99",
        "x mean",
        "same"
    );
    for r in &rows {
        println!(
            "{:<10} {:>5} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>7.1} {:>7.1} {:>7.1} | {:>5}",
            r.policy,
            r.depth,
            us(r.wasm.p50 as f64),
            us(r.wasm.p99 as f64),
            us(r.wasm.max as f64),
            us(r.wasm.mean),
            us(r.native.p50 as f64),
            us(r.native.p99 as f64),
            us(r.native.mean),
            r.wasm.p50 as f64 / r.native.p50.max(1) as f64,
            r.wasm.p99 as f64 / r.native.p99.max(1) as f64,
            r.wasm.mean / r.native.mean.max(1.0),
            if r.agree { "yes" } else { "NO" }
        );
    }
    let goal = rows.iter().find(|r| r.policy == "jellyfish" && r.depth == 32).map(|r| r.wasm.p99);
    if let Some(p99) = goal {
        println!(
            "goal: jellyfish via Wasm at depth 32, p99 <= {} µs: p99 = {} µs -> {}",
            GOAL_P99_NS / 1000,
            us(p99 as f64),
            if p99 <= GOAL_P99_NS { "MET" } else { "NOT MET" }
        );
    }
    let cells: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "policy": r.policy,
                "depth": r.depth,
                "wasm_ns": { "p50": r.wasm.p50, "p99": r.wasm.p99, "max": r.wasm.max, "mean": r.wasm.mean },
                "native_ns": { "p50": r.native.p50, "p99": r.native.p99, "max": r.native.max, "mean": r.native.mean },
                "ratio_p50": r.wasm.p50 as f64 / r.native.p50.max(1) as f64,
                "ratio_p99": r.wasm.p99 as f64 / r.native.p99.max(1) as f64,
                "ratio_mean": r.wasm.mean / r.native.mean.max(1.0),
                "decisions_agree": r.agree,
            })
        })
        .collect();
    let line = json!({
        "bench": "decide",
        "calls": CALLS,
        "timer_overhead_ns": timer,
        "goal_p99_ns": GOAL_P99_NS,
        "goal_met": goal.map(|p| p <= GOAL_P99_NS),
        "rows": cells,
    });
    println!("{line}");
}

//! RAMSIS policy-generation benchmark (see BENCHMARKS.md, "RAMSIS").
//!
//! Cases:
//! 1. the fidelity case of issue 3 (9 Pareto image models, SLO 150 ms,
//!    K = 60, λ = 2000 QPS, FLD D = 100, N_w = 32, maximal batching), single-
//!    threaded and on 2 threads, split into block construction, value
//!    iteration and power iteration, against the reference Python's ~65 s;
//! 2. the same with MD, with variable batching, and with 1,000 power
//!    iterations (the artifact's fixed count);
//! 3. §7.3.2's scale: 60 synthetic models interpolated on the Pareto front
//!    in 0.5% accuracy steps, FLD D = 100, SLO 400 ms (so the fastest model's
//!    largest batch within the SLO is B_w = 29), K = 100, λ = 4000 QPS, against
//!    the paper's 1355 s;
//! 4. the component's `decide` (a table lookup), natively and through Wasm
//!    (`target/policies/ramsis.wasm`, built by `cargo xtask policies`): `init`
//!    time, `decide` p50/p99 serving from a ready policy, and `decide` p50/p99
//!    while a new policy is generated in the background, slice by slice.
//!
//! First, the headline of issue 36 (part 3): the fidelity case against the
//! frozen pre-issue-36 generator (`mdp::reference`) in the same run, with the
//! ratio and the value iteration's flop/s.
//!
//! Prints a report, then one JSON line with everything.
//!
//! Run: `cargo bench -p sluice-core --bench ramsis` (add `-- quick` for one repetition,
//! `-- decide` for the component part only, `-- fidelity` for the headline only).

use std::path::Path;
use std::time::{Duration, Instant};

use policy_ramsis::mdp::{self, Batching, Discretization, Generator, ModelSpec, Problem};
use policy_ramsis::{latency, Ramsis};
use sluice_core::runtime::{Binding, Limits, PolicyEngine, PolicyInstance};
use sluice_sdk::{Config, Decision, Model, Pending, Policy, View};

const TABLE: &str = include_str!("../../../policies/ramsis/tests/data/ramsis_effective_latency_p95_us.csv");

/// The reference Python implementation on the fidelity case (issue 3: one
/// core of this machine kind).
const REFERENCE_FIDELITY_S: f64 = 65.0;
/// The paper's Table 2: |M_w| = 60, FLD D = 100, maximal batching, B_w = 29.
const PAPER_SCALE_S: f64 = 1355.09;

fn image_models() -> Vec<ModelSpec> {
    let mut models: Vec<ModelSpec> = Vec::new();
    for line in TABLE.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[0] != "image" {
            continue;
        }
        let index: usize = f[1].parse().expect("index");
        if models.len() < index {
            models.push(ModelSpec { name: f[2].into(), accuracy: f[3].parse().expect("acc"), latency_us: Vec::new() });
        }
        models[index - 1].latency_us.push(f[5].parse().expect("latency"));
    }
    models
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

struct Phases {
    build: Duration,
    values: Duration,
    power: Duration,
    memory: usize,
    nnz: usize,
    work: u64,
    solution: mdp::Solution,
}

/// Times one generation phase by phase. A macro, not a generic function: the
/// live generator and the frozen reference (`mdp::reference`) share no trait.
macro_rules! timed_phases {
    ($generator:expr) => {{
        let mut g = $generator;
        let t = Instant::now();
        g.build_transitions();
        let build = t.elapsed();
        let t = Instant::now();
        g.solve_values();
        let values = t.elapsed();
        let t = Instant::now();
        g.run();
        let power = t.elapsed();
        Phases {
            build,
            values,
            power,
            memory: g.memory_bytes(),
            nnz: g.block_stats().1,
            work: g.work(),
            solution: g.solution().expect("done"),
        }
    }};
}

fn phases(problem: &Problem) -> Phases {
    timed_phases!(Generator::new(problem).expect("problem"))
}

fn reference_phases(problem: &Problem) -> Phases {
    timed_phases!(mdp::reference::Generator::new(problem).expect("problem"))
}

/// Today's generator against the frozen pre-issue-36 one (`mdp::reference`),
/// interleaved run by run so that both see the same machine load: medians,
/// their ratio, and the value iteration's rate in flop/s (2 per multiply–add
/// of [`Generator::sweep_madds`], counted analytically: one per stored block
/// probability plus one per phase weight of every state–action pair).
fn against_reference(label: &str, problem: &Problem, reps: usize) -> serde_json::Value {
    let mut new = Vec::new();
    let mut old = Vec::new();
    for _ in 0..reps {
        old.push(reference_phases(problem));
        new.push(phases(problem));
    }
    assert_eq!(new[0].solution, old[0].solution, "the reference and today's generator must agree bit for bit");
    let total = |runs: &[Phases]| median(runs.iter().map(|p| p.build + p.values + p.power).collect()).as_secs_f64();
    let part = |runs: &[Phases], f: fn(&Phases) -> Duration| median(runs.iter().map(f).collect()).as_secs_f64();
    let mut g = Generator::new(problem).expect("problem");
    g.build_transitions();
    let madds = g.sweep_madds() as f64;
    let sweeps = f64::from(new[0].solution.sweeps + 1);
    let (t_new, t_old) = (total(&new), total(&old));
    let (vi_new, vi_old) = (part(&new, |p| p.values), part(&old, |p| p.values));
    let gflops = |secs: f64| 2.0 * madds * sweeps / secs / 1e9;
    println!("{label}: today vs the reference (mdp::reference), same run, medians of {reps}");
    for (name, runs, t, vi) in [("today    ", &new, t_new, vi_new), ("reference", &old, t_old, vi_old)] {
        println!(
            "  {name} {t:.4} s = build {:.4} s + value iteration {vi:.4} s ({:.1} µs/sweep, {:.2} Gflop/s) + power {:.4} s",
            part(runs, |p| p.build),
            vi * 1e6 / sweeps,
            gflops(vi),
            part(runs, |p| p.power),
        );
    }
    println!(
        "  one sweep = {:.0} multiply-adds; speed-up {:.2}x overall, {:.2}x value iteration; identical policy and expectations",
        madds,
        t_old / t_new,
        vi_old / vi_new
    );
    serde_json::json!({
        "case": label,
        "seconds": t_new,
        "reference_seconds": t_old,
        "ratio": t_old / t_new,
        "build_seconds": part(&new, |p| p.build),
        "value_iteration_seconds": vi_new,
        "power_seconds": part(&new, |p| p.power),
        "reference_build_seconds": part(&old, |p| p.build),
        "reference_value_iteration_seconds": vi_old,
        "reference_power_seconds": part(&old, |p| p.power),
        "sweep_madds": madds,
        "value_iteration_gflops": gflops(vi_new),
        "reference_value_iteration_gflops": gflops(vi_old),
    })
}

fn case(label: &str, problem: &Problem, reps: usize, baseline_s: Option<f64>) -> serde_json::Value {
    let runs: Vec<Phases> = (0..reps).map(|_| phases(problem)).collect();
    let total = median(runs.iter().map(|p| p.build + p.values + p.power).collect());
    let build = median(runs.iter().map(|p| p.build).collect());
    let values = median(runs.iter().map(|p| p.values).collect());
    let power = median(runs.iter().map(|p| p.power).collect());
    let two: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            let s = mdp::generate_with_threads(problem, 2).expect("problem");
            assert_eq!(s, runs[0].solution, "2 threads must give the same policy");
            t.elapsed()
        })
        .collect();
    let two = median(two);
    let s = &runs[0].solution;
    let sweeps = f64::from(s.sweeps + 1);
    println!("{label}");
    println!(
        "  states {}  state-action pairs {}  stored transition values {}  memory {:.1} MiB",
        s.states,
        s.actions,
        runs[0].nnz,
        runs[0].memory as f64 / (1 << 20) as f64
    );
    println!(
        "  E[acc] {:.5}  E[viol] {:.5}  power iterations {}  work units {:.2e} ({:.2} ns/unit)",
        s.expected_accuracy,
        s.expected_violation,
        s.power_iterations,
        runs[0].work as f64,
        total.as_secs_f64() * 1e9 / runs[0].work as f64
    );
    println!(
        "  1 thread: {:.3} s = build {:.3} s + {} sweeps {:.3} s ({:.2} ms/sweep) + power {:.3} s ({:.3} ms/iteration)",
        total.as_secs_f64(),
        build.as_secs_f64(),
        s.sweeps + 1,
        values.as_secs_f64(),
        values.as_secs_f64() * 1e3 / sweeps,
        power.as_secs_f64(),
        power.as_secs_f64() * 1e3 / f64::from(s.power_iterations.max(1))
    );
    println!("  2 threads: {:.3} s (speed-up {:.2}x)", two.as_secs_f64(), total.as_secs_f64() / two.as_secs_f64());
    if let Some(base) = baseline_s {
        println!(
            "  vs reference {base:.0} s: {:.0}x faster (1 thread), {:.0}x (2 threads)",
            base / total.as_secs_f64(),
            base / two.as_secs_f64()
        );
    }
    serde_json::json!({
        "case": label.trim_start_matches(['…', ' ']),
        "states": s.states,
        "actions": s.actions,
        "stored_values": runs[0].nnz,
        "memory_bytes": runs[0].memory,
        "expected_accuracy": s.expected_accuracy,
        "expected_violation": s.expected_violation,
        "seconds_1_thread": total.as_secs_f64(),
        "seconds_2_threads": two.as_secs_f64(),
        "ms_per_sweep": values.as_secs_f64() * 1e3 / sweeps,
        "baseline_seconds": baseline_s,
    })
}

fn bench_config(params: &str) -> Config {
    let models: Vec<Model> = image_models()
        .into_iter()
        .enumerate()
        .map(|(i, m)| Model {
            id: i as u32,
            name: m.name,
            accuracy: m.accuracy,
            latency: m.latency_us.iter().map(|&l| l.round() as u64).collect(),
        })
        .collect();
    Config { app: "bench".into(), slo: 150_000, workers: 60, worker: 0, models, params: params.into() }
}

/// Random views: queue 1..12, head slack uniform in [0, SLO).
fn random_views(count: usize, load_qps: f64) -> Vec<View> {
    let mut seed = 1u64;
    (0..count)
        .map(|i| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = 1 + (seed >> 33) as usize % 12;
            let slack = (seed >> 13) % 150_000;
            let now = 1_000_000 + i as u64;
            let queue: Vec<Pending> = (0..n)
                .map(|k| Pending { id: k as u64, arrival: now - (150_000 - slack), deadline: now + slack + k as u64 })
                .collect();
            View { now, worker: 0, workers: 60, load_qps, loaded: (0..9).collect(), queue }
        })
        .collect()
}

fn percentiles(mut samples: Vec<Duration>) -> (u128, u128, u128) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_nanos();
    (pct(0.5), pct(0.99), pct(1.0))
}

fn time_calls(views: &[View], mut call: impl FnMut(&View) -> Decision) -> (u128, u128, u128) {
    let samples = views
        .iter()
        .map(|v| {
            let t = Instant::now();
            let d = call(v);
            let e = t.elapsed();
            std::hint::black_box(d);
            e
        })
        .collect();
    percentiles(samples)
}

fn decide_bench(reps: usize) -> serde_json::Value {
    let config = bench_config(r#"{"load_qps": 2000, "slice_work": 0}"#);
    let t = Instant::now();
    let mut policy = Ramsis::init(config.clone()).expect("init");
    let init = t.elapsed();
    let views = random_views(reps, 2000.0);
    let (p50, p99, max) = time_calls(&views, |v| policy.decide(v));
    println!("component, native: init {:.3} s (one policy at 2000 QPS)", init.as_secs_f64());
    println!("  decide: p50 {p50} ns  p99 {p99} ns  max {max} ns over {reps} views (queue 1..12)");
    let mut out = serde_json::json!({
        "native": {"init_seconds": init.as_secs_f64(), "decide_p50_ns": p50, "decide_p99_ns": p99},
    });

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/policies/ramsis.wasm");
    let Ok(bytes) = std::fs::read(&path) else {
        println!("component, Wasm: skipped ({} missing: run `cargo xtask policies`)", path.display());
        return out;
    };
    let engine = PolicyEngine::new().expect("engine");
    let compiled = engine.compile("ramsis", &bytes).expect("compile");
    let t = Instant::now();
    let mut instance =
        PolicyInstance::new(&engine, &Binding::new(compiled.clone(), config, Limits::default()), 0).expect("init");
    let init = t.elapsed();
    let (p50, p99, max) = time_calls(&views, |v| instance.decide(v).expect("decide"));
    println!("component, Wasm: init {:.3} s (one policy at 2000 QPS)", init.as_secs_f64());
    println!("  decide: p50 {p50} ns  p99 {p99} ns  max {max} ns");
    out["wasm"] = serde_json::json!({"init_seconds": init.as_secs_f64(), "decide_p50_ns": p50, "decide_p99_ns": p99});
    // Load above the grid: the policy serves with its 2000 QPS policy and
    // generates one for 2500 · 1.05 QPS (rounded up to the 1% grid: ~2631) a
    // slice per call.
    let config = bench_config(r#"{"grid": [2000]}"#);
    let mut instance =
        PolicyInstance::new(&engine, &Binding::new(compiled.clone(), config, Limits::default()), 0).expect("init");
    let busy = random_views(reps, 2500.0);
    let mut calls = 0usize;
    let mut samples = Vec::new();
    let mut generated = None;
    let t = Instant::now();
    loop {
        // Host time advances 10 ms per decision: the policy waits for the
        // estimate to be stable for 1 s before it starts generating.
        let mut v = busy[calls % busy.len()].clone();
        let now = 1_000_000 + calls as u64 * 10_000;
        for p in &mut v.queue {
            p.arrival = p.arrival - v.now + now;
            p.deadline = p.deadline - v.now + now;
        }
        v.now = now;
        let s = Instant::now();
        std::hint::black_box(instance.decide(&v).expect("decide"));
        samples.push(s.elapsed());
        calls += 1;
        if calls.is_multiple_of(64) {
            let status: serde_json::Value =
                serde_json::from_str(&instance.status().expect("status").unwrap_or_default()).unwrap_or_default();
            let grid: Vec<f64> = status["grid_qps"]
                .as_array()
                .map(|g| g.iter().filter_map(|x| x.as_f64()).collect())
                .unwrap_or_default();
            if status["generating_qps"].is_null() && grid.iter().any(|&l| l > 2500.0) {
                generated = grid.iter().copied().find(|&l| l > 2500.0);
                break;
            }
        }
        if calls > 2_000_000 {
            println!("  background generation did not finish");
            break;
        }
    }
    let wall = t.elapsed();
    let (p50, p99, max) = percentiles(samples);
    println!(
        "  while generating a policy for {:.0} QPS in the background: {calls} decides over {:.2} s; decide p50 {p50} ns  p99 {p99} ns  max {max} ns",
        generated.unwrap_or(f64::NAN),
        wall.as_secs_f64()
    );
    out["wasm_generating"] =
        serde_json::json!({"decides": calls, "decide_p50_ns": p50, "decide_p99_ns": p99, "decide_max_ns": max});
    out
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let reps = if quick { 1 } else { 5 };
    if std::env::args().any(|a| a == "decide") {
        let component = decide_bench(if quick { 20_000 } else { 200_000 });
        println!("{}", serde_json::json!({ "component": component }));
        return;
    }
    let models = image_models();
    let fidelity = Problem::new(models.clone(), 150_000.0, 60, 2000.0);
    let headline = against_reference(
        "fidelity case (9 models, FLD 100, maximal, K=60, 2000 QPS)",
        &fidelity,
        if quick { 3 } else { 11 },
    );
    if std::env::args().any(|a| a == "fidelity") {
        println!("{}", serde_json::json!({ "fidelity_vs_reference": headline }));
        return;
    }
    let mut cases = Vec::new();
    cases.push(case(
        "fidelity case (9 models, FLD 100, maximal, K=60, 2000 QPS)",
        &fidelity,
        reps,
        Some(REFERENCE_FIDELITY_S),
    ));
    let mut md = fidelity.clone();
    md.discretization = Discretization::Md;
    cases.push(case("  … model-based discretization (MD)", &md, reps, None));
    let mut variable = fidelity.clone();
    variable.batching = Batching::Variable;
    cases.push(case("  … variable batching", &variable, reps.min(3), None));
    let mut full_power = fidelity.clone();
    full_power.stationary_tolerance = 0.0;
    cases.push(case("  … all 1,000 power iterations (artifact)", &full_power, reps.min(3), Some(REFERENCE_FIDELITY_S)));
    let pairs: Vec<(f64, Vec<f64>)> = models.iter().map(|m| (m.accuracy, m.latency_us.clone())).collect();
    let synthetic: Vec<ModelSpec> = latency::interpolate_front(&pairs, 0.005)
        .into_iter()
        .enumerate()
        .map(|(i, (accuracy, latency_us))| ModelSpec { name: format!("synthetic{i}"), accuracy, latency_us })
        .collect();
    let scale = Problem::new(synthetic.clone(), 400_000.0, 100, 4000.0);
    let b_w = (1..=32).filter(|&b| synthetic[0].latency_us[b - 1] <= 400_000.0).max().unwrap_or(0);
    cases.push(case(
        &format!("§7.3.2 scale ({} synthetic models, FLD 100, maximal, B_w={b_w}, K=100, 4000 QPS)", synthetic.len()),
        &scale,
        reps.min(3),
        Some(PAPER_SCALE_S),
    ));
    let component = decide_bench(if quick { 20_000 } else { 200_000 });
    println!(
        "{}",
        serde_json::json!({ "fidelity_vs_reference": headline, "generation": cases, "component": component })
    );
}

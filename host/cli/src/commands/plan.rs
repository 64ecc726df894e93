//! `sluice plan`: capacity planning — the fewest workers that meet an accuracy and
//! an SLO-violation target at a load, and the accuracy–workers curve
//! (docs/capacity-planning.md).
//!
//! ```text
//! sluice plan --profile profiles/ramsis-image-cpu.toml --slo 150ms --load 2000 \
//!     --accuracy 0.75 --violation 0.005 [--policy ramsis|jellyfish|model-switching|<name>|<file.wasm>]
//!     [--compare jellyfish,model-switching] [--svg plan.svg] [--json] [--verify]
//! ```
//!
//! RAMSIS is planned from its MDP's expectations (RAMSIS §5.1: no simulation);
//! every other policy by simulation at a constant Poisson load. The search itself
//! (bracketing, bisection, the neighbour check, the bounds) is
//! `sluice_sim::plan::search`; this file builds the evaluators and prints.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use policy_ramsis::mdp::{self, Discretization, ModelSpec, Problem, Space};
use serde_json::{json, Value};
use sluice_core::profile::{Percentile, Profile};
use sluice_sim::model_switching::{self, BuildArgs, Setup};
use sluice_sim::plan::{self, CapacityPlan, EvaluationCache, PlanError, Point, SearchOptions, SimPoint, Targets};
use sluice_sim::report::{line_chart, Series};

use super::ramsis::{models_from_profile, parse_duration_us};

/// `sluice plan …`
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model profile (TOML).
    #[arg(long)]
    pub profile: PathBuf,
    /// Models of the profile to serve with (comma-separated). Default: the
    /// profile's accuracy–latency Pareto front (RAMSIS §4.3.3), the models the
    /// RAMSIS experiments use; the other models are never chosen by RAMSIS anyway.
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// Latency SLO (`150ms`, `0.15s`, `150000us`; a bare number is ms), at most an hour.
    #[arg(long, value_parser = slo_us)]
    pub slo: f64,
    /// Load to plan for, requests per second (constant, Poisson arrivals): (0, 1e6].
    #[arg(long, value_parser = |t: &str| number_in(t, 0.0, true, MAX_LOAD_QPS))]
    pub load: f64,
    /// The least accuracy (mean over the requests served on time): [0, 1].
    #[arg(long, value_parser = |t: &str| number_in(t, 0.0, false, 1.0))]
    pub accuracy: f64,
    /// The largest SLO-violation rate (fraction of requests late or dropped): [0, 1].
    #[arg(long, value_parser = |t: &str| number_in(t, 0.0, false, 1.0))]
    pub violation: f64,
    /// `ramsis` (planned from its MDP), `model-switching` (its table built by
    /// simulation per worker count, then simulated), or any other built-in or
    /// `.wasm` policy (simulated as is, with `--params`).
    #[arg(long, default_value = "ramsis")]
    pub policy: String,
    /// Plan these policies too (comma-separated) and put them beside the first in
    /// the table, the JSON (`compare`) and the plot.
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Params of a simulated `--policy` (a JSON object).
    #[arg(long)]
    pub params: Option<String>,
    /// Which percentile of the profile the policies plan with.
    #[arg(long, default_value = "p95")]
    pub percentile: Percentile,
    /// Largest batch (RAMSIS: N_w, the largest modelled queue): 1 to 4096.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH))]
    pub max_batch: u32,
    /// RAMSIS: `fld:<D>` (D from 1 to 10000) or `md` (see `sluice ramsis gen`).
    #[arg(long, default_value = "fld:100", value_parser = discretization)]
    pub discretization: Discretization,
    /// The most workers a plan may use: 1 to 4096.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=MAX_WORKERS))]
    pub max_workers: u32,
    /// Worker counts evaluated at once (default: the machine's cores, at most 4): 1 to 64.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS))]
    pub threads: Option<u16>,
    /// Simulated seconds per worker count (simulated policies and `--verify`): (0, 86400].
    #[arg(long, default_value_t = 30.0, value_parser = |t: &str| number_in(t, 0.0, true, MAX_DURATION_S))]
    pub duration: f64,
    /// Seed of the simulated arrivals: 0 to 2^63 − 1 (a TOML integer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=i64::MAX as u64))]
    pub seed: u64,
    /// Where the built-in policy components are.
    #[arg(long, default_value = "target/policies")]
    pub policies: PathBuf,
    /// Points on the accuracy–workers curve (0: no curve): 0 to 256.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(0..=MAX_CURVE_POINTS))]
    pub curve_points: u16,
    /// Write the accuracy–workers curve as an SVG plot here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also simulate the answer (RAMSIS: the component at the planned workers), to
    /// check the expectations against the simulator.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

// The ranges of the numeric flags (docs/capacity-planning.md, "Ranges"), checked as
// the flags are parsed: a value outside is a one-line error naming the flag, never a
// run that exhausts the machine (`--max-batch 4000000000` filled a 32 GB latency
// table per model).

/// `--max-batch`: the RAMSIS generator's largest queue (its own bound).
const MAX_BATCH: i64 = 4096;
/// `--max-workers`: an app's most workers.
const MAX_WORKERS: i64 = 4096;
/// `--threads`: evaluations at once, each with its own MDP or simulation in memory.
const MAX_THREADS: i64 = 64;
/// `--curve-points`: evaluations on the curve.
const MAX_CURVE_POINTS: i64 = 256;
/// `--load`, requests/s.
const MAX_LOAD_QPS: f64 = 1e6;
/// `--duration`, simulated seconds: a day.
const MAX_DURATION_S: f64 = 86_400.0;
/// `--slo`, µs: an hour.
const MAX_SLO_US: f64 = 3.6e9;
/// `--discretization fld:<D>`: the most slack levels.
const MAX_LEVELS: u32 = 10_000;

/// Requests simulated at once (`--load` × `--duration` × `--threads`): a simulation
/// holds every arrival of its run, about 60 bytes a request with both policies'
/// results, so 20 million is about 1.2 GB. `sluice policy bench` has the same cap
/// per scenario.
pub(crate) const MAX_SIMULATED_REQUESTS: f64 = 20e6;

/// RAMSIS states in memory at once (per evaluation × `--threads`): about 1.3 KB a
/// state, so 2²¹ states is about 2.7 GB.
const MAX_STATES: f64 = (1u64 << 21) as f64;

/// A finite number from `min` (`open`: above it) to `max`, for a flag's value parser:
/// clap names the flag and the value in the error.
pub(crate) fn number_in(text: &str, min: f64, open: bool, max: f64) -> std::result::Result<f64, String> {
    let v: f64 = text.trim().parse().map_err(|_| format!("`{text}` is not a number"))?;
    let above = if open { v > min } else { v >= min };
    if !(v.is_finite() && above && v <= max) {
        return Err(format!("expected a number in {}{min}, {max}]", if open { "(" } else { "[" }));
    }
    Ok(v)
}

/// `--slo`: a positive duration of at most an hour, µs.
fn slo_us(text: &str) -> std::result::Result<f64, String> {
    let us = parse_duration_us(text)?;
    if us > MAX_SLO_US {
        return Err(format!("`{text}`: expected at most an hour"));
    }
    Ok(us)
}

/// `--discretization`: `md`, or `fld:<D>` with D at most 10000.
fn discretization(text: &str) -> std::result::Result<Discretization, String> {
    let d: Discretization = text.parse()?;
    if let Discretization::Fld(levels) = d {
        if levels > MAX_LEVELS {
            return Err(format!("`{text}`: expected D from 1 to {MAX_LEVELS}"));
        }
    }
    Ok(d)
}

/// One policy's plan and curve.
struct Planned {
    policy: String,
    method: &'static str,
    plan: CapacityPlan,
    curve: Vec<Point>,
    lower_bound: u32,
    evaluations: usize,
    seconds: f64,
    verify: Option<Point>,
}

/// What every policy is planned over.
struct Setting {
    profile: Profile,
    /// The chosen models' names, in the profile's order.
    models: Vec<String>,
    /// The RAMSIS generator's models (filled tables), same order.
    specs: Vec<ModelSpec>,
    targets: Targets,
    threads: usize,
}

/// Runs `sluice plan`.
pub fn run(args: PlanArgs) -> Result<()> {
    let setting = setting(&args)?;
    let mut planned = Vec::new();
    for policy in std::iter::once(&args.policy).chain(&args.compare) {
        planned.push(plan_policy(&args, &setting, policy)?);
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&args, &planned)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let mut out = report(&planned[0]);
        out["targets"] = json!(setting.targets);
        out["load_qps"] = json!(args.load);
        out["slo_ms"] = json!(args.slo / 1e3);
        out["models"] = json!(setting.models);
        if planned.len() > 1 {
            out["compare"] = Value::Array(planned[1..].iter().map(report).collect());
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_text(&args, &setting, &planned);
    }
    Ok(())
}

fn setting(args: &PlanArgs) -> Result<Setting> {
    let profile = Profile::load(&args.profile)?;
    let all = models_from_profile(&profile, args.percentile, args.max_batch);
    let chosen: Vec<ModelSpec> = if args.models.is_empty() {
        // The Pareto front, as the RAMSIS generator prunes it.
        let problem = Problem::new(all.clone(), args.slo, 1, args.load);
        let space = Space::new(&problem).map_err(|e| anyhow::anyhow!("{}: {e}", args.profile.display()))?;
        let mut keep = space.models.clone();
        keep.sort_unstable();
        keep.into_iter().map(|i| all[i].clone()).collect()
    } else {
        args.models
            .iter()
            .map(|name| {
                all.iter().find(|m| &m.name == name).cloned().with_context(|| {
                    let known: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
                    format!("model `{name}` is not in {} (it has: {})", args.profile.display(), known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    let targets = Targets { accuracy: args.accuracy, violation: args.violation };
    // A target above the most accurate model cannot be met by any number of workers.
    let best = chosen.iter().max_by(|a, b| a.accuracy.total_cmp(&b.accuracy)).context("no models")?;
    if args.accuracy > best.accuracy {
        bail!(
            "targets unreachable: accuracy {} is above the most accurate model's ({} at {:.4}); the best achievable \
             with any number of workers is {:.4}",
            args.accuracy,
            best.name,
            best.accuracy,
            best.accuracy
        );
    }
    let threads = args
        .threads
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(4), usize::from)
        .max(1);
    check_memory(args, chosen.len(), threads)?;
    Ok(Setting { models: chosen.iter().map(|m| m.name.clone()).collect(), specs: chosen, profile, targets, threads })
}

/// Refuses flags whose evaluations at once would not fit in memory: the RAMSIS
/// states of `--max-batch` and `--discretization` (per evaluation, × `--threads`),
/// and the requests a simulated policy offers (`--load` × `--duration` × `--threads`).
fn check_memory(args: &PlanArgs, models: usize, threads: usize) -> Result<()> {
    let policies = || std::iter::once(&args.policy).chain(&args.compare);
    let n = args.max_batch as f64;
    if policies().any(|p| is_ramsis(p)) {
        // J slack levels: D + 1 (FLD), or at most every latency ≤ SLO plus 0 and SLO (MD).
        let levels = match args.discretization {
            Discretization::Fld(d) => d as f64 + 1.0,
            Discretization::Md => models as f64 * n + 2.0,
        };
        let states = (n + 1.0) * levels + 1.0;
        if states * threads as f64 > MAX_STATES {
            bail!(
                "--max-batch {} and --discretization {} give {states:.0} RAMSIS states per evaluation, {threads}                  evaluation(s) at once (--threads): more than {MAX_STATES:.0} (about 3 GB); lower one of them",
                args.max_batch,
                discretization_name(args.discretization)
            );
        }
    }
    if args.verify || policies().any(|p| !is_ramsis(p)) {
        let requests = args.load * args.duration * threads as f64;
        if requests > MAX_SIMULATED_REQUESTS {
            bail!(
                "--load {} × --duration {} × {threads} evaluation(s) at once (--threads) simulate {requests:.0}                  requests at once: more than {MAX_SIMULATED_REQUESTS:.0} (about 1.2 GB); lower one of them",
                args.load,
                args.duration
            );
        }
    }
    Ok(())
}

fn discretization_name(d: Discretization) -> String {
    match d {
        Discretization::Fld(levels) => format!("fld:{levels}"),
        Discretization::Md => "md".into(),
    }
}

/// The policy names `plan` knows without a component: RAMSIS (its MDP).
fn is_ramsis(policy: &str) -> bool {
    policy.eq_ignore_ascii_case("ramsis")
}

fn plan_policy(args: &PlanArgs, s: &Setting, policy: &str) -> Result<Planned> {
    let started = Instant::now();
    let tables: Vec<Vec<f64>> = s.specs.iter().map(|m| m.latency_us.clone()).collect();
    let lower_bound = plan::capacity_lower_bound(&tables, args.slo, args.load, args.violation).min(args.max_workers);
    let opts = SearchOptions {
        min_workers: lower_bound,
        max_workers: args.max_workers,
        parallel: s.threads,
        ..SearchOptions::default()
    };
    let named = |e: PlanError| anyhow::anyhow!("policy {policy}: {e}");
    let (method, plan, curve, evaluations) = if is_ramsis(policy) {
        let eval = |k: u32| -> Result<Point, String> {
            let mut problem = Problem::new(s.specs.clone(), args.slo, k, args.load);
            problem.max_queue = args.max_batch;
            problem.discretization = args.discretization;
            let solution = mdp::generate(&problem).map_err(|e| e.to_string())?;
            Ok(Point { workers: k, accuracy: solution.expected_accuracy, violation: solution.expected_violation })
        };
        let evals = EvaluationCache::new(eval, s.threads);
        let plan = plan::search(&evals, s.targets, opts).map_err(named)?;
        let curve = curve(&evals, lower_bound, &plan, args).map_err(named)?;
        ("mdp", plan, curve, evals.count())
    } else {
        let sim = sim_point(args, s, policy)?;
        let ms = policy.eq_ignore_ascii_case("model-switching");
        let eval = |k: u32| -> Result<Point, String> {
            let result = if ms { model_switching_point(args, s, &sim, k) } else { sim.evaluate(k) };
            result.map_err(|e| format!("{e:#}"))
        };
        let evals = EvaluationCache::new(eval, s.threads);
        let plan = plan::search(&evals, s.targets, opts).map_err(named)?;
        let curve = curve(&evals, lower_bound, &plan, args).map_err(named)?;
        ("simulation", plan, curve, evals.count())
    };
    let verify = if args.verify {
        let mut sim = sim_point(args, s, policy)?;
        if is_ramsis(policy) {
            sim.params = Some(json!({ "load_qps": args.load }));
            Some(sim.evaluate(plan.workers)?)
        } else {
            Some(plan.point)
        }
    } else {
        None
    };
    Ok(Planned {
        policy: policy.to_string(),
        method,
        plan,
        curve,
        lower_bound,
        evaluations,
        seconds: started.elapsed().as_secs_f64(),
        verify,
    })
}

fn curve<F>(
    evals: &EvaluationCache<F>,
    from: u32,
    plan: &CapacityPlan,
    args: &PlanArgs,
) -> Result<Vec<Point>, PlanError>
where
    F: Fn(u32) -> Result<Point, String> + Sync,
{
    if args.curve_points == 0 {
        return Ok(Vec::new());
    }
    let workers = plan::curve_workers(from, plan.workers, args.max_workers, args.curve_points.into());
    evals.get(&workers)
}

/// A simulated policy's setting; the policy must exist (a clear error otherwise).
fn sim_point(args: &PlanArgs, s: &Setting, policy: &str) -> Result<SimPoint> {
    let component =
        if policy.ends_with(".wasm") { PathBuf::from(policy) } else { args.policies.join(format!("{policy}.wasm")) };
    if !component.is_file() {
        let mut known: Vec<String> = std::fs::read_dir(&args.policies)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".wasm")).map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        known.sort();
        bail!(
            "unknown policy `{policy}`: not `ramsis`, and no component {} (built-ins in {}: {}; `cargo xtask \
             policies` builds them, or give a .wasm path)",
            component.display(),
            args.policies.display(),
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        );
    }
    let params = match &args.params {
        Some(text) if !is_ramsis(policy) && policy == args.policy => {
            let v: Value = serde_json::from_str(text).context("--params is not JSON")?;
            if !v.is_object() {
                bail!("--params must be a JSON object, got {v}");
            }
            Some(v)
        }
        _ => None,
    };
    Ok(SimPoint {
        profile: args.profile.clone(),
        models: s.models.clone(),
        slo_ms: args.slo / 1e3,
        load_qps: args.load,
        duration_s: args.duration,
        seed: args.seed,
        max_batch: args.max_batch,
        builtin_dir: args.policies.clone(),
        policy: policy.to_string(),
        params,
    })
}

/// ModelSwitching at `k` workers: its table for the load, built by simulation as
/// `sluice model-switching build --setup sluice` does (the most accurate model
/// whose violation rate stays under 1%), then the component simulated with it.
fn model_switching_point(args: &PlanArgs, s: &Setting, sim: &SimPoint, k: u32) -> Result<Point> {
    let build = BuildArgs {
        profile: args.profile.clone(),
        models: s.models.clone(),
        slo_ms: args.slo / 1e3,
        workers: k,
        loads: vec![args.load],
        duration: args.duration,
        threshold: 0.01,
        max_batch: args.max_batch,
        seed: args.seed,
        policies: args.policies.clone(),
        out: None,
        compare: None,
        setup: Setup::Sluice,
    };
    let table = model_switching::build(&build)?;
    let mut sim = sim.clone();
    sim.params = Some(json!({ "table": table, "load_qps": args.load }));
    sim.evaluate(k)
}

fn report(p: &Planned) -> Value {
    json!({
        "policy": p.policy,
        "method": p.method,
        "workers": p.plan.workers,
        "expected_accuracy": p.plan.point.accuracy,
        "expected_violation": p.plan.point.violation,
        "lower_bound_workers": p.lower_bound,
        "evaluations": p.evaluations,
        "seconds": p.seconds,
        "non_monotone": p.plan.non_monotone,
        "curve": p.curve,
        "evaluated": p.plan.evaluated,
        "verify": p.verify.map(|v| json!({ "workers": v.workers, "simulated_accuracy": v.accuracy, "simulated_violation": v.violation })),
    })
}

fn print_text(args: &PlanArgs, s: &Setting, planned: &[Planned]) {
    println!(
        "capacity plan: {:.0} QPS, SLO {:.1} ms, accuracy ≥ {}, violation ≤ {} ({} models of {})",
        args.load,
        args.slo / 1e3,
        s.targets.accuracy,
        s.targets.violation,
        s.models.len(),
        s.profile.name
    );
    for p in planned {
        let what = if p.method == "mdp" { "expected" } else { "simulated" };
        println!(
            "  {}: {} workers ({what} accuracy {:.4}, violation {:.5}); {} evaluations in {:.2} s, capacity bound {}",
            p.policy,
            p.plan.workers,
            p.plan.point.accuracy,
            p.plan.point.violation,
            p.evaluations,
            p.seconds,
            p.lower_bound
        );
        if let Some(v) = p.verify.filter(|_| p.method == "mdp") {
            println!(
                "    simulated at {} workers: accuracy {:.4}, violation {:.5}",
                v.workers, v.accuracy, v.violation
            );
        }
        for (a, b) in &p.plan.non_monotone {
            println!("    note: {a} workers met the targets but {b} did not; the plan is above {b}");
        }
    }
    if planned.iter().all(|p| p.curve.is_empty()) {
        return;
    }
    println!();
    print!("  {:>8}", "workers");
    for p in planned {
        print!("  {:>22}", format!("{} acc / viol", p.policy));
    }
    println!();
    let mut workers: Vec<u32> = planned.iter().flat_map(|p| p.curve.iter().map(|c| c.workers)).collect();
    workers.sort_unstable();
    workers.dedup();
    for k in workers {
        print!("  {k:>8}");
        for p in planned {
            match p.curve.iter().find(|c| c.workers == k) {
                Some(c) => {
                    let mark = if c.meets(&s.targets) { '*' } else { ' ' };
                    print!("  {:>22}", format!("{:.4} / {:.5}{mark}", c.accuracy, c.violation));
                }
                None => print!("  {:>22}", "-"),
            }
        }
        println!();
    }
    println!("  (* meets the targets)");
    if let Some(path) = &args.svg {
        println!("  plot written to {}", path.display());
    }
}

fn svg(args: &PlanArgs, planned: &[Planned]) -> String {
    let mut series: Vec<Series> = planned
        .iter()
        .map(|p| Series {
            label: format!("{} (plan: {})", p.policy, p.plan.workers),
            points: p.curve.iter().map(|c| (c.workers as f64, c.accuracy)).collect(),
        })
        .collect();
    let xs = planned.iter().flat_map(|p| p.curve.iter().map(|c| c.workers as f64));
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo.is_finite() {
        series.push(Series {
            label: format!("target {}", args.accuracy),
            points: vec![(lo, args.accuracy), (hi, args.accuracy)],
        });
    }
    line_chart(
        &format!(
            "Accuracy vs workers: {:.0} QPS, SLO {:.0} ms, violation ≤ {}",
            args.load,
            args.slo / 1e3,
            args.violation
        ),
        "workers",
        "accuracy",
        &series,
    )
}

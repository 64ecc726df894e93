//! `sluice ramsis`: generate RAMSIS policies (EuroSys'24 §4–§6) natively, and
//! convert the RAMSIS artifact's profiles into sluice profiles.
//!
//! - `sluice ramsis gen --profile profiles/ramsis-image-cpu.toml --slo 150ms
//!   --workers 60 --load 2000 [--discretization fld:100|md] [--batching
//!   maximal|variable] [--out policy.json] [--json] [--load-grid]`
//! - `sluice ramsis convert --data ../shared/data/ramsis --task image --out
//!   profiles/ramsis-image-cpu.toml`
//!
//! The generator itself is `policy_ramsis::mdp` (the same code the `ramsis`
//! component runs); this file only reads inputs and prints results.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use policy_ramsis::grid::{self, GridOptions};
use policy_ramsis::latency;
use policy_ramsis::mdp::{self, Arrivals, Balancing, Batching, Discretization, ModelSpec, Problem, Space};

use sluice_core::profile::{ModelProfile, Percentile, Profile};

/// `sluice ramsis …`
#[derive(Debug, Args)]
pub struct RamsisArgs {
    #[command(subcommand)]
    command: RamsisCommand,
}

#[derive(Debug, Subcommand)]
enum RamsisCommand {
    /// Generate a RAMSIS policy (or a load grid of them) and print its expectations.
    Gen(GenArgs),
    /// Convert the RAMSIS artifact's latency profiles into a sluice profile (TOML).
    Convert(ConvertArgs),
}

/// `sluice ramsis gen`.
#[derive(Debug, Args)]
pub struct GenArgs {
    /// Model profile (TOML). Latencies at unmeasured batch sizes are filled by
    /// least squares and made non-decreasing, as the RAMSIS artifact does.
    #[arg(long, required_unless_present = "latency_table")]
    pub profile: Option<PathBuf>,
    /// Use this latency table instead of a profile: the artifact's effective
    /// table, CSV `task,action_index,model,accuracy,batch_size,latency_us`
    /// (e.g. `derived/ramsis_effective_latency_p95_us.csv`). Reproduces the
    /// artifact's inputs exactly.
    #[arg(long)]
    pub latency_table: Option<PathBuf>,
    /// Task rows to read from `--latency-table`.
    #[arg(long, default_value = "image")]
    pub task: String,
    /// Which percentile of the profile (p50, p95, p99).
    #[arg(long, default_value = "p95")]
    pub percentile: Percentile,
    /// Latency SLO (`150ms`, `0.15s`, `150000us`; a bare number is ms).
    #[arg(long, value_parser = parse_duration_us)]
    pub slo: f64,
    /// K: workers behind the balancer.
    #[arg(long)]
    pub workers: u32,
    /// λ: total load, requests per second (with `--load-grid`: the grid's top
    /// unless `--grid-max` is given).
    #[arg(long)]
    pub load: f64,
    /// `fld:<D>` (fixed-length, §4.2.2) or `md` (model-based, §4.2.1).
    #[arg(long, default_value = "fld:100")]
    pub discretization: Discretization,
    /// `maximal` or `variable` (§4.3.2).
    #[arg(long, default_value = "maximal")]
    pub batching: Batching,
    /// Variable batching: take a left-behind head's slack as `T_j − τ`
    /// (the artifact's conservative fallback) instead of from the order
    /// statistics of the arrivals.
    #[arg(long)]
    pub variable_conservative: bool,
    /// `round-robin` or `shortest-queue` (Appendix I.1).
    #[arg(long, default_value = "round-robin", value_parser = parse_balancing)]
    pub balancing: Balancing,
    /// `poisson` or `gamma:<c>` (negative-binomial counts, variance = mean·(1+c)).
    #[arg(long, default_value = "poisson", value_parser = parse_arrivals)]
    pub arrivals: Arrivals,
    /// N_w, the largest modelled worker queue (§4.2.3).
    #[arg(long, default_value_t = 32)]
    pub max_queue: u32,
    /// Value-iteration sweeps.
    #[arg(long, default_value_t = 100)]
    pub sweeps: u32,
    /// Most power iterations for the stationary distribution.
    #[arg(long, default_value_t = 1000)]
    pub power_iterations: u32,
    /// Stop the power iteration when a step changes less than this (L1); 0 runs them all.
    #[arg(long, default_value_t = 1e-13)]
    pub stationary_tolerance: f64,
    /// Keep dominated models (no Pareto pruning, §4.3.3).
    #[arg(long)]
    pub no_prune: bool,
    /// Threads for block construction and value iteration.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Write the policy table as JSON (`{"(n, j)": [model, batch], "full": …}`,
    /// models 1-based in latency order); with `--load-grid`, the component's
    /// params with every policy (`{"discretization": …, "policies": […]}`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Build the adaptive load grid (§6) by bisection instead of one policy.
    #[arg(long)]
    pub load_grid: bool,
    /// Lowest load of the grid (default: the top / 16).
    #[arg(long)]
    pub grid_min: Option<f64>,
    /// Highest load of the grid (default: `--load`).
    #[arg(long)]
    pub grid_max: Option<f64>,
    /// Adjacent policies' expected accuracies differ by less than this.
    #[arg(long, default_value_t = 0.01)]
    pub threshold: f64,
}

/// `sluice ramsis convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The artifact data directory (holds `derived/profile_summary_ms.csv`).
    #[arg(long, default_value = "../shared/data/ramsis")]
    pub data: PathBuf,
    /// `image` or `text`.
    #[arg(long)]
    pub task: String,
    /// Output profile.
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs `sluice ramsis …`.
pub fn run(args: RamsisArgs) -> Result<()> {
    match args.command {
        RamsisCommand::Gen(gen) => run_gen(gen),
        RamsisCommand::Convert(convert) => run_convert(convert),
    }
}

/// Parses `150ms`, `0.15s`, `150000us`, `150000µs` or a bare number of ms into µs.
pub fn parse_duration_us(text: &str) -> std::result::Result<f64, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e6)
    } else {
        (t, 1e3)
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("`{text}` is not a duration (e.g. 150ms)"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("`{text}`: must be positive"));
    }
    Ok(value * scale)
}

fn parse_balancing(text: &str) -> std::result::Result<Balancing, String> {
    match text.trim().to_ascii_lowercase().replace('_', "-").as_str() {
        "round-robin" | "rr" => Ok(Balancing::RoundRobin),
        "shortest-queue" | "sqf" | "jsq" => Ok(Balancing::ShortestQueue),
        other => Err(format!("unknown balancing `{other}` (round-robin or shortest-queue)")),
    }
}

fn parse_arrivals(text: &str) -> std::result::Result<Arrivals, String> {
    let t = text.trim().to_ascii_lowercase();
    if t == "poisson" {
        return Ok(Arrivals::Poisson);
    }
    if let Some(c) = t.strip_prefix("gamma:") {
        let dispersion: f64 = c.parse().map_err(|_| format!("`{text}`: gamma:<dispersion ≥ 0>"))?;
        if !(dispersion.is_finite() && dispersion >= 0.0) {
            return Err(format!("`{text}`: dispersion must be ≥ 0"));
        }
        return Ok(Arrivals::GammaPoisson { dispersion });
    }
    Err(format!("unknown arrivals `{text}` (poisson or gamma:<c>)"))
}

/// Reads the artifact's effective latency table (CSV) for one task, models in
/// `action_index` order.
pub fn read_latency_table(path: &Path, task: &str) -> Result<Vec<ModelSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut models: BTreeMap<usize, ModelSpec> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 6 {
            bail!("{}:{}: expected 6 fields", path.display(), i + 1);
        }
        if f[0] != task {
            continue;
        }
        let index: usize = f[1].parse().with_context(|| format!("{}:{}: action_index", path.display(), i + 1))?;
        let accuracy: f64 = f[3].parse().with_context(|| format!("{}:{}: accuracy", path.display(), i + 1))?;
        let batch: usize = f[4].parse().with_context(|| format!("{}:{}: batch_size", path.display(), i + 1))?;
        let latency: f64 = f[5].parse().with_context(|| format!("{}:{}: latency_us", path.display(), i + 1))?;
        let model = models.entry(index).or_insert_with(|| ModelSpec {
            name: f[2].to_string(),
            accuracy,
            latency_us: Vec::new(),
        });
        if batch != model.latency_us.len() + 1 {
            bail!("{}:{}: batch sizes of `{}` must be 1, 2, 3, …", path.display(), i + 1, f[2]);
        }
        model.latency_us.push(latency);
    }
    if models.is_empty() {
        bail!("{}: no rows for task `{task}`", path.display());
    }
    Ok(models.into_values().collect())
}

/// The generator's models from a profile: the chosen percentile at the
/// measured sizes, filled to `1..=max_batch` by least squares and made
/// non-decreasing (the artifact's `profile_utils.py`).
pub fn models_from_profile(profile: &Profile, percentile: Percentile, max_batch: u32) -> Vec<ModelSpec> {
    profile
        .models
        .iter()
        .map(|m: &ModelProfile| {
            let points: Vec<(u32, f64)> =
                m.batch_sizes.iter().zip(m.measured_us(percentile)).map(|(&b, &l)| (b, l as f64)).collect();
            ModelSpec {
                name: m.name.clone(),
                accuracy: m.accuracy,
                latency_us: latency::fill_table(&points, max_batch.max(m.max_batch())),
            }
        })
        .collect()
}

/// `sluice ramsis gen`: generates a policy (or a load grid), prints its expectations
/// and writes it where `--out` says.
pub fn run_gen(args: GenArgs) -> Result<()> {
    let models = match (&args.latency_table, &args.profile) {
        (Some(csv), _) => read_latency_table(csv, &args.task)?,
        (None, Some(path)) => models_from_profile(&Profile::load(path)?, args.percentile, args.max_queue),
        (None, None) => bail!("give --profile or --latency-table"),
    };
    let mut problem = Problem::new(models, args.slo, args.workers, args.load);
    problem.max_queue = args.max_queue;
    problem.discretization = args.discretization;
    problem.batching = args.batching;
    problem.variable_exact = !args.variable_conservative;
    problem.balancing = args.balancing;
    problem.arrivals = args.arrivals;
    problem.sweeps = args.sweeps;
    problem.power_iterations = args.power_iterations;
    problem.stationary_tolerance = args.stationary_tolerance;
    problem.pareto_prune = !args.no_prune;
    let space = Space::new(&problem)?;
    if args.load_grid {
        return run_grid(&args, &problem, &space);
    }
    let started = Instant::now();
    let solution = mdp::generate_with_threads(&problem, args.threads)?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(out) = &args.out {
        let table = policy_ramsis::table_to_json(&space, &solution.policy);
        write_json(out, &serde_json::Value::Object(table))?;
    }
    let names: Vec<&str> = space.models.iter().map(|&i| problem.models[i].name.as_str()).collect();
    if args.json {
        let report = serde_json::json!({
            "expected_accuracy": solution.expected_accuracy,
            "expected_violation": solution.expected_violation,
            "full_probability": solution.full_probability,
            "states": solution.states,
            "actions": solution.actions,
            "sweeps": solution.sweeps,
            "power_iterations": solution.power_iterations,
            "seconds": seconds,
            "threads": args.threads,
            "load_qps": args.load,
            "slo_us": args.slo,
            "workers": args.workers,
            "models": names,
            "slack_levels": space.slack_levels(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("RAMSIS policy: {} workers, {:.0} QPS, SLO {:.1} ms", args.workers, args.load, args.slo / 1e3);
        println!("  models (latency order): {}", names.join(", "));
        println!(
            "  states: {} ({} slack levels × {} queue lengths + full)",
            solution.states,
            space.slack_levels(),
            space.max_queue + 1
        );
        println!("  state-action pairs: {}", solution.actions);
        println!(
            "  iterations: {} value-iteration sweeps, {} power iterations",
            solution.sweeps, solution.power_iterations
        );
        println!("  time: {seconds:.3} s ({} thread(s))", args.threads);
        println!("  expected accuracy: {:.5}", solution.expected_accuracy);
        println!("  expected SLO violation: {:.5}", solution.expected_violation);
        if let Some(out) = &args.out {
            println!("  policy written to {}", out.display());
        }
    }
    Ok(())
}

fn run_grid(args: &GenArgs, problem: &Problem, space: &Space) -> Result<()> {
    let hi = args.grid_max.unwrap_or(args.load);
    let lo = args.grid_min.unwrap_or(hi / 16.0);
    if !(lo > 0.0 && hi >= lo) {
        bail!("--grid-min must be positive and at most --grid-max");
    }
    let options = GridOptions { threshold: args.threshold, ..GridOptions::default() };
    let bar = indicatif::ProgressBar::new(2);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} policies {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    if args.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let set = grid::build(problem, lo, hi, &options, args.threads, |done, queued| {
        bar.set_length((done + queued) as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let rows: Vec<serde_json::Value> = set
        .entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "load_qps": e.load_qps,
                "expected_accuracy": e.expected_accuracy,
                "expected_violation": e.expected_violation,
            })
        })
        .collect();
    if let Some(out) = &args.out {
        let policies: Vec<serde_json::Value> = rows
            .iter()
            .zip(&set.entries)
            .map(|(row, e)| {
                let mut p = row.clone();
                p["table"] = policy_ramsis::table_rows(space, &e.policy);
                p
            })
            .collect();
        let discretization = match problem.discretization {
            Discretization::Fld(d) => format!("fld:{d}"),
            Discretization::Md => "md".to_string(),
        };
        let params = serde_json::json!({
            "discretization": discretization,
            "batching": problem.batching,
            "variable_exact": problem.variable_exact,
            "balancing": problem.balancing,
            "max_queue": problem.max_queue,
            "threshold": args.threshold,
            "policies": policies,
        });
        write_json(out, &params)?;
    }
    if args.json {
        let report = serde_json::json!({
            "policies": rows,
            "states": space.state_count(),
            "seconds": seconds,
            "threshold": args.threshold,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "RAMSIS load grid: {} policies over {lo:.0}..{hi:.0} QPS in {seconds:.2} s (threshold {})",
            set.entries.len(),
            args.threshold
        );
        println!("  {:>10}  {:>10}  {:>10}", "load QPS", "E[acc]", "E[viol]");
        for e in &set.entries {
            println!("  {:>10.1}  {:>10.5}  {:>10.5}", e.load_qps, e.expected_accuracy, e.expected_violation);
        }
    }
    Ok(())
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Top-1 accuracies (%) the RAMSIS artifact uses (`profiles/image_models.py`,
/// `profiles/seq_models.py`): torchvision ImageNet figures for the image
/// models (quantized variants where noted there), GLUE-MNLI for the BERTs.
const ACCURACY_PERCENT: &[(&str, f64)] = &[
    ("googlenet", 69.826),
    ("inception_v3", 77.176),
    ("mobilenet_v2", 72.154),
    ("mobilenet_v3_large", 73.004),
    ("resnext101_32x8d", 82.574),
    ("resnext101_64x4d", 82.898),
    ("shufflenet_v2_x0_5", 57.972),
    ("shufflenet_v2_x1_0", 68.36),
    ("shufflenet_v2_x1_5", 72.052),
    ("shufflenet_v2_x2_0", 75.354),
    ("resnet18", 69.494),
    ("resnet50", 80.282),
    ("resnet34", 73.314),
    ("resnet101", 81.886),
    ("resnet152", 82.284),
    ("efficientnet_v2_l", 85.808),
    ("efficientnet_v2_m", 85.112),
    ("efficientnet_v2_s", 84.228),
    ("efficientnet_b0", 77.692),
    ("efficientnet_b1", 79.838),
    ("efficientnet_b2", 80.608),
    ("efficientnet_b3", 82.008),
    ("efficientnet_b4", 83.384),
    ("efficientnet_b5", 83.444),
    ("efficientnet_b6", 84.008),
    ("efficientnet_b7", 84.122),
    ("bert_tiny", 70.2),
    ("bert_mini", 74.8),
    ("bert_small", 77.6),
    ("bert_medium", 80.0),
    ("bert_base", 84.56),
];

/// One row of `profile_summary_ms.csv`: sample count, then p50, p95, p99 in µs.
type Summary = (u32, u64, u64, u64);

/// Builds the sluice profile of one task from the artifact's
/// `derived/profile_summary_ms.csv` (per model and batch size: sample count and
/// numpy-linear p50/p95/p99 of the raw per-run times, in ms).
pub fn convert(data: &Path, task: &str) -> Result<Profile> {
    let path = data.join("derived/profile_summary_ms.csv");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let wanted = format!("{task}_cloud_cpu");
    let mut rows: BTreeMap<String, BTreeMap<u32, Summary>> = BTreeMap::new();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header.iter().position(|h| *h == name).with_context(|| format!("{}: no `{name}` column", path.display()))
    };
    let (c_task, c_model, c_batch, c_n) = (col("task")?, col("model")?, col("batch_size")?, col("n_samples")?);
    let (c50, c95, c99) = (col("p50_ms")?, col("p95_ms")?, col("p99_ms")?);
    let us = |s: &str| -> Result<u64> { Ok((s.parse::<f64>()? * 1e3).round() as u64) };
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        if f.get(c_task) != Some(&wanted.as_str()) {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 2);
        let batch: u32 = f[c_batch].parse().with_context(at)?;
        let n: u32 = f[c_n].parse().with_context(at)?;
        let (p50, p95, p99) =
            (us(f[c50]).with_context(at)?, us(f[c95]).with_context(at)?, us(f[c99]).with_context(at)?);
        rows.entry(f[c_model].to_string()).or_default().insert(batch, (n, p50, p95, p99));
    }
    if rows.is_empty() {
        bail!("{}: no rows for task `{wanted}`", path.display());
    }
    let mut models = Vec::new();
    for (name, by_batch) in rows {
        let accuracy = ACCURACY_PERCENT
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| (a * 1000.0).round() / 100_000.0)
            .with_context(|| format!("no accuracy known for `{name}`"))?;
        let metric = if task == "text" { "GLUE-MNLI accuracy" } else { "ImageNet top-1" };
        models.push(ModelProfile {
            accuracy_source: format!(
                "RAMSIS artifact (github.com/dmmendo/RAMSIS @9b74967), profiles/{}: {metric} {:.3}%",
                if task == "text" { "seq_models.py" } else { "image_models.py" },
                accuracy * 100.0
            ),
            name,
            accuracy,
            file: None,
            batch_sizes: by_batch.keys().copied().collect(),
            p50_us: by_batch.values().map(|r| r.1).collect(),
            p95_us: by_batch.values().map(|r| r.2).collect(),
            p99_us: by_batch.values().map(|r| r.3).collect(),
            runs: by_batch.values().map(|r| r.0).min(),
        });
    }
    let profile = Profile {
        name: format!("ramsis-{task}-cpu"),
        device: "cpu: GCP n1 worker VMs, 4 Intel Haswell vCPUs, 16 GB (RAMSIS §7, TorchServe; latency includes transfer and pre-processing)".into(),
        source: format!(
            "converted by `sluice ramsis convert --task {task}` from the RAMSIS artifact data (github.com/dmmendo/RAMSIS @9b74967): \
             derived/profile_summary_ms.csv, i.e. numpy-linear percentiles of each profiles/{wanted}/<model>/<model>_bsize-<b>_profile.json \
             (per-run wall times), rounded to µs; only the batch sizes the artifact measured are listed"
        ),
        models,
    };
    // Round-trip through the strict parser: the file we write must load.
    Profile::parse(&profile.to_toml_string(), "converted profile").map_err(anyhow::Error::from)
}

fn run_convert(args: ConvertArgs) -> Result<()> {
    let profile = convert(&args.data, &args.task)?;
    std::fs::write(&args.out, profile.to_toml_string()).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {} ({} models)", args.out.display(), profile.models.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_us("150ms").unwrap(), 150_000.0);
        assert_eq!(parse_duration_us("0.15s").unwrap(), 150_000.0);
        assert_eq!(parse_duration_us("150000us").unwrap(), 150_000.0);
        assert_eq!(parse_duration_us("150").unwrap(), 150_000.0);
        assert!(parse_duration_us("fast").is_err());
        assert!(parse_duration_us("-1ms").is_err());
    }

    fn repo(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
    }

    /// The converted profile, filled and fixed like the artifact's table,
    /// gives the fidelity case's numbers (issue 3) and the artifact's 9
    /// Pareto models.
    #[test]
    fn converted_profile_reproduces_the_fidelity_case() {
        let profile = Profile::load(&repo("profiles/ramsis-image-cpu.toml")).unwrap();
        assert_eq!(profile.models.len(), 26);
        let models = models_from_profile(&profile, Percentile::P95, 32);
        let problem = Problem::new(models, 150_000.0, 60, 2000.0);
        let space = Space::new(&problem).unwrap();
        let names: Vec<&str> = space.models.iter().map(|&i| problem.models[i].name.as_str()).collect();
        let table =
            read_latency_table(&repo("policies/ramsis/tests/data/ramsis_effective_latency_p95_us.csv"), "image")
                .unwrap();
        let expected: Vec<&str> = table.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, expected);
        // The filled p95 table is the artifact's up to µs rounding (which a
        // regression fill spreads a little).
        for (m, model) in space.models.iter().zip(&table) {
            for (got, want) in problem.models[*m].latency_us.iter().zip(&model.latency_us) {
                assert!((got - want).abs() <= 1.0f64.max(1e-6 * want), "{}: {got} vs {want}", model.name);
            }
        }
        let solution = mdp::generate(&problem).unwrap();
        assert!((solution.expected_accuracy - 0.74875).abs() < 0.001, "{}", solution.expected_accuracy);
        assert!((solution.expected_violation - 0.00189).abs() < 0.001, "{}", solution.expected_violation);
    }

    /// `gen --load-grid --out` writes params the component accepts as they are.
    #[test]
    fn load_grid_output_is_component_params() {
        use policy_ramsis::{Params, Ramsis};
        use sluice_sdk::Policy;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("grid.json");
        let profile = repo("profiles/ramsis-image-cpu.toml");
        let args = GenArgs {
            profile: Some(profile.clone()),
            latency_table: None,
            task: "image".into(),
            percentile: Percentile::P95,
            slo: 150_000.0,
            workers: 60,
            load: 3000.0,
            discretization: Discretization::Fld(20),
            batching: Batching::Maximal,
            variable_conservative: false,
            balancing: Balancing::RoundRobin,
            arrivals: Arrivals::Poisson,
            max_queue: 12,
            sweeps: 100,
            power_iterations: 1000,
            stationary_tolerance: 1e-13,
            no_prune: false,
            threads: 1,
            out: Some(out.clone()),
            json: true,
            load_grid: true,
            grid_min: Some(1000.0),
            grid_max: None,
            threshold: 0.05,
        };
        run_gen(args).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let params: Params = serde_json::from_str(&text).unwrap();
        assert!(params.policies.len() >= 2);
        let p = Profile::load(&profile).unwrap();
        let models = p
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| sluice_sdk::Model {
                id: i as u32,
                name: m.name.clone(),
                accuracy: m.accuracy,
                latency: models_from_profile(&p, Percentile::P95, 32)[i]
                    .latency_us
                    .iter()
                    .map(|&l| l.round() as u64)
                    .collect(),
            })
            .collect();
        let config =
            sluice_sdk::Config { app: "image".into(), slo: 150_000, workers: 60, worker: 0, models, params: text };
        let policy = Ramsis::init(config).unwrap();
        assert_eq!(policy.policies().entries.len(), params.policies.len());
    }

    #[test]
    fn arrivals_and_balancing() {
        assert_eq!(parse_arrivals("poisson").unwrap(), Arrivals::Poisson);
        assert_eq!(parse_arrivals("gamma:2").unwrap(), Arrivals::GammaPoisson { dispersion: 2.0 });
        assert!(parse_arrivals("gamma:x").is_err());
        assert_eq!(parse_balancing("shortest-queue").unwrap(), Balancing::ShortestQueue);
    }
}

//! `sluice policy bench <file.wasm> --against jellyfish`: the component and a
//! built-in (or another component) simulated on the same standard scenarios —
//! constant loads, the Twitter-shaped trace of the RAMSIS experiments, bursts —
//! with the same arrivals (one seed), side by side: a table, `results.json` and
//! two SVG plots (accuracy, violations).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use sluice_sim::report::bar_chart;
use sluice_sim::{run_experiment, Experiment};
use toml::Value;

use super::standard;
use crate::commands::plan::{number_in, MAX_SIMULATED_REQUESTS};

// The ranges of the numeric flags (docs/writing-a-policy.md, `bench`), checked as they are
// parsed; their product below: every arrival of a scenario is drawn before it runs,
// so `--duration 1e12` or `--scale 1e9` grew to 22 GB.

/// `--duration`, simulated seconds: a day.
const MAX_DURATION_S: f64 = 86_400.0;
/// `--scale`: a thousand times the standard loads.
const MAX_SCALE: f64 = 1000.0;

/// `sluice policy bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The component to measure.
    pub file: PathBuf,
    /// What to compare with: a built-in's name or a `.wasm` path.
    #[arg(long, default_value = "jellyfish")]
    pub against: String,
    /// Params of the component (a JSON object).
    #[arg(long)]
    pub params: Option<String>,
    /// Params of `--against` (a JSON object).
    #[arg(long)]
    pub against_params: Option<String>,
    /// Simulated seconds per scenario (the Twitter trace is 300 s long): (0, 86400].
    #[arg(long, default_value_t = 120.0, value_parser = |t: &str| number_in(t, 0.0, true, MAX_DURATION_S))]
    pub duration: f64,
    /// Workers: 1 to 4096.
    #[arg(long, default_value_t = standard::WORKERS, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub workers: u32,
    /// A profile instead of the standard one (ramsis-image-cpu, its 9 Pareto models).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Models of `--profile` (comma-separated; default all of it).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// The scenarios' loads are these multiples of the standard ones (1000, 2000,
    /// 3000 requests/s; the trace's 1617–3905), for other profiles and worker counts:
    /// (0, 1000].
    #[arg(long, default_value_t = 1.0, value_parser = |t: &str| number_in(t, 0.0, true, MAX_SCALE))]
    pub scale: f64,
    /// Seed of the arrivals (the same for both policies): 0 to 2^63 − 1 (a TOML integer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=i64::MAX as u64))]
    pub seed: u64,
    /// Where built-in components are (default: ./target/policies, else the
    /// checkout's this sluice was built from).
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// Write results.json, accuracy.svg and violation.svg here.
    #[arg(long, default_value = "policy-bench")]
    pub out: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One scenario's result for one policy.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Scenario.
    pub scenario: String,
    /// Policy label.
    pub policy: String,
    /// Requests offered.
    pub requests: u64,
    /// Accuracy over the requests served on time.
    pub accuracy: f64,
    /// Fraction of requests late, dropped or unfinished.
    pub violation_rate: f64,
    /// Requests dropped (policy or host).
    pub dropped: u64,
    /// Policy faults answered by the safe decision.
    pub faults: u64,
}

/// The standard scenarios: (name, arrivals), the trace files written into `dir`.
fn scenarios(dir: &Path, trace: &Path, scale: f64) -> Result<Vec<(String, toml::Table)>> {
    let poisson = |qps: f64| {
        let mut t = toml::Table::new();
        t.insert("kind".into(), Value::String("poisson".into()));
        t.insert("rate_qps".into(), Value::Float(qps * scale));
        t
    };
    let trace_of = |file: &Path| {
        let mut t = toml::Table::new();
        t.insert("kind".into(), Value::String("rate-trace".into()));
        t.insert("file".into(), Value::String(file.display().to_string()));
        t.insert("scale".into(), Value::Float(scale));
        t
    };
    // Bursts: 1200 requests/s with 3 s at 3600 every 15 s — a tripled load, twice the
    // Twitter trace's fastest rise, that a load-granular policy sees only late.
    let bursts = dir.join("bursts.txt");
    let mut text = String::from("# sluice policy bench: 1200 QPS with 3 s bursts at 3600 every 15 s\n");
    for start in (0..600).step_by(15) {
        text.push_str(&format!("{start} 1200\n{} 3600\n", start + 12));
    }
    std::fs::write(&bursts, text).with_context(|| format!("writing {}", bursts.display()))?;
    Ok(vec![
        (format!("constant {:.0}", 1000.0 * scale), poisson(1000.0)),
        (format!("constant {:.0}", 2000.0 * scale), poisson(2000.0)),
        (format!("constant {:.0}", 3000.0 * scale), poisson(3000.0)),
        ("twitter".into(), trace_of(trace)),
        ("bursts".into(), trace_of(&bursts)),
    ])
}

fn json_params(text: &Option<String>, what: &str) -> Result<Option<Value>> {
    let Some(text) = text else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{what} is not JSON"))?;
    if !v.is_object() {
        bail!("{what} must be a JSON object, got {v}");
    }
    Ok(Some(Value::try_from(v).map_err(|e| anyhow::anyhow!("{what}: {e}"))?))
}

/// A component path or a built-in in `builtin`; fails naming what is missing.
fn component(policy: &str, builtin: &Path) -> Result<String> {
    let path = if policy.ends_with(".wasm") { PathBuf::from(policy) } else { builtin.join(format!("{policy}.wasm")) };
    if !path.is_file() {
        bail!(
            "policy `{policy}`: no component at {} (built-ins come from `cargo xtask policies`; --policies picks \
             their directory)",
            path.display()
        );
    }
    Ok(std::path::absolute(&path)?.display().to_string())
}

/// Runs `sluice policy bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    let requests = standard::PEAK_QPS * args.scale * args.duration;
    if requests > MAX_SIMULATED_REQUESTS {
        bail!(
            "--scale {} × --duration {}: the busiest scenario would simulate about {requests:.0} requests, more than \
             {MAX_SIMULATED_REQUESTS:.0} (about 1.2 GB); lower one of them",
            args.scale,
            args.duration
        );
    }
    let builtin = standard::builtin_dir(args.policies.as_deref());
    let candidate = component(&args.file.display().to_string(), &builtin)?;
    let against = component(&args.against, &builtin)?;
    let label = args.file.file_stem().and_then(|s| s.to_str()).unwrap_or("policy").to_string();
    let against_label =
        Path::new(&args.against).file_stem().and_then(|s| s.to_str()).unwrap_or(&args.against).to_string();
    let against_label = if against_label == label { format!("{against_label} (against)") } else { against_label };
    let params = json_params(&args.params, "--params")?;
    let against_params = json_params(&args.against_params, "--against-params")?;
    // The inputs (the standard profile, the traces) are written beside the results,
    // so a run can be repeated with `sluice sim` from what it leaves.
    let work = args.out.join("inputs");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let work = std::path::absolute(&work)?;
    let (std_profile, trace) = standard::write_files(&work)?;
    let (profile, models) = match &args.profile {
        Some(p) => (std::path::absolute(p)?, args.models.clone()),
        None => (std_profile, standard::MODELS.iter().map(|s| s.to_string()).collect()),
    };
    let mut rows = Vec::new();
    for (scenario, arrivals) in scenarios(&work, &trace, args.scale)? {
        let mut app = toml::Table::new();
        app.insert("name".into(), Value::String("bench".into()));
        app.insert("slo_ms".into(), Value::Integer(standard::SLO_MS as i64));
        app.insert("workers".into(), Value::Integer(args.workers.into()));
        app.insert("router".into(), Value::String("round-robin".into()));
        app.insert("profile".into(), Value::String(profile.display().to_string()));
        if !models.is_empty() {
            app.insert("models".into(), Value::Array(models.iter().cloned().map(Value::String).collect()));
        }
        app.insert("max_batch".into(), Value::Integer(standard::MAX_BATCH.into()));
        app.insert("policy".into(), Value::String(candidate.clone()));
        app.insert("arrivals".into(), Value::Table(arrivals));
        let choice = |policy: &str, label: &str, params: &Option<Value>| {
            let mut t = toml::Table::new();
            t.insert("policy".into(), Value::String(policy.into()));
            t.insert("label".into(), Value::String(label.into()));
            if let Some(p) = params {
                t.insert("params".into(), p.clone());
            }
            Value::Table(t)
        };
        let mut sweep = toml::Table::new();
        sweep.insert(
            "policies".into(),
            Value::Array(vec![choice(&candidate, &label, &params), choice(&against, &against_label, &against_params)]),
        );
        let mut doc = toml::Table::new();
        doc.insert("version".into(), Value::Integer(1));
        doc.insert("name".into(), Value::String(format!("policy-bench {scenario}")));
        doc.insert("seed".into(), Value::Integer(args.seed as i64));
        doc.insert("duration_s".into(), Value::Float(args.duration));
        doc.insert("builtin_policy_dir".into(), Value::String(std::path::absolute(&builtin)?.display().to_string()));
        doc.insert("app".into(), Value::Array(vec![Value::Table(app)]));
        doc.insert("sweep".into(), Value::Table(sweep));
        let text = toml::to_string(&doc)?;
        let exp = Experiment::parse(&text, &format!("policy bench, scenario {scenario}"), &work)?;
        let out = run_experiment(&exp, &work, false).with_context(|| format!("scenario {scenario}"))?;
        for r in out.results {
            rows.push(Row {
                scenario: scenario.clone(),
                policy: r.policy.clone(),
                requests: r.requests,
                accuracy: r.accuracy,
                violation_rate: r.violation_rate,
                dropped: r.dropped,
                faults: r.faults,
            });
        }
    }
    let groups: Vec<String> = rows.iter().map(|r| r.scenario.clone()).fold(Vec::new(), |mut v, s| {
        if !v.contains(&s) {
            v.push(s);
        }
        v
    });
    let series = |f: fn(&Row) -> f64| -> Vec<(String, Vec<f64>)> {
        [&label, &against_label]
            .iter()
            .map(|p| {
                let values = groups
                    .iter()
                    .map(|g| rows.iter().find(|r| &r.scenario == g && &r.policy == *p).map_or(f64::NAN, f))
                    .collect();
                (p.to_string(), values)
            })
            .collect()
    };
    let title = format!("{label} vs {against_label}: {} workers, SLO {} ms", args.workers, standard::SLO_MS);
    let files = [
        ("accuracy.svg", bar_chart(&format!("Accuracy — {title}"), "accuracy", &groups, &series(|r| r.accuracy))),
        (
            "violation.svg",
            bar_chart(&format!("SLO violations — {title}"), "violation rate", &groups, &series(|r| r.violation_rate)),
        ),
        ("results.json", serde_json::to_string_pretty(&rows)? + "\n"),
    ];
    for (name, text) in &files {
        let path = args.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "results": rows, "out": args.out }))?);
        return Ok(());
    }
    println!(
        "{label} vs {against_label}: {} workers, SLO {} ms, {} s per scenario, seed {}",
        args.workers,
        standard::SLO_MS,
        args.duration,
        args.seed
    );
    println!(
        "  {:<16} {:>22} {:>22}",
        "scenario",
        format!("{label} acc / viol"),
        format!("{against_label} acc / viol")
    );
    for g in &groups {
        let cell = |p: &str| {
            rows.iter().find(|r| &r.scenario == g && r.policy == p).map_or("-".to_string(), |r| {
                let faults = if r.faults > 0 { format!(" ({} faults)", r.faults) } else { String::new() };
                format!("{:.4} / {:.5}{faults}", r.accuracy, r.violation_rate)
            })
        };
        println!("  {g:<16} {:>22} {:>22}", cell(&label), cell(&against_label));
    }
    println!("  wrote {}/{{results.json,accuracy.svg,violation.svg}}", args.out.display());
    Ok(())
}

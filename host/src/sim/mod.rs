//! `sluice sim`: a discrete-event simulator that drives the same router, the same
//! `.wasm` policy components, the same decision core and the same profiles as the
//! live host, in virtual time.
//!
//! Start here: [`Experiment`] (the TOML file), [`run_experiment`] (every run of its
//! sweep), [`engine`] (the event loop), [`stats`] (what a run measures).
//!
//! Determinism: a run is a function of the experiment and its seed — arrivals and
//! sampled latencies come from [`rng::Rng`], policies read no clock — so
//! `results.json`, `results.csv` and `timeseries.csv` are byte-identical across
//! repetitions. `summary.json` adds wall-clock figures and is the one file that is not.

pub mod arrivals;
pub mod engine;
pub mod report;
pub mod rng;
pub mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::config::RouterMode;
use crate::profile::{Percentile, Profile};
use crate::runtime::{CompiledPolicy, PolicyEngine};
use arrivals::ArrivalSpec;

/// An experiment file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// `version = 1`.
    pub version: u32,
    /// `name = "ramsis-constant"`.
    pub name: String,
    /// `seed = 1`: arrivals and sampled latencies (a sweep's `seeds` override it).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// `duration_s = 30`: simulated time.
    pub duration_s: f64,
    /// `builtin_policy_dir = "../../target/policies"`: where policies named without a
    /// `.wasm` path are found.
    #[serde(default = "default_builtin")]
    pub builtin_policy_dir: PathBuf,
    /// `latency = "deterministic"` (the app's percentile) or `"sampled"` (drawn from
    /// the profile's measured p50/p95/p99 per batch size).
    #[serde(default)]
    pub latency: LatencyModel,
    /// `max_queue = 100000`: a worker queue longer than this ends the run as overloaded.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// `window_s = 1.0`: width of the time-series windows.
    #[serde(default = "default_window")]
    pub window_s: f64,
    /// `weakly_hard = [m, K]`: check that no K consecutive requests have more than m misses.
    #[serde(default)]
    pub weakly_hard: Option<[usize; 2]>,
    /// `[[app]]`: simulated apps.
    #[serde(rename = "app")]
    pub apps: Vec<SimApp>,
    /// `[sweep]`: the runs, as a cartesian product (one run without it).
    #[serde(default)]
    pub sweep: Sweep,
}

/// One simulated app.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimApp {
    /// App name.
    pub name: String,
    /// Latency SLO (a per-request trace may give each request its own budget).
    pub slo_ms: f64,
    /// Workers.
    pub workers: u32,
    /// Router, as in the host config.
    #[serde(default)]
    pub router: RouterMode,
    /// Profile file.
    pub profile: PathBuf,
    /// Which percentile policies see (and deterministic latency uses).
    #[serde(default = "default_percentile")]
    pub latency_percentile: Percentile,
    /// Models served (default: all in the profile), in this order (ids).
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Cap on batch sizes.
    #[serde(default)]
    pub max_batch: Option<u32>,
    /// Host expiry past the deadline, as in the host (default: one SLO).
    #[serde(default)]
    pub expire_after_ms: Option<f64>,
    /// Load-estimate window (RAMSIS §6: 500 ms).
    #[serde(default = "default_load_window")]
    pub load_window_ms: u64,
    /// Policy: a built-in name, a path to a `.wasm` (relative to the experiment), or
    /// `safe` for the host's native fallback policy (a baseline without Wasm).
    pub policy: String,
    /// Policy params.
    #[serde(default)]
    pub params: Option<toml::Table>,
    /// A JSON file of policy params (e.g. `sluice ramsis gen --load-grid --out`),
    /// relative to the experiment; `params` entries override its keys. `{workers}`
    /// in the path is replaced by the app's worker count (tables depend on K).
    #[serde(default)]
    pub params_file: Option<PathBuf>,
    /// Arrivals.
    pub arrivals: ArrivalSpec,
}

/// The runs of an experiment: every combination of the non-empty lists.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// Constant rates replacing every app's arrival rate.
    #[serde(default)]
    pub load_qps: Vec<f64>,
    /// Worker counts replacing every app's.
    #[serde(default)]
    pub workers: Vec<u32>,
    /// Policies (with params) replacing every app's.
    #[serde(default)]
    pub policies: Vec<PolicyChoice>,
    /// Seeds.
    #[serde(default)]
    pub seeds: Vec<u64>,
}

/// A policy and its params.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyChoice {
    /// Built-in name or `.wasm` path.
    pub policy: String,
    /// Params.
    #[serde(default)]
    pub params: Option<toml::Table>,
    /// A JSON file of params, as for an app.
    #[serde(default)]
    pub params_file: Option<PathBuf>,
    /// Label in results (default: the policy name).
    #[serde(default)]
    pub label: Option<String>,
}

/// How batch latencies are drawn.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyModel {
    /// Always the app's percentile of the profile.
    #[default]
    Deterministic,
    /// Sampled from the profile's measured distribution (see [`engine::LatencySampler`]).
    Sampled,
}

fn default_seed() -> u64 {
    1
}
fn default_builtin() -> PathBuf {
    PathBuf::from("target/policies")
}
fn default_max_queue() -> usize {
    100_000
}
fn default_window() -> f64 {
    1.0
}
fn default_percentile() -> Percentile {
    Percentile::P95
}
fn default_load_window() -> u64 {
    500
}

/// One run of an experiment: the experiment with the sweep's choices applied.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Index in the sweep.
    pub index: usize,
    /// The label of the policy choice (for results).
    pub policy_label: String,
    /// Seed.
    pub seed: u64,
    /// Apps with overrides applied.
    pub apps: Vec<SimApp>,
}

impl Experiment {
    /// Reads an experiment file; relative paths resolve against its directory.
    pub fn load(path: &Path) -> Result<(Experiment, PathBuf)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
        let e = Experiment::parse(&text, &path.display().to_string())?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok((e, base))
    }

    /// Parses and checks experiment text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Experiment> {
        let e: Experiment = toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        if e.version != 1 {
            bail!("{origin}: version: expected 1, got {}", e.version);
        }
        if !(e.duration_s.is_finite() && e.duration_s > 0.0) {
            bail!("{origin}: duration_s: expected a positive number of seconds");
        }
        if e.apps.is_empty() {
            bail!("{origin}: at least one [[app]] is required");
        }
        for a in &e.apps {
            if a.workers == 0 || !(a.slo_ms.is_finite() && a.slo_ms > 0.0) {
                bail!("{origin}: app {}: workers and slo_ms must be positive", a.name);
            }
        }
        Ok(e)
    }

    /// The runs: the cartesian product of the sweep's lists (in the order policies,
    /// workers, load, seeds), or the experiment as written.
    pub fn runs(&self) -> Vec<RunSpec> {
        let policies: Vec<Option<&PolicyChoice>> =
            if self.sweep.policies.is_empty() { vec![None] } else { self.sweep.policies.iter().map(Some).collect() };
        let workers: Vec<Option<u32>> = if self.sweep.workers.is_empty() {
            vec![None]
        } else {
            self.sweep.workers.iter().copied().map(Some).collect()
        };
        let loads: Vec<Option<f64>> = if self.sweep.load_qps.is_empty() {
            vec![None]
        } else {
            self.sweep.load_qps.iter().copied().map(Some).collect()
        };
        let seeds: Vec<u64> = if self.sweep.seeds.is_empty() { vec![self.seed] } else { self.sweep.seeds.clone() };
        let mut out = Vec::new();
        for p in &policies {
            for w in &workers {
                for l in &loads {
                    for s in &seeds {
                        let apps = self
                            .apps
                            .iter()
                            .map(|a| {
                                let mut a = a.clone();
                                if let Some(p) = p {
                                    a.policy = p.policy.clone();
                                    a.params = p.params.clone();
                                    a.params_file = p.params_file.clone();
                                }
                                if let Some(w) = w {
                                    a.workers = *w;
                                }
                                if let Some(l) = l {
                                    a.arrivals = a.arrivals.with_rate(*l);
                                }
                                a
                            })
                            .collect();
                        let label = p
                            .map(|p| p.label.clone().unwrap_or_else(|| p.policy.clone()))
                            .unwrap_or_else(|| self.apps[0].policy.clone());
                        out.push(RunSpec { index: out.len(), policy_label: label, seed: *s, apps });
                    }
                }
            }
        }
        out
    }
}

impl SimApp {
    /// The policy params as JSON: `params_file` (if any) overlaid with `params`.
    pub fn params_json(&self, base: &Path) -> Result<String> {
        let mut obj = match &self.params_file {
            Some(f) => {
                let path = base.join(f.to_string_lossy().replace("{workers}", &self.workers.to_string()));
                let text = std::fs::read_to_string(&path).with_context(|| format!("params_file {}", path.display()))?;
                if self.params.is_none() {
                    // Nothing to overlay: hand the file over as it is (RAMSIS grids
                    // run to megabytes), once checked to be a JSON object.
                    if !text.trim_start().starts_with('{') {
                        bail!("params_file {}: expected a JSON object", path.display());
                    }
                    serde_json::from_str::<serde::de::IgnoredAny>(&text)
                        .with_context(|| format!("params_file {}: not JSON", path.display()))?;
                    return Ok(text);
                }
                match serde_json::from_str::<serde_json::Value>(&text)
                    .with_context(|| format!("params_file {}: not JSON", path.display()))?
                {
                    serde_json::Value::Object(m) => m,
                    _ => bail!("params_file {}: expected a JSON object", path.display()),
                }
            }
            None => serde_json::Map::new(),
        };
        if let Some(t) = &self.params {
            if let serde_json::Value::Object(m) = serde_json::to_value(t)? {
                obj.extend(m);
            }
        }
        Ok(serde_json::Value::Object(obj).to_string())
    }
}

/// Compiled policies by name or path, shared by every run of an experiment.
pub struct PolicyCache {
    engine: Arc<PolicyEngine>,
    builtin_dir: PathBuf,
    base: PathBuf,
    compiled: BTreeMap<String, Arc<CompiledPolicy>>,
}

impl PolicyCache {
    /// A cache over `builtin_dir` (policies by name) and `base` (relative `.wasm` paths).
    pub fn new(builtin_dir: PathBuf, base: PathBuf) -> Result<PolicyCache> {
        Ok(PolicyCache { engine: PolicyEngine::new()?, builtin_dir, base, compiled: BTreeMap::new() })
    }

    /// The engine instances are created in.
    pub fn engine(&self) -> &Arc<PolicyEngine> {
        &self.engine
    }

    /// The compiled policy `policy` (a built-in name or a `.wasm` path).
    pub fn get(&mut self, policy: &str) -> Result<Arc<CompiledPolicy>> {
        if let Some(c) = self.compiled.get(policy) {
            return Ok(c.clone());
        }
        let (name, path) = if policy.ends_with(".wasm") {
            let p = self.base.join(policy);
            let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("policy").to_string();
            (name, p)
        } else {
            (policy.to_string(), self.builtin_dir.join(format!("{policy}.wasm")))
        };
        let bytes = std::fs::read(&path).with_context(|| {
            format!("policy `{policy}`: cannot read {} (run `cargo xtask policies`)", path.display())
        })?;
        let c = self.engine.compile(&name, &bytes)?;
        self.compiled.insert(policy.to_string(), c.clone());
        Ok(c)
    }
}

/// What `run_experiment` returns: deterministic results and wall-clock figures.
pub struct ExperimentOutput {
    /// One entry per (run, app), deterministic.
    pub results: Vec<stats::RunResult>,
    /// Time series rows (run, app, window), deterministic.
    pub timeseries: Vec<stats::WindowRow>,
    /// Wall-clock figures per (run, app).
    pub timing: Vec<stats::Timing>,
}

/// Runs every run of the experiment in order.
pub fn run_experiment(exp: &Experiment, base: &Path, progress: bool) -> Result<ExperimentOutput> {
    let mut cache = PolicyCache::new(base.join(&exp.builtin_policy_dir), base.to_path_buf())?;
    let mut profiles: BTreeMap<PathBuf, Profile> = BTreeMap::new();
    let runs = exp.runs();
    let bar = if progress { Some(indicatif::ProgressBar::new(runs.len() as u64)) } else { None };
    let mut out = ExperimentOutput { results: Vec::new(), timeseries: Vec::new(), timing: Vec::new() };
    for run in &runs {
        for a in &run.apps {
            let path = base.join(&a.profile);
            if !profiles.contains_key(&path) {
                profiles.insert(path.clone(), Profile::load(&path)?);
            }
        }
        let started = Instant::now();
        let sim = engine::Simulation::new(exp, base, run, &profiles, &mut cache)?;
        let done = sim.run();
        let wall = started.elapsed().as_secs_f64();
        for (r, ts, wasm) in done {
            out.timing.push(stats::Timing {
                run: run.index,
                app: r.app.clone(),
                policy: r.policy.clone(),
                workers: r.workers,
                load_qps: r.load_qps,
                trace: r.trace.clone(),
                requests: r.requests,
                accuracy: r.accuracy,
                violation_rate: r.violation_rate,
                dropped: r.dropped,
                wall_seconds: wall,
                wasm_seconds: wasm,
                simulated_requests_per_second: r.requests as f64 / wall.max(1e-9),
            });
            out.timeseries.extend(ts);
            out.results.push(r);
        }
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(out)
}

/// `sluice sim` arguments: an experiment file, or `report <dir>`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SimArgs {
    /// `report <dir>`: render report.md and SVG plots from a `--out` directory.
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// The experiment file.
    #[arg(required = true)]
    pub experiment: Option<PathBuf>,
    /// Write results.json, results.csv, timeseries.csv and summary.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `sluice sim` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Render report.md and SVG plots from the results of `sluice sim <experiment> --out <dir>`.
    Report(report::ReportArgs),
}

/// Runs `sluice sim`.
pub fn run(args: SimArgs) -> Result<()> {
    if let Some(SimCommand::Report(r)) = args.command {
        return report::run(r);
    }
    let Some(experiment) = &args.experiment else { bail!("sluice sim: an experiment file is required") };
    let (exp, base) = Experiment::load(experiment)?;
    let out = run_experiment(&exp, &base, true)?;
    println!(
        "{:<4} {:<16} {:<10} {:>7} {:>10} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "run", "policy", "app", "workers", "load/trace", "requests", "accuracy", "violation", "dropped", "wall s"
    );
    for t in &out.timing {
        let load = t.load_qps.map(|l| format!("{l:.0}")).unwrap_or_else(|| t.trace.clone().unwrap_or_default());
        println!(
            "{:<4} {:<16} {:<10} {:>7} {:>10} {:>9} {:>9.5} {:>9.5} {:>8} {:>9.3}",
            t.run,
            t.policy,
            t.app,
            t.workers,
            load,
            t.requests,
            t.accuracy,
            t.violation_rate,
            t.dropped,
            t.wall_seconds
        );
    }
    for r in &out.results {
        if let Some(o) = &r.overloaded {
            println!("run {} app {}: OVERLOADED: {o}", r.run, r.app);
        }
    }
    if let Some(dir) = &args.out {
        stats::write_outputs(dir, &out)?;
        println!("wrote {}/{{results.json,results.csv,timeseries.csv,summary.json}}", dir.display());
    }
    Ok(())
}

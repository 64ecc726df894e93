//! sluice-sim: a discrete-event simulator that drives the same router, the same
//! `.wasm` policy components, the same decision core and the same profiles as the
//! live host, in virtual time.
//!
//! Start here: [`Experiment`] (the TOML file; its apps are the server's
//! `AppConfig`), [`run_experiment`] (every run of its sweep), [`engine`] (the event
//! loop over `sluice_core`'s router, decision core and policy runtime, on a
//! `VirtualClock`), [`stats`] (what a run measures), [`report`] (report.md and
//! plots), [`model_switching`] (the ModelSwitching baseline's table), [`plan`] (capacity
//! planning: the fewest workers for an accuracy and a violation target), [`whatif`] (the
//! live host's recorded arrivals replayed with a candidate policy).
//!
//! Determinism: a run is a function of the experiment and its seed — arrivals and
//! sampled latencies come from [`rng::Rng`], policies read no clock — so
//! `results.json`, `results.csv` and `timeseries.csv` are byte-identical across
//! repetitions. `summary.json` adds wall-clock figures and is the one file that is not.

pub mod arrivals;
pub mod engine;
mod events;
pub mod experiment;
pub mod limit;
pub mod model_switching;
pub mod pipeline;
pub mod plan;
pub mod report;
pub mod rng;
pub mod stats;
pub mod whatif;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use sluice_core::profile::Profile;
use sluice_core::runtime::{CompiledPolicy, PolicyEngine};

pub use experiment::{Accounting, Experiment, LatencyModel, PolicyChoice, RunSpec, Sweep};

/// Compiled policies by name or path, shared by every run of an experiment.
#[derive(Clone)]
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

    /// A cache over an existing engine (policies compiled by it can be
    /// [`PolicyCache::insert`]ed).
    pub fn with_engine(engine: Arc<PolicyEngine>, builtin_dir: PathBuf, base: PathBuf) -> PolicyCache {
        PolicyCache { engine, builtin_dir, base, compiled: BTreeMap::new() }
    }

    /// Makes `policy` (an app's `policy` value) resolve to `compiled`, which must
    /// come from this cache's engine.
    pub fn insert(&mut self, policy: &str, compiled: Arc<CompiledPolicy>) {
        self.compiled.insert(policy.to_string(), compiled);
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
